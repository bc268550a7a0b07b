"""Bloom features under a byte budget: search (input stage, k, m, C) by cross-validated int8 accuracy.

Bytes: the input stage + R x p int8 weights + R biases (R = 1 for two classes, else L; p = the used slots, those
at least one component hashes to). The hash itself is regenerated from its seed and costs nothing, so for each k
the solver takes the largest m whose used slots fit the budget, counting every bias as int32 (the model ships
int16 biases when they fit: then it is a few bytes under). p is a property of (seed, d, k, m) alone, so the
bytes of a shape are known before any training.

Search, by the validated accuracy of the int8 model on the yardstick's folds (core/folds.py; the paper picks k by
cross-validation):
1. the input stage (what MAX compares, see train.py): min/global, min/feature, mean/feature, at a middle k;
2. k in K_CANDIDATES, each at its largest fitting m, times C in C_CANDIDATES, with the chosen input stage.
Among candidates tied on the best accuracy: the fewest predicted cycles, then the fewest bytes. With a latency
limit only shapes whose predicted cycles fit are tried (the cost model depends on the shape, not the data).
Layer: families (bloom).
"""

from __future__ import annotations

import time

import numpy as np

from tinyproto.core.cost import headroom_text, latency_cycle_limit
from tinyproto.core.errors import BudgetTooSmall, TinyprotoError
from tinyproto.core.folds import Folds
from tinyproto.families.solving import SolveOptions, calibration_splits, map_in_processes
from tinyproto.core.inputstage import InputStage
from tinyproto.families.bloom.cost import predict_cycles
from tinyproto.families.bloom.quantize import IntBloom
from tinyproto.families.bloom.slots import BYTE_SLOTS, hash_draws, seeded_slots, used_slots
from tinyproto.families.bloom.train import BloomClassifier, draw_seed

K_CANDIDATES = (1, 2, 3, 4, 6, 8)
C_CANDIDATES = (0.1, 1.0, 10.0)
# (offset, scaling) of the input stage; on equal validation accuracy the first listed wins. "shared" (one offset and
# gain, 4 B) is last: it is chosen when it validates better, e.g. on wide inputs where a per-feature stage (4 B per
# feature) leaves no bytes for the weights.
INPUT_STAGES = (("min", "global"), ("min", "feature"), ("mean", "feature"), ("shared", "global"))
STAGE_PROBE_K = 3  # k used while choosing the input stage
MAX_SLOTS = BYTE_SLOTS  # m <= 256: byte draws (one multiply per draw) and phi in at most 256 B of SRAM
RUNNERS_UP = 5
BIAS_BYTES = 4  # budgeted per row: int32, the widest the model may need


def stage_kind(offset: str) -> str:
    """The input stage's kind (core.inputstage.STAGE_KINDS) for a BloomClassifier offset."""
    return "shared" if offset == "shared" else "feature"


def _unit_stage(n_features: int, kind: str = "feature") -> InputStage:
    if kind == "shared":
        return InputStage.shared(0.0, 1.0, n_features)
    return InputStage.from_standardisation(np.zeros(n_features), np.ones(n_features), 1.0)


def stage_bytes(n_features: int, kind: str = "feature") -> int:
    """Bytes of the input stage for d features (from the stage's own arrays, as the ledger counts them)."""
    return _unit_stage(n_features, kind).nbytes


def placeholder_model(seed: int, n_features: int, n_classes: int, n_slots: int, n_hashes: int,
                      kind: str = "feature") -> IntBloom:
    """A model of this shape with zero weights and int32 biases: its arrays are the shape's bytes (the budget
    counts every bias as int32; a trained model whose biases fit int16 ships smaller)."""
    rows = 1 if n_classes == 2 else n_classes
    used = used_slots(seeded_slots(seed, n_features, n_hashes, n_slots)).size
    return IntBloom(list(range(n_classes)), _unit_stage(n_features, kind), seed, n_slots, n_hashes,
                    np.zeros((rows, used), dtype=np.int64), np.full(rows, 1 << 20, dtype=np.int64), 1.0)


