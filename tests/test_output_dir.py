"""The --out directory and what tinyproto owns in it: an existing empty directory filled in place, a directory of
the user's refused without a lock left in it, a directory holding only a dead run's lock reused, names that are not
UTF-8, a manifest edited to hand the user's files to tinyproto, and a failed or concurrent run that must remove only
what it created.

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
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import accepted, refused
from tinyproto.cli import main
from tinyproto.core.manifest import LOCK, MANIFEST, OWNED_NAMES, SCRATCH_PREFIX, record_outputs

# ----------------------------------------------------------------------------------------------------------- --out


IRIS = ["iris", "--budget", "1kB"]


SWEEP = ["iris", "--models", "protonn", "--budgets", "1kB", "--device", "none", "--workers", "1"]


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


@pytest.mark.parametrize("verb", [["compile", *IRIS], ["federate", *IRIS, "--parties", "2", "--backend", "local"]])
@pytest.mark.parametrize("kind, words", [("sweep", "is a sweep directory"), ("export", "is an Arduino library export")])
def test_a_model_never_replaces_another_kind_of_output(work, compiled, verb, kind, words):
    """compile --out on a sweep's directory replaced its results (every point, hours of work) with a model; the
    sweep and the export already refused a model directory. Each kind of output replaces only its own kind."""
    out = work / kind
    if kind == "sweep":
        accepted(["sweep", *SWEEP, "--out", str(out)])
    else:
        accepted(["export", str(compiled("iris", "1kB")), "--arduino", "--out", str(out)])
    refused([*verb, "--out", str(out)], words, work)


@pytest.mark.parametrize("kind", ["a symbolic link", "a directory", "a FIFO"])
def test_a_link_or_a_directory_at_the_lock_is_named(work, compiled, kind):
    """A link at .tinyproto.lock (to a file of the user's), a directory or a FIFO there was refused as "cannot lock
    m for writing: Too many levels of symbolic links" / "Is a directory" / "Invalid argument": not where to look."""
    model = work / "m"
    shutil.copytree(compiled("iris", "1kB"), model, symlinks=True)
    (model / LOCK).unlink(missing_ok=True)
    if kind == "a symbolic link":
        (work / "victim.txt").write_text("mine\n")
        (model / LOCK).symlink_to(work / "victim.txt")
    elif kind == "a FIFO":
        os.mkfifo(model / LOCK)
    else:
        (model / LOCK).mkdir()
    for verb in (["build", str(model)], ["learn", str(model), "--sim"]):
        line = refused(verb, f"{model / LOCK} is {kind}", work)
        assert "move it away" in line, line


def test_a_lock_that_cannot_be_made_on_a_full_disk_says_what_to_do(tmp_path, monkeypatch):
    """sweep on a full disk said "cannot lock DIR for writing: No space left on device" and nothing to do."""
    import errno

    import tinyproto.core.outdir as outdir
    from tinyproto.core.errors import TinyprotoError

    def full(path, verb):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(outdir, "_try_lock", full)
    with pytest.raises(TinyprotoError, match=r"No space left on device: \S+\.tinyproto\.lock; free some space and run "
                                             "the command again"):
        with outdir.locked(tmp_path, "sweep"):
            pass


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


@pytest.mark.parametrize("verb", [["compile", "--budget", "1kB"], ["run", "--budget", "1kB"],
                                  ["federate", "--budget", "1kB", "--parties", "2", "--backend", "local"],
                                  ["sweep", "--models", "protonn", "--budgets", "1kB", "--device", "none"]])
def test_an_unusable_out_is_refused_before_the_data_is_read(work, verb):
    """A file at --out was refused only after the data was loaded (seconds for a built-in set, minutes for a large
    CSV). DATA here is a file that does not exist: refusing it would name the data, so naming --out shows which
    check ran first."""
    (work / "f.txt").write_text("mine\n")
    refused([verb[0], str(work / "nosuch.csv"), *verb[1:], "--out", str(work / "f.txt")],
            "exists and is not a directory", work)


@pytest.mark.parametrize("verb", [["compile", "iris", "--budget", "1kB"], ["export", "MODEL"],
                                  ["export", "MODEL", "MODEL2"], ["sweep", "iris", "--device", "none"]])
@pytest.mark.parametrize("out", ["loop", "loop/sub"])
def test_an_out_in_a_loop_of_links_is_one_line(work, compiled, verb, out):
    """export --out LOOP was an internal error (RuntimeError: Symlink loop, from resolving it)."""
    (work / "loop").symlink_to("loop")
    model = compiled("iris", "1kB")
    other = compiled("wine", "1kB") if "MODEL2" in verb else None
    args = [str(model) if a == "MODEL" else str(other) if a == "MODEL2" else a for a in verb]
    line = refused([*args, "--out", str(work / out)], "loop", work)
    assert "internal error" not in line


@pytest.mark.parametrize("verb", ["compile", "validate", "build", "export", "report", "board-sim"])
def test_directory_name_not_utf8_is_refused(work, verb):
    bad = os.fsdecode(b"m\xff")
    args = {"compile": ["compile", *IRIS, "--out", bad], "validate": ["validate", bad], "build": ["build", bad],
            "export": ["export", bad, "--arduino"], "report": ["report", bad],
            "board-sim": ["board-sim", "--state", bad]}[verb]
    refused(args, "utf-8", work, code=2)

# ------------------------------------------------------------------------------------------- locks and failed runs


@pytest.fixture(scope="module")
def dask_fork_server() -> None:
    """multiprocessing's fork server for dask workers, started once per process with its socket's scratch directory
    in the temporary directory of the moment: started inside `work` (an in-process sweep, the first of a process,
    as with -n 0 alone) it is left in the test's private one, which `work` then finds at teardown."""
    from tinyproto.core.dask_cluster import start_forkserver_deaf_to_ctrl_c

    start_forkserver_deaf_to_ctrl_c()


def test_a_directory_holding_only_a_dead_runs_lock_is_reusable(dask_fork_server, work):
    for verb in (["sweep", *SWEEP], ["compile", "iris", "--budget", "1kB"]):
        out = work / f"left-by-a-kill-{verb[0]}"
        out.mkdir()
        (out / LOCK).write_text("999999 sweep\n")  # the run that wrote it is gone: nobody holds the flock
        accepted([*verb, "--out", str(out)])
        assert (out / ".tinyproto").is_file()


def test_a_directory_whose_lock_is_held_is_in_use_and_a_users_file_is_foreign(work):
    """A run that holds the lock may be writing its first file under a temporary name: the second run is told
    'in use', not 'not written by tinyproto' (CI once saw that race between two sweeps started at once)."""
    from tinyproto.core.outdir import locked

    out = work / "starting"
    out.mkdir()
    with locked(out, "sweep"):
        refused(["sweep", *SWEEP, "--out", str(out)], "in use", work)
        (out / "..tinyproto.half-written.tmp").write_text("{")
        refused(["sweep", *SWEEP, "--out", str(out)], "in use", work)
        refused(["compile", *IRIS, "--out", str(out)], "in use", work)
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

# -------------------------------------------------------------------------------------------------------- manifest


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


USERS_AT_OWNED_NAMES = {
    # what a user (not tinyproto) put at a name tinyproto rewrites in place; replacing the directory deleted it
    "a directory at build.json": lambda m: ((m / "build.json").unlink(), (m / "build.json").mkdir(),
                                           (m / "build.json" / "mine.txt").write_text("precious\n")),
    "a directory at validation.json": lambda m: ((m / "validation.json").mkdir(),
                                                (m / "validation.json" / "mine.txt").write_text("precious\n")),
    "a link at learn.json": lambda m: (m / "learn.json").symlink_to(m.parent / "outside.txt"),
    "a file at .pio": lambda m: (shutil.rmtree(m / ".pio"), (m / ".pio").write_text("precious\n")),
    "a note in figures": lambda m: ((m / "figures").mkdir(), (m / "figures" / "plot.png").write_bytes(b"png"),
                                    (m / "figures" / "notes.txt").write_text("precious\n")),
    "a folder in figures": lambda m: ((m / "figures" / "mine").mkdir(parents=True),
                                      (m / "figures" / "mine" / "a.png").write_bytes(b"png")),
    "a link in .pio": lambda m: (m / ".pio" / "mine").symlink_to(m.parent / "outside.txt"),
    "learned without its manifest": lambda m: ((m / "learned").mkdir(),
                                               (m / "learned" / "notes.txt").write_text("precious\n")),
    "a directory at learning/build.json": lambda m: ((m / "learning" / "build.json").mkdir(parents=True),
                                                    (m / "learning" / "build.json" / "mine.txt").write_text("x")),
    "a note at the top of learning": lambda m: ((m / "learning" / "src").mkdir(parents=True),
                                                (m / "learning" / "notes.txt").write_text("precious\n")),
    "a file among the sweep's points": lambda m: ((m / "points").mkdir(), (m / "points" / "notes.txt").write_text("x")),
    "a note in a learned model": lambda m: ((m / "learned").mkdir(), (m / "learned" / MANIFEST).write_text(
        json.dumps({"written_by": "tinyproto", "version": 1, "files": {}})),
        (m / "learned" / "notes.txt").write_text("precious\n")),
}


@pytest.mark.parametrize("case", sorted(USERS_AT_OWNED_NAMES))
def test_what_the_user_put_at_a_name_tinyproto_owns_is_foreign(work, compiled, case):
    """build, validate, learn and report rewrite these names in place (the manifest's `owned` list), and replacing
    the directory counted everything at or under them as tinyproto's: compile --out deleted the user's files."""
    model = compiled("iris", "1kB")
    (model.parent / "outside.txt").write_text("the user's\n")
    record_outputs(model, ".pio", "build.json", "validation.json", "learn.json", "figures", "learned", "learning",
                   "points")  # before writing, as every command does
    (model / ".pio").mkdir(exist_ok=True)
    (model / "build.json").write_text("{}")
    USERS_AT_OWNED_NAMES[case](model)
    refused(["compile", *IRIS, "--out", str(model)], "tinyproto did not write", model.parent)


def test_what_tinyproto_writes_at_its_names_stays_replaceable(work, compiled):
    model = compiled("iris", "1kB")
    record_outputs(model, ".pio", "build.json", "figures", "learned", "learning")  # before writing, as commands do
    (model / ".pio" / "build").mkdir(parents=True)
    (model / ".pio" / "build" / "firmware.elf").write_bytes(b"elf")
    (model / "figures").mkdir()
    (model / "figures" / "frontier.png").write_bytes(b"png")
    (model / "build.json").write_text("{}")
    for name in ("src", ".pio/build"):
        (model / "learning" / name).mkdir(parents=True)
    (model / "learning" / "eeprom.bin").write_bytes(bytes(1024))
    (model / "learning" / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    record_outputs(model, ".pio", "build.json", "figures", "learned", "learning")  # again: now they are there
    from tinyproto.core.manifest import foreign_entries

    assert foreign_entries(model) == []


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


@pytest.mark.parametrize("failure", ["write", "copy", "named"])
def test_a_failed_write_into_the_output_names_the_output_not_the_scratch(tmp_path, failure):
    """A full disk while compile writes its directory: a failed write() or close() (numpy's savez, a C header) names
    no file ("No space left on device" alone), and one that names a file names it in the scratch directory that is
    gone by the time the line is printed. The error names the output, where the file was going."""
    import errno

    from tinyproto.cli.main import os_error_line
    from tinyproto.core.outdir import atomic_directory

    out = tmp_path / "model"
    with pytest.raises(OSError) as info:
        with atomic_directory(out) as scratch:
            if failure == "write":
                raise OSError(errno.ENOSPC, "No space left on device")
            if failure == "copy":
                raise OSError(errno.ENOSPC, "No space left on device", "/src/tp_main.c", None, str(scratch / "src/a.c"))
            raise OSError(errno.ENOSPC, "No space left on device", str(scratch / "model.json"))
    line = os_error_line(info.value)
    expected = {"write": f"No space left on device: {out};",
                "copy": f"No space left on device: /src/tp_main.c -> {out}/src/a.c;",
                "named": f"No space left on device: {out}/model.json;"}[failure]
    assert line.startswith(expected) and "free some space" in line, line
    assert SCRATCH_PREFIX not in line and not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb, name", [("report", "report.html"), ("build", "build.json"),
                                        ("validate", "validation.jsonl")])
