"""tinyproto report: figures and a self-contained report.html, opened in a real headless browser (Debian's chromium
driven by playwright) that must show every plot, the frontier table, no console error and no network request.

The sweep here validates its points on the simulated board (iris, two families at one budget), so the device
figures (agreement, measured cycles) are drawn too; one of its model directories is reported on its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tinyproto.cli import main
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.htmlreport import write_report
from tinyproto.pipeline.report_data import configurations, pareto_frontier, recommend
import os

from helpers import accepted, refused

device = pytest.mark.device  # with the simulated board: avr-gcc and simavr (tools/setup.sh installs both)
needs_avr_gcc = pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def sim_sweep(tmp_path_factory):
    pytest.importorskip("distributed")
    from tinyproto.pipeline.sweep import SweepOptions, sweep

    out = tmp_path_factory.mktemp("report") / "sweep"
    result = sweep("iris", out, SweepOptions(models="protonn,flynn", budgets="0.5kB", device="sim", workers=2))
    assert result.complete
    return out


@device
@needs_avr_gcc
def test_sweep_on_the_simulated_board_records_device_figures(sim_sweep):
    records = [json.loads(line) for line in (sim_sweep / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["protonn-512B-seed0-uno", "flynn-512B-seed0-uno"]
    for r in records:
        assert r["status"] == "ok", r["error"]
        device = r["device"]
        assert device["passed"] and device["label_agreement"] == 1.0 and device["score_agreement"] == 1.0
        assert device["accuracy"] == r["int8_accuracy"]  # bit-exact: the device is the host int8 reference
        assert device["cycles_mean"] > 0 and device["stack_peak_bytes"] > 0
        assert set(r["seconds"]) == {"compile", "build", "validate", "total"}
        assert (sim_sweep / r["dir"] / "validation.json").exists()


def _row(model, budget, nbytes, acc, ms):
    return {"model": model, "budget_bytes": budget, "board": "uno", "seed": 0, "model_bytes": nbytes,
            "accuracy": acc, "float_accuracy": acc, "int8_accuracy": acc, "device_accuracy": acc,
            "latency_ms": ms, "energy_mj": ms / 4, "measured": True}


def test_frontier_and_recommendation():
    rows = [_row("protonn", 1024, 1000, 0.90, 1.0), _row("protonn", 2048, 2000, 0.97, 3.2),
            _row("flynn", 1024, 1024, 0.93, 4.0), _row("flynn", 2048, 2048, 0.95, 6.0),
            _row("protonn", 4096, 4000, 0.97, 6.5)]
    frontier = pareto_frontier(configurations(rows))
    assert [(c["model"], c["budget_bytes"]) for c in frontier] == [("protonn", 1024), ("flynn", 1024),
                                                                    ("protonn", 2048)]
    configs = configurations(rows)
    assert recommend(configs, 2048, 5.0) == "best within 2 kB and 5 ms: protonn 2kB, 97.0 %, 3.2 ms"
    assert recommend(configs, 1024, None) == "best within 1 kB: flynn 1kB, 93.0 %, 4.0 ms"
    assert recommend(configs).startswith("best overall: protonn 2kB")  # ties: the smaller one
    assert recommend(configs, 512, None).startswith("nothing fits 0.5 kB; the smallest point is protonn 1kB")


@pytest.mark.parametrize("rate, coverage, auroc, columns", [
    (None, None, None, []),  # a sweep from before confidence
    (None, 1.0, None, []),  # calibrated, nothing asked to decline: no "answered" column
    (0.05, 1.0, None, ["answered"]),  # asked to decline (sweep --unknown-rate), declined none of the test rows
    (None, 0.95, 0.9, ["answered", "AUROC"]),  # declined some, classes held out
])
def test_the_summary_shows_the_confidence_columns_that_say_something(rate, coverage, auroc, columns):
    """A pipe gets the whole table (not cut to 80 columns), with "answered" only where points may decline and
    "AUROC" only where classes were held out."""
    import io

    from rich.console import Console

    from tinyproto.pipeline.report_data import ReportInput, print_summary

    rows = [{**_row("protonn", 1024, 1000, 0.9, 1.0), "coverage": coverage, "auroc": auroc}]
    config = {"binding": {"unknown_rate": rate}} if rate is not None else {}
    out = io.StringIO()
    print_summary(Console(file=out, width=80), ReportInput("sweep", Path("s"), rows, config=config))
    header = next(line for line in out.getvalue().splitlines() if "model" in line and "budget" in line)
    assert [c for c in ("answered", "AUROC") if c in header] == columns
    assert "90.0 %" in out.getvalue()  # not wrapped as "90.0" over "%"


def test_report_cli_refuses_what_is_not_a_sweep_or_model(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 1 and "neither a sweep directory" in result.output
    result = CliRunner().invoke(main, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "is not a directory" in result.output
    with pytest.raises(TinyprotoError, match="not a directory"):
        write_report(tmp_path / "missing")


@device
@needs_avr_gcc
def test_sweep_report_files_and_terminal(sim_sweep):
    result = CliRunner().invoke(main, ["report", str(sim_sweep), "--max-bytes", "1kB", "--max-ms", "10"])
    assert result.exit_code == 0, result.output
    assert "Pareto frontier" in result.output and "best within 1 kB and 10 ms: " in result.output
    stems = {p.stem for p in (sim_sweep / "figures").glob("*.png")}
    assert stems == {"accuracy_vs_bytes", "accuracy_vs_latency", "accuracy_vs_energy", "agreement", "cycles",
                     "risk_coverage", "reliability"}
    html = (sim_sweep / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(stems)
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained
    from tinyproto.core.manifest import foreign_entries

    assert foreign_entries(sim_sweep) == []  # report.html and figures/ are recorded as tinyproto's


@device
@needs_avr_gcc
def test_single_model_report(sim_sweep):
    model_dir = sim_sweep / "points" / "protonn-512B-seed0-uno"
    report = write_report(model_dir)
    assert {p.stem for p in report.figures} == {"accuracy", "ledger", "confusion", "sram", "cycles", "agreement",
                                                 "risk_coverage", "reliability"}
    assert report.recommendation.startswith("best overall: protonn 0.5kB")
    from tinyproto.core.manifest import foreign_entries

    assert foreign_entries(model_dir) == []


@device
@needs_avr_gcc
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/setup.sh installs Debian's chromium)")
def test_report_renders_in_a_headless_browser(sim_sweep, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    write_report(sim_sweep)
    single = sim_sweep / "points" / "flynn-512B-seed0-uno"
    write_report(single)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            for directory, n_images in ((sim_sweep, 7), (single, 8)):  # risk-coverage and reliability in both
                _check_page(browser, directory / "report.html", n_images, tmp_path / f"{directory.name}.png")
        finally:
            browser.close()


def _check_page(browser, html: Path, n_images: int, screenshot: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, requests = [], []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def route(r):
        if not r.request.url.startswith(("file:", "data:")):
            requests.append(r.request.url)
            r.abort()
        else:
            r.continue_()

    page.route("**/*", route)
    page.goto(html.as_uri(), wait_until="load")
    images = page.evaluate("""() => Array.from(document.images).map(img => ({
        complete: img.complete, w: img.naturalWidth, h: img.naturalHeight,
        shown: img.getBoundingClientRect().width * img.getBoundingClientRect().height}))""")
    assert len(images) == n_images
    assert all(i["complete"] and i["w"] > 100 and i["h"] > 100 and i["shown"] > 0 for i in images), images
    assert page.locator("#frontier tbody tr").count() >= 1
    assert "%" in page.locator("#recommendation").inner_text()
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    page.close()
    assert errors == [], errors
    assert requests == [], requests
# --------------------------------------------------------------------------------------- damaged sweep directories


def _sweep_dir(work: Path, results: str) -> Path:
    """A sweep directory as `report` reads it: the configuration and the results lines (no training)."""
    folder = work / "sw"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"format": "tinyproto-sweep", "format_version": 1, "data": "iris"}))
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


def test_confidence_figures_are_drawn_from_the_models_test_rows(compiled):
    """A compiled model's report has a risk-coverage curve and a reliability diagram, drawn from its test
    vectors' confidence bytes and labels (known classes); the PNGs are the same bytes on a second run and change
    with the data they are drawn from."""
    import numpy as np

    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.pipeline.report_data import load_input
    from tinyproto.pipeline.report_figures import fig_reliability, fig_risk_coverage

    model_dir = compiled("iris", "1kB")
    report = write_report(model_dir)
    assert {"risk_coverage", "reliability"} <= {p.stem for p in report.figures}
    html = (model_dir / "report.html").read_text()
    assert "Risk against coverage" in html and "Reliability of the confidence byte" in html
    (judged,) = load_input(model_dir).judged
    vectors = load_model_dir(model_dir).vectors()
    np.testing.assert_array_equal(judged["confidence"], vectors.confidence)  # iris: every test row is known
    np.testing.assert_array_equal(judged["correct"], vectors.labels == vectors.y)
    assert judged["source"] == "host int8 reference"  # not validated: the host's answers
    assert judged["ece"] == json.loads((model_dir / "report.json").read_text())["confidence"]["ece"]
    first = (model_dir / "figures" / "risk_coverage.png").read_bytes()
    write_report(model_dir)
    assert (model_dir / "figures" / "risk_coverage.png").read_bytes() == first
    assert fig_risk_coverage([judged]) == first
    other = {**judged, "correct": ~judged["correct"]}
    assert fig_risk_coverage([other]) != first
    assert fig_reliability([other]) != (model_dir / "figures" / "reliability.png").read_bytes()
    assert fig_risk_coverage([]) is None and fig_reliability([]) is None


@pytest.mark.parametrize("checks", ["x", [1], {"scores": "ok"}, {"scores": {"ok": "yes", "detail": ""}},
                                    {"scores": {"ok": True, "detail": 5}}])
def test_a_validation_json_whose_checks_are_not_checks_is_one_error(work, compiled, checks):
    """The page's table of checks read check.ok as a key: an edited `checks` was an internal error (exit 70)."""
    model = compiled("iris", "1kB")
    (model / "validation.json").write_text(json.dumps({"n_vectors": 0, "checks": checks}))
    refused(["report", str(model)], "validation.json is damaged", model.parent)


