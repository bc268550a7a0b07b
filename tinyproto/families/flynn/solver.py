"""Choose FlyNN hyper-parameters under a byte budget (and an inference-time cap) by held-out accuracy.

Searched: preprocessing (per-feature or global scale, sign split), s, ρ, count bits b, decay c, stored or seeded
M; m is then the largest number of hash rows that fits both the byte budget (exactly: Σ CArray.nbytes of the
rendered model) and the time cap (the calibrated AVR cycle model below), and, for a model that learns on the
device (`count_limit`), whose L x m x b bits of counts fit the device's SRAM and EEPROM.

Validation is K-fold cross-validation on the training data, and it costs almost nothing extra: FlyNN counts are
additive, so the filters without fold k are counts(all) - counts(fold k), and each sample is hashed once. Every
accuracy is that of the integer model the device runs (int8 inputs, saturated counts, uint8 lut), not the float
one.

Speed: for one (preprocessing, s) the seeded M of the largest m is generated once; a smaller m is a prefix of it,
and the winners of every (m, ρ) come from one incremental top-K pass over the sorted m values.
Layer: families.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
from sklearn.utils import check_random_state

from tinyproto.core.cost import headroom_text, latency_cycle_limit
from tinyproto.core.errors import BudgetTooSmall, TinyprotoError
from tinyproto.core.folds import Folds
from tinyproto.core.moments import MomentSums, centred_stage, moment_sums
from tinyproto.core.moments import standardisation as exact_standardisation
from tinyproto.families.solving import SolveOptions, training_classes
from tinyproto.families.flynn.cost import estimate_cycles
from tinyproto.families.flynn.pricing import (DEFAULT_CAP, WIDE_FEATURES, ExactCycles, default_max_ms,
                                              largest_m, model_bytes, rows_bytes)
from tinyproto.families.flynn.quantize import (
    IntFlyNN,
    count_scales,
    fly_working_sram,
    fold_codes,
    fold_lut_weights,
    hash_inputs,
)
from tinyproto.families.flynn.seeded_index import draw_seed, seeded_indices
from tinyproto.families.flynn.hashing import project, projection_matrix
from tinyproto.families.flynn.train import FlyNNClassifier
from tinyproto.core.inputstage import InputStage, choose_input_scale, shared_stage, stage_bytes

F_CPU = 16_000_000
MIN_HASHES = 16  # fewer hash bits than this is not a FlyNN worth deploying

S_GRID = (2, 4, 6, 8, 12, 16)
RHO_GRID = (8, 16, 32, 64)
BITS_GRID = (1, 2, 3, 4)
DECAY_GRID = (0.5, 0.25, 0.1)
PREPROCESSING = (("feature", True), ("global", True), ("feature", False), ("global", False))
SHARED_PREPROCESSING = (("shared", True), ("shared", False))  # one offset and gain for every feature (4 B)
# On wide inputs (pixels) only: the shared stage and a 2- or 4-bit centre per feature
# ("centred2", "centred4": core.moments.centred_stage), which gives back what one offset for every pixel loses
# (the always-dark border's mirror wins every hash). Its centres come from exact sums, so a federation's parties
# agree on the same stage (federated.protocol); on narrow data it is not searched.
CENTRED_PREPROCESSING = (("centred2", True), ("centred2", False), ("centred4", True), ("centred4", False))
DEVICE_STAGES = ("shared", "centred2", "centred4")  # preprocessings whose stage is built from the raw values


def float_scaling(scaling: str) -> str:
    """The float model's standardisation for a preprocessing: a shared stage's own offset and step (what its int8
    inputs round); a centred stage's view is the global one (each feature's exact mean, one std: the centres are
    those means in a few bits); the others are their own."""
    return "global" if scaling.startswith("centred") else scaling


def centre_bits(scaling: str) -> int | None:
    """The bits of a centred preprocessing's centre codes ("centred2" -> 2), None for the other scalings."""
    return int(scaling[len("centred"):]) if scaling.startswith("centred") else None

# ---------------------------------------------------------------- candidates and their evaluation


@dataclass(frozen=True)
class Candidate:
    scaling: str
    sign_split: bool
    s: int
    m: int
    rho: int
    bits: int
    decay: float
    store_M: bool
    model_bytes: int
    est_cycles: int
    cv_accuracy: float = float("nan")
    count_scale: int = 1  # q: deployed counts are the training counts // q (quantize.count_scales)


@dataclass
class _Prepared:
    """One preprocessing of the training data: int8 hash inputs exactly as the device will see them."""

    scaling: str
    sign_split: bool
    U: np.ndarray  # (n, n_inputs) float64 of integers
    stage: InputStage