def minimum_budget(n_features: int, n_classes: int) -> int:
    """Bytes of the smallest model: one slot (m = 1, k = 1: every feature in it), one weight per row, and the
    cheapest input stage (shared)."""
    return placeholder_model(1, n_features, n_classes, 1, 1, "shared").model_bytes()


def used_counts(seed: int, n_features: int, n_hashes: int, m_max: int) -> np.ndarray:
    """used[m] = how many of m slots the hash of (seed, d, k) reaches, for every m in 0..m_max (used[0] = 0).

    (v * m) >> bits is non-decreasing in the draw v, so over the sorted distinct draws the distinct slots are 1 +
    the number of steps up. The draws themselves depend on m only through its regime (byte or 16-bit draws)."""
    out = np.zeros(m_max + 1, dtype=np.int64)
    regimes = {}
    for m in range(1, m_max + 1):
        byte_draws = m <= BYTE_SLOTS
        if byte_draws not in regimes:
            draws, bits = hash_draws(seed, n_features, n_hashes, m)
            regimes[byte_draws] = (np.unique(draws), bits)
        values, bits = regimes[byte_draws]
        slots = (values * m) >> bits
        out[m] = 1 + int(np.count_nonzero(slots[1:] != slots[:-1]))
    return out


def _shape_cycles(n_features: int, n_classes: int, m: int, k: int, used: int) -> int:
    """Predicted cycles of a shape, by the cost model on a placeholder model (weights do not change cycles)."""
    rows = 1 if n_classes == 2 else n_classes
    stage = InputStage.from_standardisation(np.zeros(n_features), np.ones(n_features), 1.0)
    model = _Placeholder(n_features, n_classes, m, k, np.zeros((rows, used), dtype=np.int64), stage)
    return predict_cycles(model)["total"]


class _Placeholder:
    """Just the shape the cost model reads (a candidate is priced before any calibration: no range check)."""

    checks_range = False

    def __init__(self, n_features, n_classes, n_slots, n_hashes, weights, stage):
        self.n_features, self.n_classes, self.n_slots, self.n_hashes = n_features, n_classes, n_slots, n_hashes
        self.weights, self.input_stage = weights, stage

    def multiply_accumulates(self) -> int:
        return int(self.weights.size)


def candidate_shapes(seed: int, n_features: int, n_classes: int, budget: int,
                     max_cycles: float | None, kind: str = "feature") -> list[dict]:
    """For each k, the largest m (<= MAX_SLOTS) whose used slots fit the budget (beside an input stage of this
    kind) and the cycle limit."""
    rows = 1 if n_classes == 2 else n_classes
    p_max = (budget - stage_bytes(n_features, kind) - rows * BIAS_BYTES) // rows
    shapes = []
    for k in K_CANDIDATES:
        used = used_counts(seed, n_features, k, MAX_SLOTS)
        for m in range(MAX_SLOTS, 0, -1):
            if used[m] > p_max:
                continue
            cycles = _shape_cycles(n_features, n_classes, m, k, int(used[m]))
            if max_cycles is None or cycles <= max_cycles:
                nbytes = placeholder_model(seed, n_features, n_classes, m, k, kind).model_bytes()
                if nbytes > budget:  # the arithmetic above and the arrays disagree: a bug, never shipped
                    raise TinyprotoError(f"internal error: m={m} k={k} needs {nbytes} B, over {budget} B")
                shapes.append({"n_slots": m, "n_hashes": k, "n_used": int(used[m]), "predicted_cycles": cycles,
                               "model_bytes": nbytes})
                break
    unique = {(s["n_slots"], s["n_hashes"]): s for s in shapes}
    return list(unique.values())


