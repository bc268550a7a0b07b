"""What a device answers is checked before it is used (core/measured.py), and the cycle cross-check is exact.

- The cycle markers: the real AVR device application with a fake model that busy-waits a length each vector
  chooses (tests/fixtures/protocol/fake_model.c, TP_FAKE_DELAY), on the cycle-exact simulator: Timer1 equals the
  GPIOR0 span minus the calibration span for every inference from 1 to 100 ms, including ones ending a few
  cycles either side of a Timer1 overflow; a tampered cycle counter fails validate's check with a true detail.
- Implausible figures: a firmware that answers every score right but reports 0 cycles (or the u32 limit) is a
  failed `cycles` check with latency and energy left unmeasured, never a ZeroDivisionError; the report draws it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tinyproto

from tinyproto.core.measured import MAX_CYCLES, cycle_problem, drawable, ratio

ROOT = Path(__file__).resolve().parents[1]
FIRMWARE = ROOT / "firmware"
FIXTURE = ROOT / "tests" / "fixtures" / "protocol"
F_CPU = 16_000_000
OVERFLOW = 65536


def test_the_raw_input_detail_says_what_its_count_of_int8_inputs_counts():
    """raw_input's detail said "0 of 27000 int8 inputs" for digits' 450 test vectors of 64 features: it counts
    the inputs the model reads (60 per vector), which the detail now says, with the data's width beside it."""
    from tinyproto.pipeline.validate import _checks

    raw = {"n_vectors": 450, "n_inputs": 27000, "inputs_per_vector": 60, "data_features": 64, "inputs_differing": 0,
           "labels_changed": 0, "score_vectors_changed": 0}
    detail = _checks(450, 450, 450, 450, raw, False, None, 100, True)["raw_input"]["detail"]
    assert detail.startswith("0 of 27000 int8 inputs (450 vectors x 60: the model reads 60 of the data's 64 "
                             "features), 0 score vectors"), detail
    detail = _checks(450, 450, 450, 450, raw | {"data_features": 60}, False, None, 100, True)["raw_input"]["detail"]
    assert detail.startswith("0 of 27000 int8 inputs (450 vectors x 60 features), "), detail


def test_ratio_and_cycle_problem_take_any_value():
    assert ratio(3, 2) == 1.5
    for bad in (0, -1, math.nan, math.inf, None, True, "7", 10**400):
        assert ratio(1, bad) is None, bad
        assert ratio(bad, 2) is None or bad in (0, -1), bad
    assert cycle_problem([100, 2000]) is None
    assert "2 of 3 inferences reported 0 cycles" in cycle_problem([0, 5, 0])
    for bad in (-5, MAX_CYCLES, math.nan, 2**40, "12"):
        assert "out of range" in cycle_problem([1, bad]), bad
    assert drawable([1, 2.5]) and not drawable([1, 0]) and not drawable([math.nan])


# ---- the simulated device --------------------------------------------------------------------------------


def _avr_firmware(tmp_path: Path, name: str, edit=None) -> Path:
    """The device application (firmware/, with tp_measure.c optionally edited) + the delaying fake model."""
    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import AVR_FLAGS, sizes_include

    source = tmp_path / f"src_{name}"
    shutil.copytree(FIRMWARE, source)
    if edit is not None:
        measure = source / "tp_measure.c"
        text = measure.read_text()
        edited = edit(text)
        assert edited != text
        measure.write_text(edited)
    elf = tmp_path / f"{name}.elf"
    sources = [source / n
               for n in ("tp_main.c", "tp_transport.c", "tp_measure.c", "tp_learn.c", "tp_serial.c", "tp_judge.c")]
    subprocess.run(["avr-gcc", *AVR_FLAGS, f"-I{source}", f"-I{FIXTURE}", sizes_include(tmp_path / f"sizes_{name}"),
                    "-DTP_FAKE_DELAY", *map(str, sources), str(FIXTURE / "fake_model.c"), "-o", str(elf)], check=True)
    return elf


