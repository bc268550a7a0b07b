"""What a killed run leaves, and that the next run of any verb on that directory removes it (core/outdir.py,
"leftovers"): write_json's temporary files beside a model's JSON files, and scratch directories beside an output,
empty or not. Only names tinyproto writes, only when no live process holds them, nothing else."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import new_scratch_files, scratch_dirs, signal_when, tinyproto

from tinyproto.core.manifest import LOCK, SCRATCH_PREFIX
from tinyproto.core.outdir import is_leftover_name, locked, tidy

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None, timeout=600):
    return tinyproto(*args, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def model(compiled):
    """iris / FlyNN / 1 kB, compiled once per run (conftest's `compiled`); this module's copy."""
    return compiled("iris", "1kB", "flynn")


@pytest.fixture
def fresh(model, tmp_path):
    """A private copy of the compiled model directory (its manifest still true)."""
    copy = tmp_path / "m"
    shutil.copytree(model, copy, symlinks=True)
    (copy / LOCK).unlink(missing_ok=True)
    return copy


def _temp_like_write_json(directory: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.write(fd, b'{"half": ')
    os.close(fd)
    return Path(tmp)


def test_only_write_json_temporaries_count_as_leftovers():
    for name in ("validation.json", "build.json", "learn.json", "sweep.json", ".tinyproto", "export.json"):
        assert is_leftover_name(Path(tempfile.mktemp(prefix=f".{name}.", suffix=".tmp")).name)
    for name in (".validation.json.tmp", "validation.json.abcdefgh.tmp", ".notes.txt.abcdefgh.tmp",
                 ".validation.json.abcdefgh.tmp.bak", ".validation.json.abc.tmp"):
        assert not is_leftover_name(name), name


@pytest.mark.parametrize("verb", ["compile", "export", "tidy"])
def test_the_next_run_removes_a_killed_writers_temporary(fresh, tmp_path, verb):
    leftover = _temp_like_write_json(fresh, "validation.json")
    users = fresh.parent / ".validation.json.tmp"  # beside, not inside: never ours
    users.write_text("the user's")
    if verb == "compile":
        result = cli("compile", "iris", "--model", "flynn", "--budget", "1kB", "--out", fresh)
        assert result.returncode == 0, result.stderr
    elif verb == "export":
        result = cli("export", fresh, "--arduino", "--out", tmp_path / "lib")
        assert result.returncode == 0, result.stderr
    else:
        tidy(fresh)
    assert not leftover.exists()
    assert users.read_text() == "the user's"


def test_a_live_writers_temporary_is_kept(fresh):
    with locked(fresh, "validate"):
        mine = _temp_like_write_json(fresh, "validation.json")
        child = subprocess.run([sys.executable, "-c", f"from tinyproto.core.outdir import tidy; tidy({str(fresh)!r})"],
                               capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, child.stderr
        assert mine.exists()  # the lock is held: it may be being written
    tidy(fresh)
    assert not mine.exists()


def test_a_directory_tinyproto_did_not_write_is_not_touched(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / LOCK).write_text("")
    leftover = _temp_like_write_json(theirs, "validation.json")
    tidy(theirs)
    assert leftover.exists()


def test_killed_validate_writer_then_compile_out(fresh):
    """A real SIGKILL while write_json rewrites validation.json over and over (as validate does), then the next
    compile --out on that directory: it is replaced, not refused for a file tinyproto did not write."""
    script = (f"import sys; from pathlib import Path; from tinyproto.core.safe_io import write_json\n"
              f"from tinyproto.core.outdir import locked\n"
              f"from tinyproto.core.manifest import record_outputs\n"
              f"with locked(Path({str(fresh)!r}), 'validate'):\n"
              f"    record_outputs(Path({str(fresh)!r}), 'validation.json')  # as validate does\n"
              f"    print('go', flush=True)\n"
              f"    while True: write_json(Path({str(fresh)!r}) / 'validation.json', {{'x': list(range(200000))}})\n")
    found = False
    for attempt in range(10):  # killed as soon as a temporary is seen (it may be renamed in between: try again)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 120
        while not any(is_leftover_name(p.name) for p in fresh.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if any(is_leftover_name(p.name) for p in fresh.iterdir()):
            found = True
            break
    assert found, "the kill never landed mid-write in 10 tries"
    result = cli("compile", "iris", "--model", "flynn", "--budget", "1kB", "--out", fresh)
    assert result.returncode == 0, result.stderr
    assert not any(is_leftover_name(p.name) for p in fresh.iterdir())


def test_empty_and_dead_scratch_directories_are_removed_live_ones_kept(tmp_path):
    from tinyproto.core.outdir import _new_scratch, remove_stale_scratch

    empty = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=tmp_path))  # killed before its lock was made
    dead = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=tmp_path))
    (dead / LOCK).write_text("")
    (dead / "model.json").write_text("{}")
    live, fd = _new_scratch(tmp_path, "compile")
    (live / "model.json").write_text("{}")
    user_file = tmp_path / (SCRATCH_PREFIX + "notes")
    user_file.write_text("a file, not a directory")
    other = tmp_path / "empty-dir"
    other.mkdir()
    try:
        remove_stale_scratch(tmp_path)
        assert not empty.exists() and not dead.exists()
        assert live.exists() and user_file.exists() and other.exists()
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser")
def test_another_users_private_scratch_in_a_shared_tmp_is_left_alone():
    """Build tools' scratch is a private directory in $TMPDIR (tinyproto-tool-*): another user's command, cleaning up
    killed runs' scratch there, could not look inside one of root's and failed with "Permission denied" (a build
    by one user while another user built)."""
    import site

    from helpers import other_user_python
    from tinyproto.core.outdir import _new_scratch
    from tinyproto.core.resources import IMPORT_ROOT

    python = other_user_python()
    if python is None:
        pytest.skip("no Python interpreter of this version that the user nobody may run")
    shared = Path(tempfile.mkdtemp(prefix="tinyproto-test-shared-tmp-"))
    try:
        shared.chmod(0o1777)  # like /tmp
        mine, fd = _new_scratch(shared, "scratch", "tinyproto-tool-")  # root's, mode 0700, lock held
        os.close(fd)  # and dead: another user's run may not remove it either (it cannot)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(shared), "LANG": "C.UTF-8",
               "PYTHONPATH": os.pathsep.join([str(IMPORT_ROOT), *site.getsitepackages()])}
        code = ("import sys; from pathlib import Path; from tinyproto.core.outdir import private_scratch; import os\n"
                "os.environ['TMPDIR'] = sys.argv[1]\nimport tempfile; tempfile.tempdir = sys.argv[1]\n"
                "with private_scratch('tinyproto-tool-') as scratch: print(scratch.stat().st_uid)")
        command = [shutil.which("runuser"), "-u", "nobody", "--", "env", *[f"{k}={v}" for k, v in env.items()],
                   python, "-c", code, str(shared)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert int(result.stdout) != 0 and mine.is_dir()  # nobody made its own; root's is still there
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_dead_scratch_beside_a_model_is_removed_by_any_verb_that_locks_it(fresh):
    """A compile --out killed while it replaced a model left its scratch beside it, and build / validate / learn
    on that model (which take its lock, not its parent's) kept it for ever; export and flash (tidy) removed it."""
    from tinyproto.core.outdir import _new_scratch, locked

    parent = fresh.parent
    dead = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    (dead / LOCK).write_text("")
    (dead / "model.json").write_text("{}")
    empty = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    live, fd = _new_scratch(parent, "compile")
    try:
        with locked(fresh, "validate"):
            pass
        assert scratch_dirs(parent) == [live.name]
    finally:
        os.close(fd)
    assert not dead.exists() and not empty.exists()


def _handles_sigterm_and_sighup(pid: int) -> bool:
    """Whether the process catches SIGTERM and SIGHUP (/proc/PID/status, SigCgt): `python -m tinyproto`'s run()
    sets both handlers first thing, before it imports the CLI."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return all(caught >> (signum - 1) & 1 for signum in (signal.SIGTERM, signal.SIGHUP))


# The moments a compile is killed at, each an event seen from outside (not a delay, which lands elsewhere on a
# slower or busier machine): its start (run()'s signal handlers set, then 50 ms, so inside its try), its training
# (the solver's first progress line), its scratch directory made (its lock in it), and a file written into it.
KILL_MOMENTS = {
    "starting": lambda proc, lines, parent, before: _handles_sigterm_and_sighup(proc.pid),
    "training": lambda proc, lines, parent, before: any(line.startswith("· flynn:") for line in lines),
    "scratch made": lambda proc, lines, parent, before: LOCK in new_scratch_files(parent, before),
    "scratch written": lambda proc, lines, parent, before: bool(new_scratch_files(parent, before) - {LOCK}),
}


@pytest.mark.slow
@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/status").exists(), reason="needs /proc/PID/status")
def test_a_compile_killed_at_each_moment_leaves_nothing_the_next_run_keeps(tmp_path):
    """SIGKILL and SIGINT a compile at each moment of KILL_MOMENTS, from before its scratch exists to writing
    into it: SIGINT ends it with its one line and exit 130, SIGKILL in the scratch leaves it there (the kill
    landed), and the next compile into the same parent leaves no scratch directory behind. (A table of 40 rows and
    a small budget: what is left does not depend on them, and the search is short.)"""
    data = tmp_path / "two.csv"
    data.write_text("a,b,label\n" + "".join(f"{i % 7 + 3 * (i % 2)},{i % 5 - i % 2},{i % 2}\n" for i in range(40)))
    args = ["compile", str(data), "--model", "flynn", "--budget", "256B", "--out", str(tmp_path / "m")]
    command = [sys.executable, "-m", "tinyproto", *args]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the children inherit it even under nohup
    try:
        _kill_at_each_moment(command, tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    assert scratch_dirs(tmp_path) == []


def _kill_at_each_moment(command: list[str], parent: Path) -> None:
    for sig, (moment, reached) in itertools.product((signal.SIGKILL, signal.SIGINT), KILL_MOMENTS.items()):
        before = set(scratch_dirs(parent))
        proc, _, err = signal_when(command, lambda proc, lines: reached(proc, lines, parent, before), sig,
                                   then=0.05 if moment == "starting" else 0.0,
                                   again=lambda: None)  # it ended first (a moment of a few ms of its CPU): its
        # model replaced the last, and the next try writes into the same parent
        assert "Traceback" not in err, (moment, err)
        if sig == signal.SIGINT:
            assert proc.returncode == 130 and err.startswith("interrupted") and err.count("\n") == 1, (moment, err)
        elif moment.startswith("scratch"):
            assert LOCK in new_scratch_files(parent, before), moment  # killed with it: left for the next run


# ---------------------------------------------------------------------------------------------- failed writes


FILES_REWRITTEN_IN_PLACE = ["build.json", "validation.json", "validation.jsonl", "learn.json", "report.html",
                            "sweep.json", "results.jsonl"]


@pytest.mark.parametrize("name", FILES_REWRITTEN_IN_PLACE)
def test_a_directory_where_a_file_is_rewritten_is_refused_before_writing(fresh, name):
    """report wrote its page to .report.html.tmp, then failed to rename it onto the user's directory: 'Is a
    directory: .../.report.html.tmp' (a message naming the wrong file) and the temporary file left behind."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.core.manifest import record_outputs

    (fresh / name).unlink(missing_ok=True)
    (fresh / name).mkdir()
    (fresh / name / "mine.txt").write_text("precious\n")
    before = sorted(p.name for p in fresh.iterdir())
    with pytest.raises(TinyprotoError, match=f"{name} is a directory, where tinyproto writes a file"):
        record_outputs(fresh, name)
    assert sorted(p.name for p in fresh.iterdir()) == before
    assert (fresh / name / "mine.txt").read_text() == "precious\n"


@pytest.mark.parametrize("name", [".pio", "learning", "learned", "figures", "points"])
def test_a_file_where_a_directory_is_written_is_refused_before_writing(fresh, name):
    """learn over a file at learning/ said only "error: File exists: m/learning"."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.core.manifest import record_outputs

    (fresh / name).write_text("precious\n")
    with pytest.raises(TinyprotoError, match=f"{name} is a file, where tinyproto writes a directory"):
        record_outputs(fresh, name)
    assert (fresh / name).read_text() == "precious\n"


def test_report_refuses_a_directory_at_report_html_and_leaves_nothing(fresh):
    from click.testing import CliRunner

    from tinyproto.cli import main

    (fresh / "report.html").mkdir()
    (fresh / "report.html" / "mine.txt").write_text("precious\n")
    result = CliRunner().invoke(main, ["report", str(fresh)])
    assert result.exit_code == 1 and "report.html is a directory" in result.stderr, result.output
    assert not list(fresh.glob(".*.tmp")) and not (fresh / "figures").exists()
    assert (fresh / "report.html" / "mine.txt").read_text() == "precious\n"


@pytest.mark.parametrize("writer", ["write_bytes_atomic", "write_json"])
def test_an_atomic_write_that_fails_leaves_no_temporary(tmp_path, writer):
    """Both of safe_io's writers (write_bytes_atomic: report's page and figures, the sweep's results; write_json:
    every JSON file) remove their temporary file when the write or the rename fails (a full disk, a directory in
    the way; before, report left .report.html.tmp), name the file they were writing, and write an ordinary file
    (0644, not mkstemp's private mode)."""
    from tinyproto.core import safe_io

    def write(path):
        if writer == "write_json":
            safe_io.write_json(path, {"a": 1})
        else:
            safe_io.write_bytes_atomic(path, b"<html>")

    (tmp_path / "page.html").mkdir()
    with pytest.raises(OSError) as info:
        write(tmp_path / "page.html")
    assert info.value.filename == str(tmp_path / "page.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]
    write(tmp_path / "other.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.html", "page.html"]
    assert (tmp_path / "other.html").stat().st_mode & 0o777 == 0o644


def test_the_library_measurement_of_a_killed_export_is_removed_by_the_next(compiled, tmp_path, monkeypatch):
    """export (and compile --reserve-*) measure the model's library by building it in a scratch directory of the
    temporary directory; one a SIGKILL left is removed by the next measurement (it stayed there for ever)."""
    from tinyproto import families
    from tinyproto.core.boards import load_board
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.device.library_cost import measure_library

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    killed = private / "tinyproto-library-killed1"
    (killed / "lib").mkdir(parents=True)
    (killed / LOCK).write_text("")  # its lock, held by nobody now
    model = families.load_int_model(load_model_dir(compiled("iris", "1kB")))
    assert measure_library(model, load_board("uno")).flash_bytes > 0
    assert list(private.iterdir()) == []


FORK_SERVER = """
import os, signal, sys
from tinyproto.core.dask_cluster import start_forkserver_deaf_to_ctrl_c
assert start_forkserver_deaf_to_ctrl_c() == "forkserver"
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def short_tmp():
    """A private temporary directory with a short path: under a long one the fork server's socket goes to /tmp
    (core/dask_cluster.short_temp_dir)."""
    path = Path(tempfile.mkdtemp(prefix="tp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_fork_server_directory_of_a_killed_run_is_removed_by_the_next(short_tmp):
    """sweep and federate --processes start multiprocessing's fork server, whose socket lived in a pymp-* directory
    of $TMPDIR that only a normal exit removed: after a SIGKILL it stayed there for ever. The next run removes it."""
    private = short_tmp
    env = dict(os.environ, TMPDIR=str(private))
    killed = subprocess.run([sys.executable, "-c", FORK_SERVER, "kill"], env=env, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert len(os.listdir(private)) == 1  # what the killed run left
    deadline = time.monotonic() + 30
    while True:  # its fork server ends when it sees its parent gone (and releases the directory's lock)
        after = subprocess.run([sys.executable, "-c", FORK_SERVER, "exit"], env=env, capture_output=True, timeout=120)
        assert after.returncode == 0, after.stderr
        if os.listdir(private) == [] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert os.listdir(private) == []


@pytest.mark.parametrize("ended", ["finished", "timed out"])
def test_a_build_tools_temporary_files_are_not_left_in_tmpdir(tmp_path, monkeypatch, ended):
    """Ctrl-C during learn's (or build's) link left avr-gcc's cc*.ld / cc*.le / cc*.o / cc*.c in $TMPDIR (the
    tool's process group is ended, and gcc's own clean-up races the kill). Every build tool now runs with a
    private TMPDIR that is removed when it ends, however it ends."""
    from tinyproto.device.project import _run

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    script = 'echo "$TMPDIR"; : > "$TMPDIR/ccA1b2C3.ld"; : > "$TMPDIR/ccD4e5F6.o"'
    if ended == "finished":
        result = _run(["sh", "-c", script])
        used = Path(result.stdout.strip())
    else:
        with pytest.raises(subprocess.TimeoutExpired):
            _run(["sh", "-c", f"{script}; sleep 60"], timeout=1)
        used = None
    assert used is None or used.parent == tmp
    assert list(tmp.iterdir()) == [], sorted(p.name for p in tmp.rglob("*"))