def _input_stage(X: np.ndarray, scaling: str, sums: MomentSums) -> InputStage:
    """The input stage the deployed model will have for this preprocessing. The mean and scale come from the
    rows' exact moments (core.moments), as a federation computes them, so a federated model is this one bit for
    bit. "shared": one offset and gain for every feature (4 B instead of 4 B per feature: pixels, same-unit
    sensors); "centredB": the same and a B-bit centre per feature (wide inputs)."""
    if scaling == "shared":
        return shared_stage(X)
    bits = centre_bits(scaling)
    if bits is not None:
        return centred_stage(X, bits)
    mean, scale = exact_standardisation(sums, scaling)
    return InputStage.from_standardisation(mean, scale, choose_input_scale((X - mean) / scale))


def _prepare(X: np.ndarray, scaling: str, sign_split: bool, stage: InputStage) -> _Prepared:
    """Standardise and quantize as the deployed model will: the hash inputs of `stage` (see _input_stage)."""
    return _Prepared(scaling, sign_split, hash_inputs(stage.quantize(X), sign_split).astype(np.float64), stage)


def _stage_bytes(prep: _Prepared) -> int:
    return prep.stage.nbytes


# (ρ, b, hash inputs, stored M) -> the largest m whose counts the device can hold while learning
# (tinyproto.families.flynn.learning.count_limit); None: counts stay in flash only.
CountLimit = Callable[[int, int, int, bool], int]

_ROW_BITS = 17  # keys: P * 2^17 + (2^17 - 1 - j): larger key = larger P, then lower row (the device's order)


def _ranked_winners(U: np.ndarray, indices: np.ndarray, m_values: list[int], k: int) -> dict[int, np.ndarray]:
    """For each m in m_values: the top-k rows of the first m rows of M, best first, (n, k) per m."""
    P = project(U, projection_matrix(indices[: max(m_values)], U.shape[1])).astype(np.int64)
    return ranked_winners_of_projection(P, m_values, k)


def ranked_winners_of_projection(P: np.ndarray, m_values: list[int], k: int) -> dict[int, np.ndarray]:
    """_ranked_winners from the projections P (n, m_max) already computed: for each m, the top-k of the first m
    columns, best first; ties go to the lower row index (the key packs the row below the projection)."""
    n, m_max = P.shape
    keys = (P << _ROW_BITS) + ((1 << _ROW_BITS) - 1 - np.arange(m_max))
    out: dict[int, np.ndarray] = {}
    best = np.empty((n, 0), dtype=np.int64)
    done = 0
    for m in sorted(set(m_values)):
        pool = np.concatenate([best, keys[:, done:m]], axis=1)
        kk = min(k, pool.shape[1])
        best = -np.partition(-pool, kk - 1, axis=1)[:, :kk] if pool.shape[1] > kk else pool
        done = m
        ranked = -np.sort(-best, axis=1)
        out[m] = (1 << _ROW_BITS) - 1 - (ranked & ((1 << _ROW_BITS) - 1))
    return out


def _cv_accuracies(winners: np.ndarray, y_index: np.ndarray, folds: Folds, n_classes: int, m: int,
                   weightings: list[tuple[int, float, int]]) -> list[float]:
    """Validated accuracy of the integer model for each (bits, decay, count scale) given every sample's winners:
    the correct predictions over every validation part of the yardstick, divided by the rows scored."""
    correct = _cv_correct(winners, y_index, folds, n_classes, m, weightings)
    return [int(row.sum()) / folds.n_scored() for row in correct]


