"""Cases from a sixth fault campaign, on everything tinyproto reads from the user (data files, model directories,
options), each one a failure that campaign found: model.json numbers JSON cannot hold (NaN, Infinity, 1e400),
keys given twice and lone surrogates; fields outside int_model of the wrong type or range; an int_model edited
and re-hashed into a model whose sizes disagree or that the C code cannot run (export wrote a library of it);
a data set's name that closed the header's comment; a line added to the header's banner; report.json figures
export could not print; and CSV files whose line ends are Unicode line separators.

Every refused case asserts: exit status 1 (or click's 2), one message naming the problem, no traceback, no file
of the user changed, and nothing left behind (in the directory, beside it, or in the temporary directory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner

from tinyproto import families
from tinyproto.cli import main
from tinyproto.core.modeldir import int_model_digest
from tinyproto.core.render import model_hash

from test_campaign_s4 import _snapshot, accepted, work  # noqa: F401  (work: the fixture)


def refused(args: list[str], keyword: str, watch: Path) -> str:
    """Run tinyproto; it must refuse in one line naming `keyword`, changing nothing under `watch`."""
    before = _snapshot(watch, own_files_at_root=True)
    result = CliRunner().invoke(main, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert lines and lines[-1].startswith(("error:", "Error:")), result.stderr
    assert len([line for line in lines if line.startswith("error:")]) <= 1, result.stderr
    assert keyword.lower() in lines[-1].lower(), (keyword, lines[-1])
    assert _snapshot(watch, own_files_at_root=True) == before, "a file changed, appeared or vanished"
    return lines[-1]


VERBS = {"build": lambda m: ["build", str(m)],
         "export": lambda m: ["export", str(m), "--arduino", "--out", str(m.parent / "exported")]}


# ------------------------------------------------------------------------------------------------ model.json


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
    refused(VERBS[verb](model), "model.json", model.parent)


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
    refused(VERBS[verb](model), "model.json", model.parent)


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
    "offset-short": (lambda im: im.update(offset=im["offset"][:1]), "shapes"),
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
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("case", sorted(REHASHED))
def test_rehashed_int_model_must_be_runnable(work, compiled, verb, case):
    """export wrote an Arduino library for each of these (build was saved only by the header check)."""
    model = compiled("iris", "1kB")
    edit, keyword = REHASHED[case]
    _rehashed(model, edit)
    message = refused(VERBS[verb](model), keyword, model.parent)
    assert "model.json is damaged" in message


def test_the_four_families_round_trip_their_int_model(compiled):
    """The check above refuses any int_model that is not exactly what the rebuilt model writes: every family's
    own model.json must pass it."""
    from tinyproto.core.modeldir import load_model_dir

    for name in families.names():
        directory = load_model_dir(compiled("iris", "1kB", name))
        model = families.load_int_model(directory)
        assert families.inconsistency(model) is None
        assert json.dumps(model.to_json(), sort_keys=True) == json.dumps(directory.meta["int_model"], sort_keys=True)


# ------------------------------------------------------------------------------------------------ C text


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
    refused(["build", str(model)], "not what model.json renders", model.parent)


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
    refused(["build", str(model)], "not what model.json renders", model.parent)


@pytest.mark.parametrize("total", ["Infinity", "NaN", "1e300", "[1, 2]", '"fast"', "true"])
def test_export_leaves_out_a_cycle_figure_report_json_cannot_hold(work, compiled, total):
    """report.json is not hashed; an infinite predicted cycle count was an internal error (int(inf))."""
    model = compiled("iris", "1kB")
    path = model / "report.json"
    report = json.loads(path.read_text())
    report["predicted_cycles"] = {"total": "@@"}
    path.write_text(json.dumps(report).replace('"@@"', total))
    accepted(VERBS["export"](model))
    library_h = next((model.parent / "exported").rglob("TinyprotoIris.h")).read_text()
    assert "Cost: about" not in library_h  # the figure is left out, not printed as inf, nan or text


def test_a_data_set_name_that_gives_no_library_name_says_so(work, compiled):
    """It blamed a `--name 'Tinyproto'` that nobody gave."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta["dataset"] = "!!!"
    (model / "model.json").write_text(json.dumps(meta))
    refused(VERBS["export"](model), "give one with --name", model.parent)


# ------------------------------------------------------------------------------------------------ data


GOOD_ROWS = "".join(f"{i % 7}.5,{(i * 3) % 11},{i % 2}\n" for i in range(60))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_csv_with_unicode_line_separators_is_named(work, separator):
    """Every row ran into one line and the message blamed duplicate column names."""
    data = work / "d.csv"
    data.write_text(("a,b,label\n" + GOOD_ROWS).replace("\n", separator), encoding="utf-8")
    refused(["compile", str(data), "--budget", "1kB", "--out", "o"], f"U+{ord(separator):04X}", work)


def test_csv_lines_are_read_as_stringio_would_without_its_copy():
    """A 500 MB CSV took 4.7 GB to refuse: io.StringIO held the text again at 4 bytes a character, and a list of
    its lines found the header. The lazy reader must give the csv module exactly the lines StringIO gives."""
    import io
    import random

    from tinyproto.core.data_csv import _first_nonblank_line, _lines

    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(["a", " ", ",", "\r", "\n", "\r\n", '"']) for _ in range(rng.randint(0, 14)))
        assert list(_lines(text)) == list(io.StringIO(text, newline="")), repr(text)
        expected = next((line for line in text.splitlines() if line.strip(" \t,;")), None)
        assert _first_nonblank_line(text) == expected, repr(text)


def test_a_data_file_named_as_a_directory_is_refused(work):
    """'data.csv/' was read as data.csv (pathlib drops the slash); the system itself says it is not a directory."""
    (work / "d.csv").write_text("a,b,label\n" + GOOD_ROWS)
    refused(["compile", "d.csv/", "--budget", "1kB", "--out", "o"], "not a directory", work)
