"""The files of a model directory that tinyproto reads back (model.json, the generated header and sources): a
model.json with numbers JSON cannot hold, keys given twice or lone surrogates, fields of the wrong type, an
int_model edited and re-hashed into a model that cannot run, a board that is a path, class names that are not
distinct; a header or source edited, replaced by a FIFO or linked to /dev/zero; a data set's name that would close
the header's comment. Every one is refused in one line naming the file, nothing of the user's changed."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from helpers import accepted, refused
from tinyproto import families
from tinyproto.core.modeldir import int_model_digest
from tinyproto.core.render import model_hash

# ------------------------------------------------------------------------------------------------------ model.json


VERBS = {"build": lambda m: ["build", str(m)],
         "export": lambda m: ["export", str(m), "--arduino", "--out", str(m.parent / "exported")]}


def _rewrite(model: Path, text: Callable[[str], str]) -> None:
    path = model / "model.json"
    path.write_text(text(path.read_text()))


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("case", ["Infinity", "NaN", "1e400", "twice", "surrogate"])
def test_model_json_numbers_and_text_json_cannot_mean(work, compiled, verb, case):
    """Infinity as the seed and 1e400 as the budget were internal errors (int(inf)); NaN, a key given twice and
    a lone surrogate were read as whatever the parser made of them."""
    model = compiled("iris", "1kB")
    edit = {"Infinity": lambda t: t.replace('"seed": 0', '"seed": Infinity'),
            "NaN": lambda t: t.replace('"seed": 0', '"seed": NaN'),
            "1e400": lambda t: t.replace('"budget_bytes": 1024', '"budget_bytes": 1e400'),
            "twice": lambda t: t.replace('"seed": 0', '"seed": 0, "seed": "x"'),
            "surrogate": lambda t: t.replace('"dataset": "iris"', '"dataset": "\\ud800"')}[case]
    before = (model / "model.json").read_text()
    _rewrite(model, edit)
    assert (model / "model.json").read_text() != before  # the edit applied
    refused(VERBS[verb](model), "model.json", model.parent, own_files_at_root=True)


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("field, value", [("seed", "x"), ("seed", -1), ("seed", 10**40), ("budget_bytes", -5),
                                          ("budget_bytes", "1 */ int evil; /*"), ("budget_bytes", True),
                                          ("dataset", ["iris"]), ("dataset", "d" * 300), ("format_version", True)])
def test_model_json_fields_have_the_type_compile_writes(work, compiled, verb, field, value):
    """These go into the generated header's banner and file names; export rendered a seed of 'x' and any
    budget text into C, build took a negative budget and a seed of 1e40."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta[field] = value
    (model / "model.json").write_text(json.dumps(meta))
    refused(VERBS[verb](model), "model.json", model.parent, own_files_at_root=True)


@pytest.mark.parametrize("field, value", [("int8_accuracy", [1]), ("float_accuracy", 1.5), ("model_bytes", "330"),
                                          ("budget_bytes", -5)])
def test_report_json_figures_any_verb_reads_have_their_kind(work, compiled, field, value):
    """learn printed report.json's int8_accuracy after learning: a list there was an internal error at its end;
    build and validate record model_bytes. Every verb that loads the directory checks them first."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.core.modeldir import load_model_dir

    model = compiled("iris", "1kB")
    report = json.loads((model / "report.json").read_text())
    report[field] = value
    (model / "report.json").write_text(json.dumps(report))
    with pytest.raises(TinyprotoError, match=rf"report\.json is damaged: {field} is "):
        load_model_dir(model)


@pytest.mark.parametrize("name", ["model.json", "report.json"])
@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_a_link_in_a_files_place_is_named_not_called_missing(work, compiled, name, link):
    """exists() is False for a loop of symbolic links or a dangling one: model.json there was "not a tinyproto
    model directory (no model.json)", report.json "has no report.json" (build) or silently none (learn)."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.core.modeldir import load_model_dir

    model = compiled("iris", "1kB")
    (model / name).unlink()
    (model / name).symlink_to(name if link == "loop" else "gone.json")
    words = "loop of symbolic links" if link == "loop" else "which does not exist; put the file itself there"
    with pytest.raises(TinyprotoError, match=rf"{re.escape(str(model / name))}.*{words}"):
        load_model_dir(model).require_report()