def test_without_a_manifest_no_file_at_an_output_name_is_replaced(work, compiled, verb, name):
    """A model directory whose manifest is gone is no longer tinyproto's (compile --out refuses it): report, build and
    validate went on and replaced a report.html, build.json or validation.jsonl there, which may be the user's."""
    model = compiled("iris", "1kB")
    (model / MANIFEST).unlink()
    (model / name).write_text("the user's own\n")
    args = {"report": ["report", str(model)], "build": ["build", str(model)],
            "validate": ["validate", str(model), "--sim"]}[verb]
    line = refused(args, "no readable tinyproto manifest", model.parent)
    assert name in line and (model / name).read_text() == "the user's own\n"


@pytest.mark.parametrize("verb, name", [("build", "build.json"), ("report", "report.html"),
                                        ("report", "figures/accuracy_vs_bytes.png"), ("learn", "learn.json"),
                                        ("learn", "learning/platformio.ini")])
def test_a_users_file_at_a_name_a_later_command_writes_is_not_replaced(work, compiled, verb, name):
    """A file the user put after compile at a name build, report or learn writes later (their own report.html or
    build.json) was claimed by that command's record in the manifest and overwritten. It is refused, unchanged."""
    model = compiled("iris", "1kB", "flynn", learnable=True) if verb == "learn" else compiled("iris", "1kB")
    target = model / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("the user's own\n")
    args = {"build": ["build", str(model)], "report": ["report", str(model)], "learn": ["learn", str(model), "--sim"]}
    line = refused(args[verb], "was not written by tinyproto", model.parent)
    assert name.split("/")[0] in line and target.read_text() == "the user's own\n"


@pytest.mark.parametrize("inside", ["m/sub", "m/.pio/x", "m/learned/x", "m/src"])
def test_an_out_inside_a_directory_tinyproto_wrote_is_refused(work, compiled, inside):
    """compile --out m/sub wrote a model into model directory m: m's next compile then refused m (an entry its
    manifest does not list), and a model under m/.pio went with the next build. An --out inside a directory
    tinyproto wrote is refused, but for the outputs it owns for that (learn's m/learned, a sweep's points)."""
    shutil.copytree(compiled("iris", "1kB"), work / "m", symlinks=True)
    line = refused(["compile", *IRIS, "--out", str(work / inside)], "a directory tinyproto wrote", work)
    assert f"is inside {work / 'm'}" in line and "choose a directory outside it" in line, line
    refused(["sweep", *SWEEP, "--out", str(work / inside)], "a directory tinyproto wrote", work)