def _vector(extra: int) -> np.ndarray:
    """x for the fake model delaying `extra` cycles (to the cycle, give or take a constant): 4 cycles a count of
    x[0..1], 65535 counts per unit of x[2], 3 cycles a count of x[3] (1..4, so every residue mod 4 is reached)."""
    x3 = (3 * extra) % 4 or 4
    counts = (extra - 3 * x3) // 4
    big, rest = divmod(counts, 65535)
    x = np.zeros(8, dtype=np.int8)
    x[0], x[1], x[2], x[3] = np.array([rest >> 8, rest & 255, big, x3], dtype=np.uint8).view(np.int8)
    return x


def _run_on_simulator(elf: Path, lengths_ms: list[float], offsets: range):
    """Measure, per target length, vectors ending at `offsets` cycles around the nearest Timer1 overflow.
    Returns (device cycles, the simulator's markers)."""
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    cycles = []
    with SimulatedUno(elf) as sim, open_device(sim.port, timeout=30.0) as client:
        client.hello()
        base = client.predict(_vector(100)).cycles - 100  # what the call costs besides the delay
        cycles.append(base + 100)
        for ms in lengths_ms:
            target = round(ms * F_CPU / 1000)
            end = target if target < OVERFLOW else round(target / OVERFLOW) * OVERFLOW  # at an overflow
            guess = end - base
            probe = client.predict(_vector(guess)).cycles  # the delay loops' own overhead: measured, not assumed
            cycles.append(probe)
            for offset in offsets:
                extra = guess + end + offset - probe
                assert extra > 16
                cycles.append(client.predict(_vector(extra)).cycles)
        events = sim.markers()
    return cycles, events


def _summary(cycles, events):
    from tinyproto.pipeline.validate import _calibration_span, _marker_cycles, _marker_summary

    return _marker_summary(_marker_cycles(events), cycles, _calibration_span(events), 1, list(range(len(cycles))))


LENGTHS_MS = [1, 2, 5, 10, 20, 50, 100]


@pytest.mark.device
@pytest.mark.slow
def test_timer1_equals_the_marker_span_for_any_length(tmp_path):
    from tinyproto.pipeline.validate import markers_agree, markers_detail

    cycles, events = _run_on_simulator(_avr_firmware(tmp_path, "fw"), LENGTHS_MS, range(-48, 49))
    markers = _summary(cycles, events)
    assert min(cycles[1:]) < F_CPU / 1000 * 1.1 and max(cycles) > F_CPU / 1000 * 98  # 1 ms .. 100 ms
    assert markers["n_compared"] == len(cycles) == 1 + len(LENGTHS_MS) * 98
    after = sorted({c % OVERFLOW for c in cycles if c > OVERFLOW and c % OVERFLOW < 49})
    assert len(after) >= 20 and after == list(range(min(after), 49))  # ended at every cycle just after overflows
    assert markers_agree(markers), markers_detail(markers)
    assert markers["marker_minus_timer1_min"] == markers["marker_minus_timer1_max"] == markers["expected_difference"]
    assert markers_detail(markers).startswith(f"{len(cycles)} of {len(cycles)} Timer1 counts equal")


@pytest.mark.device
@pytest.mark.slow
def test_a_tampered_cycle_counter_fails_with_a_true_detail(tmp_path):
    """A counter that adds one cycle per Timer1 overflow (as a miscounted overflow would): every inference of
    4 ms or more is off, and the detail says how many, by how much and where first."""
    from tinyproto.pipeline.validate import markers_agree, markers_detail

    elf = _avr_firmware(tmp_path, "tampered", lambda text: text.replace(
        "return cycles > tp_overhead ? cycles - tp_overhead : 0;",
        "return (cycles > tp_overhead ? cycles - tp_overhead : 0) + (cycles >> 16);"))
    cycles, events = _run_on_simulator(elf, [1, 20, 100], range(0, 9, 4))
    assert len(cycles) == 1 + 3 * 4
    markers = _summary(cycles, events)
    assert not markers_agree(markers)
    honest = [c - (c >> 16) for c in cycles]  # close enough to tell which vectors were off
    off = sum(1 for c in honest if c >> 16)
    detail = markers_detail(markers)
    assert f"{len(cycles) - off} of {len(cycles)} Timer1 counts equal" in detail
    expected = markers["expected_difference"]
    first = next(i for i, c in enumerate(honest) if c >> 16)
    assert f"first at vector {first} (Timer1 {cycles[first]}" in detail
    worst = max(c >> 16 for c in honest)
    assert f"ranged {expected - worst}..{expected}" in detail


