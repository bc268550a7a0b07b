"""The files of a sweep directory, shared by `tinyproto sweep` (which writes them) and `tinyproto report`
(which reads them): sweep.json (the grid and every run), results.jsonl (one line per finished point) and
points/<id>/ (each point's model directory).
Layer: pipeline."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.option_lists import MAX_SEED
from tinyproto.core.safe_io import read_bytes_file, write_bytes_atomic
from tinyproto.core.strict_json import loads_unique_keys

CONFIG = "sweep.json"
RESULTS = "results.jsonl"
POINTS = "points"
MAX_RESULTS_BYTES = 256 << 20  # ~100,000 points; more is not a results file tinyproto wrote
SWEEP_FORMAT = "tinyproto-sweep"
SWEEP_FORMAT_VERSION = 1
MAX_COUNT = 2**53  # bytes, cycles: anything larger is not a figure a tinyproto run measured or predicted

# The typed shape of one results.jsonl line. Every figure a report draws or a resumed sweep sorts by is checked
# here, once, so a hand-edited or damaged line is one clear error naming file:line, never a TypeError in a figure
# or a NaN drawn as a result.
_POINT_FIELDS = {"model": str, "board": str, "budget_bytes": int, "seed": int}
_KIND_NAMES = {str: "text", int: "an integer"}
_FRACTIONS = ("float_accuracy", "int8_accuracy", "int8_float_agreement")
_AMOUNTS = ("model_bytes", "predicted_cycles", "predicted_latency_ms", "predicted_energy_mj_board",
            "sram_estimate_bytes", "n_test")
_DEVICE_FRACTIONS = ("accuracy", "host_accuracy", "label_agreement", "score_agreement")
_DEVICE_AMOUNTS = ("cycles_mean", "latency_ms", "energy_mj_mcu", "energy_mj_board", "flash_bytes",
                   "sram_static_bytes", "stack_peak_bytes")
# a point's confidence figures as sweep_points writes them (these keys of report.json's confidence block)
CONFIDENCE_FIGURES = ("coverage", "accepted_accuracy", "ece", "mean_confidence")
# and, with held-out classes, these of its "held_out" block (rows: how many test rows were of held-out classes)
HELD_OUT_FIGURES = ("rows", "auroc", "declined")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_COUNT \
        and math.isfinite(value)


def _check_amount(entry: dict, key: str, where: str = "") -> None:
    value = entry.get(key)
    if value is not None and not (_is_number(value) and value >= 0):
        raise ValueError(f"{where}{key} is {_shown(value)}, not a non-negative number")


def _check_fraction(entry: dict, key: str, where: str = "") -> None:
    value = entry.get(key)
    if value is not None and not (_is_number(value) and 0 <= value <= 1):
        raise ValueError(f"{where}{key} is {_shown(value)}, not a fraction in 0..1")


def _check_confidence(entry: dict, where: str) -> None:
    """The confidence figures a report prints and draws: absent, or an object of fractions."""
    figures = entry.get("confidence")
    if figures is None:
        return
    if not isinstance(figures, dict):
        raise ValueError(f"{where}confidence is {_shown(figures)}, not an object")
    for key in CONFIDENCE_FIGURES:
        _check_fraction(figures, key, f"{where}confidence.")
    held_out = figures.get("held_out")
    if held_out is None:
        return
    if not isinstance(held_out, dict):
        raise ValueError(f"{where}confidence.held_out is {_shown(held_out)}, not an object")
    _check_amount(held_out, "rows", f"{where}confidence.held_out.")
    for key in ("auroc", "declined"):
        _check_fraction(held_out, key, f"{where}confidence.held_out.")


def _shown(value: object) -> str:
    return json.dumps(value)[:24] if not isinstance(value, float) or math.isfinite(value) else str(value)


def check_result_line(entry: object) -> dict:
    """`entry` if it has the shape of a line tinyproto sweep writes, else ValueError saying which field is wrong."""
    if not isinstance(entry, dict):
        raise ValueError("not a result object")
    for key, kind in _POINT_FIELDS.items():
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{key} is {_shown(value)}, not {_KIND_NAMES[kind]}")
    if not 0 < entry["budget_bytes"] <= MAX_COUNT or not 0 <= entry["seed"] <= MAX_SEED:
        raise ValueError("budget_bytes or seed out of range")
    point_id = f"{entry['model']}-{entry['budget_bytes']}B-seed{entry['seed']}-{entry['board']}"
    if entry.get("id") != point_id or entry.get("dir") != f"{POINTS}/{point_id}":
        raise ValueError("its id or directory does not name its point")
    if entry.get("status") not in ("ok", "failed"):
        raise ValueError("a result object without its status")
    for key in ("stage", "error", "dataset"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise ValueError(f"{key} is {_shown(entry[key])}, not text")
    for key in _FRACTIONS:
        _check_fraction(entry, key)
    for key in _AMOUNTS:
        _check_amount(entry, key)
    _check_confidence(entry, "")
    device = entry.get("device")
    if device is not None:
        if not isinstance(device, dict):
            raise ValueError(f"device is {_shown(device)}, not an object")
        for key in _DEVICE_FRACTIONS:
            _check_fraction(device, key, "device.")
        for key in _DEVICE_AMOUNTS:
            _check_amount(device, key, "device.")
        _check_confidence(device, "device.")
    if is_drawn(entry):
        missing = [k for k in FIGURES if entry.get(k) is None]
        if device is not None:
            missing += [f"device.{k}" for k in DEVICE_FIGURES if device.get(k) is None]
            if device.get("latency_ms") is not None:
                missing += [f"device.{k}" for k in ("energy_mj_board", "cycles_mean") if device.get(k) is None]
        if missing:
            raise ValueError(f"a compiled point without {', '.join(missing[:3])}")
    return entry


# A line of a point that compiled carries these figures (a report draws it): all of them, as numbers.
FIGURES = ("model_bytes", "float_accuracy", "int8_accuracy", "predicted_cycles", "predicted_latency_ms",
           "predicted_energy_mj_board")
DEVICE_FIGURES = ("accuracy", "label_agreement", "score_agreement")


def is_drawn(entry: dict) -> bool:
    """Whether a report draws this line: a point that compiled (ok, or failed only on the device's checks)."""
    return entry.get("status") == "ok" or (entry.get("stage") == "validate" and entry.get("model_bytes") is not None)


def check_config(config: dict, path: Path) -> dict:
    """sweep.json's fields that `sweep --resume` and `report` use, typed (one clear error otherwise)."""
    if config.get("format") != SWEEP_FORMAT:
        raise TinyprotoError(f"{path} is not a tinyproto sweep's configuration (no format {SWEEP_FORMAT!r})")
    version = config.get("format_version")
    if type(version) is not int or version != SWEEP_FORMAT_VERSION:
        # another version's fields may mean other things: its figures would be drawn (or resumed) wrongly
        raise TinyprotoError(f"{path} is not a tinyproto sweep of format version {SWEEP_FORMAT_VERSION} (it says "
                             f"{str(version)[:20]!r}); run that tinyproto's report, or sweep again in a new --out")
    runs = config.get("runs", [])
    runs_ok = isinstance(runs, list) and all(isinstance(r, dict) and isinstance(r.get("cluster") or {}, dict)
                                             for r in runs)  # the report's table of runs reads run.cluster.*
    if not isinstance(config.get("binding", {}), dict) or not runs_ok:
        raise TinyprotoError(f"{path} is damaged (its binding is not an object or its runs not a list); start the "
                             "sweep again in a new --out")
    for number, run in enumerate(runs, start=1):
        problem = _run_problem(run)
        if problem:  # the report's table of runs printed it: a missing one was an internal error (UndefinedError)
            raise TinyprotoError(f"{path} is damaged: its run {number} {problem}; start the sweep again in a new "
                                 "--out")
    return config


def _run_problem(run: dict) -> str | None:
    """What is wrong with one entry of sweep.json's runs (as _record_run writes it), or None."""
    for key in ("points_to_run", "points_finished"):
        value = run.get(key)
        if type(value) is not int or not 0 <= value <= MAX_COUNT:
            return f"has {key} {_shown(value)}, not a count of points"
    if not (_is_number(run.get("wall_seconds")) and run["wall_seconds"] >= 0):
        return f"has wall_seconds {_shown(run.get('wall_seconds'))}, not a number of seconds"
    cluster = run.get("cluster")
    if cluster is not None and not (isinstance(cluster, dict) and isinstance(cluster.get("scheduler"), str)
                                    and type(cluster.get("workers")) is int and cluster["workers"] >= 0):
        return "has a cluster without its scheduler's name and number of workers"
    return None


def read_config(path: Path) -> dict:
    """sweep.json: a JSON object with a binding object and a list of runs, or one clear error."""
    from tinyproto.core.safe_io import read_json

    return check_config(read_json(path, "the sweep's configuration"), path)


def read_results(path: Path, repair: bool = False) -> list[dict]:
    """The lines of results.jsonl; a torn last line (killed mid-write) is dropped, and cut off with repair."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    data = read_bytes_file(path, "a sweep's results", MAX_RESULTS_BYTES)
    lines = data.split(b"\n")
    records, good_end, seen = [], 0, set()
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)  # the part after the final newline: empty, or a torn line
        if not line.strip():
            good_end += len(line) + (0 if last else 1)
            continue
        try:
            entry = check_result_line(loads_unique_keys(line.decode("utf-8")))
            if entry["id"] in seen:  # the driver writes one line per point: a second is not its own
                raise ValueError(f"a second line for {entry['id']}")
        except (ValueError, RecursionError) as exc:
            if last:
                break  # torn by a kill: that point runs again
            raise TinyprotoError(f"{path}:{number} is not a result line ({str(exc)[:100]}); the sweep directory "
                                 "is damaged, start it again in a new --out") from None
        if last:  # a complete object without its newline: still torn (the newline is written with it)
            break
        records.append(entry)
        seen.add(entry["id"])
        good_end += len(line) + 1
    if repair and good_end < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(good_end)
    return records


class ResultsFile:
    """results.jsonl, appended one fsync'ed line per finished point by the driver alone."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # never through a link planted at results.jsonl: the lines would go to someone else's file
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self._handle = os.fdopen(fd, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def _rewrite_in_order(path: Path, records: list[dict]) -> None:
    """Replace results.jsonl by the same lines in grid order (one atomic rename, through .results.jsonl.tmp)."""
    write_bytes_atomic(path, "".join(json.dumps(record, sort_keys=True) + "\n" for record in records).encode("utf-8"))


# A result line's figures copied from its point's report.json and validation.json (sweep_points.py): a line that
# disagrees with the files of its point was edited or belongs to another run, and drawing it would be wrong.
_FROM_REPORT = {"model": "model", "board": "board", "budget_bytes": "budget_bytes", "seed": "seed",
                "dataset": "dataset", "model_bytes": "model_bytes", "n_test": "n_test",
                "float_accuracy": "float_accuracy", "int8_accuracy": "int8_accuracy",
                "predicted_latency_ms": "predicted_latency_ms"}
_FROM_VALIDATION = {"accuracy": "device_accuracy", "label_agreement": "label_agreement",
                    "score_agreement": "score_agreement", "cycles_mean": "cycles_mean", "passed": "passed"}


def _point_disagreement(path: Path, record: dict, config: dict) -> str | None:
    """How a result line disagrees with the sweep's data set or with its point's report.json / validation.json,
    or None (also when the point's directory or files are gone: the line is then all there is)."""
    from tinyproto.core.safe_io import read_json

    dataset = (config.get("binding") or {}).get("dataset")
    if record.get("dataset") is not None and dataset is not None and record["dataset"] != dataset:
        return f"names data set {str(record['dataset'])[:40]!r}, but the sweep ran on {dataset!r}"
    if record.get("status") != "ok" or not isinstance(record.get("dir"), str):
        return None
    point = path / record["dir"]
    sources = [("report.json", _FROM_REPORT, record), ("validation.json", _FROM_VALIDATION, record.get("device"))]
    for name, keys, figures in sources:
        if not isinstance(figures, dict) or not (point / name).is_file() or (point / name).is_symlink():
            continue
        try:
            doc = read_json(point / name, "a point's record")
        except TinyprotoError:
            continue  # a damaged file of the point: its own figures are then the line's
        for line_key, doc_key in keys.items():
            if line_key in figures and doc_key in doc and figures[line_key] != doc[doc_key]:
                return (f"says {line_key} {json.dumps(figures[line_key])[:30]}, but {record['dir']}/{name} "
                        f"says {json.dumps(doc[doc_key])[:30]}")
        if name == "report.json" and "predicted_cycles" in figures and isinstance(doc.get("predicted_cycles"), dict) \
                and figures["predicted_cycles"] != doc["predicted_cycles"].get("total"):
            return f"says predicted_cycles {figures['predicted_cycles']}, but {record['dir']}/report.json differs"
    return None


def check_points_agree(path: Path, records: list[dict], config: dict) -> None:
    """One clear error unless every result line agrees with its point's files: report draws nothing from a damaged
    sweep, and `sweep --resume` runs nothing into one (it ran the missing points, then refused at the end, having
    written a point and sweep.json's run into a directory it called damaged)."""
    for record in records:
        problem = _point_disagreement(path, record, config)
        if problem:
            raise TinyprotoError(f"{path / RESULTS}: the line of point {record.get('id')} {problem}; the sweep "
                                 "directory is damaged: run the sweep again in a new --out")
