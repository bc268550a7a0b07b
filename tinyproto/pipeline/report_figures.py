"""The figures of `tinyproto report` (matplotlib, PNG bytes): accuracy against bytes, latency and energy, the
device / host agreement, cycles, the ledger, a confusion matrix, SRAM, and the confidence stage's risk-coverage
curve and reliability diagram. Layer: pipeline."""

from __future__ import annotations

import io

import numpy as np

from tinyproto import families
from tinyproto.core.confidence import ECE_BINS, UNKNOWN_LABEL, reliability_bins, risk_coverage
from tinyproto.core.measured import drawable, is_positive
from tinyproto.pipeline.report_data import configurations, kb, pareto_frontier

OTHER_COLORS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
DPI = 100



def _figure(width: float = 6.4, height: float = 4.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig) -> bytes:
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings():  # a glyph the font lacks is drawn as a box (user text goes through _drawn)
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _drawn(text: str) -> str:
    """User text (a class or data set name) as a figure draws it: a character the figure's font has no glyph for
    (日本 in DejaVu Sans) is written as its escape (\\u65e5), not drawn as an empty box with a warning on stderr."""
    return "".join(c if _has_glyph(c) else c.encode("unicode_escape").decode("ascii") for c in str(text))


def _has_glyph(char: str) -> bool:
    return ord(char) < 128 or ord(char) in _font_characters()


def _font_characters() -> frozenset:
    global _FONT_CHARACTERS
    if _FONT_CHARACTERS is None:
        from matplotlib.font_manager import FontProperties, findfont, get_font

        try:
            _FONT_CHARACTERS = frozenset(get_font(findfont(FontProperties())).get_charmap())
        except Exception:  # no usable font file: draw ASCII only
            _FONT_CHARACTERS = frozenset()
    return _FONT_CHARACTERS


_FONT_CHARACTERS: frozenset | None = None


def _colors(rows: list[dict]) -> dict[str, str]:
    colors = {name: families.family(name).color for name in families.names()}
    models = sorted({r["model"] for r in rows}, key=lambda m: (m not in colors, m))
    spare = iter(OTHER_COLORS * 4)
    return {m: colors.get(m) or next(spare) for m in models}