def test_spans_of_requests_sent_again_are_passed_over_only_as_many_as_were_sent_again():
    """A request the host sent again (its answer came late and was dropped) may run the model's code twice: the
    check passes over as many spans as requests were sent again (times the timed calls of a vector), no more,
    and a wrong counter still fails."""
    from tinyproto.pipeline.validate import _marker_summary, markers_agree, markers_detail

    cycles = [300_000, 120_000, 250_000, 90_000]
    spans = [c + 14 for c in cycles]
    twice = spans[:2] + spans[1:2] + spans[2:]  # vector 1 ran twice
    summary = _marker_summary(twice, cycles, 14, 1, [10, 11, 12, 13], requests_sent_again=1)
    assert markers_agree(summary) and summary["spans_passed_over"] == 1, markers_detail(summary)
    assert "1 spans of requests the host sent again (a late answer) passed over" in markers_detail(summary)
    unsent = _marker_summary(twice, cycles, 14, 1, [10, 11, 12, 13])
    assert not markers_agree(unsent) and unsent["first_differing"]["vector"] == 12
    tampered = _marker_summary(twice, [300_000, 120_001, 250_000, 90_000], 14, 1, [10, 11, 12, 13], 3)
    assert not markers_agree(tampered) and tampered["first_differing"]["vector"] == 11
    # a streaming family timed in 3 chunks: a vector restarted after its second chunk leaves 2 spans behind
    chunks = [[5_000, 6_000, 7_000], [5_500, 6_500, 7_500]]
    timed = [sum(c) - 3 * 14 for c in chunks]
    restarted = chunks[0] + chunks[1][:2] + chunks[1]
    summary = _marker_summary(restarted, timed, 14, 3, [0, 1], requests_sent_again=1)
    assert markers_agree(summary) and summary["spans_passed_over"] == 2, markers_detail(summary)
    assert not markers_agree(_marker_summary(restarted, timed, 14, 3, [0, 1]))


@pytest.mark.device
def test_a_chip_paused_past_the_timeout_runs_a_request_twice_and_the_check_stays_exact(tmp_path):
    """On a busy host the simulator can go unscheduled for longer than the client waits for an answer: the
    client sends the request again, and the chip, which had it already, runs it twice. Paused here with SIGSTOP
    (what a busy scheduler does, on purpose); validate saw this as a false cycle_markers failure."""
    import os
    import signal
    import threading

    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.pipeline.validate import (_calibration_span, _marker_cycles, _marker_summary, markers_agree,
                                             markers_detail)

    extras = [2_000, 150_000, 40_000, 300_000, 9_000]
    with SimulatedUno(_avr_firmware(tmp_path, "fw")) as sim, open_device(sim.port, timeout=0.3) as client:
        client.hello()
        cycles = []
        for k, extra in enumerate(extras):
            if k in (1, 3):
                os.kill(sim.pid, signal.SIGSTOP)
                threading.Timer(0.45, os.kill, (sim.pid, signal.SIGCONT)).start()
            cycles.append(client.predict(_vector(extra)).cycles)
        client.hello()  # the late answers of the last paused request are in before the markers are read
        events = sim.markers()
        sent_again = client.requests_sent_again
    spans = _marker_cycles(events)
    assert sent_again >= 2 and len(spans) > len(extras), (sent_again, len(spans))
    summary = _marker_summary(spans, cycles, _calibration_span(events), 1, list(range(len(cycles))), sent_again)
    assert markers_agree(summary), markers_detail(summary)
    assert summary["spans_passed_over"] == len(spans) - len(extras) >= 2
    assert not markers_agree(_marker_summary(spans, cycles, _calibration_span(events), 1, list(range(len(cycles)))))


# ---- a whole model directory whose firmware reports implausible cycles -----------------------------------


