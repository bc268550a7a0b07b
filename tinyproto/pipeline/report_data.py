"""What `tinyproto report` reads and concludes: the rows of a sweep or of one model directory, the configurations,
their accuracy / bytes Pareto frontier and a one-line recommendation. Layer: pipeline.

Accuracy here is the device's when the point was validated on the (simulated) board, else the host int8
reference's (the two are equal when validation passed: bit-exact); latency and energy are measured on the
board when validated, else the cost model's predictions, and are marked so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
import os
from pathlib import Path

import numpy as np

from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.measured import drawable
from tinyproto.core.strict_json import check_fields, kind_ok, loads_unique_keys

REPORT = "report.html"
FIGURES = "figures"


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
    # per calibrated model: its known test rows' confidence bytes and whether each was classified
    # right (the device's answers when every vector was validated, else the host reference's), and its figures
    judged: list[dict] = field(default_factory=list)


def _row(record: dict) -> dict:
    """One sweep line (or a single model) in the form every figure and table reads."""
    device = record.get("device") or None
    # a device figure is drawn only when it is one (validate leaves latency null when the cycle counts were not)
    measured = device is not None and drawable([device.get("latency_ms"), device.get("cycles_mean")])
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
        **_judged_figures(record),
    }


def _confidence_figures(record: dict) -> dict | None:
    """A result line's confidence figures: the device's where it was validated, else the host reference's."""
    return (record.get("device") or {}).get("confidence") or record.get("confidence")


def _judged_figures(record: dict) -> dict:
    """A point's coverage (--unknown-rate) and its novelty score's AUROC (--holdout-classes), the device's where
    it was validated; None where the point has none."""
    figures = _confidence_figures(record) or {}
    held_out = figures.get("held_out") or {}
    return {"coverage": figures.get("coverage"), "auroc": held_out.get("auroc")}


def load_sweep(path: Path) -> ReportInput:
    from tinyproto.core.safe_io import check_regular_file
    from tinyproto.pipeline.sweep_files import (CONFIG, RESULTS, check_points_agree, is_drawn, read_config,
                                                read_results)

    path = Path(path)
    config = read_config(path / CONFIG)
    if os.path.lexists(path / RESULTS):
        check_regular_file(path / RESULTS, "the sweep's results")  # a FIFO would block, /dev/zero never end
    records = read_results(path / RESULTS)
    if not records:
        _check_no_lost_results(path)
    rows, failed = [], []
    check_points_agree(path, records, config)
    for record in records:  # each one typed by read_results: a drawn line has every figure, as a number
        if record["status"] == "ok":
            rows.append(_row(record))
        else:
            # shown in the report's table of failed points: every field it prints, whatever the line held
            failed.append({**record, "id": str(record.get("id", "?")), "stage": str(record.get("stage", "?")),
                           "error": str(record.get("error", "no result recorded"))[:300]})
            if is_drawn(record):  # compiled, the device disagreed: still drawn
                rows.append(_row(record))
    judged = [j for j in (_sweep_point_judged(path, r) for r in records if r["status"] == "ok") if j is not None]
    return ReportInput("sweep", path, rows, failed, config, judged=judged)


def _check_no_lost_results(path: Path) -> None:
    """A sweep without a result line (results.jsonl missing, empty, or one torn line) is one that never finished
    a point, unless points/ holds compiled models: then the figures were lost (the file deleted, emptied or
    overwritten), and "no point compiled" would be false."""
    from tinyproto.pipeline.sweep_files import POINTS, RESULTS

    try:
        compiled = [p.name for p in (path / POINTS).iterdir() if (p / "model.json").is_file()]
    except OSError:  # no points/ (or unreadable): nothing compiled that we can see
        return
    if compiled:
        state = "holds no result line" if os.path.lexists(path / RESULTS) else "is missing"
        raise TinyprotoError(f"{path / RESULTS} {state}, but {path / POINTS} holds {len(compiled)} compiled "
                             f"point{'s' if len(compiled) > 1 else ''} ({', '.join(sorted(compiled)[:2])}"
                             f"{', ...' if len(compiled) > 2 else ''}); their figures were in it: run the same "
                             "`tinyproto sweep ... --resume` to make them again")


def _sweep_point_judged(path: Path, record: dict) -> dict | None:
    """A sweep point's judged rows from its model directory; None when it has no table or its directory is gone
    or damaged (the confidence figures then leave the point out; the point's own line still holds its figures)."""
    figures = _confidence_figures(record)
    if not figures or not isinstance(record.get("dir"), str):
        return None
    name = f"{record['model']} {kb(record['budget_bytes'])}" + (f" s{record['seed']}" if record["seed"] else "")
    try:
        return judged_rows(path / record["dir"], name, record["model"], figures)
    except (TinyprotoError, OSError, ValueError, KeyError):
        return None


