"""Shared fixtures and the suite's tiers.

Fixtures: compiled model directories and the private tool cache are made once per run, shared by every
pytest-xdist worker (under a file lock in a run-wide temporary directory), and handed out as copies, so no test
can change what another one sees.

Tiers: every test is marked `device` (it needs avr-gcc, the simulated boards, avrdude or PlatformIO) or `slow`
automatically, from what it reaches: its own code, the fixtures it uses and the test-module functions they call
(see `tier_of`). A test file nobody told this file about is tiered the same way. The fast tier is
`pytest -m "not device and not slow"`. A test of the fast tier that starts a device tool anyway is listed at the
end of the run (the rules missed it: mark it `device` by hand, or teach `DEVICE_*` below the new name).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# Re-exported for test files written before helpers.py: `from conftest import needs` keeps working.
from helpers import (HAVE_SIMULATOR, PipePort, fresh_copy, header_array_bytes, made_once, needs,  # noqa: F401
                     needs_simulator, read_only, run_wide_dir, tinyproto)

TESTS = Path(__file__).resolve().parent

# Property tests draw the same examples every run: a run's verdict must not depend on which examples it drew
# (a test's own @settings changes only what it names).
hypothesis_settings.register_profile("tinyproto", derandomize=True)
hypothesis_settings.load_profile("tinyproto")

# pytest-xdist's workers already keep every core busy: a solver's own pool of processes (compile's default --jobs,
# every usable core) would only fight the other workers for the same cores and pay each pool worker's start (~1.5 s
# of CPU per compile of digits or breast_cancer). Every command the tests start inherits it; the tests of --jobs pass
# their own (tests/test_solver_jobs.py).
os.environ.setdefault("TINYPROTO_JOBS", "1")

# -n auto (pyproject's addopts): two workers per core. A worker spends much of a device test waiting, not computing:
# on a simulated board paced to the wall clock (bootloader windows, avrdude's timeouts, a quarter-speed board), on
# a dask cluster's start and stop, on a sweep's deadline, on another worker training a shared model. A second
# worker per core computes meanwhile. A run without the device tier (`-m "not device ..."`) computes: one worker per
# core, each worker's collection (~8 s of CPU) paid once per core. PYTEST_XDIST_AUTO_NUM_WORKERS=N still sets N.
WORKERS_PER_CORE = 2


def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0))
    if re.search(r"\bnot\s+device\b", getattr(config.option, "markexpr", "") or ""):
        return cores
    return WORKERS_PER_CORE * cores

# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled(data, budget, family='protonn', seed=0, board='uno', learnable=False, unknown_rate=None) -> a model
    directory of the caller's own (learnable: what `compile --learnable` writes; unknown_rate: `--unknown-rate`).

    Each model is trained once per run (whichever worker asks first; the others wait for it) into a master
    directory that no test ever sees; every call hands out a fresh copy of it. So a test may build, validate,
    learn in or damage what it got without changing what any other test gets: results do not depend on the order
    the tests run in or on the worker they run on."""
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    root = run_wide_dir(tmp_path_factory) / "compiled"
    root.mkdir(exist_ok=True)

    def make(data: str, budget: str, family: str = "protonn", seed: int = 0, board: str = "uno",
             learnable: bool = False, unknown_rate: str | None = None) -> Path:
        def train(into: Path) -> None:
            compile_model(data, CompileOptions(family, budget, seed, board, into / "model", learnable=learnable,
                                               unknown_rate=unknown_rate))

        on_board = (("" if board == "uno" else f"-{board}") + ("-learnable" if learnable else "")
                    + (f"-unknown{unknown_rate.rstrip('%')}" if unknown_rate else ""))
        master = made_once(root, f"{family}-{data}-{budget}-{seed}{on_board}", train) / "model"
        return fresh_copy(master, tmp_path_factory, f"{family}-{data}-{budget}{on_board}")

    return make