def _cli(*args):
    return tinyproto(*args, timeout=900)


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("reported", ["0", "0xFFFFFFFFUL"])
def test_implausible_cycles_are_a_failed_check_not_a_traceback(compiled, monkeypatch, reported):
    from rich.console import Console

    from tinyproto.pipeline import firmware

    out = compiled("iris", "1kB", "flynn")  # a copy of the run's iris FlyNN
    measure = out / "src" / "tp_measure.c"
    text = measure.read_text()
    edited = re.sub(r"return cycles > tp_overhead \? cycles - tp_overhead : 0;", f"(void)cycles; return {reported};",
                    text)
    assert edited != text
    measure.write_text(edited)
    import tinyproto.core.modeldir as modeldir

    monkeypatch.setattr(modeldir, "check_project_files", lambda path: None)  # the edited runtime is the point
    firmware.build_model_dir(out, None, Console(quiet=True))
    result = _cli("validate", out, "--no-raw")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "cycles" in result.stderr
    summary = json.loads((out / "validation.json").read_text())
    assert summary["checks"]["scores"]["ok"] and summary["checks"]["labels"]["ok"]  # the answers were right
    assert summary["checks"]["cycles"]["ok"] is False
    assert (f"{summary['n_vectors']} of {summary['n_vectors']} inferences reported"
            in summary["checks"]["cycles"]["detail"])
    assert summary["latency_ms_mean"] is None and summary["energy_mj_board"] is None
    assert summary["predicted_error"] is None and summary["measured_over_bound"] is None
    report = _cli("report", out)
    assert report.returncode == 0, report.stderr
    assert (out / "report.html").is_file()


@pytest.mark.device
@pytest.mark.slow
def test_the_end_marker_before_cli_was_the_race(tmp_path):
    """The firmware as it was (end marker, then interrupts off): an inference ending just after a Timer1
    overflow had the overflow interrupt counted by Timer1 but not by the marker span, so the two differed by
    the interrupt's cycles (validate saw -27..+13 on a 20 ms FlyNN model)."""
    from tinyproto.pipeline.validate import markers_agree

    elf = _avr_firmware(tmp_path, "old", lambda text: text.replace(
        "    cli();\n    GPIOR0 = (uint8_t)(mark + 1u);\n", "    GPIOR0 = (uint8_t)(mark + 1u);\n    cli();\n"))
    cycles, events = _run_on_simulator(elf, [20], range(-48, 49))
    markers = _summary(cycles, events)
    assert not markers_agree(markers)
    assert markers["marker_minus_timer1_max"] == markers["expected_difference"]
    assert markers["marker_minus_timer1_min"] < markers["expected_difference"] - 20


# ---- a device on a serial port that answers wrongly, in every way ------------------------------------------------

HELLO, PREDICT, RAW, STATS = 0x01, 0x02, 0x03, 0x04


def _set(type_wanted, at, **fields):
    """A tamper that sets `fields` of the answer to request number `at` (None: every one) of `type_wanted`."""
    def tamper(type, k, answer):
        if type == type_wanted and at in (None, k):
            answer.update(fields)
    return tamper


def _edit(type_wanted, at, edit):
    def tamper(type, k, answer):
        if type == type_wanted and k == at:
            edit(answer)
    return tamper


def _bad_crc_once(type, k, answer):
    if type == PREDICT and k == 6:
        return b"\x05\x82\x07\x01\x02\x03\x00"  # a frame whose CRC does not match: dropped, the request retried


def _extra_frames(type, k, answer):
    from tinyproto.device.codec import encode_frame

    if type == PREDICT and k == 2:  # a stale answer and an unasked STATS answer before nothing at all: a retry
        return encode_frame(0x82, 0x77, b"\x00" * 20) + encode_frame(0x84, 0x01, b"\x00" * 6)


def _pull_cable(type, k, answer):
    from helpers import FakeDevice

    return FakeDevice.CLOSE if type == PREDICT and k == 10 else None