def _cv_correct(winners: np.ndarray, y_index: np.ndarray, folds: Folds, n_classes: int, m: int,
                weightings: list[tuple[int, float, int]]) -> np.ndarray:
    """(weightings, validation parts) correct predictions: each part's rows scored by the filters counted without
    that part (FlyNN counts are additive: counts(all) - counts(part))."""
    n, rho = winners.shape
    K = folds.n_folds
    flat = (y_index[:, None] * m + winners).reshape(-1)
    out = np.zeros((len(weightings), len(folds.parts())), dtype=np.int64)
    deployed = n * rho  # the deployed model's counts sum to this; a fold model's to its rows times ρ
    for r in range(folds.n_repeats):
        ids = folds.ids[r]
        fold_of = np.repeat(ids, rho)
        per_fold = np.stack([np.bincount(flat[fold_of == f], minlength=n_classes * m) for f in range(K)])
        held_out = (per_fold.sum(axis=0)[None, :] - per_fold).reshape(K, n_classes, m)  # counts without each fold
        rows = np.flatnonzero(ids < folds.validated)
        # t of every winner of every scored sample for every class, from the filters that did not see it: (n, L, ρ)
        gathered = held_out[ids[rows, None, None], np.arange(n_classes)[None, :, None], winners[rows, None, :]]
        saturated, saturated_as = None, None  # the decays of one (bits, count scale) share their counts t
        fold_rows = ids[rows, None, None]
        counted = held_out.sum(axis=(1, 2))[fold_rows]  # each scored row's fold model's rows times ρ
        for k, (bits, decay, count_scale) in enumerate(weightings):
            if saturated_as != (bits, count_scale):  # codes as the deployed model's counts of all n rows get them
                saturated = fold_codes(gathered, count_scale, bits, counted, deployed)
                saturated_as = (bits, count_scale)
            if bits == 1:
                scores = (saturated == 0).sum(axis=2)
            else:  # each fold's model has the lut calibrated on its own counts, as the deployed one has
                scores = fold_lut_weights(held_out, saturated, fold_rows, decay, bits, count_scale,
                                          deployed).sum(axis=2)
            hits = np.argmin(scores, axis=1) == y_index[rows]
            out[k, r * folds.validated:(r + 1) * folds.validated] = np.bincount(ids[rows][hits],
                                                                               minlength=folds.validated)
    return out


RANKED_ROWS = 2400  # a hold-out scoring fewer rows than this is ranked on every fold instead (ranking_folds)


def ranking_folds(folds: Folds) -> Folds:
    """The folds the search ranks its candidates on: every fold of the yardstick's draws. On large data the
    yardstick validates one fold of three (a hold-out, which keeps the other families' searches affordable); a FlyNN
    fold model is the counts less that fold's, so scoring the other two folds as well costs little, and it
    triples the rows each candidate is ranked by. With a hold-out of 750 rows (3,000-row sets) the standard error
    of a candidate's accuracy is 1.8 points, and among hundreds of candidates the pick was often one whose count
    codes fitted those rows by chance: FlyNN's 12 hardest panel runs (tools/bench_int8.py --quick --models flynn
    --seeds 0 1 2 --panel mc12x4c3 win600s mc30x6c2 mc40x5c3) had int8 - float -0.52 points on average, worst -2.93;
    ranked on every fold, -0.08, worst -1.73, and mean int8 accuracy 63.02 -> 63.11 % (docs/guides/quantization.md).
    The chosen candidate's own figure on the yardstick (chosen_validation) is what `--model auto` compares. The
    federated selection ranks on the same folds (federated/selection.py), so it picks what compile picks.
    A hold-out of RANKED_ROWS rows or more (over 7,200 training rows) is kept: its standard error is under a
    point, and every fold would triple the search's validation work there (20,000 rows of make_classification,
    `compile --model flynn --budget 2kB --jobs 1`: 42.9 s user against 31.4 with the hold-out, the same model)."""
    validated = ranked_folds(folds.n_folds, folds.validated, folds.n_scored())
    return folds if validated == folds.validated else replace(folds, validated=validated)


def ranked_folds(n_folds: int, validated: int, scored_rows: int) -> int:
    """How many folds of each draw the search ranks on (ranking_folds), from the yardstick's K, validated folds
    and scored rows: every fold, unless the yardstick's validated ones already score RANKED_ROWS rows. Sizes
    only, so the federated selection decides alike."""
    return validated if validated == n_folds or scored_rows >= RANKED_ROWS else n_folds


def _weightings(bits_grid) -> list[tuple[int, float]]:
    return [(b, 1.0) if b == 1 else (b, c) for b in bits_grid for c in ((1.0,) if b == 1 else DECAY_GRID)]


def no_fit_message(budget: int, max_inference_ms, n_features: int, learnable: str = "") -> str:
    """The refusal when no candidate fits the budget and the time cap (max_inference_ms: None, DEFAULT_CAP or the
    user's limit), the cap by its value; learnable: what else the counts had to fit, if anything."""
    if max_inference_ms is None:
        cap = ""
    elif max_inference_ms == DEFAULT_CAP:
        cap = f" within the default cap of {default_max_ms(n_features):g} ms per inference"
    else:
        cap = f" within {float(max_inference_ms):g} ms per inference"
    return f"no FlyNN fits {budget} B{cap}{learnable}; raise the budget or the time cap"


