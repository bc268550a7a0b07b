"""Cases from a sixth fault campaign, on run state (sweeps, reports, validations, flashing, learning, federating),
run as a hostile user would, by class of fault, each one a failure that campaign found: results.jsonl, sweep.json,
report.json and validation.json holding values of the wrong JSON type (a list for a number, NaN, a huge integer,
null), a link or a FIFO in an output's place, a directory holding only a dead run's lock, a failed sweep leaving
its new --out behind (and the concurrent case: a refused sweep must never remove what another one writes), avrdude
hanging when the port vanishes, `learn --port` refused only after a long build, and federate's device parties
leaving their build in $TMPDIR after a kill.

Every refused case asserts: exit status 1 (or click's 2), one message naming the problem, no traceback, no file
of the user changed, and nothing left behind (in the directory, beside it, or in the temporary directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import needs
from test_campaign_s4 import _snapshot, accepted, refused, work  # noqa: F401  (work: the fixture)

from tinyproto.cli import main
from tinyproto.core.modeldir import LOCK

SWEEP = ["iris", "--models", "protonn", "--budgets", "1kB", "--device", "none", "--workers", "1"]


@pytest.fixture(scope="module")
def sweep_master(tmp_path_factory) -> Path:
    """One finished compile-only sweep (iris, ProtoNN, 1 kB), copied for each test that damages it."""
    from tinyproto.pipeline.sweep import SweepOptions, sweep

    out = tmp_path_factory.mktemp("s6-sweep") / "sweep"
    sweep("iris", out, SweepOptions(models="protonn", budgets="1kB", device="none", workers=1))
    return out


@pytest.fixture
def swept(sweep_master, work) -> Path:
    return _private_copy(sweep_master, work / "sweep")


def _private_copy(master: Path, copy: Path) -> Path:
    """A test's own copy of a module-wide directory, so what one test damages no other sees."""
    shutil.copytree(master, copy, symlinks=True)
    return copy


def _edit_line(path: Path, key: str, value) -> None:
    record = json.loads(path.read_text().splitlines()[0])
    record[key] = value
    path.write_text(json.dumps(record) + "\n")


# ------------------------------------------------------------------------------------------------ typed reads


@pytest.mark.parametrize("key, value", [("model", []), ("model", None), ("budget_bytes", "1kB"), ("seed", 10**400),
                                        ("float_accuracy", float("nan")), ("int8_accuracy", 7),
                                        ("model_bytes", {"a": 1}), ("predicted_latency_ms", None),
                                        ("device", [1]), ("device", {"accuracy": "high"}), ("board", 5)])
def test_a_results_line_of_the_wrong_type_is_one_error_for_report_and_resume(swept, key, value):
    """Was: TypeError / OverflowError tracebacks from the figures, or NaN drawn as a result."""
    _edit_line(swept / "results.jsonl", key, value)
    line = refused(["report", str(swept)], "results.jsonl:1", swept.parent)
    assert key.split(".")[0] in line or "id or directory" in line
    refused(["sweep", *SWEEP, "--out", str(swept), "--resume"], "results.jsonl:1", swept.parent)


@pytest.mark.parametrize("key, value", [("binding", [1]), ("binding", "x"), ("runs", 5), ("runs", [[1]]),
                                        ("runs", [{"cluster": "x"}]), ("format", None), (None, [])])
def test_a_sweep_json_of_the_wrong_shape_is_one_error(swept, key, value):
    config = json.loads((swept / "sweep.json").read_text())
    config = value if key is None else {**config, key: value}
    (swept / "sweep.json").write_text(json.dumps(config))
    refused(["report", str(swept)], "sweep.json", swept.parent)
    refused(["sweep", *SWEEP, "--out", str(swept), "--resume"], "sweep.json", swept.parent)


def test_a_second_line_for_one_point_is_refused(swept):
    results = swept / "results.jsonl"
    results.write_text(results.read_text() * 2)
    refused(["report", str(swept)], "second line", swept.parent)


def test_non_utf8_and_torn_results(swept):
    """A torn last line (a kill mid-write) is documented as dropped; bytes that are not UTF-8 before it are not."""
    results = swept / "results.jsonl"
    good = results.read_bytes()
    results.write_bytes(good + b'{"id": "prot')
    accepted(["report", str(swept)])
    results.write_bytes(b"\xff\xfe garbage\n" + good)
    refused(["report", str(swept)], "results.jsonl:1", swept.parent)


@pytest.mark.parametrize("name", ["results.jsonl", "sweep.json"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "link to /dev/zero"])
def test_a_special_file_in_place_of_a_sweep_file_is_refused_without_blocking(swept, name, kind):
    path = swept / name
    path.unlink()
    {"fifo": os.mkfifo, "directory": os.mkdir, "link to /dev/zero": lambda p: os.symlink("/dev/zero", p)}[kind](path)
    refused(["report", str(swept)], name, swept.parent)


