"""Compile on every core: the solvers validate candidates in worker processes, and the model (its header, byte
for byte) does not depend on how many."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import tinyproto

from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.families.solving import JOBS_VARIABLE, default_jobs


def one_worker_compile(compiled, tmp_path, family: str):
    """What `compile wine --budget 1kB --model FAMILY --jobs 1` writes: the run's shared compile of it (conftest's
    `compiled`) where the suite compiles with one worker (its TINYPROTO_JOBS=1, unless the environment sets another),
    else a compile of its own."""
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    if default_jobs() == 1:
        return compiled("wine", "1kB", family)
    return compile_model("wine", CompileOptions(family, "1kB", 0, out=tmp_path / "j1", jobs=1)).out_dir


@pytest.mark.parametrize("name", families.names())
def test_the_header_is_the_same_with_one_and_two_workers(compiled, tmp_path, name):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    headers = [(one_worker_compile(compiled, tmp_path, name) / "include/tinyproto_model.h").read_bytes()]
    compile_model("wine", CompileOptions(name, "1kB", 0, out=tmp_path / "j2", jobs=2))
    headers.append((tmp_path / "j2/include/tinyproto_model.h").read_bytes())
    assert headers[0] == headers[1]


@pytest.mark.slow
def test_protonn_fits_in_two_workers_give_the_same_header(compiled, tmp_path, monkeypatch):
    """ProtoNN starts workers only for large searches; with the threshold at 0 the wine search runs in two worker
    processes (each (shape, fold) fit a task) and must give the single process's header and report."""
    import json

    from tinyproto.families.protonn import solver
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    monkeypatch.setattr(solver, "PARALLEL_MIN_VALUES", 0)
    # one worker runs every fit in its own process whatever the threshold
    compile_model("wine", CompileOptions("protonn", "1kB", 0, out=tmp_path / "j2", jobs=2))
    outs = []
    for out in (one_worker_compile(compiled, tmp_path, "protonn"), tmp_path / "j2"):
        report = json.loads((out / "report.json").read_text())
        outs.append(((out / "include/tinyproto_model.h").read_bytes(), (out / "model.json").read_bytes(),
                     report["solver"]["candidates"], report["solver"]["confidence"]))
    assert outs[0] == outs[1]


def test_the_default_is_every_usable_core(monkeypatch):
    import os

    monkeypatch.delenv(JOBS_VARIABLE, raising=False)  # the suite sets it (conftest): a user who sets none
    assert default_jobs() == len(os.sched_getaffinity(0))


def test_the_environment_sets_the_default_and_a_bad_value_is_one_error(monkeypatch, tmp_path):

    monkeypatch.setenv(JOBS_VARIABLE, "3")
    assert default_jobs() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(JOBS_VARIABLE, bad)
        with pytest.raises(TinyprotoError, match=f"{JOBS_VARIABLE} must be a whole number"):
            default_jobs()
    result = tinyproto("compile", "iris", "--out", str(tmp_path / "m"), timeout=120)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"error: {JOBS_VARIABLE} must be a whole number of processes, at least 1; got '-1'"]
    assert not (tmp_path / "m").exists()


def test_inside_a_dask_worker_the_default_is_one(monkeypatch):
    """sweep and federate spread their work over a dask cluster: a solver inside one of its workers takes one
    process, not a pool of its own (default_jobs imports distributed only when the process already has), whatever
    $TINYPROTO_JOBS says."""
    from distributed import Client, LocalCluster

    monkeypatch.setenv(JOBS_VARIABLE, "2")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        assert client.submit(default_jobs).result() == 1


def _loky_workers_of(pid: int) -> list[int]:
    """The loky worker processes whose parent is `pid` (from /proc: no extra dependency)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or b"LokyProcess" not in (entry / "cmdline").read_bytes():
                continue
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # the process ended while it was read
    return found


@pytest.mark.slow
def test_a_killed_compile_takes_its_solver_workers_with_it(tmp_path):
    """A compile killed by SIGKILL left its workers computing their queued fits, holding its output pipes open."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "tinyproto", "compile", "digits", "--budget", "2kB", "--jobs", "2",
               "--out", str(tmp_path / "m")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (workers := _loky_workers_of(process.pid)) and time.monotonic() < deadline:
            assert process.poll() is None, "the compile ended before it started a worker"
            time.sleep(0.2)
        assert workers, "no solver worker started within 120 s"
        process.kill()
        process.wait()
        deadline = time.monotonic() + 15
        while (alive := [w for w in workers if os.path.exists(f"/proc/{w}")]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, f"solver workers {alive} outlived the killed compile"
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


WORKERS_AND_CTRL_C = textwrap.dedent("""
    import os, signal, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, even under nohup
    from tinyproto.families.solving import map_in_processes
    def probe(i):
        time.sleep(0.2)
        return os.getpid(), signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    results = map_in_processes(probe, [(i,) for i in range(6)], 2)
    workers = {ignored for pid, ignored in results if pid != os.getpid()}
    print("workers", sorted(workers), "parent", signal.getsignal(signal.SIGINT) is signal.default_int_handler,
          signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
""")


def test_solver_workers_never_see_ctrl_c_and_the_parent_keeps_it():
    """Ctrl-C during compile --model auto printed a KeyboardInterrupt traceback from a loky worker that was still
    importing (the terminal signals the whole process group). Workers start with SIGINT ignored; the parent's
    handler and signal mask are as before."""
    result = subprocess.run([sys.executable, "-c", WORKERS_AND_CTRL_C], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["workers", "[True]", "parent", "True", "False"], result.stdout


def test_one_thread_limits_the_libraries_and_a_new_import_makes_a_new_controller(monkeypatch):
    """solving.one_thread is threadpool_limits(limits=1) with one controller kept while no module is imported: the
    limit holds inside and is undone after, and an import (which may load a BLAS) makes a controller that sees it."""
    import sys
    import types

    from threadpoolctl import threadpool_info

    from tinyproto.families import solving

    before = threadpool_info()
    with solving.one_thread("blas"):
        inside = threadpool_info()
    assert [i["num_threads"] for i in inside if i["user_api"] == "blas"] == [1] * len(
        [i for i in before if i["user_api"] == "blas"])
    assert threadpool_info() == before
    with solving.one_thread():
        first = solving._THREADPOOLS[1]
        assert all(i["num_threads"] == 1 for i in threadpool_info())
    with solving.one_thread():
        assert solving._THREADPOOLS[1] is first  # nothing imported in between: the same controller
    monkeypatch.setitem(sys.modules, "tinyproto_test_a_new_module", types.ModuleType("tinyproto_test_a_new_module"))
    with solving.one_thread():
        assert solving._THREADPOOLS[1] is not first
