"""ProtoNN's faster kernel layouts (issue 13): the interleaved bitmap stream of W, the grouped Z + 128 score layout,
and the asm row rescale, checked against the numpy reference on the host and on the simulated Uno."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import needs

sys.path.insert(0, str(Path(__file__).resolve().parent))


def decode_bitmap_stream(stream: np.ndarray, D: int, d: int) -> np.ndarray:
    """W back from the device's bitmap stream (an independent reader of the layout)."""
    W = np.zeros((D, d), dtype=np.int8)
    pos = 0
    for r in range(D):
        for g in range((d + 7) // 8):
            bits = int(stream[pos])
            pos += 1
            for k in range(8):
                if bits >> k & 1:
                    W[r, 8 * g + k] = np.int8(np.uint8(stream[pos]).view(np.int8))
                    pos += 1
    assert pos == stream.size
    return W


@pytest.mark.parametrize("D,d,density", [(12, 64, 0.4), (3, 13, 1.0), (5, 100, 0.05), (1, 8, 0.0)])
def test_bitmap_stream_holds_W_in_the_bitmap_encodings_bytes(D, d, density):
    from tinyproto.families.protonn import encoding

    rng = np.random.default_rng(D * d)
    W = (rng.integers(-128, 128, size=(D, d)) * (rng.random((D, d)) < density)).astype(np.int8)
    stream = encoding.bitmap_stream(W)
    assert stream.dtype == np.uint8 and stream.size == encoding.encoded_bytes(W, "bitmap")
    np.testing.assert_array_equal(decode_bitmap_stream(stream, D, d), W)


@pytest.mark.parametrize("m,L", [(60, 10), (7, 1), (9, 4), (33, 5), (256, 3)])
def test_score_layout_gives_the_reference_scores(m, L):
    """Reading the layout as the C does (groups of SCORE_GROUP, prototype-major, Z + 128) and taking 128 * sum(k)
    off gives kernels @ Z exactly, for every kernel vector including all-255."""
    from tinyproto.families.protonn.quantize import SCORE_GROUP, score_layout

    rng = np.random.default_rng(m + L)
    Z = rng.integers(-128, 128, size=(m, L)).astype(np.int8)
    flat = score_layout(Z)
    assert flat.dtype == np.uint8 and flat.size == m * L
    for k in (rng.integers(0, 256, size=m), np.full(m, 255), np.zeros(m, dtype=np.int64)):
        scores, pos = [], 0
        for l0 in range(0, L, SCORE_GROUP):
            g = min(SCORE_GROUP, L - l0)
            block = flat[pos:pos + g * m].reshape(m, g).astype(np.int64)
            pos += g * m
            biased = (block * k[:, None]).sum(axis=0)
            assert biased.max() < 2**24  # the asm's 24-bit unsigned sums
            scores.extend((biased - 128 * int(k.sum())).tolist())
        np.testing.assert_array_equal(scores, k.astype(np.int64) @ Z.astype(np.int64))


@needs("avr-gcc")
@pytest.mark.usefixtures("private_cache")
@pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"), reason="libsimavr-dev not installed")
@pytest.mark.parametrize("name,d,D,m,L,options", [
    # the asm rescale clamps both ways: |p| up to 16384 * 64 >> 8 = 4096, far beyond +-127 (all inputs +-128)
    ("rescale-clamp", 64, 6, 16, 5, dict(w="max", density=1.0, proj_shift=8)),
    ("rescale-clamp-sparse", 64, 6, 16, 5, dict(w="max", density=0.6, proj_shift=9)),
    # a bitmap row longer than 64 inputs (the looped byte scan), classes 4 + 3, m not a multiple of 8
    ("long-rows-groups", 150, 7, 13, 7, dict(density=0.3, proj_shift=11)),
    ("one-class-group", 20, 4, 9, 1, dict(density=0.7, proj_shift=9)),
])
def test_fast_kernels_bit_exact_and_costed(tmp_path, name, d, D, m, L, options):
    from test_kernels_avr import build, make_model, run_sim, vectors, with_informative_table

    from tinyproto.device.hostc import build_host_runner, run_int8
    from tinyproto.families import predict_cycles

    rng = np.random.default_rng(sum(map(ord, name)))
    model = make_model(d, D, m, L, rng, **options)
    xq = vectors(d, rng)
    model = with_informative_table(model, xq, rng)
    z = model.projections(xq)
    if name.startswith("rescale-clamp"):
        assert (z == 127).any() and (z == -127).any()  # both clamps are exercised
    reference = model.scores(xq)
    assert np.count_nonzero(model.kernels(xq)) > xq.shape[0]
    scores, labels, cycles = run_sim(build(model, tmp_path / "avr").elf, xq)
    np.testing.assert_array_equal(scores, reference)
    np.testing.assert_array_equal(labels, model.labels(reference))
    host_labels, host_scores = run_int8(build_host_runner(tmp_path / "avr", tmp_path / "host", "protonn"), xq)
    np.testing.assert_array_equal(host_scores, reference)
    predicted = predict_cycles(model)["total"]
    assert abs(predicted - cycles.mean()) / cycles.mean() < 0.03, (name, predicted, cycles.mean())
