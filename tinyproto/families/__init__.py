"""The model families behind one declared interface, and the registry that names them.

Layer: families. Everything above this layer (pipeline, cli) reaches a family only through `family(name)` or
`family_of(model)`; no family name is compared as a string anywhere else. Adding a family is one package under
tinyproto/families/ (train, solver, quantize, cost, and an `__init__` that declares `FAMILY`) plus one line in
`_PACKAGES` below; its C runtime is firmware/tp_<name>.c. See docs/design.md, "Adding a family".
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from tinyproto.core.errors import TinyprotoError

if TYPE_CHECKING:  # annotations only: the registry is read by every command's --help, which imports no numpy
    import numpy as np

    from tinyproto.core.carray import CArray
    from tinyproto.core.inputstage import InputStage
    from tinyproto.core.ledger import SramItem
    from tinyproto.core.modeldir import ModelDir
    from tinyproto.families.solving import FitShape, FitUnderBudget, SolveOptions

# Re-exported from families/solving.py, imported on first use (PEP 562): the registry's names (the CLI's --model
# choices) cost no numpy, so a command that fails on its arguments or prints its help starts in a fraction of the time.
_SOLVING = ("FitShape", "FitUnderBudget", "SolveOptions", "buffer_room", "default_jobs")


def __getattr__(name: str):
    if name in _SOLVING:
        from tinyproto.families import solving

        value = globals()[name] = getattr(solving, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# The registry: family name -> the package that declares it. The order is the order users see (--help, tables).
_PACKAGES = {
    "protonn": "tinyproto.families.protonn",
    "flynn": "tinyproto.families.flynn",
    "bnc": "tinyproto.families.bnc",
    "bloom": "tinyproto.families.bloom",
}


class IntModel(Protocol):
    """The integer model of any family: what the C runtime computes, bit for bit, and what it stores."""

    family: str  # the registry name
    family_id: int  # TP_FAMILY_ID in the generated header (the device reports it)
    classes: list
    input_stage: InputStage

    @property
    def n_features(self) -> int: ...
    @property
    def n_classes(self) -> int: ...
    def carrays(self) -> list[CArray]: ...  # every array rendered to flash (the ledger sums them)
    def working_sram(self) -> list[SramItem]: ...  # the inference's buffers in SRAM
    def defines(self) -> dict[str, int]: ...  # the family's #defines in the generated header
    def scores(self, xq: np.ndarray) -> np.ndarray: ...  # int8 inputs (n, d) -> integer scores (n, L)
    def labels(self, scores: np.ndarray) -> np.ndarray: ...  # scores -> class index, ties as the C code breaks them
    def multiply_accumulates(self) -> int: ...  # for the cycle lower bound
    def to_json(self) -> dict: ...



class IntModelCommon:
    """What every family's integer model does alike, mixed into each one's dataclass: the sizes read from its
    classes and input stage, and the head of its model.json (family, classes, input stage)."""

    @property
    def n_features(self) -> int:
        return self.input_stage.n_features

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def json_head(self) -> dict:
        return {"family": self.family, "classes": list(self.classes), "input_stage": self.input_stage.to_json()}

    @classmethod
    def head_from_json(cls, raw: dict) -> dict:
        """The constructor's classes and input_stage from a model.json of this family (another family's refused)."""
        if raw.get("family") != cls.family:
            raise ValueError(f"not a {cls.family} model: {raw.get('family')!r}")
        from tinyproto.core.inputstage import InputStage

        return {"classes": list(raw["classes"]), "input_stage": InputStage.from_json(raw["input_stage"])}

# fit_under_budget(X_train, y_train, options: SolveOptions) -> (float estimator, IntModel, info): the one solver
# contract of every family, in tinyproto/families/solving.py (and checked by tests/test_solver_contract.py).
# fit_shape(X_train, y_train, info["chosen"], options) -> (float estimator, IntModel): the shape that solver chose,
# trained again on other rows with no search (the calibration's fold models; solving.FitShape).


SHAPE_KEYS_SHOWN = 6


def generic_shape_text(entry: dict) -> str:
    """A candidate's hyper-parameters in one short line, for a family that declares no shape_text of its own."""
    keys = [k for k, v in entry.items()
            if isinstance(v, (int, float, bool, str)) and not k.startswith(("val_", "model_", "predicted_"))]
    return " ".join(f"{k}={entry[k]:g}" if isinstance(entry[k], float) else f"{k}={entry[k]}"
                    for k in keys[:SHAPE_KEYS_SHOWN])


