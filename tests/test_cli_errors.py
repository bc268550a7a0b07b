"""Bad input against every verb and every file tinyproto reads: each case must end in exit status 1 (or click's
2 for a malformed option), one `error:` line naming the problem, no traceback, no internal error, no file of
the user changed or lost, and nothing left behind (temporary directories, scratch model directories).

Cases are grouped by the class of fault (a missing or special file, damaged JSON, a tampered artefact, an
unusable --out, an option out of range) and applied to every verb that reads that file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.cli import main

MODEL_VERBS = ("build", "validate", "flash", "learn")


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def golden(shared_once, private_cache, compiled) -> Path:
    """A built ProtoNN model directory (iris, 1 kB: the run's shared compile of it), made once per run for all
    workers: every case damages a copy of it."""

    def make(into: Path) -> None:
        out = into / "model"
        shutil.copytree(compiled("iris", "1kB"), out, symlinks=True)
        result = CliRunner().invoke(main, ["build", str(out)])
        assert result.exit_code == 0, result.output

    return shared_once("golden-iris-1kB-built", make) / "model"


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under root with its content hash (links by target), tinyproto's lock and manifest aside."""
    snap = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.name in (".tinyproto", ".tinyproto.lock"):
            continue
        if path.is_symlink():
            snap[rel] = "link:" + os.readlink(path)
        elif path.is_fifo():
            snap[rel] = "fifo"
        elif path.is_file():
            snap[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            snap[rel] = "dir"
    return snap


def run_case(tmp_path: Path, golden: Path, make_args: Callable[[Path, Path], list[str]], keyword: str,
             monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    model = work / "m"
    shutil.copytree(golden, model, symlinks=True)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    monkeypatch.chdir(work)
    args = make_args(work, model)
    before = _snapshot(work)

    result = CliRunner().invoke(main, args)

    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert lines, "no message at all"
    last = lines[-1]
    assert last.startswith(("error:", "Error:")), result.stderr
    if result.exit_code == 1:
        assert len([line for line in lines if line.startswith("error:")]) == 1, result.stderr
    assert keyword.lower() in last.lower(), (keyword, last)
    assert _snapshot(work) == before, "a file changed, appeared or vanished"
    assert not list(private_tmp.iterdir()), "temporary files left behind"


# ------------------------------------------------------------------------------------------------ damage


def _write(rel: str, content: bytes | str) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        path = model / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return damage


def _remove(rel: str) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        (model / rel).unlink()

    return damage


def _replace_with(rel: str, kind: str) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        path = model / rel
        path.unlink()
        if kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "devzero":
            path.symlink_to("/dev/zero")
        elif kind == "dangling":
            path.symlink_to(model / "no-such-file")

    return damage


def _edit_json(rel: str, edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """Edit the parsed JSON in place (edit's return value is ignored, so dict.pop can be used)."""

    def damage(model: Path) -> None:
        path = model / rel
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return damage


def _first_list(int_model: dict) -> list:
    for value in int_model.values():
        if isinstance(value, list) and value and isinstance(value[0], (int, list)):
            return value
    raise AssertionError("no array in int_model")


def _bump_one_value(meta: dict) -> None:
    values = _first_list(meta["int_model"])
    while isinstance(values[0], list):
        values = values[0]
    values[0] = values[0] - 1 if values[0] > 0 else values[0] + 1


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MODEL_JSON_DAMAGE = {
    "empty": (_write("model.json", b""), "model.json"),
    "not-json": (_write("model.json", "this is not json"), "model.json"),
    "binary": (_write("model.json", bytes(range(256))), "model.json"),
    "utf16": (_write("model.json", '{"format": "tinyproto-model"}'.encode("utf-16")), "model.json"),
    "array": (_write("model.json", "[1, 2, 3]"), "model.json"),
    "empty-object": (_write("model.json", "{}"), "model.json"),
    "nan-literal": (_write("model.json", '{"format": NaN}'), "model.json"),
    "deep-nesting": (_write("model.json", _nested(100000)), "model.json"),
    "wrong-format": (_edit_json("model.json", lambda d: d.update(format="other")), "model.json"),
    "future-version": (_edit_json("model.json", lambda d: d.update(format_version=99)), "model.json"),
    "hash-missing": (_edit_json("model.json", lambda d: d.pop("model_hash")), "model_hash"),
    "hash-not-hex": (_edit_json("model.json", lambda d: d.update(model_hash="0xZZZZZZZZ")), "model_hash"),
    "hash-number": (_edit_json("model.json", lambda d: d.update(model_hash=12345)), "model_hash"),
    "hash-other": (_edit_json("model.json", lambda d: d.update(model_hash="0x12345678")), "model.json"),
    "int-model-missing": (_edit_json("model.json", lambda d: d.pop("int_model")), "int_model"),
    "int-model-string": (_edit_json("model.json", lambda d: d.update(int_model="x")), "int_model"),
    "family-unknown": (_edit_json("model.json", lambda d: d["int_model"].update(family="svm")), "model.json"),
    "value-changed": (_edit_json("model.json", _bump_one_value), "model.json"),
    "classes-renamed": (_edit_json("model.json", lambda d: d["int_model"].update(classes=["a", "b", "c"])),
                        "model.json"),
    "sha-missing": (_edit_json("model.json", lambda d: d.pop("int_model_sha256")), "model.json"),
    "fifo": (_replace_with("model.json", "fifo"), "regular file"),
    "directory": (_replace_with("model.json", "dir"), "regular file"),
    "dev-zero-link": (_replace_with("model.json", "devzero"), "regular file"),
    "dangling-link": (_replace_with("model.json", "dangling"), "model.json"),
}


@pytest.mark.parametrize("verb", MODEL_VERBS)
@pytest.mark.parametrize("case", sorted(MODEL_JSON_DAMAGE))
def test_damaged_model_json(tmp_path, golden, monkeypatch, verb, case):
    damage, keyword = MODEL_JSON_DAMAGE[case]

    def args(work: Path, model: Path) -> list[str]:
        damage(model)
        return [verb, str(model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


MODEL_DIR_ARGUMENT = {
    "missing": (lambda work, model: str(work / "nope"), "not a directory"),
    "regular-file": (lambda work, model: str(model / "report.json"), "is a file"),
    "empty-dir": (lambda work, model: str(Path(tempfile.mkdtemp(dir=work))), "model.json"),
    "user-dir": (lambda work, model: str(work), "model.json"),
}


@pytest.mark.parametrize("verb", MODEL_VERBS)
@pytest.mark.parametrize("case", sorted(MODEL_DIR_ARGUMENT))
def test_model_dir_argument(tmp_path, golden, monkeypatch, verb, case):
    pick, keyword = MODEL_DIR_ARGUMENT[case]

    def args(work: Path, model: Path) -> list[str]:
        (work / "data.csv").write_text("a,b\n1,0\n")  # the user's own file beside the model
        return [verb, pick(work, model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


def _save_npz(path: Path, **arrays) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def _vectors_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        path = model / "test_vectors.npz"
        with np.load(path) as data:
            arrays = {k: data[k].copy() for k in data.files}
        edit(arrays)
        path.unlink()
        _save_npz(path, **arrays)

    return damage


def _truncate(rel: str, size: int) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        os.truncate(model / rel, size)

    return damage


VECTORS_DAMAGE = {
    "missing": (_remove("test_vectors.npz"), "test_vectors.npz"),
    "truncated": (_truncate("test_vectors.npz", 1000), "test_vectors.npz"),
    "empty": (_truncate("test_vectors.npz", 0), "test_vectors.npz"),
    "garbage": (_write("test_vectors.npz", b"PK\x03\x04" + bytes(500)), "test_vectors.npz"),
    "fifo": (_replace_with("test_vectors.npz", "fifo"), "regular file"),
    "dev-zero-link": (_replace_with("test_vectors.npz", "devzero"), "regular file"),
    "pickled-arrays": (lambda m: (m / "test_vectors.npz").unlink() or np.savez(
        m / "test_vectors.npz", X_raw=np.array([object()] * 3, dtype=object)), "test_vectors.npz"),
    "array-missing": (_vectors_edit(lambda a: a.pop("scores")), "test_vectors.npz"),
    "score-edited": (_vectors_edit(lambda a: a["scores"].__setitem__((0, 0), a["scores"][0, 0] + 1)),
                     "test_vectors.npz"),
    "rows-dropped": (_vectors_edit(lambda a: [a.__setitem__(k, v[:-1]) for k, v in list(a.items())]),
                     "test_vectors.npz"),
}


@pytest.mark.parametrize("case", sorted(VECTORS_DAMAGE))
def test_damaged_test_vectors(tmp_path, golden, monkeypatch, case):
    damage, keyword = VECTORS_DAMAGE[case]

    def args(work: Path, model: Path) -> list[str]:
        damage(model)
        return ["validate", str(model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


def _append(rel: str, content: bytes) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        with open(model / rel, "ab") as handle:
            handle.write(content)

    return damage


def _elf_rel(model: Path) -> str:
    return json.loads((model / "build.json").read_text())["elf"]


BUILD_JSON_DAMAGE = {
    "missing": (_remove("build.json"), "tinyproto build"),
    "not-json": (_write("build.json", "{"), "build.json"),
    "array": (_write("build.json", "[]"), "build.json"),
    "elf-absolute": (_edit_json("build.json", lambda d: d.update(elf="/bin/true")), "build.json"),
    "elf-outside": (_edit_json("build.json", lambda d: d.update(elf="../../../../bin/true")), "outside"),
    "elf-number": (_edit_json("build.json", lambda d: d.update(elf=7)), "build.json"),
    "sizes-text": (_edit_json("build.json", lambda d: d.update(flash_bytes="lots")), "build.json"),
    "sizes-bool": (_edit_json("build.json", lambda d: d.update(sram_static_bytes=True)), "build.json"),
    "elf-missing": (lambda m: (m / _elf_rel(m)).unlink(), "missing"),
    # the ELF replaced by a link out of the directory was blamed on build.json ("points elf outside"), untrue
    "elf-linked-out": (lambda m: ((m / _elf_rel(m)).unlink(), (m / _elf_rel(m)).symlink_to("/bin/true")),
                       "leads out of the model directory through a symbolic link"),
    "elf-changed": (lambda m: _append(_elf_rel(m), b"\0")(m), "changed"),
    "other-model": (_edit_json("build.json", lambda d: d.update(model_hash="0x00000001")), "built for model"),
    "no-binding": (_edit_json("build.json", lambda d: d.pop("firmware_sha256")), "build"),
    "fifo": (_replace_with("build.json", "fifo"), "regular file"),
    # every value build writes, checked against the file it came from (was: accepted, and validate talked at a
    # baud or ring of the damaged record, or reported its sizes; a baud of 9600 passed and was reported)
    "env-unknown": (_edit_json("build.json", lambda d: d.update(env="nosuch")), "environments"),
    "env-number": (_edit_json("build.json", lambda d: d.update(env=3)), "environments"),
    "tool": (_edit_json("build.json", lambda d: d.update(tool="rm -rf /")), "tool"),
    **{f"{key}={value}": (_edit_json("build.json", lambda d, k=key, v=value: d.update({k: v})), key)
       for key, value in [("serial_baud", 9600), ("serial_baud", 0), ("serial_baud", -1), ("serial_baud", 10**9),
                          ("serial_baud", "x"), ("serial_baud", 1.5), ("serial_baud", None), ("rx_ring_bytes", 16),
                          ("rx_ring_bytes", 100000), ("rx_ring_bytes", True), ("sram_bytes", 0),
                          ("sram_bytes", -1), ("flash_available_bytes", 10), ("model_bytes", -1),
                          ("text_bytes", "x"), ("bss_bytes", -1)]},
    "flash-not-its-sections": (_edit_json("build.json", lambda d: d.update(flash_bytes=d["flash_bytes"] + 1)),
                               "text_bytes"),
    "sizes-beyond-the-board": (_edit_json("build.json", lambda d: d.update(
        flash_bytes=40000, text_bytes=40000 - d["data_bytes"])), "exceed"),
}


@pytest.mark.parametrize("verb", ("validate", "flash"))
@pytest.mark.parametrize("case", sorted(BUILD_JSON_DAMAGE))
def test_damaged_build_record(tmp_path, golden, monkeypatch, verb, case):
    damage, keyword = BUILD_JSON_DAMAGE[case]

    def args(work: Path, model: Path) -> list[str]:
        damage(model)
        return [verb, str(model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


def _journal(lines: list[str] | bytes) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        from tinyproto.core.manifest import record_outputs

        content = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode()
        record_outputs(model, "validation.jsonl")  # as validate does before it writes its journal
        (model / "validation.jsonl").write_bytes(content)

    return damage


def _binding_line(model: Path) -> str:
    from tinyproto.pipeline.validate import binding_of, load_build_info
    from tinyproto.core.modeldir import load_model_dir

    md = load_model_dir(model)
    return json.dumps({"binding": binding_of(md, load_build_info(md), "sim")})


def _with_binding(rows: list[str]) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        _journal([_binding_line(model), *rows])(model)

    return damage


JOURNAL_DAMAGE = {
    "missing": (lambda m: None, "nothing to resume"),
    "empty": (_journal(b""), "validation.jsonl"),
    "binary": (_journal(bytes(range(1, 256)) + b"\n"), "validation.jsonl"),
    "other-binding": (_journal(['{"binding": {"model_hash": "0x00000000"}}']), "another model"),
    "no-binding": (_journal(['{"i": 0, "label": 0, "cycles": 1, "scores": [1, 2, 3]}']), "another model"),
    "garbage-middle": (_with_binding(["not json", '{"i": 0, "label": 0, "cycles": 1, "scores": [1, 2, 3]}']),
                       "validation.jsonl:2"),
    "index-out-of-range": (_with_binding(['{"i": 100000, "label": 0, "cycles": 1, "scores": [1, 2, 3]}']),
                           "validation.jsonl:2"),
    "negative-index": (_with_binding(['{"i": -1, "label": 0, "cycles": 1, "scores": [1, 2, 3]}']),
                       "validation.jsonl:2"),
    "duplicate": (_with_binding(['{"i": 0, "label": 0, "cycles": 1, "scores": [1, 2, 3], "confidence": 0, '
                                 '"decided": 0}'] * 2),
                  "validation.jsonl:3"),
    "score-count": (_with_binding(['{"i": 0, "label": 0, "cycles": 1, "scores": [1]}']), "validation.jsonl:2"),
    "text-values": (_with_binding(['{"i": "0", "label": 0, "cycles": 1, "scores": [1, 2, 3]}']),
                    "validation.jsonl:2"),
    "fields-missing": (_with_binding(['{"i": 0}']), "validation.jsonl:2"),
    "row-not-object": (_with_binding(["[1, 2]"]), "validation.jsonl:2"),
    "link-to-user-file": (lambda m: (m / "validation.jsonl").symlink_to(m.parent / "user.txt"), "validation.jsonl"),
    "fifo": (lambda m: os.mkfifo(m / "validation.jsonl"), "validation.jsonl"),
    "directory": (lambda m: (m / "validation.jsonl").mkdir(), "validation.jsonl"),
}


@pytest.mark.parametrize("case", sorted(JOURNAL_DAMAGE))
def test_damaged_journal_refuses_resume(tmp_path, golden, monkeypatch, case):
    damage, keyword = JOURNAL_DAMAGE[case]

    def args(work: Path, model: Path) -> list[str]:
        (work / "user.txt").write_text("the user's own notes\n")
        damage(model)
        return ["validate", str(model), "--resume"]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


HEADER = "include/tinyproto_model.h"
SOURCE_DAMAGE = {
    "header-missing": (_remove(HEADER), "tinyproto_model.h"),
    "header-other-hash": (lambda m: (m / HEADER).write_text((m / HEADER).read_text().replace(
        "#define TP_MODEL_HASH 0x", "#define TP_MODEL_HASH 0x1")), "tinyproto_model.h"),
    "platformio-ini-garbage": (_write("platformio.ini", "[[[not an ini"), "platformio.ini"),
    "platformio-ini-missing": (_remove("platformio.ini"), "platformio.ini"),
}


def test_planted_side_journal_is_not_followed(tmp_path, golden, monkeypatch):
    """A link planted where validate writes its new journal must not make it write to the user's file."""

    def args(work: Path, model: Path) -> list[str]:
        (work / "user.txt").write_text("the user's own notes\n")
        (model / ".validation.jsonl.new").symlink_to(work / "user.txt")
        return ["validate", str(model)]

    run_case(tmp_path, golden, args, ".validation.jsonl.new", monkeypatch)


@pytest.mark.parametrize("case", sorted(SOURCE_DAMAGE))
def test_damaged_sources_refuse_build(tmp_path, golden, monkeypatch, case):
    damage, keyword = SOURCE_DAMAGE[case]

    def args(work: Path, model: Path) -> list[str]:
        damage(model)
        return ["build", str(model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


# ------------------------------------------------------------------------------------------------ options


def _user_dir(work: Path, files: dict[str, str]) -> Path:
    target = work / "mine"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    return target


def _then(action: object, value: str) -> str:
    """Run an action for its effect (its result is ignored), then give the --out value."""
    return value


OUT_CASES = {
    "regular-file": (lambda w, m: str(_user_dir(w, {"notes.txt": "x"}) / "notes.txt"), "not a directory"),
    "foreign-dir": (lambda w, m: str(_user_dir(w, {"data.csv": "a,b\n"})), "not written by tinyproto"),
    "empty-model-json": (lambda w, m: str(_user_dir(w, {"model.json": "{}", "data.csv": "a\n"})),
                         "not written by tinyproto"),
    "edited-model-dir": (lambda w, m: _then((m / "src" / "main.c").write_text("// mine\n"), str(m)), "changed"),
    "extra-file-in-model-dir": (lambda w, m: _then((m / "notes.txt").write_text("mine"), str(m)), "notes.txt"),
    "symlink": (lambda w, m: (w / "link").symlink_to(m) or str(w / "link"), "symbolic link"),
    "under-a-file": (lambda w, m: str(m / "report.json" / "sub"), "not a directory"),
    "under-dangling-link": (lambda w, m: (w / "dl").symlink_to(w / "gone") or str(w / "dl" / "sub"),
                            "broken symbolic link"),
    "name-too-long": (lambda w, m: str(w / ("x" * 300)), "255"),
    "proc": (lambda w, m: "/proc/tinyproto-out", "a directory cannot be created in /proc"),
    "cwd-with-user-files": (lambda w, m: _then((w / "data.csv").write_text("a,b\n"), "."), "not written by tinyproto"),
}


@pytest.mark.parametrize("verb", ("compile", "run"))
@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_unusable_out_is_refused_before_training(tmp_path, golden, monkeypatch, verb, case):
    pick, keyword = OUT_CASES[case]

    def args(work: Path, model: Path) -> list[str]:
        return [verb, "iris", "--budget", "1kB", "--out", pick(work, model)]

    run_case(tmp_path, golden, args, keyword, monkeypatch)


OPTION_CASES = {
    "budget-text": (["compile", "iris", "--budget", "abc"], "budget"),
    "budget-negative": (["compile", "iris", "--budget", "-1kB"], "budget"),
    "budget-zero": (["compile", "iris", "--budget", "0"], "budget"),
    "budget-nan": (["compile", "iris", "--budget", "nan"], "budget"),
    "budget-huge": (["compile", "iris", "--budget", "1e99kB"], "budget"),
    "budget-empty": (["compile", "iris", "--budget", ""], "budget"),
    "budget-too-small": (["compile", "iris", "--budget", "8B"], "budget"),
    "seed-negative": (["compile", "iris", "--seed", "-1"], "seed"),
    "seed-too-large": (["compile", "iris", "--seed", str(2**32)], "seed"),
    "seed-text": (["compile", "iris", "--seed", "abc"], "seed"),
    "board-unknown": (["compile", "iris", "--board", "nope"], "board"),
    "board-path": (["compile", "iris", "--board", "../pyproject"], "board"),
    "model-unknown": (["compile", "iris", "--model", "svm"], "model"),
    "data-missing": (["compile", "no-such-file.csv"], "no-such-file.csv"),
    "data-directory": (["compile", "adir.csv"], "adir.csv"),
    "data-extension": (["compile", "notes.txt.bak"], "notes.txt.bak"),
    "learnable-protonn": (["compile", "iris", "--learnable"], "learnable"),
    "run-seed": (["run", "iris", "--seed", "-5"], "seed"),
    "run-budget": (["run", "iris", "--budget", "two"], "budget"),
    "validate-port-and-sim": (["validate", "m", "--port", "/dev/null", "--sim"], "--port"),
    "flash-port-and-sim": (["flash", "m", "--port", "/dev/null", "--sim"], "--port"),
    "learn-port-and-sim": (["learn", "m", "--port", "/dev/null", "--sim"], "--port"),
    "validate-port-missing": (["validate", "m", "--port", "/dev/does-not-exist"], "does not exist"),
    "flash-port-missing": (["flash", "m", "--port", "/dev/does-not-exist"], "does not exist"),
    "flash-port-devnull": (["flash", "m", "--port", "/dev/null"], "not a serial port"),
    "flash-port-regular-file": (["flash", "m", "--port", "notes.txt.bak"], "not a serial port"),
    "validate-port-devnull": (["validate", "m", "--port", "/dev/null"], "/dev/null"),
    "validate-port-directory": (["validate", "m", "--port", "adir.csv"], "adir.csv"),
    "flash-port-directory": (["flash", "m", "--port", "adir.csv"], "not a serial port"),  # was: avrdude's "plugged in?"
    # refused before the compile (was: after training and building, leaving the model directory behind)
    "run-port-missing": (["run", "iris", "--budget", "1kB", "--out", "r", "--port", "/dev/does-not-exist"],
                         "does not exist"),
    "run-port-devnull": (["run", "iris", "--budget", "1kB", "--out", "r", "--port", "/dev/null"], "not a serial port"),
    "unknown-verb": (["frobnicate"], "frobnicate"),
    "unknown-option": (["compile", "--frob"], "--frob"),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_bad_option(tmp_path, golden, monkeypatch, case):
    argv, keyword = OPTION_CASES[case]

    def args(work: Path, model: Path) -> list[str]:
        (work / "adir.csv").mkdir()
        (work / "notes.txt.bak").write_text("1,2\n")
        return argv

    run_case(tmp_path, golden, args, keyword, monkeypatch)


def test_run_without_the_avr_toolchain_is_refused_before_training(tmp_path, monkeypatch):
    """`run` builds in its default environment with the system avr-gcc: without it, one line naming the apt
    packages before any training (it trained first, then failed in the build)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "iris", "--budget", "1kB", "--out", "r"])
    assert result.exit_code == 1 and "avr-gcc not found" in result.stderr and "gcc-avr" in result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("place", ["a  b", "non-utf8"])
def test_run_into_a_directory_platformio_cannot_build_in_is_refused_before_training(tmp_path, monkeypatch, place):
    """`run --out "a  b"` (PlatformIO reads two spaces as one), or a relative --out under a working directory whose
    name is not UTF-8: it trained and wrote the model, then the build failed (for the second with PlatformIO's
    "An unexpected error occurred"). One line now, before training, nothing written."""
    from tinyproto.device.build import platformio_available

    if not platformio_available():
        pytest.skip("PlatformIO is not installed: run builds with avr-gcc")
    here = tmp_path / (os.fsdecode(b"d\xff") if place == "non-utf8" else "w")
    here.mkdir()
    monkeypatch.chdir(here)
    result = CliRunner().invoke(main, ["run", "iris", "--budget", "1kB", "--out", "a  b" if place == "a  b" else "r"])
    assert result.exit_code == 1 and "PlatformIO cannot build in" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(here) == []


@pytest.mark.parametrize("link", ["cause", "context", "deep"])
def test_an_error_a_library_raised_because_of_ctrl_c_is_an_interrupt_not_a_bug(tmp_path, monkeypatch, link):
    """A Ctrl-C inside an extension's import comes back as its own error ("ImportError: initialization failed",
    the KeyboardInterrupt as its cause): the user interrupted, so exit 130, not an internal error (70)."""
    def interrupted_import(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            if link == "cause":
                raise ImportError("initialization failed") from interrupt
            if link == "context":
                raise ImportError("initialization failed")  # noqa: B904 - what a library does
            try:
                raise RuntimeError("cleanup failed") from interrupt
            except RuntimeError:
                raise SystemError("error return without exception set")  # noqa: B904

    monkeypatch.setattr("tinyproto.pipeline.compile.load_dataset", interrupted_import)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["compile", "iris", "--out", "m"])
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines() == ["interrupted; nothing half-written was left behind"]
    assert list(tmp_path.iterdir()) == []


def test_an_error_with_no_interrupt_behind_it_is_still_an_internal_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        try:
            raise ValueError("first")
        except ValueError:
            raise ImportError("initialization failed")

    monkeypatch.setattr("tinyproto.pipeline.compile.load_dataset", broken)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["compile", "iris", "--out", "m"])
    assert result.exit_code == 70 and "internal error (ImportError" in result.stderr


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EDQUOT"])
def test_a_full_disk_names_the_file_written_and_what_to_do(tmp_path, monkeypatch, errno_name):
    """A copy on a full disk was reported as 'error: No space left on device: /.../firmware/tp_avr.h', naming the
    runtime source that was only read (the system names a copy's source first)."""
    import errno

    from tinyproto.cli.main import os_error_line

    code = getattr(errno, errno_name)
    full = OSError(code, os.strerror(code), "/checkout/firmware/tp_avr.h", None, "/full/m/lib/tp_avr.h")
    line = os_error_line(full)
    assert line.endswith("/checkout/firmware/tp_avr.h -> /full/m/lib/tp_avr.h; free some space and run the command "
                         "again"), line
    assert os_error_line(OSError(errno.EACCES, "Permission denied", "/x")).startswith("Permission denied: /x;")
    # a directory where a file goes (learn's learning/build.json) said "Is a directory: ..." and nothing to do
    assert os_error_line(OSError(errno.EISDIR, "Is a directory", "/m/b.json")).endswith("move the directory away")


@pytest.mark.parametrize("args", [["--help"], ["compile", "--help"], ["boards"]])
def test_a_full_standard_output_is_one_line_naming_it(args):
    """`tinyproto --help > /dev/full` ended in a traceback (click prints help outside the commands' handling), and
    `boards > /dev/full` said "No space left on device; free some space", as if the disk were full."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "tinyproto", *args], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines == ["error: No space left on device: standard output; what the command printed there was lost"]


def test_a_deleted_working_directory_is_named_with_what_to_do(tmp_path, monkeypatch):
    """compile --out rel from a deleted directory said only "error: No such file or directory"."""
    from tinyproto.cli.main import os_error_line

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(FileNotFoundError) as info:
        os.getcwd()
    assert os_error_line(info.value).startswith("the current directory no longer exists")


@pytest.mark.parametrize("code, said", [("EPERM", "check the permissions of /m/.tinyproto and of its directory"),
                                        ("EACCES", "check the permissions of /m/.tinyproto and of its directory"),
                                        ("EROFS", "read-only file system: work on a copy")])
def test_a_directory_tinyproto_may_not_write_says_what_to_do_and_names_the_file_not_its_temporary(code, said):
    """An immutable model directory said 'Operation not permitted: /m/..tinyproto.t4imcu5k.tmp': the temporary file
    a JSON file is written through, a name the user never sees, and nothing to do."""
    import errno

    from tinyproto.cli.main import os_error_line

    number = getattr(errno, code)
    line = os_error_line(OSError(number, os.strerror(number), "/m/..tinyproto.t4imcu5k.tmp"))
    assert line.startswith(f"{os.strerror(number)}: /m/.tinyproto;") and said in line and ".tmp" not in line, line
    named = os_error_line(OSError(number, os.strerror(number), "/m/.validation.json.AbC_1234.tmp"))
    assert named.startswith(f"{os.strerror(number)}: /m/validation.json;"), named