def _validate_candidate(n_slots: int, n_hashes: int, offset: str, scaling: str, C: float, random_state: int,
                        X: np.ndarray, y: np.ndarray, splits: list) -> tuple[list[int], list[IntBloom]]:
    """(correct int8 predictions of one candidate on each validation part, trained on the rest; the int8 model of
    each part: fit_chosen_bloom's on the part's training rows)."""
    out, models = [], []
    for tr, va in splits:
        clf = BloomClassifier(n_slots, n_hashes, offset, scaling, C, random_state)
        model = IntBloom.from_classifier(clf.fit(X[tr], y[tr]), X[tr], y[tr])
        out.append(int(np.sum(model.predict(X[va]) == y[va])))
        models.append(model)
    return out, models


def shape_text(entry: dict) -> str:
    return (f"m={entry['n_slots']} k={entry['n_hashes']} used={entry['n_used']} C={entry['C']:g} "
            f"{entry['offset']}/{entry['scaling']}")


def fit_chosen_bloom(X_train: np.ndarray, y_train: np.ndarray, chosen: dict,
                     options: SolveOptions) -> tuple[BloomClassifier, IntBloom]:
    """The shape fit_bloom_under_budget chose (its info["chosen"]) trained on these rows, no search: the solver's
    final fit. The hash comes from options.seed as the solver's does, so the bytes are the chosen shape's."""
    clf = BloomClassifier(int(chosen["n_slots"]), int(chosen["n_hashes"]), str(chosen["offset"]),
                          str(chosen["scaling"]), float(chosen["C"]), options.seed)
    X = np.asarray(X_train, dtype=np.float64)
    clf.fit(X, np.asarray(y_train))
    return clf, IntBloom.from_classifier(clf, X, np.asarray(y_train))