def _by_model(configs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in sorted(configs, key=lambda c: c["budget_bytes"]):
        out.setdefault(c["model"] + (f" ({c['board']})" if len({x['board'] for x in configs}) > 1 else ""),
                       []).append(c)
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
    ax.set_title(_drawn(title))
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
    ax.set_title(_drawn(title))
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
    measured = [r for r in rows if drawable([r["cycles_measured"], r["cycles_predicted"]])]  # a log-log plot
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
    """Counts of (true, predicted) over the test rows; rows of held-out classes (coded UNKNOWN_LABEL in the test
    vectors) get a "held out" row and the device's "unknown" answers an "unknown" column, only when present."""
    import numpy as np

    n = len(classes)
    true_names = [*classes, *(["held out"] if np.any(y == UNKNOWN_LABEL) else [])]
    predicted_names = [*classes, *(["unknown"] if np.any(predicted == UNKNOWN_LABEL) else [])]
    matrix = np.zeros((len(true_names), len(predicted_names)), dtype=np.int64)
    np.add.at(matrix, (np.where(y == UNKNOWN_LABEL, n, y), np.where(predicted == UNKNOWN_LABEL, n, predicted)), 1)
    side = min(8.0, max(3.6, 0.45 * len(true_names) + 2))
    fig, ax = _figure(side + 0.8, side)
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, shrink=0.8)
    if max(matrix.shape) <= 20:
        for (i, j), count in np.ndenumerate(matrix):
            if count:
                ax.text(j, i, str(count), ha="center", va="center", fontsize=7,
                        color="white" if count > matrix.max() / 2 else "black")
    ax.set_xticks(np.arange(len(predicted_names)), [_drawn(c) for c in predicted_names], fontsize=7,
                  rotation=90 if len(predicted_names) > 10 else 0)
    ax.set_yticks(np.arange(len(true_names)), [_drawn(c) for c in true_names], fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(_drawn(title))
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
    ax.set_title(_drawn(title))
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
    if validation is not None and validation.get("n_vectors") and is_positive(validation.get("cycles_mean")) \
            and validation.get("latency_ms_mean") is not None:
        names.append("measured (mean)")
        values.append(validation["cycles_mean"])
    ax.bar(names, values, color=["#bbbbbb", "#ff7f0e", "#2ca02c"][:len(values)])
    for i, value in enumerate(values):
        ax.annotate(f"{value:,.0f}", (i, value), ha="center", xytext=(0, 3), textcoords="offset points", fontsize=9)
    ax.set_ylabel("cycles / inference")
    ax.set_ylim(0, max(values) * 1.18)
    ax.set_title("cycles: cost model and device")
    return _png(fig)


def fig_risk_coverage(judged: list[dict]) -> bytes | None:
    """Per model, the error among the rows answered against the share answered, when only rows whose confidence
    byte reaches a threshold are answered (every threshold the byte takes); a cross marks the device's own
    answers when --unknown-rate declines some."""
    drawn = [j for j in judged if len(j["confidence"])]
    if not drawn:
        return None
    colors = _colors(drawn)
    fig, ax = _figure()
    highest = 0.0
    for j in drawn:
        coverage, risk = risk_coverage(j["confidence"], j["correct"])
        highest = max(highest, float(risk.max()))
        ax.plot(100 * coverage, 100 * risk, "-o", color=colors[j["model"]], lw=1.5, markersize=3, label=j["name"])
        if j["coverage"] is not None and j["accepted_accuracy"] is not None and j["coverage"] < 1.0:
            ax.plot([100 * j["coverage"]], [100 * (1.0 - j["accepted_accuracy"])], "x", color="black", markersize=8,
                    mew=1.5, label=f"{j['name']}: answers with --unknown-rate")
    ax.set_xlim(0, 102)
    ax.set_ylim(0, max(1.0, 110 * highest))  # a model right on every row: its line on 0 of a 1 % axis
    ax.set_xlabel("coverage: rows answered, highest confidence first (%)")
    ax.set_ylabel("risk: wrong among the answered rows (%)")
    ax.set_title("risk against coverage (confidence byte as the threshold)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def fig_reliability(judged: list[dict]) -> bytes | None:
    """Per model, the accuracy of its rows in each of ECE_BINS equal-width bins of confidence against the bin's
    mean confidence (the diagonal is a perfectly calibrated byte); a marker's area grows with the bin's rows."""
    drawn = [j for j in judged if len(j["confidence"])]
    if not drawn:
        return None
    colors = _colors(drawn)
    fig, ax = _figure(5.4, 4.6)
    ax.plot([0, 100], [0, 100], color="#777", lw=1, label="accuracy = confidence")
    for j in drawn:
        points = reliability_bins(j["confidence"], j["correct"])
        rows = np.array([p[0] for p in points], dtype=np.float64)
        x, y = [100 * p[1] for p in points], [100 * p[2] for p in points]
        ece = "" if j["ece"] is None else f" (calibration error {100 * j['ece']:.1f} points)"
        ax.plot(x, y, "-", color=colors[j["model"]], lw=1, alpha=0.7)
        ax.scatter(x, y, s=12 + 120 * rows / rows.sum(), color=colors[j["model"]], label=j["name"] + ece, zorder=3)
    ax.set_xlim(0, 102)
    ax.set_ylim(0, 102)
    ax.set_xlabel(f"mean confidence of the bin (%; {ECE_BINS} equal-width bins)")
    ax.set_ylabel("accuracy of the bin's rows (%)")
    ax.set_title("reliability of the confidence byte")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


# ------------------------------------------------------------------------------------------------ the page

