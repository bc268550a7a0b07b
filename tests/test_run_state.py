"""Run state that tinyproto reads back: a sweep's results.jsonl and sweep.json, a model directory's report.json,
validation.json, build.json and validation.jsonl holding values of the wrong JSON type (a list for a number, NaN,
a huge integer, null), torn or not UTF-8; special files and planted links in an output's place. Each is one
error line (for report, sweep --resume and validate --resume alike), never a traceback, a hang or a write through
the link."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import accepted, refused

# -------------------------------------------------------------------------------------------------------- fixtures


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


@pytest.fixture
def built(built_models, work) -> Path:
    """iris / ProtoNN / 1 kB built and validated on the simulated Uno (once per run), this test's own copy."""
    return _private_copy(built_models("iris", "1kB"), work / "model")

# ----------------------------------------------------------------------------------------------------- typed reads


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


@pytest.mark.parametrize("key, value", [("int8_accuracy", 0.5), ("float_accuracy", 0.25), ("model_bytes", 900),
                                        ("n_test", 3), ("predicted_cycles", 5), ("predicted_latency_ms", 9.0),
                                        ("dataset", "digits")])
def test_a_results_line_that_disagrees_with_its_point_is_one_error(swept, key, value):
    """Was: drawn as the point's figures (int8 accuracy 50 % in the report of a point whose report.json says 100 %,
    a line naming another data set than the sweep's)."""
    _edit_line(swept / "results.jsonl", key, value)
    line = refused(["report", str(swept)], "results.jsonl", swept.parent)
    assert key in line or "data set" in line, line


@pytest.mark.parametrize("key, value", [("binding", [1]), ("binding", "x"), ("runs", 5), ("runs", [[1]]),
                                        ("runs", [{"cluster": "x"}]), ("format", None), (None, []),
                                        # the report's table of runs: a run without points_to_run was an internal
                                        # error (UndefinedError), a cluster without its workers too
                                        ("runs", [{"cluster": None, "points_finished": 1, "wall_seconds": 2.0}]),
                                        ("runs", [{"cluster": {"scheduler": "LocalCluster"}, "points_to_run": 1,
                                                   "points_finished": 1, "wall_seconds": 2.0}]),
                                        ("runs", [{"cluster": None, "points_to_run": 1, "points_finished": 1,
                                                   "wall_seconds": float("nan")}]),
                                        # a falsy cluster that is not null passed the runs' first check
                                        ("runs", [{"cluster": 0, "points_to_run": 1, "points_finished": 1,
                                                   "wall_seconds": 2.0}]),
                                        ("format_version", 99), ("format_version", "1"), ("format_version", True),
                                        ("format_version", None)])
def test_a_sweep_json_of_the_wrong_shape_is_one_error(swept, key, value):
    config = json.loads((swept / "sweep.json").read_text())
    config = value if key is None else {**config, key: value}
    (swept / "sweep.json").write_text(json.dumps(config))
    refused(["report", str(swept)], "sweep.json", swept.parent)
    refused(["sweep", *SWEEP, "--out", str(swept), "--resume"], "sweep.json", swept.parent)


@pytest.mark.parametrize("name", ["sweep.json", "results.jsonl"])
def test_a_key_given_twice_in_a_sweep_file_is_one_error(swept, name):
    """Which of two values a parser keeps is its whim: sweep.json's was read as the last one."""
    path = swept / name
    key = next(iter(json.loads(path.read_text().splitlines()[0] if name.endswith("l") else path.read_text())))
    path.write_text(path.read_text().replace("{", "{" + json.dumps(key) + ": 7, ", 1))
    refused(["report", str(swept)], name, swept.parent)
    refused(["sweep", *SWEEP, "--out", str(swept), "--resume"], name, swept.parent)


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


@pytest.mark.parametrize("key", ["energy_mj_board", "latency_ms_mean", "stack_peak_bytes"])
def test_a_validation_summary_without_a_figure_it_may_leave_null_is_reported(built_models, tmp_path, key):
    """These figures are null when the device's cycle counts are not plausible (or before a vector was measured):
    the key missing was an internal error in report (KeyError: 'energy_mj_board'), the page now shows no figure."""
    model = tmp_path / "m"
    shutil.copytree(built_models("iris", "1kB"), model)
    summary = json.loads((model / "validation.json").read_text())
    del summary[key]
    (model / "validation.json").write_text(json.dumps(summary))
    accepted(["report", str(model)])


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
    assert time.monotonic() - started < 600  # a hang detector, not a speed target: a busy machine is slow
    assert "Confusion matrix of the test split (host int8 reference labels)" in (model / "report.html").read_text()


@pytest.mark.parametrize("value", ["fw\u0000.elf", " ", ["x"]])
def test_a_build_record_naming_no_file_is_one_error(built, value):
    """Was: ValueError (embedded null byte) from resolving the ELF's path."""
    record = json.loads((built / "build.json").read_text())
    record["elf"] = value
    (built / "build.json").write_text(json.dumps(record))
    refused(["validate", str(built), "--no-raw"], "build.json", built.parent)


@pytest.mark.parametrize("verb", ["validate", "flash"])
def test_a_firmware_that_is_a_loop_of_links_is_one_error(built, verb):
    """The ELF build.json names replaced by a link to itself: an internal error (RuntimeError: Symlink loop)."""
    elf = built / json.loads((built / "build.json").read_text())["elf"]
    elf.unlink()
    elf.symlink_to(elf.name)
    line = refused([verb, str(built), "--sim"], "loop of symbolic links", built.parent)
    assert "tinyproto build" in line, line


@pytest.mark.parametrize("name, verb", [("build.json", "validate"), ("build.json", "flash"),
                                        ("report.json", "build"), ("validation.json", "report")])
def test_a_key_given_twice_in_a_model_directory_record_is_one_error(built, name, verb):
    """build.json with "elf" twice was read as its last value, and validate or flash ran whichever firmware it named."""
    path = built / name
    key = next(iter(json.loads(path.read_text())))
    path.write_text(path.read_text().replace("{", "{" + json.dumps(key) + ': "x", ', 1))
    args = {"validate": ["validate", str(built), "--no-raw"], "flash": ["flash", str(built), "--sim"],
            "build": ["build", str(built)], "report": ["report", str(built)]}[verb]
    line = refused(args, name, built.parent)
    assert "appears twice" in line, line


def test_a_deeply_nested_journal_line_is_one_error_for_resume(built):
    """Was: RecursionError from json.loads. The journal is tinyproto's own: a damaged middle line is refused."""
    journal = built / "validation.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join([lines[0], "[" * 100_000 + "]" * 100_000, *lines[1:]]) + "\n")
    refused(["validate", str(built), "--no-raw", "--resume"], "validation.jsonl:2", built.parent)

# --------------------------------------------------------------------------------------------------------- outputs


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


def test_a_journal_that_cannot_be_opened_says_why(tmp_path):
    """Any failure to open the journal said "tinyproto writes only regular files it made", true only of a link
    planted at its name: a directory nobody may write (chattr +i, a read-only mount) got the same words."""
    import errno

    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.journal import _open_own

    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TinyprotoError, match="is a symbolic link; tinyproto writes only regular files it made"):
        _open_own(tmp_path / "link", os.O_WRONLY | os.O_CREAT)
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(TinyprotoError) as info:
        _open_own(tmp_path / "no" / "dir" / "j.jsonl", os.O_WRONLY | os.O_CREAT)
    assert os.strerror(errno.ENOENT) in str(info.value) and "regular files" not in str(info.value)