def judged_rows(path: Path, name: str, family: str, figures: dict) -> dict:
    """One model's known test rows for the confidence figures: confidence byte, classified right or not."""
    from tinyproto.core.confidence import UNKNOWN_LABEL
    from tinyproto.core.modeldir import load_model_dir

    model_dir = load_model_dir(path)
    vectors = model_dir.vectors()
    answers = _device_answers(path, len(vectors.labels), model_dir.meta)
    labels, confidence = (vectors.labels, vectors.confidence) if answers is None else answers
    known = np.asarray(vectors.y) != UNKNOWN_LABEL
    return {"name": name, "model": family, "source": "host int8 reference" if answers is None else "device",
            "confidence": np.asarray(confidence, dtype=np.int64)[known],
            "correct": (np.asarray(labels) == np.asarray(vectors.y))[known],
            "coverage": figures.get("coverage"), "accepted_accuracy": figures.get("accepted_accuracy"),
            "ece": figures.get("ece")}


# What a single model's report reads from report.json and validation.json, with its type: every value is checked
# before a figure or a table uses it, so an edited file is one clear error naming the file and the key.
_REPORT_FIELDS = {"model": "text", "board": "text", "dataset": "text", "budget_bytes": "count", "seed": "count",
                  "model_bytes": "count", "float_accuracy": "fraction", "int8_accuracy": "fraction",
                  "predicted_latency_ms": "amount", "predicted_cycles.total": "amount",
                  "predicted_cycles.lower_bound": "amount", "sram_estimate.working_bytes": "amount",
                  "sram_estimate.serial_frame_bytes": "amount", "sram_estimate.reserved_bytes": "amount",
                  "ledger.arrays": "object"}
_VALIDATION_FIELDS = {"n_vectors": "count", "device_accuracy": "fraction", "label_agreement": "fraction",
                      "score_agreement": "fraction", "latency_ms_mean": "amount", "energy_mj_board": "amount",
                      "cycles_mean": "amount", "sram_static_bytes": "amount", "stack_peak_bytes": "amount"}
_OPTIONAL = {"n_vectors", "stack_peak_bytes", "sram_static_bytes",  # absent or null before a vector was measured
             "latency_ms_mean", "energy_mj_board"}  # null when the device's cycle counts were not plausible


def _checks_ok(checks: object) -> bool:
    """validation.json's checks as the page's table reads them: {name: {"ok": true/false/null, "detail": text}}."""
    return isinstance(checks, dict) and all(
        isinstance(c, dict) and (c.get("ok") is None or isinstance(c.get("ok"), bool))
        and isinstance(c.get("detail", ""), str) for c in checks.values())


def _ledger_ok(report: dict) -> bool:
    """Every field the page's byte ledger shows (a count missing was an internal error in the template)."""
    arrays = report["ledger"]["arrays"]
    return all(isinstance(a, dict) and kind_ok(a.get("bytes"), "count") and kind_ok(a.get("count"), "count")
               and isinstance(a.get("ctype"), str) and isinstance(a.get("what"), str) for a in arrays.values())


def validation_problem(validation: dict, meta: dict, report: dict, board, n_test: int) -> str | None:
    """What makes validation.json another model's or another board's, or disagree with itself, or None: its
    model hash, board, clock, SRAM, model and budget bytes against the directory's, its vector count against the
    test vectors, and its verdicts (passed, complete) against its own checks."""
    expected = {"model_hash": meta.get("model_hash"), "board": board.name, "f_cpu_hz": board.f_cpu_hz,
                "sram_bytes": board.sram_bytes, "model_bytes": report.get("model_bytes"),
                "budget_bytes": report.get("budget_bytes")}
    for key, value in expected.items():
        if key in validation and validation[key] != value:
            return f"its {key} is {json.dumps(validation[key])[:40]}, not {value!r}"
    n = validation.get("n_vectors")
    if n is not None and n > n_test:
        return f"it measured {n} vectors of the {n_test} test vectors"
    checks = validation.get("checks", {})
    if "passed" in validation and validation["passed"] is not all(c.get("ok") is not False for c in checks.values()):
        return f"passed is {json.dumps(validation['passed'])}, not what its checks say"
    complete = checks.get("complete", {}).get("ok") if isinstance(checks.get("complete"), dict) else None
    if "complete" in validation and complete is not None and validation["complete"] is not complete:
        return f"complete is {json.dumps(validation['complete'])}, not what its checks say"
    if validation.get("complete") is True and n is not None and n != n_test:
        return f"it is complete with {n} of the {n_test} test vectors"
    return None


