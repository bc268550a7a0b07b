"""End to end on the simulated Uno (real libsimavr, real firmware, real serial protocol over a pty):
compile -> build (offline PlatformIO env) -> run -> validate every test vector bit-exactly."""

from __future__ import annotations

import json
import os

import pytest

from tinyproto.families.protonn.solver import minimum_budget

from helpers import needs, tinyproto

pytestmark = [needs("avr-gcc"), pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"),
                                                   reason="libsimavr-dev not installed")]


def cli(*args):
    return tinyproto(*args, timeout=600)


def build_and_validate(model_dir):
    built = cli("build", str(model_dir))
    assert built.returncode == 0, built.stderr
    result = cli("validate", str(model_dir), "--sim", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary == json.loads((model_dir / "validation.json").read_text())
    return summary


@pytest.mark.parametrize("family", ["protonn", "flynn"])
@pytest.mark.parametrize("data,budget", [("digits", "2kB"), ("breast_cancer", "1kB")])
def test_device_equals_host_reference(compiled, data, budget, family):
    model_dir = compiled(data, budget, family)
    report = json.loads((model_dir / "report.json").read_text())
    v = build_and_validate(model_dir)
    assert v["n_vectors"] == report["n_test"] and v["complete"]
    assert v["score_agreement"] == 1.0
    assert v["label_agreement"] == 1.0
    assert v["device_accuracy"] == pytest.approx(report["int8_accuracy"])
    # Timer1 on the device and the simulator's GPIOR0 markers measure the same inference
    markers = v["simulator_marker_cycles"]
    assert markers["n_compared"] == v["n_vectors"]
    assert markers["marker_minus_timer1_min"] == markers["marker_minus_timer1_max"]  # a constant offset
    # SRAM: static + measured stack peak fits with margin; model is in flash
    assert v["stack_peak_bytes"] > 0 and v["sram_margin_bytes"] >= 256
    assert v["model_bytes"] <= v["budget_bytes"]
    raw = v["raw_input"]
    assert raw["inputs_differing_by_more_than_1_lsb"] == 0 and raw["labels_changed"] == 0
    assert raw["n_inputs"] == raw["n_vectors"] * raw["inputs_per_vector"] <= raw["n_vectors"] * raw["data_features"]
    assert v["cycles_min"] > 1000 and v["latency_ms_mean"] == pytest.approx(v["cycles_mean"] / 16000.0)
    # the static cost model (compile time, before any build) predicts the simulator's exact cycles within 10 %
    assert abs(v["predicted_error"]) < 0.10
    assert v["predicted_cycles"] == report["predicted_cycles"]["total"]
    assert v["measured_over_bound"] > 1.0  # the bound is a bound


def test_smallest_budget_that_fits_digits(tmp_path):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    smallest = minimum_budget(64, 10)  # the calibration puts no array in flash: the solver's smallest model
    out = tmp_path / "smallest"
    result = compile_model("digits", CompileOptions("protonn", f"{smallest}B", 0, "uno", out))
    assert result.report["model_bytes"] <= smallest
    v = build_and_validate(out)
    assert v["score_agreement"] == 1.0 and v["label_agreement"] == 1.0
    below = cli("compile", "digits", "--budget", f"{smallest - 1}B", "--out", str(tmp_path / "below"))
    assert below.returncode == 1 and f"needs {smallest} B" in below.stderr


def test_pio_test_runs_on_the_simulated_uno(compiled):
    from tinyproto.device.build import run_pio_test

    passed, log = run_pio_test(compiled("breast_cancer", "1kB"), env="uno_sim")
    assert passed, log[-2000:]


def test_validate_resume_keeps_what_was_measured(built_for_board):
    model_dir = built_for_board("breast_cancer", "1kB", "uno")  # built once per run (conftest); this test's copy
    first = cli("validate", str(model_dir), "--json", "--no-raw")
    assert first.returncode == 0, first.stderr
    journal = (model_dir / "validation.jsonl").read_text().splitlines()
    (model_dir / "validation.jsonl").write_text("\n".join(journal[:40]) + "\n")
    resumed = cli("validate", str(model_dir), "--json", "--no-raw", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["n_vectors"] == len(journal) - 1  # the first line is the binding


@pytest.mark.parametrize("args,message", [
    (["validate", "{dir}", "--port", "/dev/does-not-exist"], "does not exist"),
    (["flash", "{dir}", "--port", "/dev/does-not-exist"], "does not exist"),
])
def test_bad_port_is_one_clear_error(built_for_board, args, message):
    model_dir = built_for_board("breast_cancer", "1kB", "uno")
    result = cli(*[a.replace("{dir}", str(model_dir)) for a in args])
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_validate_without_firmware_says_build_first(compiled):
    model_dir = compiled("iris", "1kB")  # compiled, never built
    for command in ("validate", "flash"):
        result = cli(command, str(model_dir))
        assert result.returncode == 1 and "tinyproto build" in result.stderr and "Traceback" not in result.stderr


def test_busy_port_is_one_clear_error(built_for_board):
    """A port another program holds open exclusively (here: a simulated Uno we are talking to)."""
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.core.errors import TinyprotoError

    model_dir = built_for_board("breast_cancer", "1kB", "uno")
    elf = model_dir / json.loads((model_dir / "build.json").read_text())["elf"]
    with SimulatedUno(elf) as uno, open_device(uno.port):
        with pytest.raises(TinyprotoError, match="busy|in use|locked"):
            open_device(uno.port)


def test_validate_fails_when_the_device_computes_other_scores(compiled, monkeypatch):
    """A firmware whose Z array differs from model.json (as a miscompiled kernel would compute): the model hash
    still matches, so only the full score comparison can catch it; validate must exit non-zero and say so.
    (`tinyproto build` refuses an edited header, so the build here skips that check, as a miscompile would.)"""
    import re

    from rich.console import Console

    from tinyproto.pipeline import firmware
    from tinyproto.core.modeldir import TestVectors

    out = compiled("iris", "1kB")  # a copy of the run's iris ProtoNN
    header = out / "include" / "tinyproto_model.h"
    text = header.read_text()
    z_array = re.search(r"tp_protonn_Z\[\d+\] PROGMEM = \{\s*(-?\d+)", text)
    first = int(z_array.group(1))
    text = text[: z_array.start(1)] + str(first + 1 if first < 127 else first - 1) + text[z_array.end(1):]
    header.write_text(text)
    assert cli("build", str(out)).returncode == 1  # the header is not what model.json renders
    monkeypatch.setattr(firmware, "_check_header_is_the_model", lambda model_dir, model: None)
    firmware.build_model_dir(out, None, Console(quiet=True))
    result = cli("validate", str(out), "--no-raw")
    assert result.returncode == 1
    assert "validation failed: scores (" in result.stderr
    summary = json.loads((out / "validation.json").read_text())
    assert summary["score_agreement"] < 1.0 and not summary["passed"]
    assert summary["checks"]["scores"]["ok"] is False
    vectors = TestVectors.load(out / "test_vectors.npz")
    first_bad = summary["mismatches"][0]
    assert first_bad["host_scores"] == [int(s) for s in vectors.scores[first_bad["vector"]]]
    assert first_bad["device_scores"] != first_bad["host_scores"]
