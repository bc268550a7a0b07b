"""Choose BNC's shape under a byte budget (and a latency limit) by the held-out accuracy of the int8 model.

Searched: r (bits of the hash) and the density of W; m (prototypes) is then the largest that fits the budget
(exactly: the bytes of IntBNC.carrays() for these sizes) and the latency limit (the cost model), capped at half
the training rows. Both input stages are priced and searched: "feature" (a mean and a gain per feature, 4 B each)
and "shared" (one offset and one gain, 4 B in all, which leaves the rest of the budget to W and the prototypes:
what makes wide inputs such as 784 pixels fit at all); the shapes of each are planned with that stage's bytes.
Each shape is trained on 75 % of the training rows (stratified, seeded) with shortened
epochs, quantized, and scored on the other 25 % with the integer reference the device runs; the best shape is
trained again on all the training rows with the full epochs. Ties: the per-feature stage (so a shared stage is
chosen only when it validates better), then fewer predicted cycles, then fewer bytes. The minimum budget is that
of the cheapest stage.
Layer: families (bnc).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from sklearn.utils import check_random_state

from tinyproto.core.cost import headroom_text, latency_cycle_limit
from tinyproto.core.errors import BudgetTooSmall, TinyprotoError
from tinyproto.core.folds import Folds
from tinyproto.families.solving import SolveOptions, fit_final_and_folds, map_in_processes, training_classes
from tinyproto.core.inputstage import InputStage, choose_input_scale, shared_stage, standardisation
from tinyproto.core.inputstage import stage_bytes as priced_stage_bytes
from tinyproto.families.bnc.cost import predict_cycles, shape_cycles
from tinyproto.families.bnc.quantize import IntBNC
from tinyproto.families.bnc.train import BNCClassifier, kept_weights

BITS_GRID = (8, 16, 24, 32, 48, 64, 96, 128)  # r <= 128: the stream's static sums stay within 768 B of SRAM
DENSITY_GRID = (1.0, 0.5, 0.25, 0.125)
SEEDED_GRID = (8, 16, 32)  # weights per row of a seeded W: only for inputs wider than WIDE_FEATURES
WIDE_FEATURES = 128  # beyond this a bitmap over d features costs more than the weights it locates
MIN_BITS = 8  # the smallest model: one code byte, one prototype per class, one weight per bit
SEARCH_EPOCHS = 12  # per phase while searching; the chosen shape is trained with the estimator's defaults
MAX_CANDIDATES = 14  # the largest-r shapes of each density are tried first; this many fits at most (per stage)
STAGE_KINDS = ("feature", "shared")  # the input stages searched (tinyproto.core.inputstage)


@dataclass(frozen=True)
class Candidate:
    n_bits: int
    density: float
    n_prototypes: int
    nonzeros: int
    model_bytes: int
    predicted_cycles: int
    val_accuracy: float = -1.0
    per_row: int = 0  # > 0: a seeded W with this many weights per row (wide inputs)
    stage: str = "feature"  # the input stage: "feature" or "shared"


def w_bytes(n_bits: int, n_features: int, nonzeros: int) -> int:
    """The smaller of dense int8 W and bitmap + nonzeros (IntBNC.w_dense decides the same way)."""
    return min(n_bits * n_features, n_bits * ((n_features + 7) // 8) + nonzeros)


def input_stage_bytes(X: np.ndarray, kind: str = "feature") -> int:
    """Bytes of the input stage of this kind the deployed model carries (what tinyproto.core.inputstage renders
    for X; the estimator builds the same stage from the same rows)."""
    if kind == "shared":
        stage = shared_stage(X)
    else:
        mean, scale = standardisation(X)
        stage = InputStage.from_standardisation(mean, scale, choose_input_scale((X - mean) / scale))
    nbytes = stage.nbytes
    assert nbytes == priced_stage_bytes(kind, X.shape[1])
    return nbytes


def model_bytes(n_bits: int, n_prototypes: int, nonzeros: int, n_features: int, n_classes: int,
                stage_bytes: int | None = None, seeded: bool = False) -> int:
    """Σ CArray.nbytes of IntBNC.carrays() for these sizes (the tests check it against real models); the input
    stage is 4 bytes per feature unless its real size is given. seeded: W is `nonzeros` values, no positions."""
    R = (n_bits + 7) // 8
    ends = n_classes * (1 if n_prototypes <= 255 else 2)
    stage = 4 * n_features if stage_bytes is None else stage_bytes
    weights = nonzeros if seeded else w_bytes(n_bits, n_features, nonzeros)
    return stage + weights + n_prototypes * R + ends


def seeded_rows(n_features: int) -> tuple[int, ...]:
    """The weights per row a seeded W may have on this many features (none up to WIDE_FEATURES, where a bitmap is
    cheaper; a segment, d / K features, must fit one byte)."""
    if n_features <= WIDE_FEATURES:
        return ()
    return tuple(K for K in SEEDED_GRID if -(-n_features // K) <= 255)


def minimum_budget(n_features: int, n_classes: int, stage_bytes: int | None = None) -> int:
    """The smallest BNC: 8 bits, one prototype per class, the cheapest W (one weight per bit; on wide inputs a
    seeded W with the fewest weights per row, if cheaper), with the cheapest input stage (the shared one, 4 B)
    unless stage_bytes is given."""
    if stage_bytes is None:
        stage_bytes = priced_stage_bytes("shared", n_features)
    smallest = model_bytes(MIN_BITS, n_classes, MIN_BITS, n_features, n_classes, stage_bytes)
    for K in seeded_rows(n_features)[:1]:
        smallest = min(smallest, model_bytes(MIN_BITS, n_classes, MIN_BITS * K, n_features, n_classes, stage_bytes,
                                             seeded=True))
    return smallest


def largest_m(budget: int, n_bits: int, nonzeros: int, n_features: int, n_classes: int, stage_bytes: int,
              seeded: bool = False) -> int:
    R = (n_bits + 7) // 8
    free = budget - stage_bytes - (nonzeros if seeded else w_bytes(n_bits, n_features, nonzeros))
    m = max(0, (free - n_classes) // R)
    while m > 0 and model_bytes(n_bits, m, nonzeros, n_features, n_classes, stage_bytes, seeded) > budget:
        m -= 1
    return m


def plan(budget: int, n_features: int, n_classes: int, m_cap: int, max_cycles: float | None,
         stage_bytes: int, stage: str = "feature") -> list[Candidate]:
    """Every (r, density) with the largest m that fits the bytes (stage_bytes for the input stage `stage`) and the
    time, at least one prototype per class."""
    out = []
    # and one weight per row (the smallest W: what a budget near the minimum can afford)
    for density in DENSITY_GRID + (1.0 / n_features,):
        for r in BITS_GRID:
            nnz = kept_weights(r, n_features, density)
            dense = r * n_features <= w_bytes(r, n_features, nnz) and density == 1.0
            m = min(largest_m(budget, r, nnz, n_features, n_classes, stage_bytes), m_cap)
            if max_cycles is not None:
                while m >= n_classes and shape_cycles(n_features, r, nnz, m, n_classes, dense) > max_cycles:
                    m = max(n_classes - 1, int(m * 0.9))
            if m < n_classes:
                continue
            if density < 1.0 and nnz >= r * n_features or any(c.n_bits == r and c.nonzeros == nnz for c in out):
                continue  # the same as a shape already planned
            out.append(Candidate(r, density, m, nnz, model_bytes(r, m, nnz, n_features, n_classes, stage_bytes),
                                 shape_cycles(n_features, r, nnz, m, n_classes, dense), stage=stage))
    for K in seeded_rows(n_features):
        for r in BITS_GRID:
            nnz = r * K
            m = min(largest_m(budget, r, nnz, n_features, n_classes, stage_bytes, True), m_cap)
            if max_cycles is not None:
                while m >= n_classes and shape_cycles(n_features, r, nnz, m, n_classes, False, K) > max_cycles:
                    m = max(n_classes - 1, int(m * 0.9))
            if m < n_classes:
                continue
            out.append(Candidate(r, K / n_features, m, nnz,
                                 model_bytes(r, m, nnz, n_features, n_classes, stage_bytes, True),
                                 shape_cycles(n_features, r, nnz, m, n_classes, False, K), per_row=K,
                                 stage=stage))
    return out


def _shortlist(cands: list[Candidate]) -> list[Candidate]:
    """At most MAX_CANDIDATES fits: per density of DENSITY_GRID the shapes nearest r_max, r_max / 2 and r_max / 4
    (more bits against more prototypes: which wins depends on the data), then the rest by r; the one-weight-per-
    row shapes only as fillers (they serve budgets near the minimum, where little else fits)."""
    by_density: dict[tuple, list[Candidate]] = {}
    for c in sorted(cands, key=lambda c: -c.n_bits):
        by_density.setdefault((c.density, c.per_row), []).append(c)
    first: list[Candidate] = []
    for (density, per_row), group in by_density.items():
        if density not in DENSITY_GRID and not per_row:
            continue
        top = group[0].n_bits
        for target in (top, top / 2, top / 4):
            pick = min(group, key=lambda c: (abs(c.n_bits - target), -c.n_bits))
            if pick not in first:
                first.append(pick)
    rest = [c for c in sorted(cands, key=lambda c: (c.density not in DENSITY_GRID and not c.per_row, -c.n_bits))
            if c not in first]
    return (first + rest)[:MAX_CANDIDATES]


def _estimator(c: Candidate, seed: int, search: bool) -> BNCClassifier:
    extra = {"epochs_joint": SEARCH_EPOCHS, "epochs_w": SEARCH_EPOCHS} if search else {}
    seeded = {"seeded_per_row": c.per_row} if c.per_row else {"density": c.density}
    return BNCClassifier(n_bits=c.n_bits, n_prototypes=c.n_prototypes, input_stage=c.stage, random_state=seed,
                         **seeded, **extra)


def _rank(c: Candidate) -> tuple:
    return (round(c.val_accuracy, 9), c.stage == "feature", -c.predicted_cycles, -c.model_bytes)


def _shape_text(c: Candidate) -> str:
    text = f"r={c.n_bits} m={c.n_prototypes} " + (f"seeded K={c.per_row}" if c.per_row else f"density={c.density:g}")
    return text + (" shared input" if c.stage == "shared" else "")


def _validate_candidate(c: Candidate, X: np.ndarray, y: np.ndarray, splits: list, fit_seed: int) -> list[int]:
    """Correct int8 predictions of shape c on each validation part, trained (shortened epochs) on the rest."""
    out = []
    for tr, va in splits:
        model = IntBNC.from_classifier(_estimator(c, fit_seed, search=True).fit(X[tr], y[tr]))
        pred = np.asarray(model.classes)[model.labels(model.scores(model.input_stage.quantize(X[va])))]
        out.append(int(np.sum(pred == y[va])))
    return out


def fit_chosen_bnc(X_train: np.ndarray, y_train: np.ndarray, chosen: dict,
                   options: SolveOptions) -> tuple[BNCClassifier, IntBNC]:
    """The shape fit_bnc_under_budget chose (its info["chosen"]) trained on these rows with the full epochs, no
    search: the solver's final fit. Its prototypes are capped at half these rows (as the search caps them; never
    binding on the solver's own rows), so the bytes and cycles are at most the chosen model's."""
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train)
    n_classes = np.unique(y).size
    m = min(int(chosen["n_prototypes"]), max(n_classes, len(X) // 2))
    shape = Candidate(int(chosen["n_bits"]), float(chosen["density"]), m, 0, 0, 0,
                      per_row=int(chosen["seeded_per_row"]), stage=str(chosen["input_stage"]))
    fit_seed = int(check_random_state(options.seed).randint(0, 2**31 - 1))  # as the solver draws it
    clf = _estimator(shape, fit_seed, search=False).fit(X, y)
    return clf, IntBNC.from_classifier(clf)


def fit_bnc_under_budget(X_train: np.ndarray, y_train: np.ndarray,
                         options: SolveOptions) -> tuple[BNCClassifier, IntBNC, dict]:
    """(fitted BNCClassifier, IntBNC, info) with the best held-out int8 accuracy within options.budget_bytes (and
    options.max_latency_ms by the cost model at options.f_cpu_hz). Never over the budget by a byte; a budget below
    the smallest BNC is refused with that minimum."""
    if options.learn_on is not None:
        raise TinyprotoError("BNC does not learn on the device (--learnable)")
    budget_bytes, seed, say = options.budget_bytes, options.seed, options.say
    max_latency_ms, f_cpu_hz = options.max_latency_ms, options.f_cpu_hz
    started = time.perf_counter()
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train)
    classes, y_index = training_classes(X, y, "BNC", min_rows=4)
    n, d = X.shape
    L = classes.size
    budget = int(budget_bytes)
    stage_bytes = {kind: input_stage_bytes(X, kind) for kind in STAGE_KINDS}
    smallest = min(minimum_budget(d, L, nbytes) for nbytes in stage_bytes.values())
    if budget < smallest:
        raise BudgetTooSmall(budget, smallest, f"BNC on {d} features and {L} classes",
                             f"{MIN_BITS} bits, one prototype per class, one shared input offset and gain")
    max_cycles = latency_cycle_limit(max_latency_ms, f_cpu_hz, n_classes=L)
    rng = check_random_state(seed)
    fit_seed = int(rng.randint(0, 2**31 - 1))
    folds = options.folds if options.folds is not None else Folds.standard(X, y, seed)
    splits = folds.splits()
    tr, va = splits[0]  # the first validation part: for the refusal's figure only
    m_cap = max(L, min(len(t) for t, _ in splits) // 2)
    plans = {kind: plan(budget, d, L, m_cap, max_cycles, nbytes, kind) for kind, nbytes in stage_bytes.items()}
    if not any(plans.values()):  # only a latency limit can empty the plans: the smallest shape always fits
        cheapest = min(STAGE_KINDS, key=lambda kind: stage_bytes[kind])
        smallest_shape = Candidate(MIN_BITS, 1.0 / d, L, MIN_BITS, smallest,
                                   shape_cycles(d, MIN_BITS, MIN_BITS, L, L, False), stage=cheapest)
        clf = _estimator(smallest_shape, fit_seed, search=True).fit(X[tr], y[tr])
        acc = float(np.mean(IntBNC.from_classifier(clf).predict(X[va]) == y[va]))
        raise TinyprotoError(f"no BNC within {budget} B is predicted to run in {max_latency_ms:g} ms "
                             f"({headroom_text()}); the fastest one "
                             f"within the budget (r={MIN_BITS}, one weight per bit, m={L}) is predicted at "
                             f"{smallest_shape.predicted_cycles / f_cpu_hz * 1e3:.3f} ms with {100 * acc:.1f} % "
                             f"held-out accuracy: raise --max-latency")
    tried = []
    shortlist = [c for kind in STAGE_KINDS for c in _shortlist(plans[kind])]
    say(f"bnc: {len(shortlist)} shapes, each validated on {len(splits)} part(s) in {options.n_jobs} process(es)")
    part_correct = map_in_processes(_validate_candidate, [(c, X, y, splits, fit_seed) for c in shortlist],
                                    options.n_jobs)
    n_scored = sum(len(v) for _, v in splits)
    fold_accuracies = {}
    for c, correct in zip(shortlist, part_correct):
        acc = sum(correct) / n_scored
        tried.append(Candidate(**{**asdict(c), "val_accuracy": acc}))
        fold_accuracies[tried[-1]] = [k / len(v) for k, (_, v) in zip(correct, splits)]
        say(f"bnc: {_shape_text(c)}: validated int8 accuracy {acc:.3f}")
    ranked = sorted(tried, key=_rank, reverse=True)
    best = ranked[0]
    # the final fit beside the chosen shape on the calibration's folds (fit_chosen_bnc reads these keys only)
    shape = {"n_bits": best.n_bits, "n_prototypes": best.n_prototypes, "density": best.density,
             "seeded_per_row": best.per_row, "input_stage": best.stage}
    (clf, model), fold_models = fit_final_and_folds(_final_fit, (best, fit_seed, X, y), fit_chosen_bnc, shape, X, y,
                                                    options.with_(folds=folds))
    nbytes = model.model_bytes()
    if nbytes > budget:  # cannot happen: model_bytes() above mirrors carrays(); keep the promise explicit
        raise AssertionError(f"chosen BNC has {nbytes} B > budget {budget} B")
    cycles = predict_cycles(model)["total"]
    if max_cycles is not None and cycles > max_cycles:
        raise AssertionError(f"chosen BNC is predicted at {cycles} cycles > the cap of {max_cycles:.0f}")
    rows = [{"shape": _shape_text(c), "input_stage": c.stage, "n_bits": c.n_bits, "density": c.density,
             "seeded_per_row": c.per_row, "n_prototypes": c.n_prototypes,
             "nonzeros": c.nonzeros, "val_int8_accuracy": c.val_accuracy, "model_bytes": c.model_bytes,
             "predicted_cycles": c.predicted_cycles,
             "predicted_latency_ms": round(c.predicted_cycles / f_cpu_hz * 1e3, 4)} for c in ranked[:6]]
    rows[0]["fold_accuracies"] = fold_accuracies[best]
    info = {
        "family": "bnc",
        "budget_bytes": budget,
        "model_bytes": nbytes,
        "chosen": {"n_bits": best.n_bits, "n_prototypes": best.n_prototypes, "density": best.density,
                   "seeded_per_row": best.per_row, "nonzeros": model.nonzeros, "w_dense": model.w_dense,
                   "input_stage": model.input_stage.kind, "random_state": fit_seed},
        "val_accuracy": best.val_accuracy,
        "validation": folds.describe() + ", int8 model, shortened epochs",
        "folds": folds.to_json(),
        "predicted_cycles": cycles,
        "candidates": [asdict(c) for c in tried],
        "chosen_validation": rows[0],
        "runners_up": rows[1:],
        "selection": "the best held-out int8 accuracy over both input stages (per-feature and shared, each priced "
                     "with its own bytes); among equal accuracies the per-feature stage, then the fewest predicted "
                     "cycles, then bytes",
        "seconds": time.perf_counter() - started,
    }
    if options.fold_models is not None:
        options.fold_models.offer_all(info["chosen"], fold_models)
    say(f"bnc: chose {_shape_text(best)}, {nbytes} B, held-out accuracy {best.val_accuracy:.3f}")
    return clf, model, info


def _final_fit(best: Candidate, fit_seed: int, X: np.ndarray, y: np.ndarray) -> tuple[BNCClassifier, IntBNC]:
    """The chosen shape trained on all the training rows with the full epochs."""
    clf = _estimator(best, fit_seed, search=False).fit(X, y)
    return clf, IntBNC.from_classifier(clf)
