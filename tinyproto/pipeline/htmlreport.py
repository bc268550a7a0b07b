"""`tinyproto report DIR`: figures (PNG, matplotlib) and one self-contained report.html (Jinja2) of a sweep
directory (`tinyproto sweep`) or of a single model directory (`tinyproto compile`, + build / validate).

The page needs no network: every figure is inlined as a PNG data URI and the page has no script. The PNGs are
also written to DIR/figures/. On the terminal: the accuracy / bytes Pareto frontier as a table and a one-line
recommendation (`--max-bytes`, `--max-ms`).

Accuracy here is the device's when the point was validated on the (simulated) board, else the host int8
reference's (the two are equal when validation passed: bit-exact); latency and energy are measured on the
board when validated, else the cost model's predictions, and are marked so.
"""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from tinyproto import families
from tinyproto.core.errors import TinyprotoError

REPORT = "report.html"
FIGURES = "figures"
OTHER_COLORS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
DPI = 100


def kb(n_bytes: int | float) -> str:
    return f"{n_bytes / 1024:g}kB"


# ------------------------------------------------------------------------------------------------ input


@dataclass
class ReportInput:
    kind: str  # "sweep" or "model"
    path: Path
    rows: list[dict]  # one per successful point (a single model: one)
    failed: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)  # the single model's report / validation / build / vectors


def _row(record: dict) -> dict:
    """One sweep line (or a single model) in the form every figure and table reads."""
    device = record.get("device") or None
    measured = device is not None and device.get("latency_ms") is not None
    return {
        "id": record["id"],
        "model": record["model"],
        "budget_bytes": record["budget_bytes"],
        "seed": record["seed"],
        "board": record["board"],
        "model_bytes": record["model_bytes"],
        "float_accuracy": record["float_accuracy"],
        "int8_accuracy": record["int8_accuracy"],
        "device_accuracy": device["accuracy"] if device else None,
        "accuracy": device["accuracy"] if device else record["int8_accuracy"],
        "measured": measured,
        "latency_ms": device["latency_ms"] if measured else record["predicted_latency_ms"],
        "energy_mj": device["energy_mj_board"] if measured else record["predicted_energy_mj_board"],
        "cycles_predicted": record["predicted_cycles"],
        "cycles_measured": device["cycles_mean"] if measured else None,
        "label_agreement": device["label_agreement"] if device else None,
        "score_agreement": device["score_agreement"] if device else None,
        "status": record.get("status", "ok"),
    }


def load_sweep(path: Path) -> ReportInput:
    from tinyproto.core.modeldir import read_json
    from tinyproto.pipeline.sweep_files import CONFIG, RESULTS, read_results

    path = Path(path)
    config = read_json(path / CONFIG, "the sweep's configuration")
    records = read_results(path / RESULTS)
    rows, failed = [], []
    for record in records:
        complete = all(record.get(k) is not None for k in ("model_bytes", "int8_accuracy", "predicted_cycles"))
        if record.get("status") == "ok" and complete:
            rows.append(_row(record))
        else:
            failed.append(record)
            if complete and record.get("stage") == "validate":  # compiled, the device disagreed: still drawn
                rows.append(_row(record))
    return ReportInput("sweep", path, rows, failed, config)


def load_single(path: Path) -> ReportInput:
    from tinyproto.core.boards import load_board
    from tinyproto.core.modeldir import load_model_dir, read_json

    model_dir = load_model_dir(path)
    report = model_dir.report
    if not report:
        raise TinyprotoError(f"{path} has no report.json; run `tinyproto compile` again")
    board = load_board(report.get("board", "uno"))
    validation = read_json(path / "validation.json", "the validation summary") \
        if (path / "validation.json").exists() else None
    build = read_json(path / "build.json", "the build record") if (path / "build.json").exists() else None
    device = None
    if validation is not None and validation.get("n_vectors"):
        device = {"accuracy": validation["device_accuracy"], "latency_ms": validation["latency_ms_mean"],
                  "energy_mj_board": validation["energy_mj_board"], "cycles_mean": validation["cycles_mean"],
                  "label_agreement": validation["label_agreement"], "score_agreement": validation["score_agreement"]}
    record = {
        "id": path.name, "model": report["model"], "budget_bytes": report["budget_bytes"], "seed": report["seed"],
        "board": report["board"], "model_bytes": report["model_bytes"], "float_accuracy": report["float_accuracy"],
        "int8_accuracy": report["int8_accuracy"], "predicted_cycles": report["predicted_cycles"]["total"],
        "predicted_latency_ms": report["predicted_latency_ms"],
        "predicted_energy_mj_board": board.energy_mj(report["predicted_latency_ms"] / 1000,
                                                     board.board_active_current_ma),
        "device": device,
    }
    model = families.load_int_model(model_dir)
    vectors = model_dir.vectors()
    device_labels = _device_labels(path, len(vectors.labels)) if device else None
    single = {"report": report, "validation": validation, "build": build, "board": board,
              "classes": [str(c) for c in model.classes], "y": vectors.y, "host_labels": vectors.labels,
              "device_labels": device_labels}
    return ReportInput("model", path, [_row(record)], [], {}, single)


