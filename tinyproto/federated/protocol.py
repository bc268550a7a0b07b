"""Federated FlyNN (FlyNN-FL, Ram & Sinha, AAAI 2022): one model from data that never leaves its parties.

FlyNN trains by counting: t_lj is the number of training points of class l whose FlyHash sets bit j. Counts of
disjoint shards add up to the counts of the pooled data (the paper's Theorem 4), so τ parties that agree on the
hash (a shared seed fixes M and every other random choice) can each count locally and all-reduce the sums.
Everything before the counting has to be agreed the same way, with sums that add up *exactly*:

1. the classes: the union of the parties' label sets;
2. the hyper-parameters (`choose_config`): the budget solver's candidate shapes ranked by K-fold accuracy of
   the integer model over *every* party's rows (federated/selection.py: per-fold counts and correct-
   prediction tallies are all-reduced, no row leaves its party), so the choice tracks what `compile` picks on
   the pooled rows at any number of parties; under DP a data-independent default shape instead;
3. the standardisation: every party sends n, Σx and Σx² per feature as exact integers (each float64 is an
   integer times a power of two, so the sums are exact Python integers); mean and std follow from the exact
   totals with one rounding each, so they are bit-identical for every partition of the data, including the
   single "central" party. (FlyNNClassifier.fit uses numpy's float sums, which depend on the row order; the
   canonical statistics differ from those by an ulp or so, which is why the central baseline is this same
   pipeline with one party.);
4. the int8 step of the input stage: `choose_input_scale` takes a quantile of |z| over all training values (a
   shared stage, scaling "shared" for wide inputs, takes the [0.1 %, 99.9 %] quantiles of the raw values instead,
   found by the same search over order keys of signed values, `inputstage.shared_range` bit for bit). The
   two order statistics it interpolates are found exactly by a distributed search over the bit patterns of
   |z| (non-negative float64 order like their int64 bit patterns): each round every party counts its values
   <= 1023 cut points, the counts are summed, the interval shrinks 1024-fold; ~7 rounds of small integer
   vectors give the same quantile numpy computes on the pooled data;
5. the counts: per party, the float model's counts and the integer model's counts (the device's hash of the
   int8 inputs, as `IntFlyNN.from_classifier` recounts them), summed; saturation to the model's count bits
   happens after the sum (min(Σ, cap) is not Σ min). Parties that learn on a device (DeviceBackend) can only
   release counts already saturated on the device; re-saturating their sum is still exact, because for
   non-negative c_p: min(Σ_p min(c_p, cap), cap) = min(Σ_p c_p, cap) (if any c_p reaches the cap both sides
   are the cap, otherwise nothing was clipped). Only the deployed, saturated counts are then comparable.

Without differential privacy the federated model is therefore *identical* to the central one: same counts,
same predictions (tests/test_federated.py checks this for strongly non-IID splits too).

Differential privacy (the paper's Algorithm 2, dp.py) is applied by each party to its own integer counts
before they leave it. Each party's randomness is a numpy Generator on its own child of SeedSequence(seed)
(shards.party_seed_sequences), so runs are reproducible and parties' streams independent.

Backends: `LocalBackend` runs every party in this process (tests, central baseline); `DaskBackend` places
each party's shard once on a dask.distributed worker (client.scatter) and runs every party's computation
there (client.submit pinned to that worker); the all-reduce is a tree of additions on the cluster;
`device_parties.DeviceBackend` makes each party a (simulated) Uno that learns its shard with the
learning firmware and whose counts are read back over serial (`allreduce_counts`).

Layer: federated. This module is the coordinator's side: the order of the all-reduces and the model at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tinyproto.core.inputstage import CENTRE_BITS, InputStage, centred_from_means
from tinyproto.families.flynn.pricing import WIDE_FEATURES
from tinyproto.families.flynn.quantize import IntFlyNN
from tinyproto.families.flynn.solver import (DEVICE_STAGES, F_CPU, CountLimit, centre_bits, estimate_cycles,
                                           float_scaling, model_bytes, solver_random_state)
from tinyproto.families.flynn.seeded_index import draw_seed
from tinyproto.families.flynn.train import FlyNNClassifier, shared_standardisation
from tinyproto.federated.config import (
    FederatedSpec, FlyNNConfig, assemble, default_config, fit_to_classes, stage_bytes_of,
)
from tinyproto.federated.dp import DPParams
from tinyproto.federated.local_parties import Backend, LocalBackend
from tinyproto.federated.party import (party_classes, party_moment_sums, party_shared_value_sums, party_value_keys,
                                     party_z_bits)
from tinyproto.federated.selection import Communication, select_config
from tinyproto.federated.shards import party_seed_sequences
from tinyproto.federated.stats import (
    INPUT_QUANTILE, MomentSums, count_at_most, exact_input_scale, exact_shared_range, standardisation,
)


@dataclass
class FederatedFit:
    clf: FlyNNClassifier  # float model (DP: its counts are the released integer-hash counts)
    model: IntFlyNN  # the deployed integer model
    spec: FederatedSpec
    int_counts: np.ndarray  # summed, before saturation (device parties: sums of their saturated counts)
    float_counts: np.ndarray  # summed (DP: = int_counts)
    quantile_rounds: int


def agree_classes(backend: Backend, handles: list | None = None) -> np.ndarray:
    """The union of the parties' classes, sorted as np.unique sorts them."""
    handles = backend.handles if handles is None else handles
    return np.unique(np.concatenate(backend.map(party_classes, handles)))