def cycle_limit_within(budget: int, n_classes: int, n_features: int, max_inference_ms, f_cpu: int,
                       exact_latency: bool = False) -> float | None:
    """The predicted cycles per inference the search may accept (max_inference_ms: None, DEFAULT_CAP or the
    user's limit, which exact_latency keeps headroom under), after refusing a budget below the smallest FlyNN on
    these sizes. The federated selection draws the same limit, so it ranks the same candidates."""
    if max_inference_ms == DEFAULT_CAP:
        max_inference_ms = default_max_ms(n_features)
    smallest = model_bytes(MIN_HASHES, 1, 1, n_classes, n_features, 2 * n_features, False,
                           stage_bytes("shared", n_features))  # the cheapest stage
    if budget < smallest:
        raise BudgetTooSmall(budget, smallest, f"FlyNN on {n_features} features and {n_classes} classes",
                             f"{MIN_HASHES} hash bits, seeded M")
    return latency_cycle_limit(max_inference_ms, f_cpu, headroom=exact_latency, n_classes=n_classes)


# ---------------------------------------------------------------- the solver


def fit_flynn_under_budget(X_train: np.ndarray, y_train: np.ndarray,
                           options: SolveOptions) -> tuple[FlyNNClassifier, IntFlyNN, dict]:
    """The family's solver under the one contract (tinyproto.families.solving): without options.max_latency_ms
    FlyNN keeps its default time cap (default_max_ms), with it the user's limit is a promise (headroom kept, and a
    limit nothing meets is refused naming the fastest model); with options.learn_on the counts also fit what that
    board holds while learning (SRAM beside the learning firmware, and the EEPROM record)."""
    limit = None
    if options.learn_on is not None:
        from tinyproto.families.flynn.learning import count_limit

        limit = count_limit(options.learn_on, np.asarray(X_train).shape[1], len(np.unique(y_train)))
    latency = ({"max_inference_ms": DEFAULT_CAP} if options.max_latency_ms is None else
               {"max_inference_ms": options.max_latency_ms, "exact_latency": True})
    X = np.asarray(X_train)
    room = options.buffer_room(X.shape[1], len(np.unique(y_train)), streamable=False)
    clf, model, info = search_flynn(X_train, y_train, options.budget_bytes, options.seed, options.progress,
                                    f_cpu=options.f_cpu_hz, count_limit=limit, folds=options.folds,
                                    sram_room=room, **latency)
    if options.learn_on is not None:
        from tinyproto.families.flynn.learning import learn_sizes

        info["chosen"]["learnable"] = True
        info["learning"] = learn_sizes(model, options.learn_on).to_dict()
    return clf, model, info


def fit_chosen_flynn(X_train: np.ndarray, y_train: np.ndarray, chosen: dict,
                     options: SolveOptions) -> tuple[FlyNNClassifier, IntFlyNN]:
    """The shape search_flynn chose (its info["chosen"]) trained on these rows, no search: the same classifier
    seed (drawn from options.seed), the same preprocessing (its stage from these rows' moments) and the same m,
    so the same bytes and, M being seeded, the same predicted cycles as the solver's model."""
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train)
    scaling = str(chosen["scaling"])
    prep = _prepare(X, scaling, bool(chosen["sign_split"]), _input_stage(X, scaling, moment_sums(X)))
    clf = FlyNNClassifier(
        n_hashes=int(chosen["n_hashes"]),
        n_inputs_per_hash=int(chosen["n_inputs_per_hash"]),
        n_winners=int(chosen["n_winners"]),
        decay=float(chosen["decay"]),
        scaling=float_scaling(prep.scaling),
        sign_split=prep.sign_split,
        random_state=solver_random_state(options.seed),
        count_scale=int(chosen.get("count_scale", 1)),  # the float model reads the counts the int8 one rounds
    ).fit(X, y)
    model = IntFlyNN.from_classifier(clf, X, y, bits=int(chosen["count_bits"]), store_M=bool(chosen["store_M"]),
                                     input_stage=prep.stage, count_scale=int(chosen.get("count_scale", 1)))
    return clf, model