# fault -> the checks it must fail (validation.json written, exit 1), or the words of its one error line
DEVICE_FAULTS = {
    "score off by one in one vector": (_edit(PREDICT, 5, lambda a: a["scores"].__setitem__(1, a["scores"][1] + 1)),
                                       ["scores"]),
    "a wrong label": (_edit(PREDICT, 7, lambda a: a.update(label=(a["label"] + 1) % 3)), ["labels"]),
    "a wrong confidence byte": (_edit(PREDICT, 3, lambda a: a.update(confidence=(a["confidence"] + 1) % 256)),
                                ["confidence"]),
    "a wrong unknown decision": (_edit(PREDICT, 3, lambda a: a.update(decided=255)), ["unknown"]),
    "0 cycles in one vector": (_set(PREDICT, 4, cycles=0), ["cycles"]),
    "1 cycle (below the MAC lower bound)": (_set(PREDICT, None, cycles=1), ["cycles"]),
    "a wrapped count (-5)": (_set(PREDICT, None, cycles=-5), ["cycles"]),
    "2^32-2 cycles": (_set(PREDICT, None, cycles=2**32 - 2), ["cycles"]),
    "cycles varying wildly": (_edit(PREDICT, 9, lambda a: a.update(cycles=10**6)), ["cycles"]),
    "stack peak 0": (_set(STATS, None, stack_peak=0), ["sram"]),
    "stack peak beyond the SRAM": (_set(STATS, None, stack_peak=40000), ["sram"]),
    "static SRAM 0": (_set(STATS, None, static_sram=0), ["sram"]),
    "static SRAM absurd": (_set(STATS, None, static_sram=65535), ["sram"]),
    "one wrong int8 input of the on-device input stage": (
        _edit(RAW, 2, lambda a: a["x"].__setitem__(0, a["x"][0] + (1 if a["x"][0] < 127 else -1))), ["raw_input"]),
    "another runtime ABI": (_set(HELLO, None, abi=7), "runtime ABI 7"),
    "2 bytes per score in HELLO": (_set(HELLO, None, score_bytes=2), "per score"),
    "2 bytes per input in HELLO": (_set(HELLO, None, input_bytes=2), "per input"),
    "another family": (_set(HELLO, None, family=4), "family id 4"),
    "another clock": (_set(HELLO, None, f_cpu=8_000_000), "8000000 Hz"),
    "no magic": (_set(HELLO, None, magic=b"XPRO"), "not a tinyproto device"),
    "the cable pulled mid-run": (_pull_cable, "serial port"),
}


@pytest.mark.parametrize("fault", list(DEVICE_FAULTS))
def test_a_device_answering_wrongly_is_a_failed_check_or_one_error_line(built_models, tmp_path, fault):
    """A fake device on a pty answers every request from the model's own reference except for one fault: each
    fault decides the exit code through the check it breaks (with a detail naming what was measured), or is one
    error line; never a traceback, never a pass."""
    from click.testing import CliRunner
    from helpers import FakeDevice

    from tinyproto.cli import main

    model = built_models("iris", "1kB")
    (model / "validation.json").unlink()
    tamper, expected = DEVICE_FAULTS[fault]
    with FakeDevice(model, tamper) as device:
        result = CliRunner().invoke(main, ["validate", str(model), "--port", device.port])
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error:"), result.stderr
    if isinstance(expected, str):
        assert expected in last, last
        return
    checks = json.loads((model / "validation.json").read_text())["checks"]
    assert [name for name, check in checks.items() if check["ok"] is False] == expected, checks
    assert all(checks[name]["detail"] in last for name in expected), last


@pytest.mark.parametrize("tamper", [None, _bad_crc_once, _extra_frames], ids=["true", "a bad CRC once", "extra frames"])
def test_a_device_answering_rightly_through_noise_passes(built_models, tamper):
    from click.testing import CliRunner
    from helpers import FakeDevice

    from tinyproto.cli import main

    model = built_models("iris", "1kB")
    with FakeDevice(model, tamper) as device:
        result = CliRunner().invoke(main, ["validate", str(model), "--port", device.port])
    assert result.exit_code == 0, result.output
    summary = json.loads((model / "validation.json").read_text())
    assert summary["passed"] and summary["target"] == device.port