# --- the facts a family declares, so no caller (code, template or doc) decides them by comparing names ----------

HIGHEST, LOWEST = "highest", "lowest"


@dataclass(frozen=True)
class ScoreRule:
    """How tp_predict turns the class scores into a label (every family breaks ties to the lowest index)."""

    wins: str  # HIGHEST or LOWEST: the label is the class with the highest / lowest score
    meaning: str  # what one class's score is, in a phrase ("minus the Hamming distance to ...")

    def __post_init__(self):
        if self.wins not in (HIGHEST, LOWEST):
            raise ValueError(f"ScoreRule.wins must be {HIGHEST!r} or {LOWEST!r}, not {self.wins!r}")


@dataclass(frozen=True)
class StaticState:
    """The static SRAM (.bss) the family's runtime file (firmware/tp_<name>.c) keeps for one model, in bytes as
    avr-gcc lays it out (tests/test_family_facts.py compiles the file and compares)."""

    predict: tuple[SramItem, ...] = ()  # static variables tp_predict itself uses: it is then not reentrant
    stream_only: tuple[SramItem, ...] = ()  # static variables only the streaming trio (tp_stream_*) uses

    @property
    def items(self) -> tuple[SramItem, ...]:
        return self.predict + self.stream_only

    @property
    def nbytes(self) -> int:
        return sum(item.nbytes for item in self.items)

    @property
    def reentrant(self) -> bool:
        """tp_predict keeps nothing between calls: safe from an interrupt while the main loop is inside it."""
        return not self.predict


def no_static_state(model: IntModel) -> StaticState:
    return StaticState()


@dataclass(frozen=True)
class Learning:
    """What a family that learns on the device gives `compile --learnable` and `tinyproto learn`."""

    # (its solver fits the learned state into what a board holds while learning when SolveOptions.learn_on is set)
    check: Callable[..., Any]  # (model, board, save_eeprom) -> its sizes (.counts, .eeprom_record, .to_dict()) or
    #                            one TinyprotoError saying what would fit
    host_counts: Callable[..., np.ndarray]  # (model, int8 vectors, class indices) -> what the device must learn
    unpack_counts: Callable[..., np.ndarray]  # (bytes the device sent, model) -> the learned counts
    host_reference: Callable[[IntModel], str]  # what the host computes to check the device, in a phrase (learn.json)


@dataclass(frozen=True)
class Family:
    """One model family, as the rest of tinyproto sees it."""

    name: str  # the --model value and model.json's "family"
    title: str  # for tables and plots
    color: str  # its line in `tinyproto report`
    fit_under_budget: FitUnderBudget
    from_json: Callable[[dict], IntModel]  # model.json's int_model -> the integer model
    predict_cycles: Callable[[IntModel], dict]  # static cost model: {"total": cycles, per stage..., "lower_bound"}
    shape_text: Callable[[dict], str] = generic_shape_text  # a candidate row of the solver, in one short line
    streamable: bool = False  # its models can take inputs chunk by chunk (each model says so: TP_STREAMABLE)
    # The facts every caller reads (templates and generated docs included):
    score: ScoreRule = field(kw_only=True)  # which score wins, and what a score is
    static_state: Callable[[IntModel], StaticState] = field(kw_only=True)  # per model: reentrancy and static SRAM
    learning: Learning | None = field(default=None, kw_only=True)  # None: it cannot learn on the device
    estimator: str = field(default="", kw_only=True)  # "module:Class" of its scikit-learn estimator (tinyproto.<Class>)
    fit_shape: FitShape = field(kw_only=True)  # the chosen shape (info["chosen"]) on other rows, no search

    @property
    def learnable(self) -> bool:
        """It can learn on the device (`tinyproto learn`, federated device parties)."""
        return self.learning is not None


def lazy(target: str) -> Callable:
    """A function that imports "package.module:attribute[.attribute]" on its first call and forwards to it, so a
    family's package declares its FAMILY without importing its (heavy) training code."""
    def call(*args, **kwargs):
        return resolve(call)(*args, **kwargs)

    call.__name__ = call.__qualname__ = target.split(":")[1]
    call.lazy_target = target  # type: ignore[attr-defined]  # resolve() finds what it forwards to
    return call


