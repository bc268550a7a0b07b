"""`pio test` of a generated project: test/test_model/test_main.c (vectors + expected scores and labels, rendered
from templates/pio_test_main.c.j2) and the custom runner (templates/pio_test_custom_runner.py), run with
PlatformIO, or by hand with avr-gcc + the simulator when PlatformIO is missing.
Layer: device."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.render import jinja_env
from tinyproto.core.resources import resource_dir
from tinyproto.device import piohome
from tinyproto.device.project import (
    PIO_RUN_TIMEOUT_S,
    SIM_TEST_TIMEOUT_CYCLES,
    TEST_BUILD_DIR,
    _c_sources,
    _check_env,
    _compile_with_avr_gcc,
    _env_option,
    _read_ini,
    _run,
    parser_of,
    project_default_env,
)
from tinyproto.device.sim import EXIT_DONE, ensure_simulator


def _c_row(values: np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def render_pio_test(project_dir: Path, xq: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> Path:
    """Writes test/test_model/test_main.c (vectors + expected scores/labels) and the custom test runner."""
    xq = np.asarray(xq)
    scores = np.asarray(scores)
    labels = np.asarray(labels).reshape(-1)
    if xq.ndim != 2 or scores.ndim != 2 or not (len(xq) == len(scores) == len(labels)) or len(xq) == 0:
        raise ValueError("render_pio_test needs xq (n, d), scores (n, L) and labels (n,) with the same n > 0")
    if xq.min() < -128 or xq.max() > 127:
        raise ValueError("xq must hold int8 values")
    if scores.min() < -(2**31) or scores.max() > 2**31 - 1:
        raise ValueError("scores must fit in int32")
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError("labels must be class indices")
    source = jinja_env().get_template("pio_test_main.c.j2").render(
        vectors=[_c_row(row) for row in xq],
        expected_scores=[_c_row(row) for row in scores],
        expected_labels=_c_row(labels),
        n_vectors=len(xq),
    )
    test_dir = Path(project_dir) / "test"
    (test_dir / "test_model").mkdir(parents=True, exist_ok=True)
    (test_dir / "test_model" / "test_main.c").write_text(source, encoding="utf-8")
    shutil.copyfile(resource_dir("templates") / "pio_test_custom_runner.py", test_dir / "test_custom_runner.py")
    return test_dir / "test_model"


def _test_summary_passed(output: str) -> bool:
    """Unity's summary line `N Tests 0 Failures 0 Ignored` followed by OK."""
    match = re.search(r"^(\d+) Tests (\d+) Failures (\d+) Ignored\s*$", output, re.MULTILINE)
    return bool(match) and int(match.group(1)) > 0 and int(match.group(2)) == 0


def _run_sim_test_without_platformio(project_dir: Path, env: str) -> tuple[bool, str]:
    """`pio test -e uno_sim` by hand: avr-gcc builds test/ + lib/, simuno --stdio runs it."""
    sources = _c_sources(project_dir / "test", project_dir / "lib")
    elf, log = _compile_with_avr_gcc(project_dir, env, sources, project_dir / TEST_BUILD_DIR / env, None)
    mcu = _env_option(parser_of(project_dir), env, "board_build.mcu", "atmega328p")
    f_cpu = _env_option(parser_of(project_dir), env, "board_build.f_cpu", "16000000UL").rstrip("UuLl")
    command = [str(ensure_simulator()), "--stdio", "--mcu", mcu, "--freq", f_cpu,
               "--timeout-cycles", str(SIM_TEST_TIMEOUT_CYCLES), str(elf)]
    result = subprocess.run(
        command, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=PIO_RUN_TIMEOUT_S
    )
    output = result.stdout.decode("utf-8", "replace")
    log += output + result.stderr.decode("utf-8", "replace")
    return result.returncode == EXIT_DONE and _test_summary_passed(output), log


def run_pio_test(project_dir: Path, env: str | None = None) -> tuple[bool, str]:
    """Runs the on-device test (`pio test -e env`); returns (passed, log). <board>_sim runs in the simulator."""
    project_dir = Path(project_dir).resolve()
    parser = _read_ini(project_dir)
    env = env or project_default_env(parser)
    _check_env(parser, env)
    if not (project_dir / "test" / "test_model").is_dir():
        raise TinyprotoError(f"{project_dir} has no test/test_model; write it with render_pio_test()")
    simulated = _env_option(parser, env, "upload_protocol") == "simavr"
    if not piohome.platformio_available():
        if not simulated:
            raise TinyprotoError("pio test on a real board needs PlatformIO: pip install platformio scons")
        warnings.warn("PlatformIO is not installed: running the test firmware with avr-gcc + simuno", stacklevel=2)
        return _run_sim_test_without_platformio(project_dir, env)
    core = piohome.prepare_pio_core()
    if simulated:
        ensure_simulator()  # compile it here, with a clear error, rather than inside pio's test stage
    command = [sys.executable, "-m", "platformio", "test", "-e", env, "-d", str(project_dir)]
    environment = piohome.pio_environment(core)
    environment["PLATFORMIO_BUILD_DIR"] = str(project_dir / TEST_BUILD_DIR)
    try:
        result = _run(command, env=environment, timeout=PIO_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TinyprotoError(f"pio test -e {env} did not finish within {PIO_RUN_TIMEOUT_S} s") from exc
    log = result.stdout + result.stderr
    return result.returncode == 0, log