@pytest.fixture(scope="session")
def shared_once(tmp_path_factory):
    """shared_once(key, make) -> a directory `make(directory)` filled once for the whole run (all workers), for
    artefacts that take seconds to make (a built firmware, a host-compiled runner). Read-only: copy before
    changing anything in it (helpers.fresh_copy)."""
    root = run_wide_dir(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    return lambda key, make: made_once(root, key, make)


@pytest.fixture(scope="session")
def release_dist(shared_once) -> Path:
    """The release's sdist and wheel: `python -m build` of a copy of the tracked files (the wheel built from the
    sdist; the checkout itself is not written to), made once per run for every worker and test file that installs
    them (test_release, test_install). Read-only: install from it, never into it."""
    root = TESTS.parent
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the release is built from the tracked files")
    tracked = [name for name in listed.stdout.splitlines() if (root / name).is_file()]

    def build(into: Path) -> None:
        source = into / "source"
        for name in tracked:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, source / name)
        made = subprocess.run([sys.executable, "-m", "build", "--outdir", str(into / "dist"), str(source)],
                              capture_output=True, text=True, timeout=1800, check=False)
        assert made.returncode == 0, (made.stdout[-3000:], made.stderr[-3000:])
        shutil.rmtree(source)

    return shared_once("release-dist", build) / "dist"


@pytest.fixture(scope="session")
def built_models(compiled, tmp_path_factory):
    """built_models(data, budget, family='protonn') -> a copy of that model built and validated (--no-raw) on the
    simulated Uno, made once per run for all workers (with the run's private tool cache)."""
    from click.testing import CliRunner

    from tinyproto.cli import main

    root = run_wide_dir(tmp_path_factory) / "built"
    root.mkdir(exist_ok=True)

    def make(data: str, budget: str, family: str = "protonn") -> Path:
        def build(into: Path) -> None:
            model = into / "model"
            shutil.copytree(compiled(data, budget, family), model, symlinks=True)
            previous = os.environ.get("TINYPROTO_CACHE")
            os.environ["TINYPROTO_CACHE"] = str(_run_cache(tmp_path_factory))
            try:
                for verb in (["build", str(model)], ["validate", str(model), "--no-raw"]):
                    result = CliRunner().invoke(main, verb)
                    assert result.exit_code == 0, result.output
            finally:
                if previous is None:
                    os.environ.pop("TINYPROTO_CACHE", None)
                else:
                    os.environ["TINYPROTO_CACHE"] = previous

        master = made_once(root, f"{family}-{data}-{budget}", build) / "model"
        return fresh_copy(master, tmp_path_factory, f"built-{family}-{data}-{budget}")

    return make