def resolve(function: Callable) -> Callable:
    """The function a lazy() forwarder calls (imported now), or the function itself: what a signature check reads."""
    target = getattr(function, "lazy_target", None)
    if target is None:
        return function
    module_name, attribute = target.split(":")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def names() -> tuple[str, ...]:
    return tuple(_PACKAGES)


def estimator_class(class_name: str):
    """The float estimator class a family declares under this name (tinyproto.ProtoNNClassifier, ...), or None."""
    for name in names():
        target = family(name).estimator
        if target.rpartition(":")[2] == class_name:
            module_name, _, attribute = target.partition(":")
            return getattr(importlib.import_module(module_name), attribute)
    return None


def learnable_names() -> tuple[str, ...]:
    """The families that learn on the device, in registry order."""
    return tuple(name for name in names() if family(name).learnable)


def family(name: str) -> Family:
    """The family called `name`, or one clear error listing the known ones."""
    if name not in _PACKAGES:
        raise TinyprotoError(f"unknown model {name!r}; choose one of {', '.join(_PACKAGES)}")
    return importlib.import_module(_PACKAGES[name]).FAMILY


def family_of(model: IntModel) -> Family:
    name = getattr(model, "family", None)
    if not isinstance(name, str) or not hasattr(model, "carrays"):  # "unknown model '?'" for a string or None
        raise TinyprotoError(f"expected an integer model (what fit_under_budget returns second, or "
                             f"int_model_from_json gives), not {type(model).__name__}")
    return family(name)


def training_rows(X_train, y_train, options) -> tuple[np.ndarray, np.ndarray]:
    """The registry's fitting functions' arguments, checked before any family sees them: a SolveOptions, and rows
    as core/data_checks.check_training_arrays takes them (numpy arrays, lists, a pandas DataFrame and Series).
    Each family failed on bad rows its own way (a KeyError from pandas, a ZeroDivisionError, "tuple index out of
    range", numpy's "'<' not supported" for mixed labels); now one TinyprotoError line says what is wrong."""
    import numpy as np

    from tinyproto.core.data_checks import check_training_arrays
    from tinyproto.families.solving import SolveOptions

    if not isinstance(options, SolveOptions):
        raise TinyprotoError(f"options must be a tinyproto.families.solving.SolveOptions (SolveOptions(budget_bytes, "
                             f"seed=0, ...)), not {type(options).__name__}")
    X_train, y_train = check_training_arrays(X_train, y_train, "the training rows")
    if y_train.dtype.kind == "f" and (y_train != np.round(y_train)).any():  # scikit-learn: "continuous" (a regression)
        raise TinyprotoError(f"the training rows: label {y_train[y_train != np.round(y_train)][0].item()!r} is a "
                             "fraction; give each class as a whole number or as text (y.astype(str))")
    classes, counts = np.unique(y_train, return_counts=True)
    if counts.min() < 2:  # FlyNN divided by zero on two rows of two classes
        raise TinyprotoError(f"the training rows: class {classes[counts.argmin()].item()!r} has a single row; every "
                             "class needs at least two (more to validate the model on)")
    if (X_train.max(axis=0) == X_train.min(axis=0)).all():
        raise TinyprotoError("the training rows: no feature varies (every column is constant); a model would be "
                             "useless")
    return X_train, y_train


def fit_under_budget(name: str, X_train: np.ndarray, y_train: np.ndarray, options: SolveOptions):
    """(fitted float estimator, integer model, solver info) for family `name`; with options.max_latency_ms, only
    models whose predicted cycles per inference (the family's cost model) fit that many ms at options.f_cpu_hz.
    Bad rows or options are one TinyprotoError (training_rows)."""
    fam = family(name)
    X_train, y_train = training_rows(X_train, y_train, options)
    return fam.fit_under_budget(X_train, y_train, options)


def lowest_wins(name: str) -> bool:
    return family(name).score.wins == LOWEST


def fit_judged(name: str, X_train: np.ndarray, y_train: np.ndarray, options: SolveOptions,
               unknown_rate: float | None = None):
    """fit_under_budget, with the model's calibration (the confidence byte's two constants) and, with
    unknown_rate, its decline threshold, both fitted on cross-validated rows (families/judging.py): the model
    compile ships."""
    from tinyproto.families.judging import fit_judged as judged

    fam = family(name)
    X_train, y_train = training_rows(X_train, y_train, options)
    return judged(fam.fit_under_budget, fam.fit_shape, X_train, y_train, options, lowest_wins(name),
                  unknown_rate, fam.predict_cycles)


