"""What each party computes on its own shard: only these results (sums, counts, tallies) ever leave it.

Layer: federated. Every function takes the party's shard (X, y) first, so any backend can run it where the
shard lives (in this process, on a dask worker, beside a device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from tinyproto.core.inputstage import InputStage, shared_values
from tinyproto.core.moments import ColumnSums, float32_column_sums
from tinyproto.families.flynn.quantize import IntFlyNN, integer_winners
from tinyproto.families.flynn.hashing import count_winners
from tinyproto.federated.config import FederatedSpec, build_estimator
from tinyproto.federated.dp import DPParams, dp_release
from tinyproto.federated.shards import Shard
from tinyproto.federated.stats import MomentSums, moment_sums, order_keys


def party_classes(shard: Shard) -> np.ndarray:
    return np.unique(shard[1])


def party_moment_sums(shard: Shard) -> MomentSums:
    return moment_sums(shard[0])


def party_shared_value_sums(shard: Shard, shared: InputStage) -> ColumnSums:
    """Exact sums of the shared stage's values of the party's rows: their totals give a centred stage's centres."""
    return float32_column_sums(shared_values(shared, shard[0]))


def party_z_bits(shard: Shard, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Sorted bit patterns of |z| over the party's values, z = (x - mean) / scale exactly as
    FlyNNClassifier.transform_input computes it (kept on the party for the quantile search)."""
    z = np.abs((np.asarray(shard[0], dtype=np.float64) - mean) / scale).reshape(-1)
    return np.sort(z.view(np.int64))


def party_value_keys(shard: Shard) -> np.ndarray:
    """Sorted order keys (stats.order_keys) of every raw value of the party's rows, kept on the party for the
    search of the shared input stage's range."""
    return np.sort(order_keys(np.asarray(shard[0], dtype=np.float64).reshape(-1)))


@dataclass(frozen=True)
class CountRelease:
    """What a party sends in the counting all-reduce: integer-model counts (noised under DP) and, without DP, the
    float model's counts as well."""

    int_counts: np.ndarray
    float_counts: np.ndarray | None

    def __add__(self, other: "CountRelease") -> "CountRelease":
        both = self.float_counts is not None and other.float_counts is not None
        floats = self.float_counts + other.float_counts if both else None
        return CountRelease(self.int_counts + other.int_counts, floats)


def party_counts(shard: Shard, spec: FederatedSpec, dp: DPParams | None = None,
                 seed_seq: np.random.SeedSequence | None = None) -> CountRelease:
    """Hash and count the party's rows with the float model and the device's integer hash; apply DP if asked
    (before anything leaves the party)."""
    X, y = shard
    clf, stage = _hashing_of(spec)
    y_index = np.searchsorted(spec.classes, y)
    if not np.array_equal(spec.classes[np.clip(y_index, 0, len(spec.classes) - 1)], y):
        raise ValueError("a party holds labels outside the agreed classes")
    L, m = len(spec.classes), clf.n_hashes_
    int_winners = integer_winners(stage.quantize(X), clf.M_indices_, clf.n_winners_, clf.sign_split)
    int_counts = count_winners(int_winners, y_index, L, m)
    if dp is None:
        return CountRelease(int_counts, count_winners(clf.winners(X), y_index, L, m))
    rng = np.random.default_rng(seed_seq)
    return CountRelease(dp_release(int_counts, dp, rng), None)


_HASHING: dict = {}  # the last spec's (estimator, input stage): every party on this process hashes with them


def _hashing_of(spec: FederatedSpec):
    """(the zero-count estimator, the int8 input stage) of this spec, built once per process and spec, not once
    per party: drawing M (seeded_walk) dominated the counting round at 1,000 parties. Only read afterwards."""
    classes = spec.classes
    key = (spec.config, classes.dtype.str, tuple(classes.tolist()) if classes.dtype == object else classes.tobytes(),
           spec.mean.tobytes(), spec.scale.tobytes(), spec.input_scale,
           None if spec.device_stage is None else json.dumps(spec.device_stage.to_json()))
    cached = _HASHING.get(key)
    if cached is None:
        cached = (build_estimator(spec), spec.input_stage())
        _HASHING.clear()  # one spec at a time: memory stays bounded on a long-lived worker
        _HASHING[key] = cached
    return cached


def party_accuracy(shard: Shard, model: IntFlyNN) -> float:
    """A party's check of the model it received: integer-model accuracy on its own training rows."""
    X, y = shard
    return float(np.mean(model.predict(X) == y)) if len(y) else float("nan")


__all__ = ["CountRelease", "party_accuracy", "party_classes", "party_counts", "party_moment_sums",
           "party_shared_value_sums", "party_value_keys", "party_z_bits"]
