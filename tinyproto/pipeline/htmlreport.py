"""`tinyproto report DIR`: figures (PNG, matplotlib) and one self-contained report.html (Jinja2) of a sweep
directory (`tinyproto sweep`) or of a single model directory (`tinyproto compile`, + build / validate).

The page needs no network: every figure is inlined as a PNG data URI and the page has no script. The PNGs are
also written to DIR/figures/. On the terminal: the accuracy / bytes Pareto frontier as a table and a one-line
recommendation (`--max-bytes`, `--max-ms`). What is read and concluded: report_data.py; the figures:
report_figures.py. Layer: pipeline.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.report_data import (FIGURES, REPORT, ReportInput, _pct, _three_places, configurations, kb,
                                            load_input, pareto_frontier, print_summary, recommend)
from tinyproto.pipeline.report_figures import (fig_accuracy_vs, fig_accuracy_vs_bytes, fig_agreement, fig_confusion,
                                               fig_cycles, fig_ledger, fig_reliability, fig_risk_coverage,
                                               fig_single_accuracy, fig_single_cycles, fig_sram)


@dataclass
class Report:
    html: Path
    figures: list[Path]
    recommendation: str


def build_figures(data: ReportInput) -> list[tuple[str, str, bytes]]:
    """(file stem, caption, PNG) of every figure this input supports."""
    rows, out = data.rows, []
    measured = bool(rows) and all(r["measured"] for r in rows)
    where = "on the board" if measured else "predicted by the cost model"
    dataset = (data.config.get("binding") or {}).get("dataset") or (data.model.get("report") or {}).get("dataset", "")
    if rows and data.kind == "sweep":
        out.append(("accuracy_vs_bytes", "Accuracy against model bytes, one line per model family (int8 host "
                    "reference solid, float dashed, device crosses); the Pareto frontier is circled.",
                    fig_accuracy_vs_bytes(rows, f"{dataset}: accuracy vs model size")))
    if rows and data.kind == "sweep":
        out.append(("accuracy_vs_latency", f"Accuracy against latency per inference ({where}).",
                    fig_accuracy_vs(rows, "latency_ms", f"latency per inference, ms ({where})",
                                    "accuracy vs latency")))
        out.append(("accuracy_vs_energy", f"Accuracy against energy per inference (whole board, V x I x latency, "
                    f"latency {where}).",
                    fig_accuracy_vs(rows, "energy_mj", "energy per inference, mJ (board)", "accuracy vs energy")))
    if data.kind == "model":
        single, row = data.model, rows[0]
        out.append(("accuracy", "Float and int8 host accuracy, and the device's.", fig_single_accuracy(row)))
        out.append(("ledger", "The byte ledger: every array the model puts in flash.", fig_ledger(single["report"])))
        predicted = single["device_labels"] if single["device_labels"] is not None else single["host_labels"]
        source = "device" if single["device_labels"] is not None else "host int8 reference"
        out.append(("confusion", f"Confusion matrix of the test split ({source} labels).",
                    fig_confusion(single["classes"], single["y"], predicted, f"confusion ({source})")))
        out.append(("sram", "SRAM: static + stack peak against the board.", fig_sram(single)))
        out.append(("cycles", "Cycles per inference: measured against predicted.",
                    fig_single_cycles(row, single["validation"], single["report"])))
    agreement = fig_agreement(rows)
    if agreement is not None:
        out.append(("agreement", "Host-versus-device agreement: identical labels and identical score vectors.",
                    agreement))
    if data.judged:
        sources = sorted({j["source"] for j in data.judged})
        risk = fig_risk_coverage(data.judged)
        if risk is not None:
            out.append(("risk_coverage", "Risk against coverage: answering only the test rows whose confidence byte "
                        "reaches a threshold, the share of them classified wrongly, for every threshold (known "
                        f"classes; {' and '.join(sources)} answers). A cross: the device's answers with "
                        "--unknown-rate.", risk))
        reliability = fig_reliability(data.judged)
        if reliability is not None:
            out.append(("reliability", "Reliability of the confidence byte: per bin of confidence, the accuracy of "
                        "its test rows against their mean confidence (on the diagonal: calibrated).", reliability))
    if data.kind == "sweep":
        cycles = fig_cycles(rows)
        if cycles is not None:
            out.append(("cycles", "Measured against predicted cycles per inference (the diagonal is a perfect "
                        "cost model).", cycles))
    return out


def write_report(path: Path, max_bytes: int | None = None, max_ms: float | None = None, console=None) -> Report:
    """Write DIR/report.html and DIR/figures/*.png (inside DIR's lock; both recorded in its manifest)."""
    from tinyproto.core.manifest import record_outputs
    from tinyproto.core.outdir import locked

    data = load_input(path)
    with locked(data.path, "report"):
        record_outputs(data.path, REPORT, FIGURES, f".{REPORT}.tmp")
        figures = build_figures(data)
        folder = data.path / FIGURES
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise TinyprotoError(f"{folder} is not a directory tinyproto wrote; move it away and run report again")
        folder.mkdir(exist_ok=True)
        written = []
        for stem, _, png in figures:
            target = folder / f"{stem}.png"
            _write_atomic(target, png)
            written.append(target)
        configs = configurations(data.rows)
        line = recommend(configs, max_bytes, max_ms)
        html = render_html(data, figures, configs, line)
        _write_atomic(data.path / REPORT, html.encode("utf-8", "surrogateescape"))
    if console is not None:
        print_summary(console, data, max_bytes, max_ms)
    return Report(data.path / REPORT, written, line)


def _write_atomic(path: Path, content: bytes) -> None:
    from tinyproto.core.safe_io import write_bytes_atomic

    write_bytes_atomic(path, content)  # (.<name>.tmp: the temporary name record_outputs owns)


def render_html(data: ReportInput, figures: list[tuple[str, str, bytes]], configs: list[dict], line: str) -> str:
    import jinja2

    from tinyproto.core.version import __version__
    from tinyproto.core.resources import resource_dir

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    frontier = pareto_frontier(configs)
    images = [{"stem": stem, "caption": caption, "width": _png_size(png)[0], "height": _png_size(png)[1],
               "src": "data:image/png;base64," + base64.b64encode(png).decode("ascii")}
              for stem, caption, png in figures]
    single = data.model
    context: dict[str, Any] = {
        "title": (f"tinyproto sweep: {data.config.get('binding', {}).get('dataset', '')}" if data.kind == "sweep"
                  else f"tinyproto model: {single['report']['model']} {kb(single['report']['budget_bytes'])} on "
                       f"{single['report']['dataset']}"),
        "kind": data.kind,
        "path": str(data.path),
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "version": __version__,
        "recommendation": line,
        "frontier": [_display(c) for c in frontier],
        "configs": [_display(c) for c in configs],
        "rows": data.rows,
        "failed": data.failed,
        "images": images,
        "measured": bool(configs) and all(c["measured"] for c in configs),
        "device": (data.config.get("binding") or {}).get("device"),
        "runs": data.config.get("runs", []),
        "ledger": single.get("report", {}).get("ledger", {}).get("arrays", {}) if data.kind == "model" else {},
        "checks": (single.get("validation") or {}).get("checks", {}) if data.kind == "model" else {},
        "kb": kb,
        "pct": _pct,
    }
    return env.get_template("report.html.j2").render(**context)


def _display(c: dict) -> dict:
    return {**c, "budget": kb(c["budget_bytes"]), "accuracy_pct": _pct(c["accuracy"]),
            "float_pct": _pct(c["float_accuracy"]), "int8_pct": _pct(c["int8_accuracy"]),
            "device_pct": _pct(c["device_accuracy"]),
            "latency": f"{c['latency_ms']:.2f}" + ("" if c["measured"] else " (pred.)"),
            "energy": _three_places(c["energy_mj"])}  # none: no plausible figure


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# ------------------------------------------------------------------------------------------------ the command


