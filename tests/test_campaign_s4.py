"""Cases from a fourth fault campaign (run as a hostile user would, by class of fault), each one a failure that
campaign found: an existing empty --out, names that are not UTF-8, blank option values, data wider than the
device can index, and a manifest edited to hand a user's files to tinyproto.

Every refused case asserts: exit status 1 (or click's 2), one message naming the problem, no traceback, no file
of the user changed, and nothing left behind (in the directory, beside it, or in the temporary directory).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.cli import main
from tinyproto.core.manifest import LOCK, MANIFEST, SCRATCH_PREFIX, OWNED_NAMES, record_outputs

IRIS = ["iris", "--budget", "1kB"]


def _snapshot(root: Path, own_files_at_root: bool = False) -> dict[str, str]:
    """Every entry under root with its content hash. tinyproto's manifest and lock in the directories it owns are
    left out; own_files_at_root: root itself is a directory tinyproto owns (a model directory), so are its."""
    snap = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.name in (MANIFEST, LOCK) and (own_files_at_root or path.parent != root):
            continue
        if path.is_symlink():
            snap[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            snap[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            snap[rel] = "dir" if path.is_dir() else "other"
    return snap


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A working directory with a private temporary directory (checked empty afterwards)."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    yield folder
    assert not list(private_tmp.iterdir()), "temporary files left behind"
    assert not [p for p in folder.rglob("*") if p.name.startswith(SCRATCH_PREFIX)], "scratch directory left behind"


def refused(args: list[str], keyword: str, watch: Path, code: int | None = None) -> str:
    """Run tinyproto; it must refuse in one line naming `keyword`, changing nothing under `watch`."""
    before = _snapshot(watch)
    result = CliRunner().invoke(main, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code in ((1, 2) if code is None else (code,)), (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert lines and lines[-1].startswith(("error:", "Error:")), result.stderr
    assert keyword.lower() in lines[-1].lower(), (keyword, lines[-1])
    assert _snapshot(watch) == before, "a file changed, appeared or vanished"
    return lines[-1]


def accepted(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


# ------------------------------------------------------------------------------------------------ --out


def test_existing_empty_out_is_filled_in_place(work):
    """It failed after training ('holds .tinyproto.lock') and left that lock in the user's directory."""
    out = work / "empty"
    out.mkdir()
    inode = out.stat().st_ino
    accepted(["compile", *IRIS, "--out", str(out)])
    assert out.stat().st_ino == inode  # the same directory: a shell inside it sees the model
    assert (out / "model.json").is_file() and (out / MANIFEST).is_file()
    assert not [p for p in work.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


def test_out_dot_in_an_empty_working_directory(work, monkeypatch):
    here = work / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    accepted(["compile", *IRIS, "--out", "."])
    assert (here / "model.json").is_file()
    output = CliRunner().invoke(main, ["compile", *IRIS, "--seed", "1", "--out", "."])
    assert output.exit_code == 0, output.output
    assert "was replaced" in output.stderr  # the shell's directory is now the old one: say so


@pytest.mark.parametrize("entry", ["notes.txt", ".hidden", "sub/"])
def test_non_empty_foreign_out_gets_no_lock(work, entry):
    out = work / "mine"
    out.mkdir()
    if entry.endswith("/"):
        (out / entry).mkdir()
    else:
        (out / entry).write_text("precious\n")
    refused(["compile", *IRIS, "--out", str(out)], "not written by tinyproto", work)
    assert not (out / LOCK).exists()


@pytest.mark.parametrize("option", ["--out", "--port", "--upload-port", "--scheduler", "--ports", "MODEL_DIR"])
@pytest.mark.parametrize("value", ["", "  "])
def test_blank_option_values_are_refused(work, compiled, option, value):
    """--port "$PORT" with PORT unset used to flash the simulator instead (and --out "" meant the cwd)."""
    model = compiled("iris", "1kB")
    args = {
        "--out": ["compile", *IRIS, "--out", value],
        "--port": ["flash", str(model), "--port", value],
        "--upload-port": ["flash", str(model), "--port", "/dev/null", "--upload-port", value],
        "--scheduler": ["federate", "iris", "--parties", "2", "--scheduler", value],
        "--ports": ["federate", "iris", "--parties", "2", "--backend", "port", "--ports", value],
        "MODEL_DIR": ["validate", value],
    }[option]
    refused(args, "empty", work, code=2)


# ------------------------------------------------------------------------------------------------ names


def test_data_file_name_not_utf8(work):
    """The name goes into model.json and the header; a Latin-1 byte in it was an internal error."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.repeat([0, 1], 20)
    X[y == 1] += 3
    name = os.fsdecode(b"caf\xe9.npz")
    np.savez(work / name, X=X, y=y)
    accepted(["compile", name, "--budget", "1kB", "--out", "o"])
    assert json.loads((work / "o" / "model.json").read_text())["dataset"] == "caf\ufffd"


@pytest.mark.parametrize("verb", ["compile", "validate", "build", "export", "report", "board-sim"])
def test_directory_name_not_utf8_is_refused(work, verb):
    bad = os.fsdecode(b"m\xff")
    args = {"compile": ["compile", *IRIS, "--out", bad], "validate": ["validate", bad], "build": ["build", bad],
            "export": ["export", bad, "--arduino"], "report": ["report", bad],
            "board-sim": ["board-sim", "--state", bad]}[verb]
    refused(args, "utf-8", work, code=2)


# ------------------------------------------------------------------------------------------------ data


@pytest.mark.parametrize("suffix", [".npz", ".csv"])
def test_wider_than_the_device_can_index(work, suffix):
    """100,000 columns went on to a search that ran for minutes; the device indexes inputs in 16 bits."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8, 65536)).astype(np.float32)
    y = np.repeat([0, 1], 4)
    if suffix == ".npz":
        np.savez(work / "wide.npz", X=X, y=y)
    else:
        text = io.StringIO()
        text.write(",".join(f"c{j}" for j in range(X.shape[1])) + ",label\n")
        for row, label in zip(X, y):
            text.write(",".join("%.2f" % v for v in row) + f",{label}\n")
        (work / "wide.csv").write_text(text.getvalue())
    refused(["compile", f"wide{suffix}", "--budget", "1kB", "--out", "o"], "65,535", work)


# ------------------------------------------------------------------------------------------------ manifest


def _edit_manifest(model: Path, edit) -> None:
    data = json.loads((model / MANIFEST).read_text())
    edit(data)
    (model / MANIFEST).write_text(json.dumps(data))


@pytest.mark.parametrize("owned", [["notes"], ["notes/n.txt"], [".", "notes"], ["", "notes"]])
def test_edited_owned_list_does_not_hand_over_user_files(work, compiled, owned):
    model = compiled("iris", "1kB")
    (model / "notes").mkdir()
    (model / "notes" / "n.txt").write_text("precious\n")
    _edit_manifest(model, lambda d: d.__setitem__("owned", d.get("owned", []) + owned))
    refused(["compile", *IRIS, "--out", str(model)], "notes", model.parent)


@pytest.mark.parametrize("damage", ["owned-number", "owned-dict", "owned-ints", "files-list", "list", "deep"])
def test_damaged_manifest_means_not_ours(work, compiled, damage):
    model = compiled("iris", "1kB")
    (model / "mine.txt").write_text("precious\n")
    path = model / MANIFEST
    data = json.loads(path.read_text())
    text = {"owned-number": json.dumps({**data, "owned": 5}), "owned-dict": json.dumps({**data, "owned": {"a": 1}}),
            "owned-ints": json.dumps({**data, "owned": [1, 2]}), "files-list": json.dumps({**data, "files": []}),
            "list": "[]", "deep": "[" * 100_000 + "]" * 100_000}[damage]
    path.write_text(text)
    refused(["compile", *IRIS, "--out", str(model)], "not written by tinyproto", model.parent)


def test_record_outputs_names_are_declared(tmp_path):
    """A command that starts writing a new name in place must declare it (else it could never be replaced)."""
    with pytest.raises(ValueError):
        record_outputs(tmp_path, "something-new")
    assert {"build.json", "validation.jsonl", ".pio", "learned", "results.jsonl"} <= OWNED_NAMES


# ------------------------------------------------------------------------------------------------ model directory


def _bump_first_array_value(text: str) -> str:
    import re

    match = re.search(r"PROGMEM = \{\s*(-?\d+)", text)
    value = int(match.group(1))
    return text[:match.start(1)] + str(value - 1 if value > 0 else value + 1) + text[match.end(1):]


HEADER = "include/tinyproto_model.h"
BUILD_DAMAGE = {
    # an array value edited by hand, TP_MODEL_HASH left alone: it was built, and with --no-raw it passed
    "header-value-edited": (lambda m: (m / HEADER).write_text(_bump_first_array_value((m / HEADER).read_text())),
                            "not what model.json renders"),
    "header-define-added": (lambda m: (m / HEADER).write_text((m / HEADER).read_text().replace(
        "#define TP_N_CLASSES", "#define TP_EXTRA 1\n#define TP_N_CLASSES")), "not what model.json renders"),
    # a FIFO or /dev/zero in a source's place: the header read (or the compiler) blocked for ever
    "header-fifo": (lambda m: ((m / HEADER).unlink(), os.mkfifo(m / HEADER)), "tinyproto_model.h"),
    "header-devzero": (lambda m: ((m / HEADER).unlink(), (m / HEADER).symlink_to("/dev/zero")), "tinyproto_model.h"),
    "main-fifo": (lambda m: ((m / "src/main.c").unlink(), os.mkfifo(m / "src/main.c")), "main.c"),
    "runtime-fifo": (lambda m: ((m / "lib/tinyproto/tp_input.c").unlink(), os.mkfifo(m / "lib/tinyproto/tp_input.c")),
                     "tp_input.c"),
    "ini-devzero": (lambda m: ((m / "platformio.ini").unlink(), (m / "platformio.ini").symlink_to("/dev/zero")),
                    "platformio.ini"),
}


@pytest.mark.parametrize("case", sorted(BUILD_DAMAGE))
def test_build_refuses_a_header_or_source_that_is_not_the_model(work, compiled, case):
    damage, keyword = BUILD_DAMAGE[case]
    model = compiled("iris", "1kB")
    damage(model)
    refused(["build", str(model)], keyword, model.parent)


def _edit_int_model(model: Path, edit) -> None:
    from tinyproto.core.modeldir import int_model_digest

    meta = json.loads((model / "model.json").read_text())
    edit(meta["int_model"])
    meta["int_model_sha256"] = int_model_digest(meta["int_model"])  # a consistent edit: the hash is no defence
    (model / "model.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("classes", [[0, 0, 2], ["a", "a", "b"], [0, True, 2], [[0], [1], [2]], [0]])
@pytest.mark.parametrize("verb", ["build", "export", "validate"])
def test_model_json_classes_must_be_distinct_names(work, compiled, classes, verb):
    model = compiled("iris", "1kB")
    _edit_int_model(model, lambda im: im.__setitem__("classes", classes))
    args = [verb, str(model)] + (["--arduino"] if verb == "export" else [])
    refused(args, "classes", model.parent)


# ------------------------------------------------------------------------------------------------ options


OPTION_CASES = {
    "budget-400-digits": (["compile", "iris", "--budget", "9" * 400], "larger than any board"),
    "budget-over-a-gigabyte": (["compile", "iris", "--budget", "2000000kB"], "larger than any board"),
    "board-relative-path": (["compile", "iris", "--board", "../boards/uno"], "unknown board"),
    "board-absolute-path": (["compile", "iris", "--board", "/etc/passwd"], "unknown board"),
    "federate-more-workers-than-parties": (["federate", "iris", "--parties", "2", "--workers", "100000"], "--workers"),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_option_out_of_range(work, case):
    args, keyword = OPTION_CASES[case]
    refused(args, keyword, work, code=1)


@pytest.mark.parametrize("board", ["../boards/uno", "/tmp/evil", 5, None])
def test_model_json_board_is_a_name_not_a_path(work, compiled, board):
    """model.json's board picked any JSON file on the machine (a board file without the keys: internal error)."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta["board"] = board
    (model / "model.json").write_text(json.dumps(meta))
    refused(["build", str(model)], "unknown board", model.parent)


def test_out_on_a_place_nobody_may_write_is_refused_before_training(work):
    """access() says yes to root on /sys; the refusal came after training, from the rename."""
    refused(["compile", "iris", "--budget", "1kB", "--out", "/sys/kernel/tinyproto-out"], "cannot write", work)


FLAG_CASES = {
    "learn-no-flash-on-the-simulator": (["learn", "{model}", "--no-flash"], "--no-flash", 1),
    "sweep-raw-check-without-device": (["sweep", "iris", "--raw-check", "--device", "none", "--out", "s"], "--raw-check", 1),
    "build-env-empty": (["build", "{model}", "--env", ""], "empty", 2),
    "board-sim-100000-boards": (["board-sim", "--count", "100000"], "--count", 2),
    "board-sim-no-boards": (["board-sim", "--count", "0"], "--count", 2),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_an_option_that_would_be_silently_ignored_or_never_finish(work, compiled, case):
    args, keyword, code = FLAG_CASES[case]
    model = compiled("iris", "1kB")
    refused([a.format(model=model) for a in args], keyword, work, code=code)


# ------------------------------------------------------------------------------------------------ report


def _sweep_dir(work: Path, results: str) -> Path:
    """A sweep directory as `report` reads it: the configuration and the results lines (no training)."""
    folder = work / "sw"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"format": "tinyproto-sweep", "data": "iris"}))
    (folder / "results.jsonl").write_text(results)
    return folder


@pytest.mark.parametrize("kind", ["fifo", "devzero", "directory"])
def test_report_refuses_a_special_results_file(work, kind):
    """A FIFO as results.jsonl blocked report for ever; /dev/zero filled the memory."""
    folder = _sweep_dir(work, "")
    (folder / "results.jsonl").unlink()
    {"fifo": lambda p: os.mkfifo(p), "devzero": lambda p: p.symlink_to("/dev/zero"),
     "directory": lambda p: p.mkdir()}[kind](folder / "results.jsonl")
    refused(["report", str(folder)], "results.jsonl", work, code=1)


def test_report_refuses_a_results_line_that_holds_only_an_id(work):
    """A line tinyproto did not write (no status, no directory) was an internal error in the page template; it is
    now refused in one line naming the line, by report and by sweep --resume alike."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.report_data import load_sweep

    folder = _sweep_dir(work, json.dumps({"id": "p1"}) + "\n")
    with pytest.raises(TinyprotoError, match=r"results.jsonl:1 is not a result line"):
        load_sweep(folder)