@pytest.mark.parametrize("field", ["count", "what", "ctype", "bytes"])
def test_a_ledger_entry_without_a_field_the_page_shows_is_one_error(compiled, field):
    """A ledger array without its count (report.json of a federate directory, edited) was an internal error in the
    page's template; every field the byte ledger shows is checked first."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.report_data import load_input

    model = compiled("iris", "1kB")
    report = json.loads((model / "report.json").read_text())
    del next(iter(report["ledger"]["arrays"].values()))[field]
    (model / "report.json").write_text(json.dumps(report))
    with pytest.raises(TinyprotoError, match="report.json is damaged: its ledger"):
        load_input(model)


VALIDATION_DISAGREES = {
    "other-model": lambda v: v.update(model_hash="0x00000001"),
    "other-board": lambda v: v.update(board="mega2560"),
    "other-clock": lambda v: v.update(f_cpu_hz=8_000_000),
    "other-sram": lambda v: v.update(sram_bytes=8192),
    "other-model-bytes": lambda v: v.update(model_bytes=v["model_bytes"] + 1),
    "other-budget": lambda v: v.update(budget_bytes=4096),
    "more-vectors-than-tested": lambda v: v.update(n_vectors=999),
    "complete-with-fewer": lambda v: v.update(n_vectors=v["n_vectors"] - 1),
    "passed-a-failed-check": lambda v: v["checks"]["scores"].update(ok=False),
    "failed-all-checks-passed": lambda v: v.update(passed=False),
    "passed-not-a-verdict": lambda v: v.update(passed="yes"),
    "complete-not-its-check": lambda v: v.update(complete=False),
}


@pytest.mark.parametrize("case", sorted(VALIDATION_DISAGREES))
def test_a_validation_json_that_disagrees_with_the_model_directory_is_one_error(built_models, case):
    """Was: drawn as this model's device figures (another model's hash, another board's clock, 999 of 38 vectors,
    passed with a failed check)."""
    model = built_models("iris", "1kB")
    summary = json.loads((model / "validation.json").read_text())
    VALIDATION_DISAGREES[case](summary)
    (model / "validation.json").write_text(json.dumps(summary))
    refused(["report", str(model)], "disagrees with the model directory", model.parent)


def _journal_edit(edit):
    def apply(model):
        lines = (model / "validation.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        edit(rows)
        (model / "validation.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return apply


JOURNAL_DISAGREES = {
    "another-models-binding": (_journal_edit(lambda rows: rows[0]["binding"].update(model_hash="0x00000001")),
                               "not the journal of this model"),
    "other-vectors-binding": (_journal_edit(lambda rows: rows[0]["binding"].update(vectors_sha256="0" * 64)),
                              "not the journal of this model"),
    "no-binding": (_journal_edit(lambda rows: rows.__setitem__(0, {"x": 1})), "not the journal of this model"),
    "labels-shifted": (_journal_edit(lambda rows: [row.update(label=(row["label"] + 1) % 3) for row in rows[1:]]),
                       "disagrees with validation.json"),
}


@pytest.mark.parametrize("case", sorted(JOURNAL_DISAGREES))
def test_a_journal_that_is_not_this_validations_is_one_error(built_models, case):
    """Was: the device confusion matrix drawn from validation.jsonl whatever model it bound, or labels that
    disagree with validation.json's label agreement (0 % drawn beside 100 %)."""
    model = built_models("iris", "1kB")
    damage, words = JOURNAL_DISAGREES[case]
    damage(model)
    refused(["report", str(model)], words, model.parent)


