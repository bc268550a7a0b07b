"""The centred input stage (core.moments.centred_stage, core.inputstage.centred_from_means): one offset and gain,
then a few bits of centre per feature. Its arithmetic on the host equals the C input stage bit for bit, it survives
JSON and keep_only, its bytes are what stage_bytes prices, and it is what gives FlyNN on wide pixel data its
accuracy back."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tinyproto.core.inputstage import InputStage, shared_stage, stage_bytes
from tinyproto.core.moments import centred_stage

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs the host C compiler")


def pixels(n: int, d: int, seed: int) -> np.ndarray:
    """Whole-number pixels whose typical brightness depends on the place (a bright middle, a dark border)."""
    rng = np.random.default_rng(seed)
    place = np.clip(255 * np.sin(np.linspace(0, np.pi, d)) ** 4 + rng.normal(0, 20, size=d), 0, 255)
    return np.clip(np.rint(place + rng.normal(0, 60, size=(n, d))), 0, 255).astype(np.float32)


@pytest.mark.parametrize("bits", [2, 4])
def test_centres_follow_the_feature_means(bits):
    X = pixels(400, 90, bits)
    stage = centred_stage(X, bits)
    assert stage.kind == "centred" and stage.n_features == 90
    assert stage.centre_codes.max() < 1 << bits
    shared = shared_stage(X).quantize(X).astype(np.float64)
    centred = stage.quantize(X).astype(np.float64)
    # the per-feature means of the centred inputs are much nearer zero than the shared stage's
    assert np.abs(centred.mean(axis=0)).mean() < 0.5 * np.abs(shared.mean(axis=0)).mean()
    assert np.abs(centred.mean(axis=0)).max() <= stage.centre_step  # each centre within one step of its mean
    assert sum(a.nbytes for a in stage.carrays()) == stage_bytes("centred", 90, bits) == 4 + -(-90 * bits // 8)


def test_json_round_trip_and_keep_only():
    X = pixels(200, 33, 1)
    stage = centred_stage(X, 2)
    again = InputStage.from_json(stage.to_json())
    np.testing.assert_array_equal(again.quantize(X), stage.quantize(X))
    assert again.defines() == stage.defines()
    used = np.arange(33) % 3 != 0
    kept = stage.keep_only(used)
    assert kept.n_features == used.sum() and kept.kind == "centred"
    np.testing.assert_array_equal(kept.quantize(X), stage.quantize(X)[:, used])


def test_refuses_codes_beyond_their_bits():
    with pytest.raises(ValueError, match="centred stage"):
        InputStage.centred(127.5, 1.0, np.array([0, 4]), 2, 10, -127)
    with pytest.raises(ValueError, match="centred stage"):
        InputStage.centred(127.5, 1.0, np.array([0, 3]), 2, 100, 0)  # 3 * 100 is beyond ±254


@needs_gcc
@pytest.mark.parametrize("bits,d", [(2, 37), (4, 300)])
def test_host_c_input_stage_equals_numpy(tmp_path, bits, d):
    """The C input stage (tp_input.c, TP_INPUT_CENTRE_BITS) gives the host's int8 inputs for every raw value,
    NaN and far-out readings included, and the FlyNN built on them gives the same scores."""
    from tinyproto.core.render import write_sources
    from tinyproto.device.hostc import build_host_runner, run_raw
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.seeded_index import seeded_indices

    X = pixels(300, d, d)
    stage = centred_stage(X, bits)
    test = pixels(40, d, d + 1)
    test[0, :5] = [np.nan, 1e30, -1e30, 255.49, -3.0]
    rng = np.random.default_rng(d)
    model = IntFlyNN([0, 1, 2], stage, True, 777, seeded_indices(777, 64, 4, 2 * d), 8, 1,
                     rng.integers(0, 2, size=(3, 64)), 1.0, False)
    write_sources(model, tmp_path, "test", 0, 1 << 20)
    runner = build_host_runner(tmp_path, tmp_path / "runner", "flynn")
    xq_c, labels, scores = run_raw(runner, test)
    xq = stage.quantize(test)
    np.testing.assert_array_equal(xq_c, xq)
    np.testing.assert_array_equal(scores, model.scores(xq))
    np.testing.assert_array_equal(labels, model.labels(model.scores(xq)))


def test_the_centres_come_from_exact_sums_that_any_partition_of_the_rows_adds_up_to():
    """A federation's parties add their column sums of the shared stage's values: the totals, and so the means and
    the centre codes, are those of the pooled rows whatever the partition (values of any magnitude, zeros too)."""
    from fractions import Fraction

    from tinyproto.core.inputstage import centred_from_means, shared_values
    from tinyproto.core.moments import float32_column_sums

    rng = np.random.default_rng(5)
    values = (rng.normal(size=(600, 40)) * 10.0 ** rng.integers(-30, 3, size=(600, 40))).astype(np.float32)
    values[:, 3] = 0
    whole = float32_column_sums(values)
    for j in (0, 3, 17):
        assert Fraction(whole.sums[j]) * Fraction(2) ** whole.exponent == sum(Fraction(float(v)) for v in values[:, j])
    cuts = [0, 1, 250, 251, 600]
    parts = [float32_column_sums(values[a:b]) for a, b in zip(cuts, cuts[1:])]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    assert total.n == 600 and np.array_equal(total.means(), whole.means())
    X = pixels(300, 300, 2)
    shared = shared_stage(X)
    pooled = centred_stage(X, 2)
    halves = float32_column_sums(shared_values(shared, X[:120])) + float32_column_sums(shared_values(shared, X[120:]))
    assert np.array_equal(centred_from_means(shared, halves.means(), 2).centre_codes, pooled.centre_codes)