def load_single(path: Path) -> ReportInput:
    from tinyproto.core.boards import load_board
    from tinyproto.core.manifest import remake_advice
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.core.safe_io import read_json

    model_dir = load_model_dir(path)
    report = model_dir.report
    if not report:
        raise TinyprotoError(f"{path} has no report.json; {remake_advice(path)}")
    check_fields(report, _REPORT_FIELDS, path / "report.json", advice=remake_advice(path))
    if not _ledger_ok(report):
        raise TinyprotoError(f"{path / 'report.json'} is damaged: its ledger is not a list of arrays with their "
                             f"type, count, bytes and description; {remake_advice(path)}")
    board = load_board(report["board"])
    validation = read_json(path / "validation.json", "the validation summary") \
        if os.path.lexists(path / "validation.json") else None
    if validation is not None and validation.get("n_vectors"):
        check_fields(validation, _VALIDATION_FIELDS, path / "validation.json", _OPTIONAL)
    elif validation is not None:
        check_fields(validation, {k: _VALIDATION_FIELDS[k] for k in _OPTIONAL}, path / "validation.json", _OPTIONAL)
    if validation is not None and not _checks_ok(validation.get("checks", {})):
        raise TinyprotoError(f"{path / 'validation.json'} is damaged: its checks are not names with an ok of true, "
                             "false or null and a detail text; run `tinyproto validate` again")
    if validation is not None and validation.get("stack_peak_bytes") is not None:  # the SRAM figure adds the two
        check_fields(validation, {"sram_static_bytes": "amount"}, path / "validation.json")
    build = read_json(path / "build.json", "the build record") if os.path.lexists(path / "build.json") else None
    model = families.load_int_model(model_dir)
    vectors = model_dir.vectors()
    problem = (validation_problem(validation, model_dir.meta, report, board, len(vectors.labels))
               if validation is not None else None)
    if problem:
        raise TinyprotoError(f"{path / 'validation.json'} disagrees with the model directory: {problem}; run "
                             f"`tinyproto validate {path}` again")
    if build is not None:
        from tinyproto.pipeline.validate import build_record_problem

        problem = build_record_problem(model_dir, build)
        if problem:
            raise TinyprotoError(f"{path / 'build.json'} does not match the model directory (damaged, or a file "
                                 f"changed since the build): {problem}; run `tinyproto build {path}` again")
    device = None
    if validation is not None and validation.get("n_vectors"):
        device = {"accuracy": validation["device_accuracy"], "latency_ms": validation.get("latency_ms_mean"),
                  "energy_mj_board": validation.get("energy_mj_board"), "cycles_mean": validation["cycles_mean"],
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
    device_labels = _device_labels(path, len(vectors.labels), model_dir.meta) if device else None
    if device_labels is not None and not _same_fraction(np.mean(device_labels == vectors.labels),
                                                        validation["label_agreement"], len(vectors.labels)):
        raise TinyprotoError(f"{path / 'validation.jsonl'} disagrees with validation.json: its device labels agree "
                             f"with the host on {np.mean(device_labels == vectors.labels):.1%} of the vectors, "
                             f"validation.json says {validation['label_agreement']:.1%}; run `tinyproto validate "
                             f"{path}` again")
    single = {"report": report, "validation": validation, "build": build, "board": board,
              "classes": [str(c) for c in model.classes], "y": vectors.y, "host_labels": vectors.labels,
              "device_labels": device_labels}
    figures = report.get("confidence")
    judged = ([judged_rows(path, f"{report['model']} {kb(report['budget_bytes'])}", report["model"], figures)]
              if isinstance(figures, dict) else [])
    return ReportInput("model", path, [_row(record)], [], {}, single, judged)


def _same_fraction(a: float, b: float, n: int) -> bool:
    return abs(float(a) - float(b)) < 0.5 / max(n, 1)


def _device_labels(path: Path, n: int, meta: dict) -> np.ndarray | None:
    """The device's label per test vector from validation.jsonl, when every vector was measured."""
    answers = _device_answers(path, n, meta)
    return None if answers is None else answers[0]


def _device_answers(path: Path, n: int, meta: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The device's (label, confidence byte) per test vector from validation.jsonl, when every vector was
    measured (a journal written before the confidence stage gives labels and confidence 0). Refused unless its
    first line binds it to this model and these test vectors: another model's answers are not this one's."""
    journal = path / "validation.jsonl"
    if not journal.is_file():  # missing, or not a regular file (a FIFO would block)
        return None
    from tinyproto.core.safe_io import read_text_file

    labels = np.full(n, -1, dtype=np.int64)
    confidence = np.zeros(n, dtype=np.int64)
    # bounded and non-blocking: a link to a huge file or to /dev/zero in the journal's place ends with one error
    lines = read_text_file(journal, "the validation journal").splitlines()
    try:
        binding = loads_unique_keys(lines[0])["binding"] if lines else None
        bound = all(binding[key] == meta.get(key) for key in ("model_hash", "vectors_sha256"))
    except (ValueError, KeyError, TypeError, RecursionError):
        bound = False
    if not bound:
        raise TinyprotoError(f"{journal} is not the journal of this model and its test vectors (its first line "
                             f"binds another, or none); run `tinyproto validate {path}` again")
    n_classes = len(meta.get("int_model", {}).get("classes", [])) or 2**31
    for line in lines[1:]:
        try:
            entry = loads_unique_keys(line)
            i, label, byte = entry["i"], entry["label"], entry.get("confidence", 0)
            if (isinstance(i, int) and isinstance(label, int) and 0 <= i < n and 0 <= label < n_classes
                    and isinstance(byte, int) and 0 <= byte <= 255):
                labels[i], confidence[i] = label, byte
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, AttributeError):
            continue  # a line that is not a result is simply not a label: the host's are shown instead
    return (labels, confidence) if (labels >= 0).all() else None


def load_input(path: Path) -> ReportInput:
    path = Path(path)
    if not path.is_dir():
        raise TinyprotoError(f"{path} is not a directory; give a sweep directory or a model directory")
    if os.path.lexists(path / "sweep.json"):  # (a loop of links there is said so by the loader, not "no sweep.json")
        return load_sweep(path)
    if os.path.lexists(path / "model.json"):
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
            values = [m.get(key) for m in members if m.get(key) is not None]
            return float(np.mean(values)) if values else None
        out.append({"model": model, "budget_bytes": budget, "board": board, "n_seeds": len(members),
                    "model_bytes": mean("model_bytes"), "accuracy": mean("accuracy"),
                    "float_accuracy": mean("float_accuracy"), "int8_accuracy": mean("int8_accuracy"),
                    "device_accuracy": mean("device_accuracy"), "latency_ms": mean("latency_ms"),
                    "energy_mj": mean("energy_mj"), "measured": all(m["measured"] for m in members),
                    "coverage": mean("coverage"), "auroc": mean("auroc")})
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
    # the confidence columns only where they say something: "answered" for points that may decline (a sweep with
    # --unknown-rate, or a point that declined test rows), "AUROC" for points with held-out classes
    rate = (data.config.get("binding") or {}).get("unknown_rate")
    declines = rate is not None or any(c["coverage"] is not None and c["coverage"] < 1 for c in frontier)
    judged = [key for key in JUDGED_COLUMNS
              if any(c[key] is not None for c in frontier) and (key != "coverage" or declines)]
    for column in ("model", "budget", "bytes", "acc.", "float", "int8", "device", "ms", "mJ") + tuple(
            JUDGED_COLUMNS[key][0] for key in judged):
        table.add_column(column, justify="left" if column == "model" else "right")
    for c in frontier:
        table.add_row(c["model"] + (f" ({c['board']})" if boards > 1 else ""), kb(c["budget_bytes"]),
                      f"{c['model_bytes']:.0f}", _pct(c["accuracy"]), _pct(c["float_accuracy"]),
                      _pct(c["int8_accuracy"]), _pct(c["device_accuracy"]),
                      f"{c['latency_ms']:.2f}" + ("" if c["measured"] else "*"),
                      _three_places(c["energy_mj"]),  # none: no plausible figure
                      *(JUDGED_COLUMNS[key][1](c[key]) for key in judged))
    table.caption = ("accuracy: the device's where validated, else the host int8 reference's; ms and mJ per inference"
                     + ("" if measured else "; * predicted by the cost model")
                     + "".join(f"; {JUDGED_COLUMNS[key][2]}" for key in judged))
    if frontier:
        _print_unwrapped(console, table)
    line = recommend(configs, max_bytes, max_ms)
    console.print(line)
    return line


def _print_unwrapped(console, table) -> None:
    """The table at its own width into a pipe or a file (there, rich assumes 80 columns and would wrap "100.0 %"
    over two lines); a terminal gets it fitted to its width."""
    from rich.measure import Measurement

    width = console.width
    if not console.is_terminal:
        console.width = max(width, Measurement.get(console, console.options.update_width(10_000), table).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _three_places(x: float | None) -> str:
    """A figure with three decimals (an AUROC, millijoules), or "-" where there is none."""
    return "-" if x is None else f"{x:.3f}"


# a configuration's confidence figure -> its column's header, its cell, its caption
JUDGED_COLUMNS = {
    "coverage": ("answered", _pct, "answered: share of known-class test rows not declined as unknown"),
    "auroc": ("AUROC", _three_places, "AUROC: how well the novelty score tells held-out classes' rows from known ones"),
}


# ------------------------------------------------------------------------------------------------ figures