def test_a_journal_label_beyond_the_classes_is_not_drawn(built_models):
    """Was: an internal error (IndexError: index 7 is out of bounds for axis 1 with size 3) drawing the device's
    confusion matrix. Such a line is not a device answer: the host's labels are drawn instead."""
    model = built_models("iris", "1kB")
    _journal_edit(lambda rows: rows[1].update(label=7))(model)
    accepted(["report", str(model)])
    assert "(host int8 reference labels)" in (model / "report.html").read_text()


@pytest.mark.parametrize("change", [{"serial_baud": 9600}, {"model_bytes": -1}, {"env": "nosuch"}])
def test_a_damaged_build_record_is_one_error(built_models, change):
    """report drew build.json's figures unchecked (validate and flash refuse the same record)."""
    model = built_models("iris", "1kB")
    record = json.loads((model / "build.json").read_text())
    (model / "build.json").write_text(json.dumps({**record, **change}))
    refused(["report", str(model)], "build.json does not match the model directory", model.parent)


def test_names_the_figures_font_cannot_draw_are_escaped_without_a_warning():
    """Class names 日本 (and a data set's name in a title): matplotlib's font has no glyph for them, so the
    confusion matrix drew empty boxes and `report` printed a UserWarning with a line of tinyproto's source on
    stderr. They are drawn as escapes, and nothing is printed."""
    import warnings

    import numpy as np

    from tinyproto.pipeline.report_figures import _drawn, fig_confusion

    assert _drawn("café 日本") == "café \\u65e5\\u672c"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png = fig_confusion(["café", "日本", "x"], np.array([0, 1, 2]), np.array([0, 1, 1]), "confusion: 日本")
    assert png.startswith(b"\x89PNG")


def test_held_out_rows_get_their_own_row_in_the_confusion_matrix(tmp_path):
    """A model compiled with --holdout-classes keeps those classes' test rows under the unknown code (255): the
    model report draws them as a "held out" row (and the device's unknown answers as an "unknown" column) instead
    of failing on a class index beyond the matrix."""
    import numpy as np

    from tinyproto.pipeline.compile import CompileOptions, compile_model
    from tinyproto.pipeline.report_figures import fig_confusion

    model_dir = tmp_path / "held"
    compile_model("iris", CompileOptions("protonn", "1kB", 0, "uno", model_dir, holdout_classes="2",
                                         unknown_rate="5%"))
    report = write_report(model_dir)
    assert "confusion" in {p.stem for p in report.figures}
    y, known = np.array([0, 1, 255, 255]), np.array([0, 1, 1, 1])
    with_held_out = fig_confusion(["a", "b"], y, known, "t")
    assert with_held_out != fig_confusion(["a", "b"], np.array([0, 1, 1, 1]), known, "t")
    assert fig_confusion(["a", "b"], y, np.array([0, 255, 255, 1]), "t") != with_held_out  # an unknown column