def search_flynn(
    X_train,
    y_train,
    budget_bytes: int,
    random_state=None,
    progress: Callable[[str], None] | None = None,
    *,
    max_inference_ms: float | str | None = DEFAULT_CAP,
    f_cpu: int = F_CPU,
    folds: Folds | None = None,
    count_limit: CountLimit | None = None,
    exact_latency: bool = False,
    sram_room: int | None = None,
) -> tuple[FlyNNClassifier, IntFlyNN, dict]:
    """The search behind fit_flynn_under_budget, with FlyNN's own knobs (benchmarks use max_inference_ms=None:
    no time cap at all). Fit the FlyNN with the best cross-validated integer accuracy whose model bytes are <=
    budget_bytes.

    progress, if given, receives one-line status messages. max_inference_ms caps the estimated AVR inference time
    at f_cpu (None: no cap; DEFAULT_CAP: default_max_ms(n_features)). count_limit, if given, caps m for each
    (ρ, b, inputs, M mode) so the counts fit where the learning firmware keeps them (SRAM, EEPROM). The cap is
    always applied to the calibrated cost model (cost.predict_cycles of the integer model, exactly). exact_latency
    (--max-latency): a cap nothing meets is refused naming the fastest model within the budget. Returns the float
    classifier refitted on all of X_train, its integer model, and an info dict (chosen hyper-parameters, every
    candidate tried with its bytes, cycles and CV accuracy). sram_room, if given, is the SRAM the device leaves
    for tp_predict's buffers (SolveOptions.buffer_room): a ρ whose heap would not fit there is not tried.
    """
    started = time.perf_counter()
    say = progress or (lambda message: None)
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train)
    classes, y_index = training_classes(X, y, "FlyNN", min_rows=2)
    n, d = X.shape
    L = classes.size
    budget = int(budget_bytes)
    max_cycles = cycle_limit_within(budget, L, d, max_inference_ms, f_cpu, exact_latency)
    rng = check_random_state(random_state)
    clf_state = int(rng.randint(0, 2**31 - 1))  # the classifier's random_state; it draws M's seed from it
    seed = draw_seed(clf_state)
    folds = Folds.standard(X, y, random_state or 0) if folds is None else folds
    ranking = ranking_folds(folds)

    sums = moment_sums(X)
    centred = CENTRED_PREPROCESSING if d > WIDE_FEATURES else ()
    preprocessings = PREPROCESSING + SHARED_PREPROCESSING + centred
    stages = {scaling: _input_stage(X, scaling, sums) for scaling, _ in preprocessings}  # one per scaling
    prepared = [_prepare(X, scaling, split, stages[scaling]) for scaling, split in preprocessings]
    limits = PlanLimits(budget, max_cycles, L, d, count_limit, sram_room)
    replays = CycleReplays(seed)
    tried: dict[Candidate, Candidate] = {}  # without its accuracy -> with it (stage 2 repeats stage 1's grid)

    def evaluate(prep: _Prepared, s_grid, rho_grid, bits_grid, store_grid) -> None:
        n_in = prep.U.shape[1]
        for s in sorted({min(s, max(1, n_in // 2)) for s in s_grid}):  # s <= half the inputs keeps rows diverse
            plan = exact_plan(limits, s, ShapeGrid(rho_grid, bits_grid, store_grid), n_in, _stage_bytes(prep),
                              replays)
            if not plan:
                continue
            m_values = sorted({c.m for c in plan})
            indices = seeded_indices(seed, max(m_values), s, n_in)
            ranked = _ranked_winners(prep.U, indices, m_values, max(c.rho for c in plan))
            by_shape: dict[tuple[int, int], list[Candidate]] = {}
            for c in plan:
                by_shape.setdefault((c.m, c.rho), []).append(c)
            for (m, rho), group in by_shape.items():
                group = [replace(c, scaling=prep.scaling, sign_split=prep.sign_split, count_scale=q) for c in group
                         for q in count_scales(n, L, m, rho, c.bits, learnable=count_limit is not None)]
                weightings = sorted({(c.bits, c.decay, c.count_scale) for c in group if c not in tried})
                if not weightings:
                    continue
                accs = dict(zip(weightings, _cv_accuracies(ranked[m][:, :rho], y_index, ranking, L, m,
                                                           weightings)))
                for c in group:
                    if c not in tried:
                        tried[c] = replace(c, cv_accuracy=accs[(c.bits, c.decay, c.count_scale)])

    # Stage 1: the preprocessing, on a small reference grid. Stage 2: everything else for the best one.
    for prep in prepared:
        evaluate(prep, (4, 8), (8, 16, 32), (1, 2), (False,))
        say(f"flynn: preprocessing {prep.scaling}/{'split' if prep.sign_split else 'plain'} tried")
    if not tried and exact_latency:
        raise TinyprotoError(_fastest_refusal(prepared, budget, max_inference_ms, L, d, y_index, folds, seed, f_cpu))
    if not tried and sram_room is not None:
        smallest = min(_buffer_bytes(rho, p.U.shape[1], L, store, s)
                       for p in prepared for rho in RHO_GRID for store in (False, True) for s in S_GRID)
        if smallest > sram_room:
            room = (f"the {sram_room} B of SRAM the device app leaves beside {d} int8 inputs" if sram_room >= 0
                    else f"the board's SRAM: the device app with {d} int8 inputs already needs {-sram_room} B more "
                    "than it has")
            raise TinyprotoError(
                f"no FlyNN's buffers fit {room} (the smallest need {smallest} B); use fewer features or a family that "
                "streams its input")
    if not tried:
        learnable = " with counts that fit the device's SRAM and EEPROM (--learnable)" if count_limit else ""
        raise TinyprotoError(no_fit_message(budget, max_inference_ms, d, learnable))
    best_prep = max(tried.values(), key=candidate_rank)
    prep = next(p for p in prepared if (p.scaling, p.sign_split) == (best_prep.scaling, best_prep.sign_split))
    evaluate(prep, S_GRID, RHO_GRID, BITS_GRID, (False, True))
    candidates = list(tried.values())
    say(f"flynn: {len(candidates)} candidates evaluated")

    best = max(candidates, key=candidate_rank)
    chosen_prep = next(p for p in prepared if (p.scaling, p.sign_split) == (best.scaling, best.sign_split))
    clf = FlyNNClassifier(
        n_hashes=best.m,
        n_inputs_per_hash=best.s,
        n_winners=best.rho,
        decay=best.decay,
        scaling=float_scaling(best.scaling),
        sign_split=best.sign_split,
        random_state=clf_state,  # draws `seed`: the M that was evaluated
        count_scale=best.count_scale,  # the float model reads the counts the int8 one rounds (t / q)
    ).fit(X, y)
    model = IntFlyNN.from_classifier(clf, X, y, bits=best.bits, store_M=best.store_M,
                                     input_stage=chosen_prep.stage, count_scale=best.count_scale)
    nbytes = model.model_bytes()
    if nbytes > budget:  # cannot happen: model_bytes() mirrors carrays(); keep the promise explicit
        raise AssertionError(f"chosen FlyNN has {nbytes} B > budget {budget} B")
    from tinyproto.families.flynn.cost import predict_cycles

    cycles = predict_cycles(model)["total"]
    if max_cycles is not None and cycles > max_cycles:  # cannot happen: ExactCycles is the cost model
        raise AssertionError(f"chosen FlyNN is predicted at {cycles} cycles > the cap of {max_cycles:.0f}")
    ranked = sorted(candidates, key=candidate_rank, reverse=True)
    shown = [best] + [c for c in ranked if c != best][:5]
    for_table = {}
    for c in shown:  # the cost model's cycles (exact for a seeded or stored M) for the table of runners-up
        n_in_c = 2 * d if c.sign_split else d
        exact = for_table.get((c.s, n_in_c))
        if exact is None or exact.m_max < c.m:
            exact = for_table[(c.s, n_in_c)] = ExactCycles(seed, c.s, n_in_c, c.m, d)
        for_table[c] = exact.cycles(c.m, c.rho, c.bits, L, c.store_M)
    n_in_best = chosen_prep.U.shape[1]
    ranked_best = _ranked_winners(chosen_prep.U, seeded_indices(seed, best.m, best.s, n_in_best), [best.m], best.rho)
    best_parts = _cv_correct(ranked_best[best.m], y_index, folds, L, best.m,
                             [(best.bits, best.decay, best.count_scale)])[0]
    on_yardstick = _yardstick_accuracies(shown, prepared, seed, y_index, folds, ranking, L)
    rows = [{"n_hashes": c.m, "n_inputs_per_hash": c.s, "n_winners": c.rho, "count_bits": c.bits,
             "decay": c.decay, "store_M": c.store_M, "scaling": c.scaling, "sign_split": c.sign_split,
             **({"count_scale": c.count_scale} if c.count_scale != 1 else {}),
             "val_int8_accuracy": on_yardstick[c],
             **({"ranked_accuracy": c.cv_accuracy} if ranking is not folds else {}),
             "model_bytes": c.model_bytes, "predicted_cycles": for_table[c],
             "predicted_latency_ms": round(for_table[c] / f_cpu * 1e3, 4)} for c in shown]
    rows[0]["fold_accuracies"] = folds.part_accuracies(best_parts)
    info = {
        "family": "flynn",
        "budget_bytes": budget,
        "model_bytes": nbytes,
        "chosen": {
            "n_hashes": best.m,
            "n_inputs_per_hash": best.s,
            "n_winners": best.rho,
            "decay": best.decay,
            "count_bits": best.bits,
            "store_M": best.store_M,
            "scaling": best.scaling,
            "sign_split": best.sign_split,
            "seed": seed,
            **({"count_scale": best.count_scale} if best.count_scale != 1 else {}),
        },
        "cv_accuracy": best.cv_accuracy,
        "validation": folds.describe() + ", of the integer model on the training data" + (
            "; candidates ranked on every fold of its draws (" + ranking.describe() + ")" if ranking is not folds
            else ""),
        "folds": folds.to_json(),
        "estimated_cycles": int(cycles),
        "estimated_ms": cycles / f_cpu * 1e3,
        "max_inference_ms": max_inference_ms,
        "candidates": [asdict(c) for c in candidates],
        "chosen_validation": rows[0],
        "runners_up": rows[1:],
        "selection": ("the best cross-validated int8 accuracy; among equal accuracies the fewest "
                      + "predicted cycles (cost model)" + ", then bytes"),
        "max_latency_ms": max_inference_ms if exact_latency else None,
        "seconds": time.perf_counter() - started,
    }
    say(f"flynn: chose m={best.m} s={best.s} rho={best.rho} b={best.bits} c={best.decay:g} "
        f"{'stored' if best.store_M else 'seeded'} M, {nbytes} B, CV accuracy {best.cv_accuracy:.3f}")
    return clf, model, info


def _yardstick_accuracies(shown: list[Candidate], prepared: list[_Prepared], seed: int, y_index: np.ndarray,
                          folds: Folds, ranking: Folds, L: int) -> dict[Candidate, float]:
    """Each shown candidate's validated accuracy on the yardstick (the one every family reports), which is the
    accuracy it was ranked by unless the search ranked on more folds (ranking_folds)."""
    if ranking is folds:
        return {c: c.cv_accuracy for c in shown}
    out = {}
    for c in shown:
        prep = next(p for p in prepared if (p.scaling, p.sign_split) == (c.scaling, c.sign_split))
        winners = _ranked_winners(prep.U, seeded_indices(seed, c.m, c.s, prep.U.shape[1]), [c.m], c.rho)[c.m]
        out[c] = _cv_accuracies(winners, y_index, folds, L, c.m, [(c.bits, c.decay, c.count_scale)])[0]
    return out


def candidate_rank(c: Candidate) -> tuple:
    """The sort key of the solver's choice (the largest wins): the best accuracy; among equals the faster, then
    the smaller model, then the counts as they are (the smaller count scale). Public: the federated selection
    ranks the same candidates by it."""
    return (round(c.cv_accuracy, 9), -c.est_cycles, -c.model_bytes, -c.count_scale)


def _buffer_bytes(rho: int, n_in: int, L: int, store_M: bool, s: int) -> int:
    """tp_predict's buffers for this shape (IntFlyNN.working_sram: they do not depend on m or the count bits)."""
    return sum(item.nbytes for item in fly_working_sram(rho, n_in, L, store_M, s))


def _buffers_fit(sram_room: int | None, rho: int, n_in: int, L: int, store_M: bool, s: int) -> bool:
    return sram_room is None or _buffer_bytes(rho, n_in, L, store_M, s) <= sram_room


@dataclass(frozen=True)
class PlanLimits:
    """What every candidate of one solve must fit, whatever its s, input stage and grid: the budget in bytes,
    the predicted cycles per inference (None: no cap), the device's count storage when learning (count_limit)
    and the SRAM left for tp_predict's buffers (sram_room; None: not checked)."""

    budget: int
    max_cycles: float | None
    n_classes: int
    n_features: int
    count_limit: CountLimit | None = None
    sram_room: int | None = None


@dataclass(frozen=True)
class ShapeGrid:
    """The ρ, count bits and M modes a stage of the search tries."""

    rho: tuple[int, ...]
    bits: tuple[int, ...]
    store_M: tuple[bool, ...]


class CycleReplays:
    """The cost model's cycles of the seeded M that ships (ExactCycles), one stream replay per (seed, s, inputs),
    grown when a larger m is asked. The replays are kept for the process (the last _KEPT_REPLAYS), not per solve:
    a replay depends on nothing but its key, and the federated selection prices the very plans compile's search
    priced (federate runs both), as a sweep's points and the folds' searches do."""

    _replays: dict[tuple[int, int, int, int], ExactCycles] = {}

    def __init__(self, seed: int):
        self.seed = seed

    def of(self, s: int, n_in: int, m_max: int, n_features: int) -> ExactCycles:
        key = (self.seed, s, n_in, n_features)
        replay = self._replays.pop(key, None)
        if replay is None or replay.m_max < m_max:
            replay = ExactCycles(self.seed, s, n_in, m_max, n_features)
        self._replays[key] = replay  # the most recently used last
        while len(self._replays) > _KEPT_REPLAYS:
            del self._replays[next(iter(self._replays))]
        return replay


_KEPT_REPLAYS = 32  # a solve uses one per s grid value and input count (a handful); a few solves' worth


def _plan(limits: PlanLimits, s: int, grid: ShapeGrid, n_in: int, stage: int | None) -> list[Candidate]:
    """Every (ρ, b, c, M mode) for this s, each with the largest m that fits the bytes (and the device's count
    storage when learning, and its buffers in sram_room), not yet the time; stage: the input stage's bytes
    (None: a mean and a gain per feature)."""
    L, d = limits.n_classes, limits.n_features
    plan = []
    for store in grid.store_M:
        for bits in grid.bits:
            m_bytes = largest_m(limits.budget, s, bits, L, d, n_in, store, stage)
            for rho in grid.rho:
                if not _buffers_fit(limits.sram_room, rho, n_in, L, store, s):
                    continue
                m = m_bytes
                if limits.count_limit is not None:
                    m = min(m, limits.count_limit(rho, bits, n_in, store))
                if m < max(MIN_HASHES, 2 * rho):
                    continue
                nbytes = model_bytes(m, s, bits, L, d, n_in, store, stage)
                cycles = int(estimate_cycles(m, s, rho, bits, L, n_in, store))
                for weighting in _weightings((bits,)):
                    plan.append(Candidate("", False, s, m, rho, bits, weighting[1], store, nbytes, cycles))
    return plan


def exact_plan(limits: PlanLimits, s: int, grid: ShapeGrid, n_in: int, stage: int | None,
               replays: CycleReplays) -> list[Candidate]:
    """Every (ρ, b, c, M mode) for this s with the largest m that fits the bytes, the device's count storage and
    the time cap, the cap applied to the cost model of the seeded M that ships (exact; shared by the federated
    selection, so both price the same candidates the same way)."""
    plan = _plan(limits, s, grid, n_in, stage)
    exact = replays.of(s, n_in, max((c.m for c in plan), default=1), limits.n_features)
    return _exact_plan(plan, exact, limits.max_cycles, limits.n_classes)


def _exact_plan(plan: list[Candidate], exact: ExactCycles, max_cycles: float | None, L: int) -> list[Candidate]:
    """The plan with each m capped so the cost model's predicted cycles fit max_cycles, and those cycles recorded."""
    out = []
    for c in plan:
        m = c.m if max_cycles is None else exact.largest_m(max_cycles, c.m, c.rho, c.bits, L, c.store_M)
        if m < max(MIN_HASHES, 2 * c.rho):
            continue
        nbytes = c.model_bytes - rows_bytes(c.m, c.s, c.bits, L, exact.n_inputs, c.store_M) + rows_bytes(
            m, c.s, c.bits, L, exact.n_inputs, c.store_M)
        out.append(replace(c, m=m, model_bytes=nbytes, est_cycles=exact.cycles(m, c.rho, c.bits, L, c.store_M)))
    return out


def _fastest_refusal(prepared, budget, max_ms, L, d, y_index, folds, seed, f_cpu) -> str:
    """One line naming the fastest FlyNN within the budget (smallest s, rho, m; 1-bit counts; seeded M), its
    predicted latency and its cross-validated accuracy."""
    prep = prepared[0]
    n_in = prep.U.shape[1]
    s, rho, bits = 1, RHO_GRID[0], 1
    m = max(MIN_HASHES, 2 * rho)
    exact = ExactCycles(seed, s, n_in, m, d)
    modes = [store for store in (False, True) if largest_m(budget, s, bits, L, d, n_in, store) >= m]
    if not modes:
        return f"no FlyNN fits {budget} B with {m} hash rows; raise the budget"
    store = min(modes, key=lambda store: (exact.cycles(m, rho, bits, L, store), store))
    cycles = exact.cycles(m, rho, bits, L, store)
    ranked = _ranked_winners(prep.U, seeded_indices(seed, m, s, n_in), [m], rho)
    acc = _cv_accuracies(ranked[m], y_index, folds, L, m, [(bits, 1.0, 1)])[0]
    return (f"no FlyNN within {budget} B is predicted to run in {max_ms:g} ms ({headroom_text()}); the fastest one "
            f"within the budget (m={m} s={s} rho={rho} b={bits}, {'stored' if store else 'seeded'} M) is predicted at "
            f"{cycles / f_cpu * 1e3:.3f} ms with "
            f"{100 * acc:.1f} % cross-validated accuracy: raise --max-latency")


def solver_random_state(seed: int) -> int:
    """The FlyNNClassifier random_state the solver with seed `seed` uses (its first draw)."""
    return int(check_random_state(seed).randint(0, 2**31 - 1))