@pytest.fixture(scope="session")
def built_for_board(compiled, shared_once, tmp_path_factory):
    """built_for_board(data, budget, board) -> a copy of that ProtoNN model compiled for `board` and built with
    `tinyproto build` (its simulator environment; not validated), made once per run for all workers."""

    def make(data: str, budget: str, board: str) -> Path:
        def build(into: Path) -> None:
            shutil.copytree(compiled(data, budget, board=board), into / "model", symlinks=True)
            result = tinyproto("build", into / "model")
            assert result.returncode == 0, result.stdout + result.stderr

        master = shared_once(f"built-protonn-{data}-{budget}-{board}", build) / "model"
        return fresh_copy(master, tmp_path_factory, f"built-{data}-{budget}-{board}")

    return make


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A working directory (also the current one) with a private temporary directory, checked afterwards: no
    temporary file and no scratch model directory left behind."""
    from tinyproto.core.manifest import SCRATCH_PREFIX

    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    yield folder
    left = [p for p in private_tmp.iterdir() if str(p) != _fork_server_scratch()]
    assert not left, "temporary files left behind"
    assert not [p for p in folder.rglob("*") if p.name.startswith(SCRATCH_PREFIX)], "scratch directory left behind"


def _fork_server_scratch() -> str | None:
    """The scratch of this process's fork server (core/dask_cluster.py), made in the temporary directory of the test
    that first ran a sweep or federation in-process: it lasts as long as the process (removed at exit), so it is not
    a leftover of that test, and which test makes it depends only on the order the tests run in."""
    import multiprocessing

    return multiprocessing.current_process()._config.get("tempdir")


def _run_cache(tmp_path_factory) -> Path:
    cache = run_wide_dir(tmp_path_factory) / "tinyproto-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """PlatformIO's home, the toolchain package, simuno and the bootloaders in a cache of this run's own, never
    the user's: made from empty by the first test that needs it, then shared by the run's workers (tinyproto's
    cache is keyed by content and locked, as for concurrent users). Restored afterwards for other modules."""
    previous = os.environ.get("TINYPROTO_CACHE")
    os.environ["TINYPROTO_CACHE"] = str(_run_cache(tmp_path_factory))
    yield
    if previous is None:
        os.environ.pop("TINYPROTO_CACHE", None)
    else:
        os.environ["TINYPROTO_CACHE"] = previous


# ------------------------------------------------------------------------------------------------ tiers

# What makes a test a `device` test, as it appears in the code it reaches:
DEVICE_STRINGS = {  # string constants: the tools, and the verbs that build or run firmware
    "avr-gcc", "avr-size", "avr-objcopy", "simavr", "avrdude", "pio", "platformio", "arduino-builder",
    "build", "validate", "flash", "--sim",
    "export",  # the Arduino export measures its library's flash and SRAM with avr-gcc
}
DEVICE_NAMES = {  # names (functions, classes, flags) of the device layer and of the skip conditions
    "build_model_dir", "build_project", "SimulatedUno", "SimulatedBoard", "ensure_simulator", "ensure_bootloader",
    "flash_port", "learn_on_device", "run_pio_test", "prepare_pio_core", "export_arduino_built",
    "export_arduino", "export_arduino_models", "measure_library", "beside_sketch", "library_header",
    "needs_simulator", "needs_bootloaders", "HAVE_SIMULATOR", "HAVE_SIM", "HAVE_SIMAVR", "HAVE_AVR",
}
DEVICE_FIXTURES = {"private_cache", "built_models", "built_for_board"}
DEVICE_SKIP_REASON = re.compile(r"avr-gcc|simavr|simuno|avrdude|platformio|scons|optiboot|arduino", re.I)
# What makes a test `slow` (seconds each, though no device): a dask cluster, a browser, a new virtualenv,
# libFuzzer runs, scikit-learn's whole estimator check list.
SLOW_STRINGS = {"dask", "chromium", "venv", "clang", "-fsanitize=fuzzer"}
SLOW_NAMES = {"LocalCluster", "Client", "parametrize_with_checks", "check_estimator", "sync_playwright", "dask_backend",
              "EnvBuilder"}

# ... and what was measured to take seconds in the fast tier's run (tools/slow_tests.py writes the list).
SLOW_LIST = TESTS / "slow_tests.txt"


def measured_slow() -> set[str]:
    """The node ids tests/slow_tests.txt lists."""
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.exists() else []
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def nonexistent_tests(nodes) -> list[str]:
    """The node ids among `nodes` whose file or test function is not in tests/ (a list naming a renamed or
    deleted test)."""
    missing = []
    for node in sorted(nodes):
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
        source = TESTS.parent / path
        if not source.exists() or not re.search(rf"^\s*def {re.escape(function)}\(", source.read_text(), re.M):
            missing.append(node)
    return missing


_MEASURED_SLOW = measured_slow()
_reach_cache: dict[int, tuple[set, set]] = {}


def _code_reach(func, seen: set[int]) -> tuple[set[str], set[str]]:
    """(names, strings) a function's code uses, following the functions of test modules it names."""
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None or id(code) in seen:
        return set(), set()
    seen.add(id(code))
    names, strings = set(), set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        for const in c.co_consts:
            if isinstance(const, str):
                strings.add(const)
            elif isinstance(const, types.CodeType):
                stack.append(const)
            elif isinstance(const, tuple):
                strings.update(v for v in const if isinstance(v, str))
    module_globals = getattr(func, "__globals__", {})
    for name in list(names):
        target = module_globals.get(name)
        if isinstance(target, types.FunctionType) and _is_test_code(target):
            more_names, more_strings = _code_reach(target, seen)
            names |= more_names
            strings |= more_strings
    return names, strings


def _is_test_code(func) -> bool:
    path = getattr(func.__code__, "co_filename", "")
    return path.startswith(str(TESTS))


