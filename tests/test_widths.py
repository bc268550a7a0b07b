"""Compile never accepts what build refuses, at any width: synthetic data from 8 to 2,048 features. Every model
`compile` accepts builds, validates bit-exactly on the simulated Uno, and its static SRAM + measured stack peak
stays within compile's estimate (and within 1,792 B up to 1,024 features); every refusal is one line that names
the limit and what would fit."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.cli import main

from helpers import needs, tinyproto

pytestmark = [needs("avr-gcc"), pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"),
                                                   reason="libsimavr-dev not installed")]

SRAM_GOAL = 1792  # static + stack peak for every accepted model up to 1,024 features (issue 11)


def cli(*args: str) -> subprocess.CompletedProcess:
    return tinyproto(*args, timeout=600)


def synthetic(path: Path, n_features: int, n_rows: int = 90, n_classes: int = 3, seed: int = 0) -> Path:
    """Separable classes in a few informative features among many noisy ones (pixels-like 0..255 values)."""
    rng = np.random.default_rng(seed + n_features)
    y = np.arange(n_rows) % n_classes
    X = rng.integers(0, 64, size=(n_rows, n_features)).astype(np.float64)
    informative = rng.choice(n_features, size=min(n_features, 6), replace=False)
    X[:, informative] += 120.0 * (y[:, None] == (np.arange(len(informative)) % n_classes)[None, :])
    np.savez(path, X=X, y=y)
    return path


# (family, width, budget): small budgets keep the runs fast; the widest ones are refused, for the budget or the
# SRAM (FlyNN's buffers grow with the features: 2 B per feature).
CASES = [("protonn", 8, "1kB"), ("protonn", 256, "2kB"), ("protonn", 1024, "6kB"), ("protonn", 2048, "12kB"),
         ("flynn", 256, "2kB"), ("flynn", 1024, "6kB")]


@pytest.mark.parametrize("family, n_features, budget", CASES)
def test_every_accepted_width_builds_and_validates_within_its_estimate(tmp_path, family, n_features, budget):
    data = synthetic(tmp_path / f"w{n_features}.npz", n_features)
    model_dir = tmp_path / "model"
    compiled = cli("compile", str(data), "--model", family, "--budget", budget, "--out", str(model_dir),
                   "--seed", "0")
    if compiled.returncode != 0:
        message = compiled.stderr.strip()
        assert "Traceback" not in message and len(message.splitlines()) == 1, message
        # the limit and what would fit: SRAM (features that fit) or the budget (bytes the smallest model needs)
        assert ("SRAM" in message and "would fit" in message) or "needs" in message, message
        assert n_features > 256, f"refused at {n_features} features: {message}"
        return
    report = json.loads((model_dir / "report.json").read_text())
    estimate = report["sram_estimate"]["estimated_total_bytes"]
    # build and validate as the CLI runs them, in this process (click's runner: two interpreters' start-up fewer)
    for verb in (["build", str(model_dir)], ["validate", str(model_dir), "--sim", "--json", "--no-raw"]):
        result = CliRunner().invoke(main, verb)
        assert result.exit_code == 0, result.output
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0 and v["complete"]
    used = v["sram_static_bytes"] + v["stack_peak_bytes"]
    assert used <= estimate, f"{n_features} features: static + stack {used} B > compile's estimate {estimate} B"
    if n_features <= 1024:
        assert used <= SRAM_GOAL, f"{n_features} features: static + stack {used} B"


def test_a_refusal_for_sram_names_the_features_that_would_fit(tmp_path):
    """4,096 features for FlyNN, which needs the whole input vector in SRAM: at a budget that holds the model the
    input buffer no longer fits the Uno (the streamable families take such widths chunk by chunk)."""
    data = synthetic(tmp_path / "w4096.npz", 4096, n_rows=60)
    refused = cli("compile", str(data), "--model", "flynn", "--budget", "24kB", "--out", str(tmp_path / "m"))
    assert refused.returncode != 0
    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1 and "2048 B" in message and "features fit" in message, message
    fit = int(message.split("at most ")[1].split()[0])
    assert 0 < fit < 2048


def test_a_model_directory_without_the_sizes_header_is_refused_in_one_line(compiled, tmp_path):
    """A directory compiled before protocol version 2 has no include/tinyproto_sizes.h: build says what to do."""
    import shutil

    model_dir = tmp_path / "old"
    shutil.copytree(compiled("breast_cancer", "1kB"), model_dir)
    (model_dir / "include" / "tinyproto_sizes.h").unlink()
    built = cli("build", str(model_dir))
    assert built.returncode != 0
    assert built.stderr.strip().splitlines() == [
        f"error: {model_dir}/include/tinyproto_sizes.h is missing; run `tinyproto compile` again"]
