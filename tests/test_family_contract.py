"""The contract every registered family keeps, checked through the registry alone (tinyproto.families.names()):
a family is tested here by being registered. The float estimator its solver returns is a scikit-learn estimator
(sklearn's own estimator checks, on a fresh clone of the fitted one), and its integer model survives model.json
(from_json(to_json()) computes the same scores, arrays and defines, and hashes the same). The budget and the seed
are the solver contract's subject (tests/test_solver_contract.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tinyproto import families
from tinyproto.core.render import model_hash
from tinyproto.families.solving import SolveOptions


@functools.lru_cache(maxsize=None)
def solved(name: str):
    from tinyproto.core.datasets import load_dataset, split

    sp = split(load_dataset("iris"))
    return families.fit_under_budget(name, sp.X_train, sp.y_train, SolveOptions(1024, 0))


@pytest.mark.parametrize("name", families.names())
def test_the_solvers_estimator_passes_scikit_learns_checks(name):
    from sklearn.base import clone
    from sklearn.utils.estimator_checks import check_estimator

    clf, _, _ = solved(name)
    check_estimator(clone(clf))


READ_WITHOUT_TRAINING = """
import sys
from pathlib import Path
from tinyproto.core.modeldir import load_model_dir
from tinyproto.families import load_int_model, predict_cycles
for path in sys.argv[1:]:
    predict_cycles(load_int_model(load_model_dir(Path(path))))
print("sklearn" in sys.modules)
"""


def test_a_compiled_model_is_read_and_priced_without_the_training_code(compiled):
    """build, validate and export rebuild a model directory's integer model (and price it) without
    importing scikit-learn, about a second of CPU per command: its estimators only train. Every family at once,
    in a process of its own (this one has imported everything)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    dirs = [str(compiled("iris", "1kB", name)) for name in families.names()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run([sys.executable, "-c", READ_WITHOUT_TRAINING, *dirs], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False", result.stdout


@pytest.mark.parametrize("name", families.names())
def test_the_integer_model_survives_model_json(name):
    _, model, _ = solved(name)
    again = families.int_model_from_json(model.to_json())
    xq = np.random.default_rng(0).integers(-128, 128, size=(50, model.n_features)).astype(np.int8)
    np.testing.assert_array_equal(again.scores(xq), model.scores(xq))
    assert again.defines() == model.defines() and model_hash(again) == model_hash(model)
    assert [(a.name, a.nbytes) for a in again.carrays()] == [(a.name, a.nbytes) for a in model.carrays()]
    assert families.inconsistency(again) is None
    assert families.family_of(again).name == name


@pytest.mark.parametrize("name", families.names())
def test_fit_shape_on_the_solvers_rows_is_the_solvers_model_bit_for_bit(name):
    """Family.fit_shape (the chosen shape trained again, no search: what the calibration's fold models are)
    given the solver's own rows and its info["chosen"] returns the solver's model: the same arrays, defines and
    hash. So the shape is recoverable from the solver's report and every random choice comes from the seed."""
    from tinyproto.core.datasets import load_dataset, split

    _, model, info = solved(name)
    sp = split(load_dataset("iris"))
    _, again = families.family(name).fit_shape(sp.X_train, sp.y_train, info["chosen"], SolveOptions(1024, 0))
    assert again.to_json() == model.to_json()
    assert model_hash(again) == model_hash(model) and again.defines() == model.defines()


@pytest.mark.parametrize("name", families.names())
def test_fit_shape_on_fewer_rows_keeps_the_shape_and_the_budget(name):
    """On a validation fold's rows (two thirds of them) the same shape is trained: the same family and classes,
    no more bytes than the budget, and (the hyper-parameters being the chosen ones) a model of its own rows."""
    from tinyproto.core.datasets import load_dataset, split

    _, model, info = solved(name)
    sp = split(load_dataset("iris"))
    rows = np.arange(len(sp.y_train)) % 3 != 0
    _, fold = families.family(name).fit_shape(sp.X_train[rows], sp.y_train[rows], info["chosen"],
                                              SolveOptions(1024, 0))
    assert families.family_of(fold).name == name and list(fold.classes) == list(model.classes)
    assert sum(a.nbytes for a in fold.carrays()) <= 1024
    assert [a.name for a in fold.carrays()] == [a.name for a in model.carrays()]
    assert fold.to_json() != model.to_json()  # trained on other rows


@pytest.mark.parametrize("name", families.names())
def test_a_score_bound_holds_on_any_input(name):
    """A family that proves a bound on |score| (score_bound: tp_judge's 16-bit view of the scores is chosen by it) is
    never beaten by an input, the extreme ones included; one that proves none is read in its top two bytes."""
    from tinyproto.core.confidence import VIEW_MAX, judge_score_byte
    from tinyproto.families.judging import score_bound

    _, model, _ = solved(name)
    bound = score_bound(model)
    rng = np.random.default_rng(1)
    xq = rng.integers(-128, 128, size=(300, model.n_features))
    xq[:3] = np.array([[-128], [127], [0]])
    xq[3:40] = rng.choice([-128, 127], size=(37, model.n_features))
    scores = np.asarray(model.scores(xq.astype(np.int8)))
    if bound is not None:
        assert np.abs(scores).max() <= bound
    byte = judge_score_byte(bound)
    assert byte == 2 if bound is None else (np.abs(scores) >> (8 * byte)).max() <= VIEW_MAX