@pytest.mark.parametrize("name, key, value", [
    ("validation.json", "device_accuracy", "x"), ("validation.json", "cycles_mean", float("nan")),
    ("validation.json", "latency_ms_mean", [1]), ("validation.json", "n_vectors", 10**400),
    ("validation.json", "sram_static_bytes", None),
    ("report.json", "model_bytes", None), ("report.json", "predicted_cycles", 5), ("report.json", "ledger", []),
    ("report.json", "board", ["uno"])])
def test_a_model_directory_summary_of_the_wrong_type_is_one_error(compiled, work, name, key, value):
    model = compiled("iris", "1kB")
    summary = {"n_vectors": 38, "device_accuracy": 0.9, "label_agreement": 1.0, "score_agreement": 1.0,
               "latency_ms_mean": 0.3, "energy_mj_board": 0.1, "cycles_mean": 4000.0, "sram_static_bytes": 300,
               "stack_peak_bytes": 120}
    (model / "validation.json").write_text(json.dumps(summary))
    doc = json.loads((model / name).read_text())
    doc[key] = value
    (model / name).write_text(json.dumps(doc))
    refused(["report", str(model)], name, model.parent)


def test_a_journal_link_to_dev_zero_does_not_hang_report(compiled, work):
    model = compiled("iris", "1kB")
    (model / "validation.json").write_text(json.dumps({"n_vectors": 38, "device_accuracy": 0.9,
                                                       "label_agreement": 1.0, "score_agreement": 1.0,
                                                       "latency_ms_mean": 0.3, "energy_mj_board": 0.1,
                                                       "cycles_mean": 4000.0}))
    os.symlink("/dev/zero", model / "validation.jsonl")
    started = time.monotonic()
    accepted(["report", str(model)])
    assert time.monotonic() - started < 30
    assert "Confusion matrix of the test split (host int8 reference labels)" in (model / "report.html").read_text()


# ------------------------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize("name", [".report.html.tmp", "figures", "report.html"])
def test_report_never_writes_through_a_planted_link(swept, name):
    victim = swept.parent / "victim.txt"
    victim.write_text("the user's\n")
    os.symlink(victim if name != "figures" else swept.parent, swept / name)
    refused(["report", str(swept)], "symbolic link", swept.parent)
    assert victim.read_text() == "the user's\n"


def test_sweep_resume_never_appends_through_a_planted_link(swept):
    victim = swept.parent / "victim.jsonl"
    shutil.copy(swept / "results.jsonl", victim)
    before = victim.read_bytes()
    (swept / "results.jsonl").unlink()
    os.symlink(victim, swept / "results.jsonl")
    refused(["sweep", *SWEEP, "--budgets", "1kB,2kB", "--out", str(swept), "--resume"], "symbolic link", swept.parent)
    assert victim.read_bytes() == before


def test_build_never_writes_through_a_planted_pio_link(compiled, work):
    model = compiled("iris", "1kB")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(model / ".pio", ignore_errors=True)
    os.symlink(elsewhere, model / ".pio")
    refused(["build", str(model)], ".pio", model.parent)
    assert not any(elsewhere.iterdir())


# ------------------------------------------------------------------------------------------------ the --out dir


def test_a_directory_holding_only_a_dead_runs_lock_is_reusable(work):
    for verb in (["sweep", *SWEEP], ["compile", "iris", "--budget", "1kB"]):
        out = work / f"left-by-a-kill-{verb[0]}"
        out.mkdir()
        (out / LOCK).write_text("999999 sweep\n")  # the run that wrote it is gone: nobody holds the flock
        accepted([*verb, "--out", str(out)])
        assert (out / ".tinyproto").is_file()


def test_a_directory_holding_only_a_live_lock_is_in_use_and_a_users_file_is_foreign(work):
    from tinyproto.core.outdir import locked

    out = work / "starting"
    out.mkdir()
    with locked(out, "sweep"):
        refused(["sweep", *SWEEP, "--out", str(out)], "in use", work)
    mine = work / "mine"
    mine.mkdir()
    (mine / LOCK).write_text("my notes, not a lock\n")
    refused(["sweep", *SWEEP, "--out", str(mine)], "not written by tinyproto", work)


def test_a_failed_sweep_removes_the_out_it_created_and_only_that(work):
    """A sweep refused after it made --out (here: no scheduler listening) takes it back, parents too; an --out
    that existed before is left as it was."""
    args = ["sweep", *SWEEP, "--scheduler", "tcp://127.0.0.1:1"]
    refused([*args, "--out", str(work / "new" / "deeper")], "scheduler", work)
    assert not (work / "new").exists()
    existing = work / "existing"
    existing.mkdir()
    refused([*args, "--out", str(existing)], "scheduler", work)
    assert existing.is_dir()


