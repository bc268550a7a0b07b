"""The configuration every party shares, and the FlyNN models built from it.

Layer: federated. `FlyNNConfig` holds every hyper-parameter (M's 16-bit seed drawn as the budget solver draws
it); `FederatedSpec` adds what the all-reduces agreed (classes, standardisation, int8 step). `build_estimator`
and `assemble` turn them, and summed counts, into the float estimator and the deployed integer model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import InputStage, stage_bytes
from tinyproto.families.flynn.quantize import IntFlyNN, calibrated_lut, scaled_counts
from tinyproto.families.flynn.solver import (
    DEFAULT_CAP, F_CPU, MIN_HASHES, CountLimit, centre_bits, float_scaling, largest_m, model_bytes,
    solver_random_state, default_max_ms,
)
from tinyproto.families.flynn.pricing import fastest_m
from tinyproto.families.flynn.seeded_index import draw_seed
from tinyproto.families.flynn.train import FlyNNClassifier

# the shape under DP (data-independent): a middle-of-the-road FlyNN, m sized to the budget
FAMILY = IntFlyNN.family  # the family federated training trains (its registry name, tinyproto.families)


def device_count_limit(board, n_features: int, n_classes: int):
    """The cap `compile --learnable` puts on m, for parties that learn on a (simulated) board."""
    from tinyproto.families.flynn.learning import count_limit

    return count_limit(board, n_features, n_classes)


DEFAULT_CONFIG = {"n_inputs_per_hash": 8, "n_winners": 16, "decay": 1.0, "count_bits": 1, "store_M": False,
                  "scaling": "feature", "sign_split": True}


@dataclass(frozen=True)
class FlyNNConfig:
    """Every hyper-parameter the parties share; `random_state` draws M's 16-bit `seed` (draw_seed)."""

    n_hashes: int
    n_inputs_per_hash: int
    n_winners: int
    decay: float
    count_bits: int
    store_M: bool
    scaling: str
    sign_split: bool
    seed: int
    random_state: int
    count_scale: int = 1  # deployed counts = summed counts // count_scale (families.flynn.quantize.count_scales)

    def chosen(self) -> dict:
        """The hyper-parameters as `compile` reports them (model.json / report.json `hyperparameters`; the count
        scale only when it is not 1, as compile's solver writes it)."""
        out = asdict(self)
        out.pop("random_state")
        if out["count_scale"] == 1:
            out.pop("count_scale")
        return out


@dataclass(frozen=True)
class FederatedSpec:
    """What every party needs to hash and count: the configuration, the classes and the agreed input stage."""

    config: FlyNNConfig
    classes: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    input_scale: float | None = None  # known after the quantile search
    # a stage built from the raw values (scaling "shared" or "centredB"), agreed by the parties; mean and scale then
    # serve only the float model, standardised globally
    device_stage: InputStage | None = None

    @property
    def n_features(self) -> int:
        return int(self.mean.size)

    def input_stage(self) -> InputStage:
        """The device's input stage: per-feature from the standardisation and int8 step, or the agreed shared or
        centred one (as the budget solver builds them; mean and scale then serve only the float model)."""
        if self.device_stage is not None:
            return self.device_stage
        if self.input_scale is None:
            raise ValueError("the int8 step is not agreed yet")
        return InputStage.from_standardisation(self.mean, self.scale, self.input_scale)


def config_from_solver(chosen: dict, seed: int) -> FlyNNConfig:
    """FlyNNConfig from the solver's info['chosen'] (fit with random_state=seed)."""
    state = solver_random_state(seed)
    if draw_seed(state) != int(chosen["seed"]):  # the solver changed how it seeds M: fail loudly, never silently
        raise AssertionError("fit_flynn_under_budget no longer draws M's seed from its first random draw")
    return FlyNNConfig(int(chosen["n_hashes"]), int(chosen["n_inputs_per_hash"]), int(chosen["n_winners"]),
                       float(chosen["decay"]), int(chosen["count_bits"]), bool(chosen["store_M"]),
                       str(chosen["scaling"]), bool(chosen["sign_split"]), int(chosen["seed"]), state,
                       int(chosen.get("count_scale", 1)))


def default_config(seed: int, n_features: int | None = None, budget_bytes: int | None = None) -> FlyNNConfig:
    """DEFAULT_CONFIG with the largest m allowed (fit_to_classes sizes it); M seeded as the solver would.

    Wide inputs (a per-feature stage would take more than a quarter of the budget) get the shared input stage
    (4 B) instead, so the default still fits; the choice depends only on the public sizes."""
    state = solver_random_state(seed)
    c = DEFAULT_CONFIG
    scaling = c["scaling"]
    if n_features is not None and budget_bytes is not None and stage_bytes("feature", n_features) * 4 > budget_bytes:
        scaling = "shared"
    return FlyNNConfig(8192, c["n_inputs_per_hash"], c["n_winners"], c["decay"], c["count_bits"], c["store_M"],
                       scaling, c["sign_split"], draw_seed(state), state)


