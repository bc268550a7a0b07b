"""Crash and resume: SIGKILL at several points of compile, validate, learn and federate.

After every kill: the output directory is either the old one or a complete new one (never half of one),
no user file is lost, nothing of the killed run survives a following run (scratch directories, simulator
processes), and a resumed validation measures every vector exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import new_scratch_files, signal_when
from helpers import tinyproto as tinyproto_cli

from tinyproto.core.manifest import LOCK, SCRATCH_PREFIX
from tinyproto.core.modeldir import load_model_dir
from tinyproto import families

ROOT = Path(__file__).resolve().parents[1]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinyproto", *args]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return tinyproto_cli(*args, cwd=cwd, timeout=600)


def journal_lines(model: Path) -> int:
    path = model / "validation.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def assert_complete_model(model: Path) -> str:
    """The directory is a whole model directory; returns its model hash."""
    from tinyproto.pipeline.validate import checked_vectors

    md = load_model_dir(model)
    checked_vectors(md, families.load_int_model(md))
    return md.meta["model_hash"]


def no_scratch_left(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


# ------------------------------------------------------------------------------------------------ compile

KILL_IN_SWAP = textwrap.dedent("""
    import os, signal, sys
    import tinyproto.core.outdir as md  # where the swap and its manifest write are looked up
    point = sys.argv[1]
    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)
    original_manifest, original_exchange = md.write_manifest, md._exchange
    if point == "before-manifest":
        md.write_manifest = die
    elif point == "before-swap":
        md._exchange = die
    elif point == "after-swap":
        def exchange_then_die(a, b):
            original_exchange(a, b)
            die()
        md._exchange = exchange_then_die
    from tinyproto.pipeline.compile import CompileOptions, compile_model
    compile_model("iris", CompileOptions("protonn", "1kB", int(sys.argv[3]), "uno", sys.argv[2]))
""")


@pytest.mark.parametrize("point", ["before-manifest", "before-swap", "after-swap"])
def test_compile_killed_while_replacing_leaves_old_or_new(tmp_path, point, compiled):
    out = tmp_path / "m"
    (tmp_path / "data.csv").write_text("mine\n")
    shutil.copytree(compiled("iris", "1kB"), out, symlinks=True)  # what `compile iris --budget 1kB` wrote
    old_hash = assert_complete_model(out)
    killed = subprocess.run([sys.executable, "-c", KILL_IN_SWAP, point, str(out), "7"], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    now = assert_complete_model(out)
    assert (now == old_hash) == (point != "after-swap")
    assert (tmp_path / "data.csv").read_text() == "mine\n"
    again = run("compile", "iris", "--budget", "1kB", "--seed", "3", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert_complete_model(out)
    no_scratch_left(tmp_path)


# A compile into an existing model directory, killed at each moment before its swap: its training (the solver's
# first progress line) and a file of the new model written into its scratch directory beside the old one
COMPILE_MOMENTS = {
    "training": lambda parent, before, lines: any(line.startswith("· ") for line in lines),
    "scratch written": lambda parent, before, lines: bool(new_scratch_files(parent, before) - {LOCK}),
}


@pytest.mark.parametrize("moment", COMPILE_MOMENTS)
def test_compile_killed_before_its_swap_changes_nothing(tmp_path, moment, compiled):
    out = tmp_path / "m"

    def the_old_model() -> None:  # what `compile iris --budget 1kB` wrote
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(compiled("iris", "1kB"), out, symlinks=True)

    the_old_model()
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != LOCK}
    old_hash = assert_complete_model(out)
    reached = COMPILE_MOMENTS[moment]
    again = ("compile", "iris", "--budget", "1kB", "--seed", "3", "--out", str(out))  # another model: other bytes
    proc, _, _ = signal_when(command(*again), lambda proc, lines: reached(tmp_path, set(), lines),
                             again=the_old_model)  # if it ended first (a moment of a few ms of its CPU)
    assert proc.returncode == -signal.SIGKILL  # killed there, not ended
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != LOCK}
    assert after == before
    if moment == "training":
        no_scratch_left(tmp_path)  # nothing was written yet
        return
    assert LOCK in new_scratch_files(tmp_path, set())  # the kill landed in the write: left for the next run
    assert run(*again).returncode == 0
    assert assert_complete_model(out) != old_hash  # replaced by the next run
    no_scratch_left(tmp_path)


# ------------------------------------------------------------------------------------------------ validate


@pytest.fixture(scope="module")
def built_digits_master(shared_once, private_cache, compiled) -> Path:
    """digits / ProtoNN / 1 kB compiled (the run's shared copy of what `compile digits --budget 1kB` writes: its
    budget test trains it too) and built, made once per run for all workers (read-only: copied below)."""

    def make(into: Path) -> None:
        out = into / "digits"
        shutil.copytree(compiled("digits", "1kB"), out, symlinks=True)
        result = run("build", str(out))
        assert result.returncode == 0, result.stderr

    return shared_once("kill-digits-1kB-built", make) / "digits"


@pytest.fixture
def built_digits(built_digits_master, tmp_path) -> Path:
    """A copy of the built model per test: no journal of another test's validate, so each kill lands in the run
    the test started (with a complete old journal, `journal_lines >= N` would hold before the new run began)."""
    out = tmp_path / "digits"
    shutil.copytree(built_digits_master, out, symlinks=True)
    return out


def simulators_of(model: Path) -> list[str]:
    """Live simulator processes started for this model's firmware."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "simuno" in cmdline and str(model) in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("phase", ["vectors", "raw-inputs"])
