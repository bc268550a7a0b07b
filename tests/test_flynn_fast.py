"""FlyNN's fast lifting (issue 13): blocks of consecutive rotations summed four rows at a time on the AVR (narrow
inputs; wide ones draw a rotation per row).

The seeded M's structure must cost (almost) no accuracy against a fully random sparse M of the same shape, and
the four-row AVR scan (unrolled, and the counted loop for long patterns) must stay bit-exact, including the short
last group and blocks longer than the doubled input buffer.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_flynn import HAVE_SIMAVR, extreme_vectors, run_on_simavr
from tinyproto.core.datasets import load_dataset, split
from tinyproto.core.inputstage import InputStage, choose_input_scale
from tinyproto.families.flynn.quantize import IntFlyNN, integer_winners, scores_from_winners
from tinyproto.families.flynn.seeded_index import (
    BLOCK_ROWS,
    GROUP_ROWS,
    WIDE_BLOCK_ROWS,
    random_rotations,
    seeded_indices,
)
from tinyproto.families.flynn.train import count_winners, standardisation


def _accuracy(indices: np.ndarray, rho: int, data, scaling: str) -> float:
    """Test accuracy of the 1-bit integer FlyNN (sign split) with this M."""
    mean, scale = standardisation(data.X_train, scaling)
    stage = InputStage.from_standardisation(mean, scale, choose_input_scale((data.X_train - mean) / scale))
    classes, y_index = np.unique(data.y_train, return_inverse=True)
    winners = integer_winners(stage.quantize(data.X_train), indices, rho, True)
    counts = np.minimum(count_winners(winners, y_index, classes.size, len(indices)), 1)
    test = integer_winners(stage.quantize(data.X_test), indices, rho, True)
    scores = scores_from_winners(test, counts, 1, np.zeros(2, dtype=np.int64))
    return float(np.mean(classes[np.argmin(scores, axis=1)] == data.y_test))


@pytest.mark.parametrize("name, scaling, m, s, rho", [("digits", "global", 800, 8, 32),
                                                     ("breast_cancer", "feature", 600, 8, 32),
                                                     ("digits28", "global", 816, 12, 64)])  # wide: a rotation per row
def test_the_seeded_block_format_costs_at_most_a_point_against_a_random_M(name, scaling, m, s, rho):
    """Mean over 4 seeds: the seeded block format within 1 point of M drawn as independent random s-subsets."""
    data = split(load_dataset(name))
    n_in = 2 * data.X_train.shape[1]
    seeded, random = [], []
    for seed in range(1, 5):
        seeded.append(_accuracy(seeded_indices(977 * seed, m, s, n_in), rho, data, scaling))
        rng = np.random.default_rng(seed)
        random.append(_accuracy(np.array([rng.choice(n_in, s, replace=False) for _ in range(m)]), rho, data, scaling))
    assert np.mean(seeded) >= np.mean(random) - 0.01, (seeded, random)


def test_blocks_are_a_whole_number_of_groups_and_only_wide_inputs_draw_a_rotation_per_row():
    assert BLOCK_ROWS % GROUP_ROWS == 0 and WIDE_BLOCK_ROWS < 257
    assert not any(random_rotations(n) for n in (1, 2, 8, 128, 256))
    assert all(random_rotations(n) for n in (257, 300, 784, 1568))


def _random_model(n_features: int, m: int, s: int, rho: int, bits: int, seed: int) -> IntFlyNN:
    rng = np.random.default_rng(seed)
    stage = InputStage.from_standardisation(np.zeros(n_features), np.ones(n_features), 0.05)
    n_in = 2 * n_features
    return IntFlyNN(classes=list(range(3)), input_stage=stage, sign_split=True, seed=seed,
                    indices=seeded_indices(seed, m, s, n_in), n_winners=rho, bits=bits,
                    counts=rng.integers(0, 1 << bits, size=(3, m)), decay=0.5, store_M=False)


@pytest.mark.device
@pytest.mark.skipif(not HAVE_SIMAVR, reason="simavr (with its headers) not installed")
@pytest.mark.parametrize("n_features, m, s, rho, flags", [
    (3, 1, 2, 1, ()),  # one row: a group of one, the other three sums zeroed
    (3, 70, 4, 9, ()),  # 6 inputs: a block (32 rows) reaches past the doubled buffer
    (40, 33, 8, 5, ()),  # one full block and a last group of one row
    (40, 131, 40, 12, ()),  # s > 32: the counted loop instead of the unrolled sum
    (64, 99, 7, 20, ("-DTP_FORCE_REFERENCE",)),  # the portable C four-row sum on the AVR
])
def test_four_row_scan_is_bit_exact_on_the_avr(tmp_path, n_features, m, s, rho, flags):
    model = _random_model(n_features, m, s, rho, 2, 1000 + m)
    rng = np.random.default_rng(m)
    xq = np.vstack([rng.integers(-128, 128, size=(10, n_features)), rng.integers(-2, 3, size=(4, n_features)),
                    extreme_vectors(n_features)])
    _, labels, scores = run_on_simavr(model, xq, tmp_path, flags)
    np.testing.assert_array_equal(scores, model.scores(xq))
    np.testing.assert_array_equal(labels, model.labels(scores))


def test_a_model_from_the_old_block_format_is_refused_with_a_recompile_hint():
    """model.json from before the format (16 random rotations per block): its seeded M is not what the runtime
    regenerates, so loading it fails in one line that says to recompile, instead of deploying wrong winners."""
    from tinyproto.core.errors import TinyprotoError

    model = _random_model(5, 40, 3, 4, 1, 77)
    raw = model.to_json()
    assert IntFlyNN.from_json(raw).n_hashes == 40
    old = np.array(raw["indices"])
    old[BLOCK_ROWS - 1] = np.roll(old[BLOCK_ROWS - 1], 1) + 1  # the same pattern at another rotation
    raw["indices"] = (old % model.n_hash_inputs).tolist()
    with pytest.raises(TinyprotoError, match="recompile"):
        IntFlyNN.from_json(raw)