def test_a_file_that_cannot_be_read_is_said_so_not_damaged_or_changed(work, compiled):
    """Unreadable files (no read permission) were called what they are not: test_vectors.npz "damaged
    (PermissionError); run tinyproto compile again", the header "no longer matches the built firmware",
    platformio.ini a project of no environments (configparser skips a file it cannot open), the manifest (.tinyproto)
    "not written by tinyproto". Each reader now says
    it cannot read the file and what to do. Root reads any file: it runs without CAP_DAC_OVERRIDE then."""
    import subprocess
    import sys

    model = compiled("iris", "1kB")
    files = ["test_vectors.npz", "include/tinyproto_model.h", "platformio.ini", ".tinyproto"]
    for name in files:
        os.chmod(model / name, 0)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tinyproto.core.errors import TinyprotoError\n"
        "from tinyproto.core.manifest import read_manifest\n"
        "from tinyproto.core.modeldir import load_model_dir\n"
        "from tinyproto.device.project import parser_of\n"
        "from tinyproto.pipeline.validate import header_model_hash\n"
        "m = Path(sys.argv[1])\n"
        "for read in (lambda: load_model_dir(m).vectors(), lambda: header_model_hash(m), lambda: parser_of(m),\n"
        "             lambda: read_manifest(m)):\n"
        "    try:\n"
        "        read()\n"
        "        print('read')\n"
        "    except TinyprotoError as exc:\n"
        "        print(exc)\n")
    prefix = ([shutil.which("setpriv"), "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
               "-dac_override,-dac_read_search"] if os.geteuid() == 0 else [])
    if os.geteuid() == 0 and prefix[0] is None:
        pytest.skip("root without setpriv reads any file")
    lines = subprocess.run([*prefix, sys.executable, "-c", script, str(model)], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert len(lines) == 4, lines
    for name, line in zip(files, lines):
        assert line.startswith(f"cannot read {model / name} (") and "Permission denied; make it readable" in line, line


@pytest.mark.parametrize("verb", ["build", "export", "validate"])
@pytest.mark.parametrize("field", ["board", "prefix", "seed", "dataset"])
def test_model_json_without_a_field_compile_writes_is_refused(work, compiled, verb, field):
    """A missing board was filled in as uno (a Mega's model built and validated for an Uno), a missing prefix as
    the data set's name, a missing seed as 0: each default builds another firmware than compile's."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    del meta[field]
    (model / "model.json").write_text(json.dumps(meta))
    args = VERBS[verb](model) if verb in VERBS else ["validate", str(model), "--sim"]
    line = refused(args, f"has no {field}", model.parent, own_files_at_root=True)
    assert "run `tinyproto compile` again" in line, line


def _rehashed(model: Path, edit: Callable[[dict], object]) -> None:
    """Edit int_model and record its sha256 and model hash anew, as a tool (or a person) that knows the format
    would: the hashes then prove nothing, and what is left is whether the model itself holds together."""
    meta = json.loads((model / "model.json").read_text())
    edit(meta["int_model"])
    meta["int_model_sha256"] = int_model_digest(meta["int_model"])
    try:
        meta["model_hash"] = f"0x{model_hash(families.int_model_from_json(meta['int_model'])):08X}"
    except Exception:  # a model the loader cannot even build keeps the old hash: refused either way
        pass
    (model / "model.json").write_text(json.dumps(meta))


def _stage(**fields) -> Callable[[dict], None]:
    return lambda im: im["input_stage"].update(fields)


REHASHED = {
    "W-wider-than-the-input": (lambda im: im.update(W_q=[row + [1] for row in im["W_q"]]), "features"),
    "B-other-projection": (lambda im: im.update(B_q=[row[:-1] for row in im["B_q"]]), "shapes"),
    "Z-more-classes": (lambda im: im.update(Z_q=[row + [0] for row in im["Z_q"]]), "class"),
    "Z-fewer-prototypes": (lambda im: im.update(Z_q=im["Z_q"][:5]), "shapes"),
    # a one-entry projection offset for a D > 1 projection (the model may have none: a per-feature input stage)
    "offset-short": (lambda im: im.update(offset=(im.get("offset") or [0, 0])[:1]), "shapes"),
    "classes-more": (lambda im: im.update(classes=[0, 1, 2, 3]), "class"),
    "shift-beyond-int32": (lambda im: im.update(table_shift=99), "SHIFT"),
    "shift-text": (lambda im: im.update(proj_shift="7"), "proj_shift"),
    "shift-fraction": (lambda im: im.update(proj_shift=6.5), "proj_shift"),
    "weight-fraction": (lambda im: im["W_q"][0].__setitem__(0, 1.5), "W_q"),
    "unknown-field": (lambda im: im.update(evil=[1, 2, 3]), "evil"),
    "inputs-negative": (_stage(n_inputs=-4), "inputs"),
    "inputs-fewer-than-features": (_stage(n_inputs=2), "inputs"),
    "inputs-huge": (_stage(n_inputs=10**12), "inputs"),
    "input-scale-zero": (_stage(input_scale=0.0), "input_scale"),
    "exponent-huge": (_stage(mean_exp=10**6), "EXP"),
    # a field missing: named in words ("it has no field 'table'"), where the line said "(KeyError: 'table')"
    "table-missing": (lambda im: im.pop("table"), "it has no field 'table'"),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("case", sorted(REHASHED))
def test_rehashed_int_model_must_be_runnable(work, compiled, verb, case):
    """export wrote an Arduino library for each of these (build was saved only by the header check)."""
    model = compiled("iris", "1kB")
    edit, keyword = REHASHED[case]
    _rehashed(model, edit)
    message = refused(VERBS[verb](model), keyword, model.parent, own_files_at_root=True)
    assert "model.json is damaged" in message


def _confidence(**fields) -> Callable[[dict], None]:
    return lambda im: im["confidence"].update(fields)


REHASHED_CONFIDENCE = {
    "doubt-negative": _confidence(doubt=-5), "doubt-text": _confidence(doubt="x"),
    "halving-zero": _confidence(halving=0), "threshold-beyond-16-bits": _confidence(unknown_above=10**12),
    "threshold-fraction": _confidence(unknown_above=0.5), "rate-negative": _confidence(unknown_rate=-0.1),
    "rate-above-half": _confidence(unknown_rate=3), "rate-text": _confidence(unknown_rate="5%"),
    "score-byte-7": _confidence(score_byte=7), "lowest-wins-text": _confidence(lowest_wins="yes"),
    "range-reversed": _confidence(range=[512, 255]),
    "clips-unknown-side": _confidence(clips={"side": "up", "above": 1}),
    "not-an-object": lambda im: im.update(confidence=[1, 2]),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("case", sorted(REHASHED_CONFIDENCE))
def test_rehashed_confidence_must_be_in_range(work, compiled, verb, case):
    """A calibration edited consistently (hashes rewritten) is refused naming model.json; a negative unknown_rate
    was built, validated and exported (the report then stated it as the model's rate)."""
    model = compiled("iris", "1kB", unknown_rate="5%")
    _rehashed(model, REHASHED_CONFIDENCE[case])
    message = refused(VERBS[verb](model), "model.json is damaged", model.parent, own_files_at_root=True)
    assert "confidence" in message or "unknown" in message


def test_the_four_families_round_trip_their_int_model(compiled):
    """The check above refuses any int_model that is not exactly what the rebuilt model writes: every family's
    own model.json must pass it."""
    from tinyproto.core.modeldir import load_model_dir

    for name in families.names():
        directory = load_model_dir(compiled("iris", "1kB", name))
        model = families.load_int_model(directory)
        assert families.inconsistency(model) is None
        assert json.dumps(model.to_json(), sort_keys=True) == json.dumps(directory.meta["int_model"], sort_keys=True)


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


@pytest.mark.parametrize("board", ["../boards/uno", "/tmp/evil", 5, None])
def test_model_json_board_is_a_name_not_a_path(work, compiled, board):
    """model.json's board picked any JSON file on the machine (a board file without the keys: internal error)."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta["board"] = board
    (model / "model.json").write_text(json.dumps(meta))
    refused(["build", str(model)], "unknown board", model.parent)

# ------------------------------------------------------------------------------------------------ test_vectors.npz


@pytest.mark.parametrize("verb", ["build", "export", "report"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_test_vectors_file_is_named_once(work, compiled, verb, damage):
    """A damaged test_vectors.npz was reported as "model.json is damaged: the directory is inconsistent,
    .../test_vectors.npz is damaged (BadZipFile); run `tinyproto compile` again; run `tinyproto compile` again"."""
    model = compiled("iris", "1kB")
    path = model / "test_vectors.npz"
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[: len(raw) // 2], "garbage": b"\x00\xff not a zip" * 40, "empty": b""}[damage])
    args = [verb, str(model)] + (["--arduino", "--out", str(model.parent / "lib")] if verb == "export" else [])
    line = refused(args, "test_vectors.npz is damaged", model.parent)
    assert "model.json" not in line and line.count("tinyproto compile") == 1, line


@pytest.mark.parametrize("verb", ["build", "report"])
def test_a_missing_or_pickled_array_of_the_test_vectors_is_named_in_words(work, compiled, verb):
    """A test_vectors.npz without its scores array was "is damaged (KeyError)"; one whose array holds Python
    objects "(ValueError)": every .npz reader names what is missing or wrong, never numpy's exception class."""
    model = compiled("iris", "1kB")
    path = model / "test_vectors.npz"
    arrays = dict(np.load(path))
    del arrays["scores"]
    np.savez(path, **arrays)
    line = refused([verb, str(model)], "it has no array 'scores' (arrays in it: X_raw", model.parent)
    assert "Error" not in line and "run `tinyproto compile` again" in line, line
    arrays["scores"] = np.array([{"a": 1}], dtype=object)
    np.savez(path, **arrays)
    line = refused([verb, str(model)], "its array 'scores' holds Python objects", model.parent)
    assert "Error" not in line, line


def test_the_advice_names_the_command_that_made_the_directory(work, compiled):
    """A federated model's damaged report.json or test vectors said "run tinyproto compile again": the manifest
    records the verb that made a directory (made_by), and every "make it again" advice names that verb (federate,
    learn for its learned/ model, a sweep for its point); a directory with no such record is compile's."""
    from tinyproto.core.manifest import remake_advice

    accepted(["federate", "iris", "--parties", "2", "--backend", "local", "--budget", "1kB", "--out",
              str(work / "fed")])
    manifest = json.loads((work / "fed" / ".tinyproto").read_text())
    assert manifest.pop("made_by") == "federate"
    (work / "fed" / ".tinyproto").write_text(json.dumps(manifest))  # as a federate before made_by wrote it
    assert remake_advice(work / "fed") == "run `tinyproto federate` again"  # from its report.json's parties
    (work / "fed" / ".tinyproto").write_text(json.dumps({**manifest, "made_by": "federate"}))
    (work / "fed" / "report.json").write_text('{"model": ')
    line = refused(["build", str(work / "fed")], "report.json is damaged", work)
    assert line.endswith("run `tinyproto federate` again"), line
    model = compiled("iris", "1kB")
    assert json.loads((model / ".tinyproto").read_text())["made_by"] == "compile"
    assert remake_advice(model) == "run `tinyproto compile` again"
    (work / "learnable").mkdir()
    (work / "learnable" / "learn.json").write_text("{}")
    shutil.copytree(model, work / "learnable" / "learned", symlinks=True)
    (work / "learnable" / "learned" / ".tinyproto").unlink()  # no record: decided from where it is
    assert remake_advice(work / "learnable" / "learned") == f"run `tinyproto learn {work / 'learnable'}` again"
    (work / "sweep" / "points").mkdir(parents=True)
    (work / "sweep" / "sweep.json").write_text("{}")
    shutil.copytree(model, work / "sweep" / "points" / "p1", symlinks=True)
    assert remake_advice(work / "sweep" / "points" / "p1").startswith("run the sweep again in a new --out")


VECTOR_EDITS = {
    "a label out of range": lambda a: a.__setitem__("y", a["y"] + 50),
    "a negative label": lambda a: a.__setitem__("y", a["y"] - 50),
    "NaN inputs": lambda a: a.__setitem__("X_raw", a["X_raw"] * np.nan),
    "a reference label changed": lambda a: a["labels"].__setitem__(0, (a["labels"][0] + 1) % 3),
    "a confidence of 300": lambda a: a.__setitem__("confidence", a["confidence"] + 300),
    "one row left": lambda a: [a.__setitem__(k, v[:1]) for k, v in list(a.items())],
    "an extra array": lambda a: a.__setitem__("extra", np.ones(3)),
}


@pytest.mark.parametrize("verb", ["report", "export"])
@pytest.mark.parametrize("edit", sorted(VECTOR_EDITS))
def test_edited_test_vectors_are_refused_by_every_verb(work, compiled, verb, edit):
    """Only validate compared test_vectors.npz with model.json's vectors_sha256: report drew edited rows (NaN
    inputs, a label changed) and failed on a label out of range (IndexError, exit 70)."""
    model = compiled("iris", "1kB")
    path = model / "test_vectors.npz"
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    VECTOR_EDITS[edit](arrays)
    np.savez(path, **arrays)
    args = [verb, str(model)] + (["--arduino", "--out", str(model.parent / "lib")] if verb == "export" else [])
    refused(args, "test_vectors.npz is damaged or edited", model.parent)


@pytest.mark.parametrize("key, change", [("y", lambda a: a + 0.5), ("labels", lambda a: a.astype(np.float64)),
                                         ("X_raw", lambda a: a.astype(np.int64))])
def test_test_vectors_of_another_dtype_are_refused_even_rehashed(work, built_models, tmp_path, key, change):
    """Rewritten with vectors_sha256 recorded anew (as a tool that knows the format would): true labels of 3.5 were
    validated (exit 0, the device's accuracy computed against labels no class has); each array has its dtype."""
    import hashlib
    import shutil

    model = tmp_path / "m"
    shutil.copytree(built_models("iris", "1kB"), model)
    path = model / "test_vectors.npz"
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays[key] = change(arrays[key])
    np.savez(path, **arrays)
    meta = json.loads((model / "model.json").read_text())
    meta["vectors_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (model / "model.json").write_text(json.dumps(meta))
    refused(["validate", str(model), "--sim"], f"its array {key} has shape", tmp_path, own_files_at_root=True)


# ---------------------------------------------------------------------------------------------- header and sources


def _bump_first_array_value(text: str) -> str:
    import re

    match = re.search(r"PROGMEM = \{\s*(-?\d+)", text)
    value = int(match.group(1))
    return text[:match.start(1)] + str(value - 1 if value > 0 else value + 1) + text[match.end(1):]


HEADER = "include/tinyproto_model.h"
SIZES = "include/tinyproto_sizes.h"


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
    # the sizes header was checked only for being a file: a directory there was "missing (the directory predates
    # protocol version 2)", and a link to another file, or a size edited, went to the compiler
    "sizes-directory": (lambda m: ((m / SIZES).unlink(), (m / SIZES).mkdir()), "sizes.h is not a regular file"),
    "sizes-link-to-a-user-file": (lambda m: ((m / SIZES).unlink(), (m.parent / "notes.txt").write_text("mine\n"),
                                             (m / SIZES).symlink_to(m.parent / "notes.txt")),
                                  "not what tinyproto writes"),
    "sizes-ring-edited": (lambda m: (m / SIZES).write_text(re.sub(r"(#define TP_RX_RING )\d+", r"\g<1>8",
                                                                  (m / SIZES).read_text())),
                          "not what tinyproto writes"),
}


@pytest.mark.parametrize("case", sorted(BUILD_DAMAGE))
def test_build_refuses_a_header_or_source_that_is_not_the_model(work, compiled, case):
    damage, keyword = BUILD_DAMAGE[case]
    model = compiled("iris", "1kB")
    damage(model)
    refused(["build", str(model)], keyword, model.parent)


def test_data_set_name_cannot_close_the_header_comment(work, compiled):
    """model.json's dataset went verbatim into tinyproto_model.h's banner: '*/' and a line break made it code."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta["dataset"] = "x */\n#error injected\n/*"
    (model / "model.json").write_text(json.dumps(meta))
    accepted(VERBS["export"](model))
    header = next((model.parent / "exported").rglob("tinyproto_model.h")).read_text()
    banner = header[: header.find("#ifndef")]
    assert "#error" not in banner.replace("?#error", "") and banner.count("*/") == 1, banner


@pytest.mark.parametrize("line", ["#define TP_PROTONN_PROJ_RSHIFT 3\n", '#include "/etc/hostname"\n'])
def test_a_line_added_to_the_header_banner_is_refused(work, compiled, line):
    """Only the header from its include guard on was compared: a line above it was compiled unchecked."""
    model = compiled("iris", "1kB")
    path = model / "include" / "tinyproto_model.h"
    text = path.read_text()
    guard = text.find("#ifndef TINYPROTO_MODEL_H")
    path.write_text(text[:guard] + line + text[guard:])
    refused(["build", str(model)], "not what model.json renders", model.parent, own_files_at_root=True)


def test_header_naming_another_tinyproto_version_still_builds_the_check(work, compiled):
    """The first line (tinyproto's version) is the one line allowed to differ."""
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.pipeline.firmware import _check_header_is_the_model

    model = compiled("iris", "1kB")
    path = model / "include" / "tinyproto_model.h"
    first, _, rest = path.read_text().partition("\n")
    path.write_text("/* Generated by tinyproto 9.9.1+local; do not edit.\n" + rest)
    directory = load_model_dir(model)
    _check_header_is_the_model(directory, families.load_int_model(directory))


def test_code_after_the_version_on_the_first_line_is_refused(work, compiled):
    model = compiled("iris", "1kB")
    path = model / "include" / "tinyproto_model.h"
    first, _, rest = path.read_text().partition("\n")
    path.write_text(first.replace("; do not edit.", "; do not edit. */ #define TP_N_CLASSES 2 /*") + "\n" + rest)
    refused(["build", str(model)], "not what model.json renders", model.parent, own_files_at_root=True)