def test_validate_killed_then_resumed_measures_every_vector_once(built_digits, phase):
    model = built_digits
    n_vectors = len(load_model_dir(model).vectors().labels)
    first_kill_at = 60 if phase == "vectors" else n_vectors + 1  # +1: the binding line
    proc, _, _ = signal_when(command("validate", str(model)), lambda proc, lines: journal_lines(model) >= first_kill_at)
    assert proc.returncode == -signal.SIGKILL  # killed there, not ended
    deadline = time.monotonic() + 10  # it sees its parent gone at its next read: a moment, however busy the machine
    while simulators_of(model) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not simulators_of(model), "the simulator outlived its parent"
    summary = json.loads((model / "validation.json").read_text()) if (model / "validation.json").exists() else {}
    assert summary.get("complete") is not True or summary.get("n_vectors") == n_vectors

    resumed = run("validate", str(model), "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["passed"] and result["complete"] and result["n_vectors"] == n_vectors
    rows = [json.loads(line) for line in (model / "validation.jsonl").read_text().splitlines()[1:]]
    assert sorted(row["i"] for row in rows) == list(range(n_vectors))


def _holds_open(pid: int, path: str) -> bool:
    """Whether process `pid` has `path` open (/proc/PID/fd)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:  # closed meanwhile
            pass
    return False


def test_validate_killed_before_its_first_result_keeps_the_old_journal(built_digits):
    """Killed while it waits for a board that never answers: the previous run's results are still there."""
    model = built_digits
    assert run("validate", str(model), "--no-raw").returncode == 0
    old = (model / "validation.jsonl").read_bytes()
    controller, device = os.openpty()  # a port nobody answers on
    try:
        port = os.ttyname(device)
        proc, _, _ = signal_when(command("validate", str(model), "--no-raw", "--port", port),
                                 lambda proc, lines: _holds_open(proc.pid, port))  # waiting for the board
    finally:
        os.close(controller)
        os.close(device)
    assert proc.returncode == -signal.SIGKILL  # killed there, not ended
    assert (model / "validation.jsonl").read_bytes() == old
    assert run("validate", str(model), "--no-raw", "--resume").returncode == 0


def test_torn_last_line_is_measured_again(built_digits):
    model = built_digits
    assert run("validate", str(model), "--no-raw").returncode == 0
    journal = model / "validation.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 10])  # a kill in the middle of the last write
    resumed = run("validate", str(model), "--no-raw", "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert len(rows) == len({row["i"] for row in rows}) == json.loads(resumed.stdout)["n_vectors"]


def test_a_second_writer_is_refused_while_the_first_runs(built_digits):
    """While one command holds the directory (here this process, holding it as `validate` does), every other
    writer is refused at once, naming the holder; once it lets go, the next one runs. A real validate as the
    holder would race it: it may finish first on a fast machine, and pausing it disturbs its own timing."""
    from tinyproto.core.outdir import locked

    model = built_digits
    with locked(model, "validate"):
        for verb in (("validate", str(model), "--resume"), ("build", str(model)),
                     ("compile", "iris", "--budget", "1kB", "--out", str(model))):
            second = run(*verb)
            assert second.returncode == 1 and "in use by `tinyproto validate`" in second.stderr, second.stderr
            assert f"pid {os.getpid()}" in second.stderr
    assert run("build", str(model)).returncode == 0


# ------------------------------------------------------------------------------------------------ learn, federate


def test_learn_killed_then_run_again(tmp_path, private_cache, compiled):
    model = tmp_path / "fly"  # what `compile iris --model flynn --budget 1kB --learnable` writes: the run's copy
    shutil.copytree(compiled("iris", "1kB", "flynn", learnable=True), model, symlinks=True)
    proc, _, _ = signal_when(command("learn", str(model), "--sim"),
                             lambda proc, lines: (model / "learning" / "build.json").exists())  # its firmware built
    assert proc.returncode == -signal.SIGKILL  # killed there, not ended
    assert not (model / "learned").exists() or assert_complete_model(model / "learned")
    again = run("learn", str(model), "--sim")
    assert again.returncode == 0, again.stderr
    assert_complete_model(model / "learned")
    no_scratch_left(model)


# A federation killed at each moment: its parties reading their rows (the backend's progress line, after the split),
# and a file of its output written (into the scratch directory beside --out; or at --out, which must not happen)
FEDERATE_MOMENTS = {
    "parties read": lambda parent, lines: any(line.startswith("· backend:") for line in lines),
    "scratch written": lambda parent, lines: bool(new_scratch_files(parent, set()) - {LOCK})
    or (parent / "fed").is_dir() and any((parent / "fed").iterdir()),
}


@pytest.mark.parametrize("moment", FEDERATE_MOMENTS)
def test_federate_killed_leaves_no_partial_output(tmp_path, moment):
    # iris and 0.5 kB: the same writes as wine or the default 2 kB, in less time (a whole run 2.7 s of CPU, wine's
    # 3.9 s; measured on this machine, load 8)
    out = tmp_path / "fed"
    again = ("federate", "iris", "--parties", "3", "--backend", "local", "--budget", "0.5kB", "--out", str(out))
    reached = FEDERATE_MOMENTS[moment]
    proc, _, _ = signal_when(command(*again), lambda proc, lines: reached(tmp_path, lines),
                             again=lambda: shutil.rmtree(out))  # if it ended first (a moment of a few ms of its CPU)
    assert proc.returncode == -signal.SIGKILL  # killed there, not ended
    assert not out.exists()  # before its swap: nothing at --out
    if moment == "parties read":
        no_scratch_left(tmp_path)  # nothing was written yet
        return
    assert LOCK in new_scratch_files(tmp_path, set())  # the kill landed in the write: left for the next run
    result = run(*again)
    assert result.returncode == 0, result.stderr
    assert_complete_model(out)
    no_scratch_left(tmp_path)


def test_sigterm_cleans_up_like_ctrl_c(tmp_path):
    out = tmp_path / "m"
    proc, _, err = signal_when(command("compile", "digits", "--budget", "2kB", "--out", str(out)),
                               lambda proc, lines: any("candidate" in line for line in lines),  # in its training
                               signal.SIGTERM)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert not out.exists()
    no_scratch_left(tmp_path)


SIGNAL_DURING_START_UP = textwrap.dedent("""
    import os, signal, sys
    import tinyproto.core.terminal as terminal
    import tinyproto.__main__ as entry
    first, signo = terminal.ascii_safe_stdio, getattr(signal, sys.argv[1])
    def signalled_then_first():  # the signal lands while the CLI is still being imported
        os.kill(os.getpid(), signo)
        first()
    terminal.ascii_safe_stdio = signalled_then_first
    sys.argv = ["tinyproto", "boards"]
    entry.run()
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_during_start_up_is_an_interrupt(name):
    """SIGTERM or SIGHUP before the CLI installed its handlers (numpy, scikit-learn and click being imported)
    killed tinyproto silently (the shell saw 143 / 129, no line); now it is Ctrl-C: one line, exit 130."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child inherits it even under nohup
    try:
        result = subprocess.run([sys.executable, "-c", SIGNAL_DURING_START_UP, name], capture_output=True,
                                text=True, timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.strip() == "interrupted" and result.stdout == ""


SIGNAL_WHILE_CLICK_STARTS = textwrap.dedent("""
    import sys
    import click
    import tinyproto.__main__ as entry
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as a SIGINT landing there does
    where, sys.argv = sys.argv[1], ["tinyproto", "boards"]
    setattr(click.Group, where, interrupted)
    entry.run()
""")


@pytest.mark.parametrize("where", ["_main_shell_completion", "parse_args"])
def test_a_signal_while_click_starts_is_an_interrupt(where):
    """Ctrl-C in click's own start, once the CLI was imported: in its shell-completion check it was a traceback,
    while it parsed the command line "Aborted!" and exit 1 (a compile killed 50 ms after its signal handlers were
    set, test_leftovers); now one line, exit 130, as anywhere else."""
    result = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_CLICK_STARTS, where], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.strip() == "interrupted" and result.stdout == ""


SIGNAL_AFTER_THE_VERB = textwrap.dedent("""
    import os, signal, sys, time
    import tinyproto.__main__ as entry
    signo, sys.argv = getattr(signal, sys.argv[1]), ["tinyproto", "boards"]
    try:
        entry.run()
    except SystemExit as exc:
        code = exc.code
    os.kill(os.getpid(), signo)  # as in the interpreter's teardown, after the verb's work
    time.sleep(0.2)
    sys.exit(code)
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_after_the_verb_finished_changes_nothing(name):
    """A SIGTERM in the moment between a verb's end and the process's (the interpreter's teardown, where Python
    resets its handlers to the default) killed a compile that had written its directory: exit 143, no line. Once
    the verb has ended its exit status stands."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child inherits it even under nohup
    try:
        result = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_THE_VERB, name], capture_output=True, text=True,
                                timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.returncode == 0 and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    assert "uno" in result.stdout


INTERRUPT_THROUGH_EMBEDDED_CODE = textwrap.dedent("""
    import ctypes, sys
    import tinyproto.core.boards as boards
    import tinyproto.__main__ as entry
    run_string = ctypes.pythonapi.PyRun_String
    run_string.restype, run_string.argtypes = ctypes.py_object, [ctypes.c_char_p, ctypes.c_int, ctypes.py_object,
                                                                 ctypes.py_object]
    def rows():  # the SIGTERM lands in Python code a compiled library runs through PyRun_String
        run_string(b"raise KeyboardInterrupt", 257, {}, {})
    boards.boards_table_rows = rows
    sys.argv = ["tinyproto", "boards"]
    entry.run()
""")


def test_an_interrupt_that_passed_through_embedded_code_still_exits_130(tmp_path):
    """`python -m tinyproto federate`, SIGTERM at 4 s: "error: interrupted; nothing was written" and exit 130
    decided, yet the process died of SIGINT (status -2): CPython records a KeyboardInterrupt that left code run
    through PyRun_String (as compiled libraries do), and a `python -m` run then kills itself with SIGINT at its
    exit, whatever status was decided."""
    (tmp_path / "interrupted_entry.py").write_text(INTERRUPT_THROUGH_EMBEDDED_CODE)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child inherits it even under nohup
    try:
        result = subprocess.run([sys.executable, "-m", "interrupted_entry"], capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.strip() == "interrupted; nothing half-written was left behind", result.stderr


SIGNAL_WHILE_DASK_STARTS = textwrap.dedent("""
    import os, signal, sys
    import multiprocessing.context as context
    import tinyproto.__main__ as entry
    original, signo = context.ForkServerProcess._Popen, getattr(signal, sys.argv[1])
    def start_then_signal(process_obj):  # `kill -TERM -PGID` just after dask started its worker process:
        started = original(process_obj)
        os.killpg(0, signo)             # this process, the fork server and the worker get it
        return started
    context.ForkServerProcess._Popen = staticmethod(start_then_signal)
    sys.argv = ["tinyproto", "sweep", "iris", "--models", "protonn", "--budgets", "1kB", "--device", "none",
                "--workers", "1", "--out", sys.argv[2]]
    entry.run()
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_group_while_dask_starts_is_one_interrupt(tmp_path, name):
    """SIGTERM to the process group while sweep's LocalCluster started printed dask's traceback (its exit hook
    closing a half-built cluster) after the one line; SIGINT was already held until the cluster stood, SIGTERM
    was not. Now either is the interruption: one line, exit 130, nothing left."""
    pytest.importorskip("distributed")
    out = tmp_path / "s"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child inherits it even under nohup
    try:
        result = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_DASK_STARTS, name, str(out)], capture_output=True,
                                text=True, timeout=300, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.returncode == 130, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "points" not in line]
    assert lines == ["interrupted; nothing half-written was left behind"], result.stderr
    assert not out.exists() or not [p for p in out.iterdir() if p.name not in (".tinyproto.lock",)], \
        sorted(p.name for p in out.iterdir())
    no_scratch_left(tmp_path)