def fit_to_classes(config: FlyNNConfig, n_classes: int, n_features: int, budget_bytes: int,
                   max_inference_ms: float | str | None = DEFAULT_CAP,
                   count_limit: CountLimit | None = None) -> FlyNNConfig:
    """Shrink m (and s, as the solver caps it) so the filters of all n_classes fit the budget and the time cap
    (and, with count_limit, the learning firmware's SRAM/EEPROM: parties that learn on a device).

    Party 0 may hold fewer classes than the federation; its configuration would then overflow the budget."""
    n_in = 2 * n_features if config.sign_split else n_features
    stage = stage_bytes_of(config.scaling, n_features)
    s = min(config.n_inputs_per_hash, max(1, n_in // 2))
    if max_inference_ms == DEFAULT_CAP:
        max_inference_ms = default_max_ms(n_features)
    max_cycles = None if max_inference_ms is None else max_inference_ms * 1e-3 * F_CPU
    m = min(config.n_hashes,
            largest_m(budget_bytes, s, config.count_bits, n_classes, n_features, n_in, config.store_M, stage),
            fastest_m(max_cycles, s, config.n_winners, config.count_bits, n_classes, n_in, config.store_M))
    if count_limit is not None:
        m = min(m, count_limit(config.n_winners, config.count_bits, n_in, config.store_M))
    if m < max(MIN_HASHES, config.n_winners):
        need = model_bytes(max(MIN_HASHES, config.n_winners), s, config.count_bits, n_classes, n_features, n_in,
                           config.store_M, stage)
        where = " and the learning firmware's SRAM/EEPROM" if count_limit is not None else ""
        raise TinyprotoError(f"the chosen FlyNN (rho={config.n_winners}) does not fit {budget_bytes} B{where} for "
                             f"{n_classes} classes; it needs about {need} B")
    return FlyNNConfig(m, s, config.n_winners, config.decay, config.count_bits, config.store_M, config.scaling,
                       config.sign_split, config.seed, config.random_state, config.count_scale)


def stage_bytes_of(scaling: str, n_features: int) -> int | None:
    """The input stage's flash bytes for the byte pricing (None: the pricing's default, a mean and a gain per
    feature)."""
    bits = centre_bits(scaling)
    if bits is not None:
        return stage_bytes("centred", n_features, bits)
    return stage_bytes("shared", n_features) if scaling == "shared" else None


def build_estimator(spec: FederatedSpec) -> FlyNNClassifier:
    """A FlyNNClassifier with the agreed configuration, standardisation and M, and zero counts.

    Uses the public partial_fit: its first call draws M from random_state, as in any fit; the agreed mean and
    scale then replace what that one-row batch gave, and the row's counts are cleared.
    """
    c = spec.config
    clf = FlyNNClassifier(n_hashes=c.n_hashes, n_inputs_per_hash=c.n_inputs_per_hash, n_winners=c.n_winners,
                          decay=c.decay, scaling=float_scaling(c.scaling), sign_split=c.sign_split,
                          random_state=c.random_state, count_scale=c.count_scale)
    clf.partial_fit(spec.mean[None, :], spec.classes[:1], classes=spec.classes)
    clf.mean_ = np.array(spec.mean, dtype=np.float64)
    clf.scale_ = np.array(spec.scale, dtype=np.float64)
    clf.counts_ = np.zeros_like(clf.counts_)
    if clf.M_seed_ != c.seed:
        raise AssertionError("the estimator did not take the agreed seed")
    return clf


def assemble(spec: FederatedSpec, int_counts: np.ndarray, float_counts: np.ndarray) -> tuple[FlyNNClassifier, IntFlyNN]:
    """The float estimator and the integer model from summed counts (saturated to the count bits only now)."""
    c = spec.config
    clf = build_estimator(spec)
    clf.counts_ = np.asarray(float_counts, dtype=np.int64).copy()
    model = IntFlyNN(  # the same fields IntFlyNN.from_classifier fills, with the all-reduced counts
        classes=spec.classes.tolist(),
        input_stage=spec.input_stage(),
        sign_split=bool(c.sign_split),
        seed=int(clf.M_seed_),
        indices=clf.M_indices_,
        n_winners=int(clf.n_winners_),
        bits=int(c.count_bits),
        counts=scaled_counts(int_counts, c.count_scale, c.count_bits),
        decay=1.0 if c.count_bits == 1 else float(c.decay),
        store_M=bool(c.store_M),
        count_scale=int(c.count_scale),
        lut_values=None if c.count_bits == 1 or c.count_scale == 1 else calibrated_lut(
            int_counts, float(c.decay), c.count_bits, c.count_scale),
    )
    return clf, model


__all__ = ["DEFAULT_CONFIG", "FederatedSpec", "FlyNNConfig", "assemble", "build_estimator", "config_from_solver",
           "default_config", "fit_to_classes", "stage_bytes_of"]