def _reach(item) -> tuple[set[str], set[str]]:
    seen: set[int] = set()
    names, strings = _code_reach(getattr(item, "obj", None), seen)
    infos = getattr(item, "_fixtureinfo", None)
    for fixturedefs in (infos.name2fixturedefs.values() if infos else ()):
        for fixturedef in fixturedefs:
            more_names, more_strings = _code_reach(fixturedef.func, seen)
            names |= more_names
            strings |= more_strings
    return names, strings


def tier_of(item) -> set[str]:
    """The markers `item` gets: `device` where it reaches a device tool, `slow` where it reaches something that
    takes seconds."""
    marks = set()
    names, strings = _reach(item)
    reasons = " ".join(str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
    if (names & DEVICE_NAMES or strings & DEVICE_STRINGS or DEVICE_SKIP_REASON.search(reasons)
            or DEVICE_FIXTURES & set(item.fixturenames)):
        marks.add("device")
    if names & SLOW_NAMES or strings & SLOW_STRINGS or item.nodeid in _MEASURED_SLOW:
        marks.add("slow")
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for name in sorted(tier_of(item) - have):
            item.add_marker(getattr(pytest.mark, name))
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:  # on a pytest-xdist worker: every worker computes the same order (the same seed, the same file)
        expected = measured_durations()
        modules = [(key, list(group))
                   for key, group in itertools.groupby(items, key=lambda item: item.nodeid.partition("::")[0])]
        order = longest_first([[expected.get(item.nodeid, UNLISTED_SECONDS) for item in group]
                               for _, group in modules], workers)
        items[:] = [modules[m][1][t] for m, t in order]


# ------------------------------------------------------------------------------------------------ the order
# The workers end together only if no long test starts late. pytest-xdist's worksteal scheduler first sends worker
# k the k-th of `workers` runs of the collected order (runs_of: equal counts); each worker runs its run from the
# front, and an idle worker steals the back half of a busy one's queue. So the order is made of `workers` runs of
# those sizes, balanced by the tests' durations measured in a whole run (tests/durations.json, written by
# tools/test_durations.py), longest first: longest-processing-time-first, by test file. A file's tests stay
# together, so its module-scoped fixtures are made once per worker that runs it (pytest tears them down when the
# next test is another file's); inside a file, its longest tests go first. Tests and files of equal expected time
# keep the order they were collected in (pytest-randomly's shuffle). A test the file does not name (it took under
# a second, or it is new) counts half a second.

DURATIONS = TESTS / "durations.json"
UNLISTED_SECONDS = 0.5


def measured_durations() -> dict[str, float]:
    """node id -> seconds, from tests/durations.json (empty when it is missing)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def runs_of(count: int, workers: int) -> list[int]:
    """The sizes of the runs pytest-xdist's worksteal scheduler first sends each of `workers` idle workers."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def longest_first(seconds: list[list[float]], workers: int) -> list[tuple[int, int]]:
    """An order of the tests (file index, test index) of files whose tests take `seconds`: the files, longest
    first, each into the run with the least time so far; each file's tests longest first (stable sorts: ties keep
    their order). Then the runs get the sizes of runs_of: a run too long gives its last (shortest) tests to the
    end of the next run, a run too short takes the last ones of the runs after it."""
    runs: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
    totals = [0.0] * workers
    for m in sorted(range(len(seconds)), key=lambda m: -sum(seconds[m])):
        k = min(range(workers), key=lambda k: (totals[k], k))
        runs[k] += [(m, t) for t in sorted(range(len(seconds[m])), key=lambda t: -seconds[m][t])]
        totals[k] += sum(seconds[m])
    sizes = runs_of(sum(len(run) for run in runs), workers)
    for k in range(workers - 1):
        if len(runs[k]) > sizes[k]:
            runs[k + 1] += runs[k][sizes[k]:]
            del runs[k][sizes[k]:]
        for j in range(workers - 1, k, -1):
            missing = sizes[k] - len(runs[k])
            if missing > 0:
                taken = runs[j][len(runs[j]) - min(missing, len(runs[j])):]
                del runs[j][len(runs[j]) - len(taken):]
                runs[k] += taken
    return [test for run in runs for test in run]


# ------------------------------------------------------------------------------------------------ the tier guard
# A test outside the device tier that starts a device tool is reported, so the rules above can be corrected.

DEVICE_PROGRAMS = {"avr-gcc", "avr-size", "avr-objcopy", "avrdude", "simavr", "pio", "platformio", "arduino-builder"}
_current: dict[str, object] = {"item": None}
_leaks: dict[str, str] = {}  # nodeid -> the device program it started


def _device_program(args) -> str | None:
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    try:
        words = [os.fsdecode(a) for a in args]
    except TypeError:
        return None
    if not words:
        return None
    program = os.path.basename(words[0])
    if program == "avr-gcc" and "-E" in words:  # compile's check of the board's MCU (device/build.mcu_lacks): the
        # preprocessor alone, and skipped where avr-gcc is not installed, so a fast-tier test may run it
        return None
    if program in DEVICE_PROGRAMS or program.startswith(("simuno", "plainuno")):
        return program
    if "--help" in words:  # a verb's help starts no tool
        return None
    if "-m" in words:
        after = words[words.index("-m") + 1:]
        if after[:1] == ["platformio"] or (after[:1] == ["tinyproto"] and
                                           (set(after[1:2]) & {"build", "validate", "flash"} or "--sim" in after)):
            return " ".join(after[:2])
    return None


_original_popen_init = subprocess.Popen.__init__


def _watch(args) -> None:
    item = _current["item"]
    if item is not None and item.get_closest_marker("device") is None:
        program = _device_program(args)
        if program:
            _leaks.setdefault(item.nodeid, program)


def _watched_popen_init(self, args, *rest, **kwargs):
    _watch(args)
    return _original_popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    import cli_forkserver

    subprocess.Popen.__init__ = _watched_popen_init
    cli_forkserver.WATCHERS.append(_watch)  # a command from the fork server is no Popen
    if not hasattr(config, "workerinput"):  # once, before pytest-xdist starts the workers
        compile_bytecode_once(config)


# ------------------------------------------------------------------------------------------------ bytecode, once
# Where PYTHONDONTWRITEBYTECODE is set (it is in this project's CI containers), no Python process writes a .pyc:
# every pytest-xdist worker rewrote and compiled every test module at its collection (~4 s of CPU each), and every
# `tinyproto` command the tests start compiled the tinyproto modules it imports (~0.2 s of CPU for compile's). A
# process still reads what is there, so the run's first process writes it once: tinyproto's modules and tests/
# helpers.py as Python itself writes them (__pycache__, ignored by git; py_compile does not read the variable), and
# the test modules as pytest's assertion rewriting caches them (its own pyc files, which its workers read back).


def compile_bytecode_once(config) -> None:
    import compileall
    import py_compile

    compileall.compile_dir(str(TESTS.parent / "tinyproto"), quiet=1)
    py_compile.compile(str(TESTS / "helpers.py"), doraise=False)
    try:  # pytest's own functions (not public API: when they change, the workers just rewrite as before)
        from _pytest.assertion import assertstate_key
        from _pytest.assertion.rewrite import (PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc, get_cache_dir,
                                               try_makedirs)

        state = config.stash[assertstate_key]
        for source in sorted([*TESTS.glob("test_*.py"), TESTS / "conftest.py"]):
            pyc = get_cache_dir(source) / (source.name[:-3] + PYC_TAIL)
            if _read_pyc(source, pyc, state.trace) is None and try_makedirs(pyc.parent):
                source_hash, code = _rewrite_test(source, config)
                _write_pyc(state, code, source_hash, pyc)
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _original_popen_init
    import cli_forkserver

    cli_forkserver.SERVER.close()  # its children's CPU time counts in this process's, as a subprocess's does


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["item"] = item
    try:
        return (yield)
    finally:
        _current["item"] = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and item.nodeid in _leaks:  # user_properties travel from xdist workers too
        report.user_properties.append(("tier_leak", f"{item.nodeid} ran {_leaks[item.nodeid]}"))
    return report


_leak_reports: list[str] = []


def pytest_report_teststatus(report, config):
    for key, value in getattr(report, "user_properties", ()):
        if key == "tier_leak" and value not in _leak_reports:
            _leak_reports.append(value)


def pytest_terminal_summary(terminalreporter):
    if _leak_reports:
        terminalreporter.section("tests outside the device tier that started a device tool")
        for line in _leak_reports:
            terminalreporter.line(line)
