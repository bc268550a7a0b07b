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
    return sp.X_train[:240], sp.y_train[:240]


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