def _device_labels(path: Path, n: int) -> np.ndarray | None:
    """The device's label per test vector from validation.jsonl, when every vector was measured."""
    import numpy as np

    journal = path / "validation.jsonl"
    if not journal.is_file():  # missing, or not a regular file (a FIFO would block)
        return None
    labels = np.full(n, -1, dtype=np.int64)
    for line in journal.read_text(errors="replace").splitlines()[1:]:
        try:
            entry = json.loads(line)
            if 0 <= int(entry["i"]) < n:
                labels[int(entry["i"])] = int(entry["label"])
        except (ValueError, KeyError, TypeError, IndexError):
            continue
    return labels if (labels >= 0).all() else None


def load_input(path: Path) -> ReportInput:
    path = Path(path)
    if not path.is_dir():
        raise TinyprotoError(f"{path} is not a directory; give a sweep directory or a model directory")
    if (path / "sweep.json").exists():
        return load_sweep(path)
    if (path / "model.json").exists():
        return load_single(path)
    raise TinyprotoError(f"{path} is neither a sweep directory (no sweep.json) nor a model directory (no "
                         "model.json); run `tinyproto sweep` or `tinyproto compile` first")


# ------------------------------------------------------------------------------------------------ frontier


def configurations(rows: list[dict]) -> list[dict]:
    """Rows grouped over seeds: one per (model, budget, board), the mean of every figure."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["budget_bytes"], row["board"]), []).append(row)
    out = []
    for (model, budget, board), members in groups.items():
        def mean(key):
            values = [m[key] for m in members if m[key] is not None]
            return float(np.mean(values)) if values else None
        out.append({"model": model, "budget_bytes": budget, "board": board, "n_seeds": len(members),
                    "model_bytes": mean("model_bytes"), "accuracy": mean("accuracy"),
                    "float_accuracy": mean("float_accuracy"), "int8_accuracy": mean("int8_accuracy"),
                    "device_accuracy": mean("device_accuracy"), "latency_ms": mean("latency_ms"),
                    "energy_mj": mean("energy_mj"), "measured": all(m["measured"] for m in members)})
    return sorted(out, key=lambda c: (c["model_bytes"], -c["accuracy"], c["model"], c["board"]))


def pareto_frontier(configs: list[dict]) -> list[dict]:
    """Configurations no other beats in both fewer model bytes and higher accuracy (ascending bytes)."""
    frontier, best = [], -1.0
    for config in sorted(configs, key=lambda c: (c["model_bytes"], -c["accuracy"], c["latency_ms"])):
        if config["accuracy"] > best:
            frontier.append(config)
            best = config["accuracy"]
    return frontier


def _name(config: dict, boards: int = 1) -> str:
    return f"{config['model']} {kb(config['budget_bytes'])}" + (f" on {config['board']}" if boards > 1 else "")


def recommend(configs: list[dict], max_bytes: int | None = None, max_ms: float | None = None) -> str:
    """The one-line answer: the most accurate configuration within the limits (ties: fewer bytes, less time)."""
    if not configs:
        return "no point compiled; nothing to recommend"
    boards = len({c["board"] for c in configs})
    limits = [f"{kb(max_bytes).replace('kB', ' kB')}" if max_bytes is not None else None,
              f"{max_ms:g} ms" if max_ms is not None else None]
    within = "best within " + " and ".join(x for x in limits if x) if any(limits) else "best overall"
    fitting = [c for c in configs if (max_bytes is None or c["model_bytes"] <= max_bytes)
               and (max_ms is None or c["latency_ms"] <= max_ms)]
    if not fitting:
        smallest = min(configs, key=lambda c: (c["model_bytes"], c["latency_ms"]))
        return (f"nothing fits {within[len('best within '):]}; the smallest point is {_describe(smallest, boards)}")
    best = min(fitting, key=lambda c: (-c["accuracy"], c["model_bytes"], c["latency_ms"]))
    return f"{within}: {_describe(best, boards)}"


def _describe(config: dict, boards: int = 1) -> str:
    latency = f"{config['latency_ms']:.1f} ms" + ("" if config["measured"] else " predicted")
    return f"{_name(config, boards)}, {100 * config['accuracy']:.1f} %, {latency}"


def print_summary(console, data: ReportInput, max_bytes: int | None = None, max_ms: float | None = None) -> str:
    """The frontier as a table and the recommendation line; returns the line."""
    from rich.table import Table

    configs = configurations(data.rows)
    frontier = pareto_frontier(configs)
    measured = all(c["measured"] for c in configs) if configs else False
    boards = len({c["board"] for c in configs})
    table = Table(title=f"Pareto frontier, accuracy / model bytes ({len(frontier)} of {len(configs)} configurations)")
    for column in ("model", "budget", "bytes", "acc.", "float", "int8", "device", "ms", "mJ"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for c in frontier:
        table.add_row(c["model"] + (f" ({c['board']})" if boards > 1 else ""), kb(c["budget_bytes"]),
                      f"{c['model_bytes']:.0f}", _pct(c["accuracy"]), _pct(c["float_accuracy"]),
                      _pct(c["int8_accuracy"]), _pct(c["device_accuracy"]),
                      f"{c['latency_ms']:.2f}" + ("" if c["measured"] else "*"), f"{c['energy_mj']:.3f}")
    table.caption = ("accuracy: the device's where validated, else the host int8 reference's; ms and mJ per inference"
                     + ("" if measured else "; * predicted by the cost model"))
    if frontier:
        console.print(table)
    line = recommend(configs, max_bytes, max_ms)
    console.print(line)
    return line


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


# ------------------------------------------------------------------------------------------------ figures


def _figure(width: float = 6.4, height: float = 4.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _colors(rows: list[dict]) -> dict[str, str]:
    colors = {name: families.family(name).color for name in families.names()}
    models = sorted({r["model"] for r in rows}, key=lambda m: (m not in colors, m))
    spare = iter(OTHER_COLORS * 4)
    return {m: colors.get(m) or next(spare) for m in models}


def _by_model(configs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in sorted(configs, key=lambda c: c["budget_bytes"]):
        out.setdefault(c["model"] + (f" ({c['board']})" if len({x['board'] for x in configs}) > 1 else ""), []).append(c)
    return out


def fig_accuracy_vs_bytes(rows: list[dict], title: str) -> bytes:
    configs = configurations(rows)
    frontier = pareto_frontier(configs)
    colors = _colors(rows)
    fig, ax = _figure()
    for name, members in _by_model(configs).items():
        members = sorted(members, key=lambda c: c["model_bytes"])  # a bigger budget may give a smaller model
        color = colors[members[0]["model"]]
        x = [c["model_bytes"] for c in members]
        ax.plot(x, [100 * c["int8_accuracy"] for c in members], "-o", color=color, label=f"{name}: int8 (host)")
        ax.plot(x, [100 * c["float_accuracy"] for c in members], "--", color=color, alpha=0.55, label=f"{name}: float")
        device = [(c["model_bytes"], 100 * c["device_accuracy"]) for c in members if c["device_accuracy"] is not None]
        if device:
            ax.plot(*zip(*device), "x", color="black", markersize=7, mew=1.5,
                    label="device (simulated board)" if name == list(_by_model(configs))[0] else None)
    if len({r["seed"] for r in rows}) > 1:
        ax.scatter([r["model_bytes"] for r in rows], [100 * r["accuracy"] for r in rows], s=10,
                   c=[colors[r["model"]] for r in rows], alpha=0.35, label="single seeds")
    if frontier:
        ax.step([c["model_bytes"] for c in frontier], [100 * c["accuracy"] for c in frontier], where="post",
                color="#555", lw=1, alpha=0.7)
        ax.scatter([c["model_bytes"] for c in frontier], [100 * c["accuracy"] for c in frontier], s=160,
                   facecolors="none", edgecolors="goldenrod", linewidths=2, label="Pareto frontier", zorder=5)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_bytes_formatter())
    ax.set_xlabel("model bytes in flash (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.08, y=0.1)
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def _bytes_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v / 1024:g} kB" if v >= 1024 else f"{v:g} B")


def fig_accuracy_vs(rows: list[dict], key: str, label: str, title: str) -> bytes:
    configs = configurations(rows)
    colors = _colors(rows)
    fig, ax = _figure()
    for name, members in _by_model(configs).items():
        members = sorted(members, key=lambda c: c[key])
        color = colors[members[0]["model"]]
        measured = all(c["measured"] for c in members)
        ax.plot([c[key] for c in members], [100 * c["accuracy"] for c in members], "-o" if measured else "--o",
                color=color, mfc=color if measured else "white",
                label=name + ("" if measured else " (predicted)"))
        for c in members:
            ax.annotate(kb(c["budget_bytes"]), (c[key], 100 * c["accuracy"]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color=color)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(_plain_formatter())
    ax.xaxis.set_minor_formatter(_plain_formatter(minor=True))
    ax.margins(x=0.12, y=0.1)
    ax.set_xlabel(label)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def _plain_formatter(minor: bool = False):
    """Log-axis tick labels as plain numbers (0.5, 2, 10); minor ticks labelled only at 2 and 5."""
    import math

    from matplotlib.ticker import FuncFormatter

    def label(value, _):
        if value <= 0:
            return ""
        lead = round(value / 10 ** math.floor(math.log10(value)), 6)
        if minor and lead not in (2, 5):
            return ""
        return f"{value:g}"

    return FuncFormatter(label)


def fig_agreement(rows: list[dict]) -> bytes | None:
    import numpy as np

    device = [r for r in rows if r["label_agreement"] is not None]
    if not device:
        return None
    device = sorted(device, key=lambda r: (r["model"], r["budget_bytes"], r["seed"], r["board"]))
    fig, ax = _figure(max(6.4, 0.45 * len(device) + 2), 4.2)
    x = np.arange(len(device))
    ax.bar(x - 0.2, [100 * r["label_agreement"] for r in device], 0.4, label="labels identical", color="#2ca02c")
    ax.bar(x + 0.2, [100 * r["score_agreement"] for r in device], 0.4, label="score vectors identical",
           color="#17becf")
    ax.set_xticks(x, [f"{r['model']} {kb(r['budget_bytes'])}" + (f" s{r['seed']}" if r["seed"] else "")
                      for r in device], rotation=45, ha="right", fontsize=8)
    ax.set_xlim(-0.8, max(len(device), 3) - 0.2)
    ax.set_ylim(0, 105)
    ax.set_ylabel("of the test vectors (%)")
    ax.set_title("host int8 reference vs device: agreement")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)


def fig_cycles(rows: list[dict]) -> bytes | None:
    measured = [r for r in rows if r["cycles_measured"] is not None]
    if not measured:
        return None
    colors = _colors(rows)
    fig, ax = _figure(5.4, 4.6)
    for model in sorted({r["model"] for r in measured}):
        mine = [r for r in measured if r["model"] == model]
        ax.scatter([r["cycles_predicted"] for r in mine], [r["cycles_measured"] for r in mine], color=colors[model],
                   label=model, s=30)
    values = [r["cycles_predicted"] for r in measured] + [r["cycles_measured"] for r in measured]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], color="#777", lw=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted cycles / inference (cost model)")
    ax.set_ylabel("measured cycles / inference (device)")
    ax.set_title("cost model vs device")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def fig_ledger(report: dict) -> bytes:
    import numpy as np

    arrays = report["ledger"]["arrays"]
    names = list(arrays)
    fig, ax = _figure(6.4, max(2.4, 0.4 * len(names) + 1.4))
    y = np.arange(len(names))
    ax.barh(y, [arrays[n]["bytes"] for n in names], color="#1f77b4")
    for i, n in enumerate(names):
        ax.annotate(f"{arrays[n]['bytes']} B", (arrays[n]["bytes"], i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(y, [f"{n} ({arrays[n]['ctype']})" for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("bytes in flash")
    ax.set_title(f"byte ledger: {report['model_bytes']} of {report['budget_bytes']} B budget")
    ax.axvline(report["budget_bytes"], color="#d62728", lw=1, ls="--")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def fig_confusion(classes: list[str], y: np.ndarray, predicted: np.ndarray, title: str) -> bytes:
    import numpy as np

    n = len(classes)
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (y, predicted), 1)
    side = min(8.0, max(3.6, 0.45 * n + 2))
    fig, ax = _figure(side + 0.8, side)
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, shrink=0.8)
    if n <= 20:
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    ticks = np.arange(n)
    ax.set_xticks(ticks, classes, fontsize=7, rotation=90 if n > 10 else 0)
    ax.set_yticks(ticks, classes, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    return _png(fig)


def fig_sram(single: dict) -> bytes:
    board, validation, report = single["board"], single["validation"], single["report"]
    fig, ax = _figure(6.4, 2.4)
    if validation is not None and validation.get("stack_peak_bytes") is not None:
        parts = [("static (.data + .bss)", validation["sram_static_bytes"], "#1f77b4"),
                 ("stack peak (measured)", validation["stack_peak_bytes"], "#ff7f0e")]
        title = "SRAM on the device"
    else:
        estimate = report["sram_estimate"]
        parts = [("inference buffers", estimate["working_bytes"], "#1f77b4"),
                 ("serial frame", estimate["serial_frame_bytes"], "#17becf"),
                 ("reserve", estimate["reserved_bytes"], "#bbbbbb")]
        title = "SRAM estimate (before build; validate measures it)"
    left = 0
    for label, value, color in parts:
        ax.barh([0], [value], left=left, color=color, label=f"{label}: {value} B")
        left += value
    ax.axvline(board.sram_bytes, color="#d62728", lw=2, label=f"{board.name} SRAM: {board.sram_bytes} B")
    ax.set_xlim(0, board.sram_bytes * 1.08)
    ax.set_yticks([])
    ax.set_xlabel("bytes")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
    return _png(fig)


def fig_single_accuracy(row: dict) -> bytes:
    fig, ax = _figure(5.0, 3.2)
    names = ["float (host)", "int8 (host)"] + (["device"] if row["device_accuracy"] is not None else [])
    values = [row["float_accuracy"], row["int8_accuracy"]] + (
        [row["device_accuracy"]] if row["device_accuracy"] is not None else [])
    bars = ax.bar(names, [100 * v for v in values], color=["#aaaaaa", "#1f77b4", "#2ca02c"][:len(values)])
    for bar, value in zip(bars, values):
        ax.annotate(f"{100 * value:.1f} %", (bar.get_x() + bar.get_width() / 2, 100 * value), ha="center",
                    xytext=(0, 3), textcoords="offset points", fontsize=9)
    ax.set_ylim(0, 110)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy")
    return _png(fig)


def fig_single_cycles(row: dict, validation: dict | None, report: dict) -> bytes:
    fig, ax = _figure(5.0, 3.2)
    names = ["lower bound", "predicted"]
    values = [report["predicted_cycles"]["lower_bound"], report["predicted_cycles"]["total"]]
    if validation is not None and validation.get("n_vectors"):
        names.append("measured (mean)")
        values.append(validation["cycles_mean"])
    ax.bar(names, values, color=["#bbbbbb", "#ff7f0e", "#2ca02c"][:len(values)])
    for i, value in enumerate(values):
        ax.annotate(f"{value:,.0f}", (i, value), ha="center", xytext=(0, 3), textcoords="offset points", fontsize=9)
    ax.set_ylabel("cycles / inference")
    ax.set_ylim(0, max(values) * 1.18)
    ax.set_title("cycles: cost model and device")
    return _png(fig)


# ------------------------------------------------------------------------------------------------ the page


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
    if data.kind == "sweep":
        cycles = fig_cycles(rows)
        if cycles is not None:
            out.append(("cycles", "Measured against predicted cycles per inference (the diagonal is a perfect "
                        "cost model).", cycles))
    return out


def write_report(path: Path, max_bytes: int | None = None, max_ms: float | None = None, console=None) -> Report:
    """Write DIR/report.html and DIR/figures/*.png (inside DIR's lock; both recorded in its manifest)."""
    from tinyproto.core.modeldir import locked, record_outputs

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
        _write_atomic(data.path / REPORT, html.encode("utf-8"))
    if console is not None:
        print_summary(console, data, max_bytes, max_ms)
    return Report(data.path / REPORT, written, line)


def _write_atomic(path: Path, content: bytes) -> None:
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def render_html(data: ReportInput, figures: list[tuple[str, str, bytes]], configs: list[dict], line: str) -> str:
    import jinja2

    from tinyproto import __version__
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
            "energy": f"{c['energy_mj']:.3f}"}


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# ------------------------------------------------------------------------------------------------ the command


