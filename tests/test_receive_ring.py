"""The serial receive ring takes the SRAM a model leaves free: up to 256 B, a smaller ring when less is free, none
when it would not hold two requests (wire.rx_ring_bytes). So the ring never refuses a model that fits without it,
and a firmware with a small ring, or none, computes exactly the host reference on the simulated Uno."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import compiled_model
from rich.console import Console

from tinyproto.core import wire
from tinyproto.core.boards import load_board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import load_model_dir
from tinyproto.device import protocol as P
from tinyproto.device.project import project_rx_ring
from tinyproto.pipeline.compile import check_fits_board, firmware_sram_estimate, write_model_files


def test_the_ring_rule_at_its_edges():
    assert wire.rx_ring_bytes(10_000) == wire.RX_RING_MAX == 256
    assert wire.rx_ring_bytes(wire.RX_RING_MAX + wire.RX_RING_INDICES) == wire.RX_RING_MAX
    assert wire.rx_ring_bytes(wire.RX_RING_MAX + wire.RX_RING_INDICES - 1) == wire.RX_RING_MAX - 1
    assert wire.rx_ring_bytes(wire.RX_RING_MIN + wire.RX_RING_INDICES) == wire.RX_RING_MIN
    assert wire.rx_ring_bytes(wire.RX_RING_MIN + wire.RX_RING_INDICES - 1) == 0
    assert wire.rx_ring_bytes(-500) == 0
    assert wire.rx_ring_static_bytes(0) == 0 and wire.rx_ring_static_bytes(150) == 152
    with pytest.raises(ValueError):
        wire.sizes_defines(3, rx_ring=wire.RX_RING_MIN - 1)  # a ring that cannot hold a window is never rendered


def test_the_smallest_ring_holds_two_of_the_largest_requests_as_the_host_sends_them():
    """The host puts a 0x00 before each frame of a window; both chunked predictions' largest frames fit twice."""
    largest = [1 + len(P.encode_frame(P.MSG_PREDICT_RAW, 0xFF, b"\xff" * (2 + 4 * wire.RAW_CHUNK_FEATURES))),
               1 + len(P.encode_frame(P.MSG_PREDICT, 0xFF, b"\xff" * (2 + wire.CHUNK_BYTES)))]
    assert max(largest) == wire.WINDOW_FRAME_BYTES
    assert wire.rx_window_bytes(wire.RX_RING_MIN) >= 2 * wire.WINDOW_FRAME_BYTES


@pytest.mark.parametrize("family", ["protonn", "flynn", "bnc", "bloom"])
def test_a_model_that_fits_without_the_ring_fits_with_it(compiled, family):
    """Whatever the board's SRAM: the model is refused exactly when it does not fit without a ring, and otherwise
    the ring is what is left (so every model that compiled before the ring existed compiles again)."""
    model = compiled_model(compiled, family)
    uno = load_board("uno")
    alone = firmware_sram_estimate(model, dataclasses.replace(uno, sram_bytes=0))  # no SRAM free: no ring
    assert alone["rx_ring_bytes"] == 0
    base = alone["estimated_total_bytes"]
    for sram in range(base - 3, base + wire.RX_RING_MAX + 40):
        board = dataclasses.replace(uno, sram_bytes=sram)
        estimate = firmware_sram_estimate(model, board)
        if sram < base:
            with pytest.raises(TinyprotoError, match="SRAM"):
                check_fits_board(model, board)
            continue
        check_fits_board(model, board)
        ring = estimate["rx_ring_bytes"]
        assert ring == wire.rx_ring_bytes(sram - base)
        assert estimate["estimated_total_bytes"] == base + wire.rx_ring_static_bytes(ring) <= sram


def _written_for(tmp_path, source, ring):
    """source's model directory written again, by compile's writer, for an Uno whose SRAM leaves `ring` bytes
    (and the ring's indices) free beside the model: compile decides the ring, the header and build.json carry it."""
    from tinyproto import families

    md = load_model_dir(source)
    model = families.load_int_model(md)
    uno = load_board("uno")
    base = firmware_sram_estimate(model, dataclasses.replace(uno, sram_bytes=0))["estimated_total_bytes"]
    board = dataclasses.replace(uno, sram_bytes=base + wire.rx_ring_static_bytes(ring) + (1 if not ring else 0))
    out = tmp_path / f"ring{ring}"
    out.mkdir()
    write_model_files(out, model, dict(md.meta), dict(md.report), md.vectors(), board)
    assert project_rx_ring(out) == ring
    return out


@pytest.mark.device
@pytest.mark.parametrize("family", ["protonn", "flynn"])
def test_small_ring_and_no_ring_validate_bit_exactly_on_the_simulated_uno(compiled, tmp_path, family):
    """A streaming (ProtoNN) and a gathering (FlyNN) family with the smallest ring and with none: every score,
    label and int8 input of both passes equals the host reference, the host's window never overruns the small
    ring (no frame lost or refused), and the ring's bytes are exactly what avr-size measures between the two."""
    from tinyproto.pipeline import firmware
    from tinyproto.pipeline.validate import validate

    source = compiled("iris", "1kB", family)
    static = {}
    for ring in (wire.RX_RING_MIN, 0):
        out = _written_for(tmp_path, source, ring)
        build = firmware.build_model_dir(out, None, Console(quiet=True))
        assert build["rx_ring_bytes"] == ring
        static[ring] = build["sram_static_bytes"]
        v = validate(out)
        assert v["passed"], json.dumps(v["checks"], indent=1)
        assert v["score_agreement"] == v["label_agreement"] == 1.0 and v["n_vectors"] > 0
        assert v["line"]["window"] == bool(ring) and v["line"]["window_restarts"] == 0
        assert v["line"]["simulator_cpu_seconds"] > 0 and v["line"]["host_cpu_seconds"] > 0  # each process's share
    assert static[wire.RX_RING_MIN] - static[0] == wire.rx_ring_static_bytes(wire.RX_RING_MIN)
