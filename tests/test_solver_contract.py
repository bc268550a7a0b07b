"""The one solver contract: every registered family's fit_under_budget takes (X_train, y_train, options:
SolveOptions) and nothing else, returns (estimator, IntModel, info), and keeps the options' promises."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import tinyproto
from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.families.solving import FitShape, FitUnderBudget, SolveOptions

PACKAGE = Path(tinyproto.__file__).resolve().parent


def _solver(name: str):
    return families.resolve(families.family(name).fit_under_budget)


def _protocol_signature() -> inspect.Signature:
    signature = inspect.signature(FitUnderBudget.__call__)  # annotations as text: IntModel is for type checkers
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # without self


@pytest.mark.parametrize("name", families.names())
def test_every_solver_has_the_protocols_signature(name):
    expected = _protocol_signature()
    actual = inspect.signature(_solver(name), eval_str=True)
    assert list(actual.parameters) == list(expected.parameters) == ["X_train", "y_train", "options"]
    for param in actual.parameters.values():
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and param.default is inspect.Parameter.empty
    assert actual.parameters["options"].annotation is SolveOptions
    assert actual.parameters["X_train"].annotation is np.ndarray
    returned = actual.return_annotation
    assert getattr(returned, "__origin__", None) is tuple and len(returned.__args__) == 3, returned
    assert returned.__args__[2] is dict


@pytest.mark.parametrize("name", families.names())
def test_every_fit_shape_has_the_protocols_signature(name):
    """Family.fit_shape (the chosen shape, no search) keeps solving.FitShape: (X_train, y_train, chosen, options)."""
    signature = inspect.signature(FitShape.__call__)
    expected = list(signature.parameters)[1:]  # without self
    actual = inspect.signature(families.resolve(families.family(name).fit_shape), eval_str=True)
    assert list(actual.parameters) == expected == ["X_train", "y_train", "chosen", "options"]
    for param in actual.parameters.values():
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and param.default is inspect.Parameter.empty
    assert actual.parameters["options"].annotation is SolveOptions
    assert actual.parameters["chosen"].annotation is dict
    returned = actual.return_annotation
    assert getattr(returned, "__origin__", None) is tuple and len(returned.__args__) == 2, returned


def test_the_options_refuse_what_no_solver_can_do():
    with pytest.raises(TinyprotoError, match="--max-latency"):
        SolveOptions(2048, 0, max_latency_ms=0.0)
    with pytest.raises(TinyprotoError, match="--jobs"):
        SolveOptions(2048, 0, n_jobs=0)
    with pytest.raises(TinyprotoError, match="budget"):
        SolveOptions(0)
    options = SolveOptions(2048, 3)
    with pytest.raises(AttributeError):
        options.seed = 4  # frozen: a solver cannot change what the caller asked  # type: ignore[misc]
    assert options.with_(seed=4).seed == 4 and options.seed == 3


def test_no_caller_reaches_a_solvers_private_names():
    """Outside a family's package, nothing uses a solver's private functions (the federated selection ranks by
    the FlyNN family's public candidate_rank)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if PACKAGE / "families" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and "solver" in node.value.id:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not offenders, offenders


@pytest.fixture(scope="module")
def small_digits():
    from tinyproto.core.datasets import load_dataset, split

    sp = split(load_dataset("digits"))
    return sp.X_train[:120], sp.y_train[:120]  # budget and seed do not depend on the rows' number: 12 per class


@pytest.mark.parametrize("name", families.names())
def test_every_solver_keeps_the_budget_and_the_seed(name, small_digits):
    """Called only through the registry with one SolveOptions: within the budget, and the same seed gives the
    same model, whatever the labels are called as long as they sort in the same order (digits' 0..9 recoded as
    7, 17, .. 97: the folds hash a row's class index, not its label's text)."""
    X, y = small_digits
    options = SolveOptions(1024, 1)
    _, model, info = families.fit_under_budget(name, X, y, options)
    assert sum(a.nbytes for a in model.carrays()) <= 1024
    assert 0.0 <= info["chosen_validation"]["val_int8_accuracy"] <= 1.0
    again = families.fit_under_budget(name, X, 10 * y + 7, options)[1].to_json()
    assert again["classes"] == [10 * c + 7 for c in model.to_json()["classes"]]
    assert {**again, "classes": model.to_json()["classes"]} == model.to_json()


@pytest.mark.parametrize("name", [n for n in families.names() if not families.family(n).learnable])
def test_a_family_that_cannot_learn_refuses_learn_on(name, small_digits):
    from tinyproto.core.boards import load_board

    X, y = small_digits
    with pytest.raises(TinyprotoError, match="learn"):
        families.fit_under_budget(name, X, y, SolveOptions(1024, 0, learn_on=load_board("uno")))


class _FrameLike:
    """What a pandas DataFrame or Series is to numpy (pandas is no dependency): values through __array__, and an
    index that is not 0..n-1, which the solvers' row indexing (X[rows]) took for labels (a KeyError from pandas)."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __getitem__(self, rows):
        raise KeyError(f"None of [{rows!r}] are in the [columns]")


def _iris_rows():
    from sklearn.datasets import load_iris

    data = load_iris()
    return data.data[::2], data.target[::2]


BAD_ROWS = {
    "X None": (lambda X, y: (None, y), "both X"),
    "a 1-D X": (lambda X, y: (X[:, 0], y), r"X must be \(n, d\)"),
    "no columns": (lambda X, y: (X[:, :0], y), "no samples or no features"),
    "no rows": (lambda X, y: (X[:0], y[:0]), "no samples or no features"),
    "labels short": (lambda X, y: (X, y[:-3]), r"X must be \(n, d\)"),
    "NaN features": (lambda X, y: (np.where(X > 7, np.nan, X), y), "NaN or infinite"),
    "complex features": (lambda X, y: (X + 0j, y), "complex numbers"),
    "text features": (lambda X, y: (np.full(X.shape, "a"), y), "features must be numeric"),
    "NaN labels": (lambda X, y: (X, np.where(y == 0, np.nan, y)), "labels are NaN"),
    "labels of numbers and text": (lambda X, y: (X, np.array([1, "a", 2.5], dtype=object)[y]), "mix numbers and text"),
    "fractional labels": (lambda X, y: (X, y + 0.5), "is a fraction"),
    "one class": (lambda X, y: (X[y == 0], y[y == 0]), "at least two classes"),
    "a class of one row": (lambda X, y: (X[[0, 1, -1]], y[[0, 1, -1]]), "has a single row"),
    "constant features": (lambda X, y: (np.ones_like(X), y), "no feature varies"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_the_registry_refuses_bad_training_rows_in_one_line_for_every_family(case):
    """fit_under_budget, fit_judged and fit_best_family (the documented API) passed any rows to the family, and
    each failed its own way: "tuple index out of range", ZeroDivisionError, numpy's "'<' not supported between
    'str' and 'int'", a KeyError from pandas. They are checked once, at the registry, in one TinyprotoError."""
    make, words = BAD_ROWS[case]
    X, y = make(*_iris_rows())
    for name in families.names():
        with pytest.raises(TinyprotoError, match=words):
            families.fit_under_budget(name, X, y, SolveOptions(512))
    with pytest.raises(TinyprotoError, match=words):
        families.fit_judged(families.names()[0], X, y, SolveOptions(512))
    with pytest.raises(TinyprotoError, match=words):
        families.fit_best_family(X, y, SolveOptions(512))


def test_the_registry_takes_lists_and_frames_as_numpy_arrays():
    """A DataFrame's values and a list of rows are read as numpy arrays (the solvers index rows by position); a
    numeric ndarray is passed on as it is, its dtype kept (the same model, bit for bit)."""
    X, y = _iris_rows()
    rows, labels = families.training_rows(_FrameLike(X), _FrameLike(y), SolveOptions(512))
    assert isinstance(rows, np.ndarray) and np.array_equal(rows, X) and np.array_equal(labels, y)
    rows, labels = families.training_rows(X.tolist(), y.tolist(), SolveOptions(512))
    assert rows.dtype == np.float64 and np.array_equal(rows, X)
    X32 = X.astype(np.float32)
    assert families.training_rows(X32, y, SolveOptions(512))[0] is X32


@pytest.mark.parametrize("fields, words", [
    ({"budget_bytes": "1kB"}, "budget_bytes .* whole number"), ({"budget_bytes": None}, "budget_bytes"),
    ({"budget_bytes": 512, "seed": -1}, r"seed must be in 0\.\.4294967295"), ({"budget_bytes": 512, "seed": "x"},
                                                                              "seed must be a whole number"),
    ({"budget_bytes": 512, "n_jobs": "two"}, "n_jobs"), ({"budget_bytes": 512, "max_latency_ms": "5"},
                                                          "max_latency_ms must be a number"),
    ({"budget_bytes": True}, "budget_bytes")])
def test_solve_options_of_the_wrong_type_are_one_line(fields, words):
    """SolveOptions(budget_bytes="1kB") raised ValueError from int(), seed=-1 numpy's own range error from deep in
    the solver; options=None an AttributeError."""
    with pytest.raises(TinyprotoError, match=words):
        SolveOptions(**fields)
    X, y = _iris_rows()
    with pytest.raises(TinyprotoError, match="options must be a tinyproto.families.solving.SolveOptions"):
        families.fit_under_budget("protonn", X, y, None)


def test_predict_cycles_of_something_not_a_model_says_what_it_takes():
    with pytest.raises(TinyprotoError, match="expected an integer model .* not str"):
        families.predict_cycles("protonn")