def judge(model: IntModel, scores: np.ndarray, labels: np.ndarray,
          xq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(confidence byte, decided label: the class or 255) per row: the host reference of tp_judge(); `xq`, the
    rows' int8 inputs, is needed by a model that also checks a range (families/judging.range_signal)."""
    from tinyproto.families.judging import judge as judged

    return judged(model, scores, labels, xq)


def novelty_score(model: IntModel, scores: np.ndarray, labels: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """The novelty score the held-out AUROC ranks (larger: less like the training rows): from the winning score,
    and a row outside a range check's range above every other (families/judging.novelty_score)."""
    from tinyproto.families.judging import novelty_score as score

    return score(model, scores, labels, lowest_wins(model.family), xq)


def judge_static(model: IntModel) -> tuple:
    """The confidence stage's static SRAM that tp_predict writes (the clip check's count: families/judging.py), as
    SramItems; () for a model without the check."""
    from tinyproto.families.judging import judge_static as static

    return static(model)


def calibrated(model: IntModel) -> bool:
    """The model carries a calibration (every model compile writes; a federated one does not)."""
    from tinyproto.families.judging import calibration_of

    return calibration_of(model) is not None


def calibrate_chosen(name: str, model: IntModel, chosen: dict, X_train: np.ndarray, y_train: np.ndarray,
                     options: SolveOptions, unknown_rate: float | None = None):
    """A model already fitted (under options.budget_bytes less the table; `chosen`: its solver's info["chosen"])
    judged: (judged model, its info)."""
    from tinyproto.families.judging import calibrate

    fam = family(name)
    return calibrate(fam.fit_under_budget, fam.fit_shape, chosen, model, X_train, y_train, options, lowest_wins(name),
                     unknown_rate, fam.predict_cycles)


DEFAULT = "protonn"  # --model when none is given
AUTO = "auto"  # --model auto: every family under the same budget, the best validated int8 accuracy wins


def validation_accuracy(info: dict) -> float:
    """The chosen model's validated int8 accuracy, from a solver's info (training data only, never the test split)."""
    return float(info["chosen_validation"]["val_int8_accuracy"])


def fit_best_family(X_train: np.ndarray, y_train: np.ndarray, options: SolveOptions,
                    fits_board: Callable[[IntModel], None] | None = None):
    """`--model auto`: fit every family under the budget (and latency limit) and keep the best validated int8
    accuracy, where the families within one standard error of it are tied and the fewest predicted cycles, then
    the fewest bytes, then registry order wins among them (families/choosing.py). Every family is validated on
    the same folds of the same rows (options.folds, drawn once here when not given: tinyproto.core.folds), so the
    accuracies compare like with like.
    fits_board(model) raises TinyprotoError for a model the board cannot run (its SRAM): that family is refused.
    info["auto"] lists every family's outcome (its validated accuracy, its spread over the validation parts, bytes
    and cycles, or why it was refused)."""
    import numpy as np

    from tinyproto.core.folds import Folds
    from tinyproto.families import choosing

    X_train, y_train = training_rows(X_train, y_train, options)  # checked once, not once per family
    if options.folds is None:
        options = options.with_(folds=Folds.standard(X_train, y_train, options.seed))
    outcomes, fitted = [], []
    for name in names():
        options.say(f"--model auto: {name}")
        try:
            clf, model, info = family(name).fit_under_budget(X_train, y_train, options)  # rows checked above
            if fits_board is not None:
                fits_board(model)
        except TinyprotoError as exc:
            outcomes.append({"family": name, "refused": str(exc)})
            continue
        parts = info["chosen_validation"].get("fold_accuracies", [])
        row = {"family": name, "val_int8_accuracy": validation_accuracy(info),
               "spread": float(np.std(parts, ddof=1)) if len(parts) > 1 else None, "fold_accuracies": parts,
               "model_bytes": sum(a.nbytes for a in model.carrays()),
               "predicted_cycles": int(predict_cycles(model)["total"])}
        outcomes.append(row)
        fitted.append((row, clf, model, info))
    if not fitted:
        raise TinyprotoError("no model family fits: " + "; ".join(f"{o['family']}: {o['refused']}" for o in outcomes))
    n_rows = options.folds.n_validated_rows()
    best = choosing.choose([f[0] for f in fitted], n_rows)
    row, clf, model, info = next(f for f in fitted if f[0] is best)
    tied = [r["family"] for r in choosing.tied_with_best([f[0] for f in fitted], n_rows)]
    info["auto"] = {"chosen": row["family"], "families": outcomes, "folds": options.folds.to_json(),
                    "tied_with_best": tied, "validated_rows": n_rows, "selection": choosing.RULE}
    return clf, model, info


def int_model_from_json(raw: dict) -> IntModel:
    """Rebuild the integer model (and so the host reference) from model.json's `int_model`."""
    from tinyproto.families.judging import split_json, wrap_from_json

    name = raw.get("family")
    if not isinstance(name, str) or name not in _PACKAGES:
        raise TinyprotoError(f"model.json names an unknown model family {name!r}")
    own, calibration = split_json(raw)
    return wrap_from_json(family(name).from_json(own), calibration, lowest_wins(name))


def _in_words(exc: Exception) -> str:
    """A malformed int_model's fault as the user reads it (a missing field is not "KeyError")."""
    text = " ".join(str(exc).split())[:80]
    if isinstance(exc, KeyError):
        return f"it has no field {exc.args[0]!r}" if exc.args else "a field is missing"
    if isinstance(exc, IndexError):
        return "an array is shorter than its shape says"
    if isinstance(exc, (TypeError, ValueError)):
        return f"a field has the wrong type or shape: {text}"
    return f"a field is malformed: {text}"


def load_int_model(model_dir: ModelDir) -> IntModel:
    """The integer model of a model directory; a damaged or edited model.json is refused, never trusted."""
    from tinyproto.core.manifest import remake_advice
    from tinyproto.core.render import model_hash

    raw = model_dir.int_model_json()
    where = model_dir.path / "model.json"
    try:
        model = int_model_from_json(raw)
        problem = _not_canonical(raw, model.to_json()) or inconsistency(model)
        digest = model_hash(model)
    except TinyprotoError as exc:  # a field out of its range: say which file holds it
        raise TinyprotoError(f"{where} is damaged: {exc}") from None
    except Exception as exc:  # any malformed field: wrong type, shape, missing key
        raise TinyprotoError(f"{where} is damaged: its int_model cannot be read ({_in_words(exc)}); "
                             f"{remake_advice(model_dir.path)}") from None
    if problem:
        raise TinyprotoError(f"{where} is damaged: its int_model is not a model tinyproto can run ({problem})")
    if digest != model_dir.model_hash:
        raise TinyprotoError(f"{where} was changed after compile: its model hashes to 0x{digest:08X}, not the "
                             f"recorded {model_dir.meta['model_hash']}")
    disagreement = model_dir_disagreement(model_dir, model)
    if disagreement:
        raise TinyprotoError(f"{where} is damaged: the directory is inconsistent, {disagreement}; "
                             f"{remake_advice(model_dir.path)}")
    return model


def model_dir_disagreement(model_dir: ModelDir, model: IntModel) -> str | None:
    """The first field of a model directory that disagrees with the integer model (which its hashes vouch for),
    or None. Each file is written from the one model, so any disagreement means an edit or a mix of directories:
    model.json's family and budget, report.json's family, sizes, hash, bytes, budget and board (test_vectors.npz
    whose arrays do not fit the model is refused here, naming that file). A directory that disagrees with itself
    would be validated, reported or exported under the wrong name or figures."""
    meta, report = model_dir.meta, model_dir.report
    model_bytes = sum(a.nbytes for a in model.carrays())
    checks = [
        ("model.json's family", meta.get("family"), model.family),
        ("report.json's model", report.get("model", model.family), model.family),
        ("report.json's n_features", report.get("n_features", model.n_features), model.n_features),
        ("report.json's n_classes", report.get("n_classes", model.n_classes), model.n_classes),
        ("report.json's model_hash", report.get("model_hash", meta.get("model_hash")), meta.get("model_hash")),
        ("report.json's model_bytes", report.get("model_bytes", model_bytes), model_bytes),
        ("report.json's budget_bytes", report.get("budget_bytes", meta.get("budget_bytes")), meta.get("budget_bytes")),
        ("report.json's board", report.get("board", model_dir.board), model_dir.board),
    ]
    for what, found, expected in checks:
        if type(found) is not type(expected) or found != expected:
            return f"{what} is {str(found)[:40]!r}, not {str(expected)[:40]!r} as the model it holds says"
    budget = meta.get("budget_bytes")
    if isinstance(budget, int) and model_bytes > budget:
        return f"the int_model is {model_bytes} B, over model.json's budget of {budget} B"
    vectors_path = model_dir.path / "test_vectors.npz"
    if vectors_path.is_file():
        # a damaged file, or one whose arrays do not fit the model, is refused under its own name, not model.json's
        model_dir.vectors().check_shapes(model.n_features, model.n_classes, vectors_path)
    return None


def _not_canonical(raw: dict, written: dict) -> str | None:
    """The first field of model.json's int_model that differs from what the rebuilt model writes, or None.
    from_json converts leniently (1.5 -> 1, "7" -> 7, true -> 1) and ignores keys it does not know; a model.json
    compile wrote round-trips exactly, so any difference means a field of the wrong type or an unknown one."""
    import json

    def canonical(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    for key in sorted(set(raw) | set(written), key=str):
        if key not in written:
            return f"unknown field {str(key)[:40]!r}"
        if key not in raw or canonical(raw[key]) != canonical(written[key]):
            return f"field {key!r} is not what tinyproto writes (a wrong type or value)"
    return None


MAX_SHIFT = 31  # a C shift of an int32 by 32 or more (or by a negative amount) is undefined behaviour
MAX_EXPONENT = 126  # the input stage's power-of-two exponents stay within float32's


def inconsistency(model: IntModel) -> str | None:
    """What makes a rebuilt integer model unrunnable, or None. The hashes in model.json only prove it unchanged
    since it was hashed: one edited and re-hashed (or written by a buggy tool) must still be a model whose sizes
    agree (classes, features, the input stage's columns), whose constants the C code can use, and whose host
    reference computes, or build, export and validate would each trust something the device cannot run."""
    import numpy as np

    from tinyproto.core.data_checks import MAX_CLASSES, MAX_FEATURES

    n, classes = model.n_features, model.n_classes
    if len(model.classes) != classes or not 2 <= classes <= MAX_CLASSES:
        return f"{len(model.classes)} class names for {classes} classes of scores"
    stage = model.input_stage
    n_inputs = n if stage.n_inputs is None else stage.n_inputs
    if not 1 <= n <= n_inputs <= MAX_FEATURES:
        return f"{n} features of {n_inputs} inputs"
    if stage.kept is not None and (len(stage.kept) != n or stage.kept[-1] >= n_inputs):
        return f"{len(stage.kept)} kept columns for {n} features of {n_inputs} inputs"
    if not (math.isfinite(stage.input_scale) and stage.input_scale > 0):
        return f"input_scale {stage.input_scale!r}"
    for name, value in model.defines().items():
        value = int(value)
        if "SHIFT" in name and not 0 <= value <= MAX_SHIFT:
            return f"{name} is {value}"
        if name.endswith("_EXP") and abs(value) > MAX_EXPONENT:
            return f"{name} is {value}"
        if not -(2**31) <= value < 2**31:
            return f"{name} is {value}"
    probe = np.zeros((2, n), dtype=np.int8)
    probe[1] = 127
    scores = np.asarray(model.scores(probe))
    labels = np.asarray(model.labels(scores))
    if scores.shape != (2, classes) or labels.shape != (2,) or not ((labels >= 0) & (labels < classes)).all():
        return f"its host reference gives scores of shape {scores.shape} for {classes} classes"
    return None


def predict_cycles(model: IntModel) -> dict:
    """Predicted AVR cycles per inference of an integer model, by its family's cost model, plus the confidence
    stage's (tp_judge, the same for every family: core/cost.judge_cycles) when the model carries its table."""
    from tinyproto.core.cost import judge_cycles

    out = dict(family_of(model).predict_cycles(model))
    if calibrated(model):
        out["judge"] = judge_cycles(model.n_classes, model.calibration.unknown_above is not None,
                                    model.calibration.has_range,
                                    model.n_features if model.calibration.has_clips else 0)
        out["total"] += out["judge"]
    return out