def fit_bloom_under_budget(X_train: np.ndarray, y_train: np.ndarray,
                           options: SolveOptions) -> tuple[BloomClassifier, IntBloom, dict]:
    """(float estimator, int8 model, info) for the best cross-validated int8 Bloom model within
    options.budget_bytes (and options.max_latency_ms by the cost model at options.f_cpu_hz)."""
    if options.learn_on is not None:
        raise TinyprotoError("Bloom features do not learn on the device (--learnable)")
    budget_bytes, random_state, progress = options.budget_bytes, options.seed, options.progress
    max_latency_ms, f_cpu_hz = options.max_latency_ms, options.f_cpu_hz
    started = time.perf_counter()
    X_train = np.asarray(X_train, dtype=np.float64)
    y_train = np.asarray(y_train)
    n_features = X_train.shape[1]
    classes = np.unique(y_train)
    floor = minimum_budget(n_features, classes.size)
    if budget_bytes < floor:
        raise BudgetTooSmall(budget_bytes, floor, f"Bloom features on {n_features} features and {classes.size} classes",
                             "one used slot")
    max_cycles = latency_cycle_limit(max_latency_ms, f_cpu_hz, n_classes=classes.size)
    seed = draw_seed(random_state)
    shapes_of = {kind: candidate_shapes(seed, n_features, classes.size, budget_bytes, max_cycles, kind)
                 for kind in ("feature", "shared")}
    if not any(shapes_of.values()):
        fastest = _shape_cycles(n_features, classes.size, 1, 1, 1)
        raise TinyprotoError(
            f"no Bloom model within {budget_bytes} B is predicted to run in {max_latency_ms:g} ms "
            f"({headroom_text()}); the fastest "
            f"(k=1, one slot) is predicted at {1000.0 * fastest / f_cpu_hz:.3f} ms: raise --max-latency"
        )
    folds = options.folds if options.folds is not None else Folds.standard(X_train, y_train, random_state)
    splits = folds.splits()
    n_val = sum(len(v) for _, v in splits)
    tried: list[dict] = []
    fold_accuracies: list[list[float]] = []
    split_models: list[list[IntBloom]] = []  # per tried candidate, its model on each split

    def evaluate(batch: list[tuple[dict, str, str, float]]) -> list[dict]:
        """Validate (shape, offset, scaling, C) candidates on the yardstick's parts, in options.n_jobs processes."""
        corrects = map_in_processes(_validate_candidate, [(shape["n_slots"], shape["n_hashes"], offset, scaling, C,
                                                            random_state, X_train, y_train, splits)
                                                           for shape, offset, scaling, C in batch], options.n_jobs)
        out = []
        for (shape, offset, scaling, C), (correct, models) in zip(batch, corrects):
            split_models.append(models)
            entry = {**{k: shape[k] for k in ("n_slots", "n_hashes", "n_used", "model_bytes", "predicted_cycles")},
                     "offset": offset, "scaling": scaling, "C": C, "seed": seed,
                     "val_int8_accuracy": sum(correct) / n_val,
                     "predicted_latency_ms": round(1000.0 * shape["predicted_cycles"] / f_cpu_hz, 4)}
            tried.append(entry)
            fold_accuracies.append([k / len(v) for k, (_, v) in zip(correct, splits)])
            if progress:
                progress(f"{shape_text(entry)}: {100 * entry['val_int8_accuracy']:.2f} %")
            out.append(entry)
        return out

    probes = {kind: min(shapes, key=lambda s: (abs(s["n_hashes"] - STAGE_PROBE_K), s["n_hashes"]))
              for kind, shapes in shapes_of.items() if shapes}
    stage_scores = evaluate([(probes[stage_kind(offset)], offset, scaling, 1.0)
                             for offset, scaling in INPUT_STAGES if stage_kind(offset) in probes])
    best_stage = max(stage_scores, key=lambda e: e["val_int8_accuracy"])  # first best: the listed order
    offset, scaling = best_stage["offset"], best_stage["scaling"]
    probe = probes[stage_kind(offset)]
    evaluate([(shape, offset, scaling, C) for shape in shapes_of[stage_kind(offset)] for C in C_CANDIDATES
              if not (shape is probe and C == 1.0)])

    best_acc = max(t["val_int8_accuracy"] for t in tried)
    order = sorted(range(len(tried)), key=lambda i: (-tried[i]["val_int8_accuracy"], tried[i]["predicted_cycles"],
                                                    tried[i]["model_bytes"], i))
    chosen = dict(tried[order[0]], fold_accuracies=fold_accuracies[order[0]])
    if progress:
        progress(f"refit {shape_text(chosen)} on all training data")
    clf = BloomClassifier(chosen["n_slots"], chosen["n_hashes"], chosen["offset"], chosen["scaling"], chosen["C"],
                          random_state).fit(X_train, y_train)
    model = IntBloom.from_classifier(clf, X_train, y_train)
    if model.model_bytes() > budget_bytes:  # the byte count is the shape's, known before training: a bug
        raise TinyprotoError(f"internal error: Bloom model is {model.model_bytes()} B, over {budget_bytes} B")
    keys = ("n_slots", "n_hashes", "n_used", "offset", "scaling", "C", "seed")
    # the search trained the chosen candidate on every fold as the calibration would
    if options.fold_models is not None:
        for index, _, _ in calibration_splits(folds):
            options.fold_models.offer({k: chosen[k] for k in keys}, index, split_models[order[0]][index])
    info = {
        "chosen": {k: chosen[k] for k in keys},
        "candidates": tried,
        "chosen_validation": chosen,
        "runners_up": [tried[i] for i in order[1 : 1 + RUNNERS_UP]],
        "selection": (f"the fewest predicted cycles, then bytes, among the candidates tied with the best int8 "
                      f"accuracy ({100 * best_acc:.2f} %) over {n_val} validated samples"),
        "validation": folds.describe() + ", int8 model",
        "folds": folds.to_json(),
        "max_latency_ms": max_latency_ms,
        "search_seconds": round(time.perf_counter() - started, 2),
        "minimum_budget_bytes": floor,
    }
    return clf, model, info
