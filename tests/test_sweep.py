"""tinyproto sweep: refusals, and a results.jsonl that is complete, resumable after a kill and deterministic.

Kept small (iris, --device none, budgets where one point is refused): the device path is exercised by
tests/test_report.py, whose sweep validates on the simulated board.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tinyproto.cli import main
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.sweep import Point, SweepOptions, parse_grid, read_results, sweep

pytest.importorskip("distributed")

# 8 B is refused by both families (a failed point, recorded); 0.5 kB compiles quickly on iris.
GRID = dict(models="protonn,flynn", budgets="8B,0.5kB", seeds="0", boards="uno", device="none")
GRID_IDS = {"protonn-8B-seed0-uno", "protonn-512B-seed0-uno", "flynn-8B-seed0-uno", "flynn-512B-seed0-uno"}
# The kill test needs work left after the first recorded point on any machine: two seeds leave seven points still
# to run when the first line appears, about 0.5 s of CPU each (a sweep of this grid with four seeds, 16 points, took
# 13.1 s of CPU with one worker, with one seed 6.8 s: `tinyproto sweep iris --workers 1 --device none ...`, every
# process of it counted), against a poll every 10 ms. Each point more costs the three sweeps of the test 0.5 s.
KILL_GRID = dict(GRID, seeds="0,1")
KILL_GRID_IDS = {f"{m}-{b}-seed{s}-uno" for m in ("protonn", "flynn") for b in ("8B", "512B") for s in range(2)}


def _without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_grid_is_parsed_checked_and_ordered():
    points = parse_grid("flynn,protonn,flynn", "1kB,0.5kB,1024", "1,0", "uno")
    assert [p.id for p in points] == ["protonn-512B-seed0-uno", "protonn-512B-seed1-uno", "protonn-1024B-seed0-uno",
                                      "protonn-1024B-seed1-uno", "flynn-512B-seed0-uno", "flynn-512B-seed1-uno",
                                      "flynn-1024B-seed0-uno", "flynn-1024B-seed1-uno"]
    assert parse_grid("FlyNN,flynn", "1kB", "0", "uno") == parse_grid("flynn", "1kB", "0", "uno")  # case-blind
    for models, budgets, seeds, boards, message in [
        ("protonn,svm", "1kB", "0", "uno", "unknown model 'svm'"),
        ("protonn", "1kB,,2kB", "0", "uno", "without empty items"),
        ("protonn", "1 MB", "0", "uno", "unknown unit"),
        ("protonn", "1kB", "-1", "uno", "is not a seed"),
        ("protonn", "1kB", "\uff12", "uno", "is not a seed"),  # the digits 0-9 only (core.option_lists.plain_digits)
        ("protonn", "1kB", "0", "mega", "unknown board 'mega'"),
    ]:
        with pytest.raises(TinyprotoError, match=message):
            parse_grid(models, budgets, seeds, boards)


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be in 1..64"),
    (["--workers", "10000"], "--workers must be in 1..64"),
    (["--workers", "-2"], "--workers must be in 1..64"),
    (["--scheduler", "tcp://127.0.0.1:1", "--workers", "2"], "brings its own workers"),
    (["--timeout", "0"], "--timeout must be a positive"),
    (["--models", "svm"], "unknown model"),
    (["--budgets", "abc"], "is not a size"),
    (["--max-bytes", "x"], "--max-bytes 'x' is not a size"),
    (["--max-bytes", "0"], "--max-bytes '0' is zero"),  # it said "budget '0'": not the option given
    (["--max-ms", "-1"], "--max-ms must be a positive"),
    (["--holdout-classes", "7"], "--holdout-classes: no class '7'"),
    (["--holdout-classes", "0,2"], "must leave at least two classes"),
    (["--holdout-classes", "0,"], "without empty items"),
])
def test_sweep_refuses_bad_arguments_in_one_line(tmp_path, args, message):
    result = _cli("sweep", "iris", "--device", "none", "--out", str(tmp_path / "s"), *args)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_sweep_refuses_foreign_and_model_directories(tmp_path, compiled):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    result = _cli("sweep", "iris", "--device", "none", "--out", str(foreign))
    assert result.exit_code == 1 and "not written by tinyproto" in result.output
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    model_dir = compiled("iris", "0.5kB", "flynn")
    with pytest.raises(TinyprotoError, match="is a model directory"):
        sweep("iris", model_dir, SweepOptions(**GRID))
    with pytest.raises(TinyprotoError, match="nothing to resume"):
        sweep("iris", tmp_path / "new", SweepOptions(resume=True, **GRID))
    assert not (tmp_path / "new").exists()  # the refusal left no directory holding only its lock file


def test_results_survive_a_kill_and_resume_gives_the_same_set(tmp_path):
    # the reference: one uninterrupted sweep (2 workers)
    reference = sweep("iris", tmp_path / "ref", SweepOptions(workers=2, **KILL_GRID))
    assert reference.complete and {r["id"] for r in reference.records} == KILL_GRID_IDS
    lines = read_results(tmp_path / "ref" / "results.jsonl")
    assert [r["id"] for r in lines] == [p.id for p in parse_grid(KILL_GRID["models"], KILL_GRID["budgets"],
                                                                 KILL_GRID["seeds"], "uno")]
    refused = [r for r in lines if r["budget_bytes"] == 8]
    assert all(r["status"] == "failed" and r["stage"] == "compile" and r["error"] for r in refused)
    assert all(r["status"] == "ok" and r["model_bytes"] <= 512 and (tmp_path / "ref" / r["dir"] / "model.json").exists()
               for r in lines if r["budget_bytes"] == 512)

    # the same sweep, killed (driver and its dask workers, SIGKILL) once the first point is recorded
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "tinyproto", "sweep", "iris", "--workers", "1", "--out", str(out),
               *[f"--{k}={v}" for k, v in KILL_GRID.items()]]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_results(out / "results.jsonl")) >= 1:
                break
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = read_results(out / "results.jsonl")
    assert 1 <= len(before) < len(KILL_GRID_IDS), "the sweep was not interrupted midway"
    with open(out / "results.jsonl", "a") as handle:  # and a line torn by the kill, mid-write
        handle.write('{"id": "flynn-512B-seed0-uno", "status": "o')

    with pytest.raises(TinyprotoError, match="already holds a sweep"):
        sweep("iris", out, SweepOptions(**KILL_GRID))  # never silently redone or mixed
    with pytest.raises(TinyprotoError, match="other inputs"):
        sweep("wine", out, SweepOptions(resume=True, **KILL_GRID))
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cluster:
        resumed = sweep("iris", out, SweepOptions(resume=True, scheduler=cluster.scheduler_address,  # --scheduler
                                                  **KILL_GRID))
    assert resumed.skipped == len(before) and resumed.ran == len(KILL_GRID_IDS) - len(before)
    after = read_results(out / "results.jsonl")
    assert (out / "results.jsonl").read_bytes().endswith(b"\n")
    assert [r["id"] for r in after] == [r["id"] for r in lines]  # complete, each point once, grid order
    assert _without_timings(after) == _without_timings(lines)  # deterministic: same content except timings
    assert all(isinstance(r["seconds"], dict) for r in after)

    # nothing left to do: resume is a no-op that starts no cluster; the sweep's files are its own
    again = sweep("iris", out, SweepOptions(resume=True, **KILL_GRID))
    assert again.ran == 0 and again.cluster is None
    config = json.loads((out / "sweep.json").read_text())
    # the killed run never finished; the resumed one and the no-op are recorded with their cluster and times
    assert [run["cluster"] and run["cluster"]["workers"] for run in config["runs"]] == [2, None]
    assert config["runs"][0]["cluster"]["scheduler"].startswith("tcp://")
    from tinyproto.core.manifest import foreign_entries

    assert foreign_entries(out) == []

    # the report of a compile-only sweep: predicted latency and energy, no device figures, the failures listed
    from tinyproto.pipeline.htmlreport import write_report

    report = write_report(tmp_path / "ref")
    assert {p.stem for p in report.figures} == {"accuracy_vs_bytes", "accuracy_vs_latency", "accuracy_vs_energy",
                                                 "risk_coverage", "reliability"}  # host reference confidence
    html = (tmp_path / "ref" / "report.html").read_text()
    assert 'id="failed"' in html and "protonn-8B-seed0-uno" in html and "(pred.)" in html
    assert report.recommendation.startswith("best overall: ") and report.recommendation.endswith(" predicted")


def _line(model: str) -> str:
    """A result line of the shape tinyproto sweep writes (read_results checks every field's type)."""
    point_id = f"{model}-1024B-seed0-uno"
    return json.dumps({"id": point_id, "model": model, "budget_bytes": 1024, "seed": 0, "board": "uno",
                       "status": "failed", "stage": "compile", "error": "budget too small",
                       "dir": f"points/{point_id}"})


def test_torn_results_line_is_dropped_and_cut(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(f'{_line("a")}\n{_line("b")}\n{_line("c")[:-3]}')
    assert [r["model"] for r in read_results(path, repair=True)] == ["a", "b"]
    assert path.read_text() == f'{_line("a")}\n{_line("b")}\n'
    path.write_text(f'{_line("a")}\nnot json\n{_line("b")}\n')
    with pytest.raises(TinyprotoError, match="results.jsonl:2 is not a result line"):
        read_results(path)


@pytest.mark.parametrize("line", ['{"id": "a"}', '{"id": "a", "status": "maybe", "dir": "points/a"}', '[1]'])
def test_a_results_line_that_tinyproto_did_not_write_is_refused(tmp_path, line):
    path = tmp_path / "results.jsonl"
    path.write_text(f"{line}\n{_line('b')}\n")
    with pytest.raises(TinyprotoError, match="results.jsonl:1 is not a result line"):
        read_results(path)


@pytest.mark.parametrize("where", ["top", "device"])
@pytest.mark.parametrize("figures", ['"x"', '{"ece": "x"}', '{"ece": []}', '{"coverage": -1}',
                                     '{"mean_confidence": 1e308}', '{"accepted_accuracy": true}'])
def test_a_results_line_with_damaged_confidence_figures_is_refused(tmp_path, where, figures):
    """The confidence figures are printed and drawn by report: a text ECE was an internal error, a negative
    coverage a figure drawn as measured."""
    entry = json.loads(_line("a"))
    entry["status"], entry["stage"], entry["error"] = "failed", "validate", "a check failed"
    target = entry if where == "top" else entry.setdefault("device", {})
    target["confidence"] = json.loads(figures)
    path = tmp_path / "results.jsonl"
    path.write_text(f"{json.dumps(entry)}\n{_line('b')}\n")
    with pytest.raises(TinyprotoError, match=r"results.jsonl:1 is not a result line \((device\.)?confidence"):
        read_results(path)


def test_a_fifo_in_place_of_the_results_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "results.jsonl")
    with pytest.raises(TinyprotoError, match="is not a regular file"):
        read_results(tmp_path / "results.jsonl")


def test_a_silent_scheduler_is_one_line_not_a_hang(tmp_path, monkeypatch):
    """A service that accepts the connection and never speaks is refused by the probe, within its timeout (3 s
    here rather than the sweep's 30: what is checked is that the wait ends, in one line)."""
    import socket

    import tinyproto.pipeline.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "CONNECT_TIMEOUT_S", 3.0)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        started = time.monotonic()
        result = _cli("sweep", "iris", "--models", "protonn", "--budgets", "1kB", "--device", "none",
                      "--scheduler", f"tcp://127.0.0.1:{port}", "--out", str(tmp_path / "s"))
    assert result.exit_code == 1 and "no dask handshake within 3 s" in result.output, result.output
    assert time.monotonic() - started < 60


