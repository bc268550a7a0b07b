import numpy as np
import pytest

from tinyproto.core.budget import parse_budget
from tinyproto.core.datasets import load_dataset, split
from tinyproto.core.errors import TinyprotoError


@pytest.mark.parametrize(
    "text,expected",
    [("2kB", 2048), ("2KiB", 2048), ("1.5kB", 1536), ("2048B", 2048), ("2048", 2048), ("0.5kb", 512), (" 4 kB ", 4096)],
)
def test_budget_forms(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["abc", "0kB", "0", "-1kB", "2MB", "", "kB"])
def test_bad_budgets_are_user_errors(text):
    with pytest.raises(TinyprotoError):
        parse_budget(text)


def test_builtin_sets_load():
    for name, shape in [("digits", (1797, 64)), ("breast_cancer", (569, 30)), ("wine", (178, 13)), ("iris", (150, 4))]:
        assert load_dataset(name).X.shape == shape


def test_csv_with_label_column(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,label,b\n1,x,2\n3,y,4\n5,x,6\n7,y,8\n")
    ds = load_dataset(str(path), label="label")
    assert ds.X.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert ds.y.tolist() == ["x", "y", "x", "y"]


@pytest.mark.parametrize(
    "body,message",
    [
        ("1,nan,0\n2,3,1\n4,5,0\n6,7,1\n", "NaN or infinite"),
        ("1,inf,0\n2,3,1\n4,5,0\n6,7,1\n", "NaN or infinite"),
        ("1,red,0\n2,3,1\n4,5,0\n6,7,1\n", "not a number"),
        ("1,2,0\n2,3,0\n4,5,0\n", "at least two classes"),
    ],
)
def test_bad_csv_is_one_clear_error(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text("f1,f2,y\n" + body)
    with pytest.raises(TinyprotoError, match=message):
        load_dataset(str(path))


def test_npz_without_pickle(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, X=np.arange(20.0).reshape(10, 2), y=np.array([0, 1] * 5))
    assert load_dataset(str(path)).X.shape == (10, 2)


def test_split_is_fixed_and_stratified():
    ds = load_dataset("digits")
    a, b = split(ds), split(ds)
    assert np.array_equal(a.y_test, b.y_test)
    assert len(a.y_test) == 450
    assert set(np.unique(a.y_test)) == set(range(10))