def agree_input_stage(backend: Backend, sums: MomentSums, scaling: str, communication: Communication | None = None
                      ) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(mean, scale, int8 step, search rounds) of one scaling from the all-reduced moment sums: the exact
    distributed quantile search over the parties' |z|, which stay with each party for the rounds."""
    mean, scale = standardisation(sums, scaling)
    z_bits = backend.derive(party_z_bits, backend.handles, mean, scale)

    def count(cuts: np.ndarray) -> np.ndarray:
        if communication is not None:
            communication.allreduce(len(cuts), 8)
        return backend.allreduce(count_at_most, z_bits, cuts)

    input_scale, rounds = exact_input_scale(count, sums.n * len(sums.sum1))
    backend.release(z_bits)
    return mean, scale, input_scale, rounds


def agree_shared_range(backend: Backend, n_values: int, communication: Communication | None = None
                       ) -> tuple[float, float, int]:
    """(offset, gain, search rounds) of the shared input stage (inputstage.shared_range on the pooled raw values):
    an exact distributed search for its quantiles; the parties' values stay with them."""
    keys = backend.derive(party_value_keys, backend.handles)

    def count(cuts: np.ndarray) -> np.ndarray:
        if communication is not None:
            communication.allreduce(len(cuts), 8)
        return backend.allreduce(count_at_most, keys, cuts)

    offset, gain, rounds = exact_shared_range(count, n_values)
    backend.release(keys)
    return offset, gain, rounds