def test_a_local_sweep_leaves_nothing_in_the_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    result = _cli("sweep", "iris", "--models", "protonn", "--budgets", "1kB", "--device", "none", "--workers", "1",
                  "--out", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    assert list(scratch.iterdir()) == []


def test_point_ids_are_stable():
    assert Point("flynn", 2048, 3, "uno").id == "flynn-2048B-seed3-uno"


def test_a_sweep_that_waits_too_long_stops_in_one_line(tmp_path):
    # digits at 8 kB trains for many seconds: a 1 s --timeout stops the sweep, cancels the point, keeps DIR usable
    out = tmp_path / "slow"
    result = _cli("sweep", "digits", "--models", "protonn", "--budgets", "8kB", "--device", "none", "--workers", "1",
                  "--timeout", "1", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "no point finished within 1 s (--timeout); 0 of 1 are recorded" in result.output
    assert "Traceback" not in result.output
    assert read_results(out / "results.jsonl") == []
    assert json.loads((out / "sweep.json").read_text())["runs"][0]["points_finished"] == 0


def test_a_sweep_where_every_point_fails_exits_non_zero(tmp_path):
    out = tmp_path / "refused"
    result = _cli("sweep", "iris", "--models", "protonn,flynn", "--budgets", "8B", "--device", "none",
                  "--workers", "1", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "every point of the sweep failed" in result.output
    records = read_results(out / "results.jsonl")
    assert len(records) == 2 and all(r["status"] == "failed" and r["stage"] == "compile" for r in records)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: every point of the sweep failed; see"), last  # two causes: the file has them


def test_a_sweep_whose_points_all_fail_for_one_reason_says_it_in_the_last_line(tmp_path):
    """Was: "every point of the sweep failed; see results.jsonl", the reason (a budget no model fits) only in the
    lines above it."""
    out = tmp_path / "refused"
    result = _cli("sweep", "iris", "--models", "protonn", "--budgets", "1B", "--device", "none", "--workers", "1",
                  "--out", str(out))
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: every point of the sweep failed: budget 1 B is too small for ProtoNN"), last
    assert last.endswith("results.jsonl"), last


@pytest.mark.parametrize("error, words", [
    (OSError(28, "No space left on device", "points/p"), "No space left on device: points/p; free some space"),
    (PermissionError(13, "Permission denied", "points/p"), "Permission denied: points/p"),
])
def test_a_point_that_meets_a_system_error_records_its_words_not_an_internal_error(tmp_path, monkeypatch, error,
                                                                                     words):
    """A sweep into a full disk recorded each point as "internal error (OSError: [Errno 28] ...)", a bug's words
    for the system's refusal; a point records a system error as the CLI prints one."""
    import tinyproto.pipeline.compile as compile_module
    from tinyproto.pipeline.sweep_points import PointSettings, run_point

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(compile_module, "compile_model", refuse)
    point = {"model": "protonn", "budget_bytes": 512, "seed": 0, "board": "uno"}
    record = run_point(point, "iris", str(tmp_path / "p"), PointSettings(device="none"))
    assert record["status"] == "failed" and record["stage"] == "compile", record
    assert record["error"].startswith(words) and "internal error" not in record["error"], record["error"]


def test_holdout_classes_reach_every_point_and_bind_the_sweep(tmp_path):
    """--holdout-classes is compile's at every point: each line carries the held-out rows' AUROC and share
    declined, the summary shows the AUROC, and resuming with other classes held out is refused."""
    out = tmp_path / "held"
    result = _cli("sweep", "iris", "--models", "protonn", "--budgets", "1kB", "--device", "none", "--workers", "1",
                  "--holdout-classes", "2", "--unknown-rate", "5%", "--out", str(out))
    assert result.exit_code == 0, result.output
    (record,) = read_results(out / "results.jsonl")
    held_out = record["confidence"]["held_out"]
    assert held_out["rows"] == 50 and 0.5 < held_out["auroc"] <= 1 and 0 <= held_out["declined"] <= 1, held_out
    assert "AUROC" in result.output and f"{held_out['auroc']:.3f}" in result.output
    with pytest.raises(TinyprotoError, match="other inputs"):
        sweep("iris", out, SweepOptions(models="protonn", budgets="1kB", resume=True, device="none",
                                        unknown_rate="5%", holdout_classes="1"))


def test_max_latency_reaches_every_point_and_binds_the_sweep(tmp_path):
    """--max-latency is compile's limit at every point: ok points are predicted within it, a point that cannot
    meet it is recorded as failed with the solver's message; resuming with another limit is refused."""
    out = tmp_path / "fast"
    result = sweep("iris", out, SweepOptions(models="protonn,flynn", budgets="1kB", seeds="0", boards="uno",
                                             device="none", workers=1, max_latency_ms=0.5))
    assert {r["status"] for r in result.records} == {"ok"}
    assert all(r["predicted_latency_ms"] <= 0.5 for r in result.records)
    with pytest.raises(TinyprotoError, match="other inputs"):
        sweep("iris", out, SweepOptions(models="protonn,flynn", budgets="1kB", resume=True, device="none",
                                        max_latency_ms=2.0))
    impossible = sweep("iris", tmp_path / "impossible", SweepOptions(models="protonn", budgets="1kB", device="none",
                                                                     workers=1, max_latency_ms=0.001))
    (record,) = impossible.records
    assert record["status"] == "failed" and record["stage"] == "compile" and "0.001 ms" in record["error"]
    result = _cli("sweep", "iris", "--device", "none", "--max-latency", "0", "--out", str(tmp_path / "bad"))
    assert result.exit_code == 1 and "--max-latency must be a positive" in result.output


def test_a_killed_runs_scratch_is_removed_by_the_next_run_and_a_live_one_is_kept(tmp_path, monkeypatch):
    import tempfile

    from tinyproto.core.manifest import LOCK
    from tinyproto.core.outdir import private_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / "tinyproto-dask-stale"  # a SIGKILLed run's: its lock file has no holder
    stale.mkdir()
    (stale / LOCK).write_text("123 scratch\n")
    (stale / "worker-1").mkdir()
    foreign = tmp_path / "tinyproto-dask-user"  # no lock file and something in it: not one of ours, kept
    foreign.mkdir()
    (foreign / "notes.txt").write_text("a user's file\n")
    killed_early = tmp_path / "tinyproto-dask-empty"  # empty, no lock: a run killed before it locked it
    killed_early.mkdir()
    with private_scratch("tinyproto-dask-") as live:
        assert not stale.exists() and not killed_early.exists() and foreign.exists()
        with private_scratch("tinyproto-dask-") as other:  # a concurrent run keeps the first one's directory
            assert live.exists() and other != live
    assert not live.exists() and not other.exists() and (foreign / "notes.txt").read_text() == "a user's file\n"


def test_resume_runs_again_a_point_whose_directory_is_gone_and_report_names_lost_results(tmp_path, monkeypatch):
    """A compiled point whose points/<id> was deleted is run again by --resume (its line was a figure of a model
    that no longer exists); a sweep whose results.jsonl is gone while points/ holds models is refused by report in
    one line, not reported as "no point compiled". Run from a directory holding a directory named like the
    built-in data set: the workers must still load the built-in set, not that directory."""
    work = tmp_path / "cwd"
    (work / "iris").mkdir(parents=True)
    monkeypatch.chdir(work)
    out = tmp_path / "s"
    grid = ["--models", "flynn", "--budgets", "8B,0.5kB", "--device", "none", "--workers", "1", "--out", str(out)]
    assert _cli("sweep", "iris", *grid).exit_code == 0
    first = read_results(out / "results.jsonl")
    assert [r["status"] for r in first] == ["failed", "ok"]
    lost = first[1]["id"]
    import shutil

    shutil.rmtree(out / "points" / lost)
    result = _cli("sweep", "iris", *grid, "--resume")
    assert result.exit_code == 0, result.output
    assert (out / "points" / lost / "model.json").is_file()
    again = read_results(out / "results.jsonl")
    assert _without_timings(again) == _without_timings(first)  # each point once, the same figures

    # a line that disagrees with its point's files: --resume of a larger grid ran the new point, then refused the
    # directory as damaged, having written the point and a run into sweep.json; it refuses before anything now
    results = out / "results.jsonl"
    saved = results.read_text()
    results.write_text("".join(json.dumps(dict(line, model_bytes=7) if line["id"] == lost else line) + "\n"
                               for line in map(json.loads, saved.splitlines())))
    before = {name: (out / name).read_bytes() for name in ("sweep.json", "results.jsonl")}
    result = _cli("sweep", "iris", *[("8B,0.5kB,1kB" if a == "8B,0.5kB" else a) for a in grid], "--resume")
    assert result.exit_code == 1 and "says model_bytes 7, but" in result.stderr, result.output
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not (out / "points" / "flynn-1024B-seed0-uno").exists()
    results.write_text(saved)

    for damage, words in [("garbage", "holds no result line"), ("empty", "holds no result line"),
                          ("missing", "is missing")]:
        (out / "results.jsonl").unlink()
        if damage != "missing":
            (out / "results.jsonl").write_bytes(b"\x00\xff not a line" if damage == "garbage" else b"")
        result = CliRunner().invoke(main, ["report", str(out)])
        assert result.exit_code == 1, result.output
        assert result.stderr.strip().splitlines() == [result.stderr.strip()]
        assert f"results.jsonl {words}" in result.stderr and "1 compiled point" in result.stderr
        assert "--resume" in result.stderr and not (out / "report.html").exists()


@pytest.mark.parametrize("field, value, wording", [("seed", "1.5", "seed is 1.5, not an integer"),
                                                    ("budget_bytes", '"1kB"', 'budget_bytes is "1kB", not an integer'),
                                                    ("model", "7", "model is 7, not text")])
def test_a_results_line_of_the_wrong_type_is_named_in_plain_words(tmp_path, field, value, wording):
    entry = json.loads(_line("a"))
    entry[field] = json.loads(value)
    path = tmp_path / "results.jsonl"
    path.write_text(f"{json.dumps(entry)}\n{_line('b')}\n")
    with pytest.raises(TinyprotoError, match=f"results.jsonl:1 is not a result line \\({wording}\\)"):
        read_results(path)


def test_sweep_called_by_a_worker_importing_the_users_script_refuses_before_touching_a_file(tmp_path, monkeypatch):
    """A script calling sweep() with no `if __name__ == "__main__":` guard: every worker process imports it again
    (multiprocessing's start), so each called sweep() on the same directory; the first run said "Nanny failed to
    start" and a worker's run failed writing sweep.json (FileNotFoundError). In such a worker sweep() refuses at
    once, and the first run's error says what to do."""
    import multiprocessing
    import types

    from tinyproto.core import dask_cluster

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(TinyprotoError, match=r"put the call under `if __name__ == \"__main__\":`"):
        sweep("iris", tmp_path / "out", SweepOptions(models="protonn", budgets="512B", device="none"))
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", False, raising=False)

    script = types.ModuleType("__main__")
    script.__file__, script.__spec__ = str(tmp_path / "my_sweep.py"), None
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert "imports " + str(tmp_path / "my_sweep.py") in dask_cluster._script_hint(None, processes=True)
    assert dask_cluster._script_hint("tcp://127.0.0.1:8786", processes=True) == ""
    script.__file__ = os.path.join(sys.prefix, "bin", "tinyproto")  # the command line: nothing to add
    assert dask_cluster._script_hint(None, processes=True) == ""


def test_a_sim_sweep_into_a_directory_platformio_cannot_build_in_is_refused_before_any_point(tmp_path):
    """--device sim builds every point in DIR/points: with two spaces in a row in DIR's path (PlatformIO reads them
    as one) every point failed after its compile; refused in one line now, nothing written."""
    from tinyproto.device.build import platformio_available

    if not platformio_available():
        pytest.skip("PlatformIO is not installed: the points build with avr-gcc")
    with pytest.raises(TinyprotoError, match="2 spaces in a row"):
        sweep("iris", tmp_path / "a  b", SweepOptions(models="protonn", budgets="512B", device="sim"))
    assert os.listdir(tmp_path) == []