def test_two_sweeps_started_at_once_on_a_new_out_never_lose_the_winners_work(work):
    """The refused one must not remove the directory the other writes (a lost attempt did exactly that)."""
    out = work / "race"
    cmd = [sys.executable, "-m", "tinyproto", "sweep", *SWEEP, "--out", str(out)]
    env = {**os.environ, "TMPDIR": tempfile.gettempdir()}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outcomes = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(code for _, _, code in outcomes)
    assert codes[0] == 0, outcomes
    for stdout, stderr, code in outcomes:
        assert "Traceback" not in stderr
        if code:
            assert code == 1 and ("in use" in stderr or "already holds a sweep" in stderr), stderr
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["status"] == "ok"
    accepted(["report", str(out)])


# ------------------------------------------------------------------------------------------------ devices


@pytest.fixture(scope="module")
def built_master(compiled, private_cache) -> Path:
    """iris / ProtoNN / 1 kB built and validated once on the simulated Uno; copies of it for the tests that
    damage it."""
    model = compiled("iris", "1kB")
    for verb in (["build", str(model)], ["validate", str(model), "--no-raw"]):
        result = CliRunner().invoke(main, verb)
        assert result.exit_code == 0, result.output
    return model


@pytest.fixture
def built(built_master, work) -> Path:
    return _private_copy(built_master, work / "model")


@pytest.mark.parametrize("value", ["fw\u0000.elf", " ", ["x"]])
def test_a_build_record_naming_no_file_is_one_error(built, value):
    """Was: ValueError (embedded null byte) from resolving the ELF's path."""
    record = json.loads((built / "build.json").read_text())
    record["elf"] = value
    (built / "build.json").write_text(json.dumps(record))
    refused(["validate", str(built), "--no-raw"], "build.json", built.parent)


def test_a_deeply_nested_journal_line_is_one_error_for_resume(built):
    """Was: RecursionError from json.loads. The journal is tinyproto's own: a damaged middle line is refused."""
    journal = built / "validation.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join([lines[0], "[" * 100_000 + "]" * 100_000, *lines[1:]]) + "\n")
    refused(["validate", str(built), "--no-raw", "--resume"], "validation.jsonl:2", built.parent)


@needs("avrdude")
def test_flash_stops_when_the_port_vanishes_midway(built, work):
    """Was: avrdude blocked in a write to the vanished port until the 180 s limit."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.device.board_sim import SimulatedBoard
    from tinyproto.device.flash import flash_port

    model = built
    hex_path = model / json.loads((model / "build.json").read_text())["hex"]
    with SimulatedBoard("atmega328p", work / "uno-state", fresh=True) as board:
        port = board.port

        def unplug_when_avrdude_runs() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not _avrdude_running(port):
                time.sleep(0.05)
            time.sleep(0.3)
            board.stop()

        threading.Thread(target=unplug_when_avrdude_runs, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(TinyprotoError) as error:
            flash_port(load_board("uno"), port, hex_path)
        assert time.monotonic() - started < 30, "avrdude was not stopped"
        assert port in str(error.value)
        assert not _avrdude_running(port), "avrdude left running"


def _avrdude_running(port: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"avrdude") and port.encode() in cmdline:
            return True
    return False


@pytest.mark.parametrize("port", ["/nonexistent-port", "/dev/null", ".", "data.csv"])
def test_learn_checks_the_port_before_building(compiled, work, port):
    """Was: refused only after the learning firmware's build (about 30 s)."""
    model = compiled("iris", "1kB", "flynn")
    (work / "data.csv").write_text("a,b\n1,2\n")
    refused(["learn", str(model), "--port", port], port.lstrip("./") or "port", work)
    assert not (model / "learning").exists(), "the learning firmware was built before the port was checked"


def test_federate_device_parties_build_in_a_private_scratch_removed_after_a_kill(work):
    """The learning project of `federate --backend sim` goes to a locked private scratch: removed on close, and
    one a SIGKILL left (its lock free) is removed by the next run, never left in $TMPDIR for ever."""
    import numpy as np

    from tinyproto.core.boards import load_board
    from tinyproto.federated.device_parties import DeviceBackend

    tmp = Path(tempfile.gettempdir())
    stale = tmp / "tinyproto-federate-killed"
    stale.mkdir()
    (stale / LOCK).write_text("999999 scratch\n")
    shards = [(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]))]
    backend = DeviceBackend(shards, load_board("uno"))
    assert not stale.exists(), "a killed run's scratch stayed"
    scratch = [p for p in tmp.iterdir() if p.name.startswith("tinyproto-federate-")]
    assert len(scratch) == 1 and (scratch[0] / LOCK).is_file()
    backend.close()
    assert not any(p.name.startswith("tinyproto-federate-") for p in tmp.iterdir())