def _sums_bytes(values: Sequence[int]) -> int:
    """What a party sends for exact integer sums (moment or column sums): n and each integer."""
    return 8 + sum((abs(v).bit_length() + 8) // 8 for v in values)


def agree_centred_stages(backend: Backend, shared: InputStage, bits: Sequence[int],
                         communication: Communication | None = None) -> dict:
    """{"centredB": the centred stage} for each B, from the agreed shared stage and the exact sums of its values
    over every party's rows: the stage `compile` builds on the pooled rows (core.moments.centred_stage)."""
    sums = backend.allreduce(party_shared_value_sums, backend.handles, shared)
    if communication is not None:
        communication.allreduce(1, _sums_bytes(sums.sums), broadcast=False)
    means = sums.means()
    return {f"centred{b}": centred_from_means(shared, means, b) for b in bits}


def agree_input_stages(backend: Backend, communication: Communication | None = None,
                       scalings: Sequence[str] = ("feature", "global", "shared")) -> dict:
    """{"n": rows, scaling: InputStage} for each scaling, by the same exact all-reduces as the training (moment
    sums once, one distributed quantile search per scaling); on wide inputs also the centred stages the solver
    tries there."""
    comm = communication if communication is not None else Communication()
    sums = backend.allreduce(party_moment_sums, backend.handles)
    comm.allreduce(1, _sums_bytes(sums.sum1 + sums.sum2), broadcast=False)
    n_features = len(sums.sum1)
    stages: dict = {"n": sums.n}
    for scaling in scalings:
        if scaling == "shared":
            offset, gain, _ = agree_shared_range(backend, sums.n * n_features, comm)
            stages[scaling] = InputStage.shared(offset, gain, n_features)
        else:
            stages[scaling] = InputStage.from_standardisation(*agree_input_stage(backend, sums, scaling, comm)[:3])
    if "shared" in stages and n_features > WIDE_FEATURES:
        stages |= agree_centred_stages(backend, stages["shared"], CENTRE_BITS, comm)
    return stages


DP_SHAPE_NOTE = ("data-independent default shape (differential privacy: ranking shapes on the parties' rows would "
                 "release information the DP budget does not cover, and splitting epsilon over ~500 candidate "
                 "accuracies would leave each too noisy to rank; the default depends only on the budget, the "
                 "number of classes and features, which are public)")


def choose_config(backend: Backend, budget_bytes: int, seed: int, classes: np.ndarray, n_features: int, *,
                  dp: bool = False, count_limit: CountLimit | None = None, sram_room: int | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[FlyNNConfig, dict]:
    """The hyper-parameters every party will use.

    Without DP: the budget solver's candidates ranked by K-fold accuracy over every party's rows
    (selection.py; no row leaves its party). With DP: a data-independent default shape sized to
    the budget (DP_SHAPE_NOTE). count_limit (parties that learn on a device: families.flynn.learning.count_limit)
    keeps the counts learnable; sram_room (SolveOptions.buffer_room) keeps tp_predict's buffers within the
    board's SRAM, as compile's solver does."""
    comm = Communication()
    if dp:
        info: dict = {"candidates": [], "cv_accuracy": None, "validation": "none: the shape is not chosen from data"}
        config = fit_to_classes(default_config(seed, n_features, budget_bytes), len(classes), n_features, budget_bytes,
                                count_limit=count_limit)
        source = DP_SHAPE_NOTE
    else:
        stages = agree_input_stages(backend, comm)
        best, info = select_config(backend, budget_bytes, seed, classes, n_features, stages,
                                   count_limit=count_limit, sram_room=sram_room, progress=progress,
                                   communication=comm)
        state = solver_random_state(seed)
        config = FlyNNConfig(best.m, best.s, best.rho, best.decay, best.bits, best.store_M, best.scaling,
                             best.sign_split, draw_seed(state), state, best.count_scale)
        source = ("federated model selection: the budget solver's candidates ranked by K-fold accuracy of the "
                  "integer model over every party's rows (all-reduced counts and correct-prediction tallies)")
    n_in = 2 * n_features if config.sign_split else n_features
    cycles = estimate_cycles(config.n_hashes, config.n_inputs_per_hash, config.n_winners, config.count_bits,
                             len(classes), n_in, config.store_M)
    info = {
        **info,
        "chosen": config.chosen(),
        "hyperparameter_source": source,
        "model_bytes": model_bytes(config.n_hashes, config.n_inputs_per_hash, config.count_bits, len(classes),
                                   n_features, n_in, config.store_M, stage_bytes_of(config.scaling, n_features)),
        "estimated_cycles": int(cycles),
        "estimated_ms": cycles / F_CPU * 1e3,
        "selection_communication": {
            "allreduce_rounds": comm.rounds,
            "bytes_sent_per_party": comm.sent,
            "bytes_received_per_party": comm.received,
            "counted_as": "dense vectors per all-reduce (count vectors int32, tallies and quantile counts int64, "
                          "moment sums as their exact integers); sparse count vectors are sent when smaller",
        },
    }
    return config, info


def federated_fit(backend: Backend, config: FlyNNConfig, classes: np.ndarray, dp: DPParams | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> FederatedFit:
    """Standardisation, int8 step and counts agreed by all-reduces over the backend's parties; the model."""
    say = progress or (lambda message: None)
    sums = backend.allreduce(party_moment_sums, backend.handles)
    say(f"all-reduce: standardisation of {len(sums.sum1)} features from {sums.n} rows (exact sums)")
    if config.scaling in DEVICE_STAGES:  # the device's stage from the raw values; the float model: its view
        offset, gain, rounds = agree_shared_range(backend, sums.n * len(sums.sum1))
        stage = InputStage.shared(offset, gain, len(sums.sum1))
        if float_scaling(config.scaling) == "shared":  # the stage's own offset and step, as FlyNNClassifier's
            mean, scale = shared_standardisation(offset, gain, len(sums.sum1))
        else:
            mean, scale = standardisation(sums, float_scaling(config.scaling))
        say(f"all-reduce: shared input stage from the exact quantiles of every value ({rounds} rounds)")
        bits = centre_bits(config.scaling)
        if bits is not None:
            stage = agree_centred_stages(backend, stage, (bits,))[config.scaling]
            say(f"all-reduce: {bits}-bit centres of the input stage from the exact sums of its values")
        spec = FederatedSpec(config, np.asarray(classes), mean, scale, 1.0, device_stage=stage)
    else:
        mean, scale, input_scale, rounds = agree_input_stage(backend, sums, config.scaling)
        spec = FederatedSpec(config, np.asarray(classes), mean, scale, input_scale)
        say(f"all-reduce: int8 step from the exact {INPUT_QUANTILE:g} quantile of |z| ({rounds} rounds)")

    per_party = party_seed_sequences(seed, backend.n_parties)[1]
    total = backend.allreduce_counts(spec, dp, per_party)
    say(f"all-reduce: counts of {len(classes)} classes x {config.n_hashes} hash bits"
        + (f" (DP: epsilon={dp.epsilon:g}, T={dp.T})" if dp else ""))
    float_counts = total.float_counts if total.float_counts is not None else total.int_counts
    clf, model = assemble(spec, total.int_counts, float_counts)
    return FederatedFit(clf, model, spec, total.int_counts, float_counts, rounds)


def central_fit(X: np.ndarray, y: np.ndarray, config: FlyNNConfig, classes: np.ndarray | None = None) -> FederatedFit:
    """The same configuration trained on the pooled rows (one party, no DP): the federated model's reference."""
    backend = LocalBackend([(X, y)])
    return federated_fit(backend, config, agree_classes(backend) if classes is None else classes)


__all__ = ["DP_SHAPE_NOTE", "FederatedFit", "agree_centred_stages", "agree_classes", "agree_input_stage",
           "agree_input_stages", "agree_shared_range", "central_fit", "choose_config", "federated_fit"]
