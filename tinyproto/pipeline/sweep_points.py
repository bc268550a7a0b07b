"""The points of `tinyproto sweep`: the (model, budget, seed, board) grid, checked before any work, and what one
point runs (compile, and with --device sim build and validate) inside a dask task. Layer: pipeline."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tinyproto import families
from tinyproto.core.errors import TinyprotoError, os_error_line
from tinyproto.core.option_lists import MAX_SEED, comma_items, plain_digits
from tinyproto.pipeline.sweep_files import CONFIDENCE_FIGURES, HELD_OUT_FIGURES, POINTS

FAMILIES = families.names()
DEVICES = ("sim", "none")
TOPIC = "tinyproto-sweep"


# ------------------------------------------------------------------------------------------------ the grid


@dataclass(frozen=True)
class Point:
    model: str
    budget_bytes: int
    seed: int
    board: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.budget_bytes}B-seed{self.seed}-{self.board}"

    def order(self) -> tuple:
        return (FAMILIES.index(self.model) if self.model in FAMILIES else len(FAMILIES), self.model,
                self.budget_bytes, self.seed, self.board)


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


def parse_grid(models: str, budgets: str, seeds: str, boards: str) -> list[Point]:
    """Every (model, budget, seed, board) point, in grid order; each item is checked here, before any work."""
    from tinyproto.core.boards import load_board
    from tinyproto.device.build import check_mcu_known
    from tinyproto.core.budget import parse_budget

    families = _unique([item.lower() for item in comma_items(models, "--models")])  # --model is case-blind too
    for family in families:
        if family not in FAMILIES:
            raise TinyprotoError(f"--models: unknown model {family!r}; choose from {', '.join(FAMILIES)}")
    budget_bytes = _unique([parse_budget(b) for b in comma_items(budgets, "--budgets")])
    seed_values = []
    for text in comma_items(seeds, "--seeds"):
        if not (plain_digits(text) and text.isdigit() and int(text) <= MAX_SEED):
            raise TinyprotoError(f"--seeds: {text!r} is not a seed (an integer from 0 to {MAX_SEED})")
        seed_values.append(int(text))
    board_names = _unique(comma_items(boards, "--boards"))
    for name in board_names:
        check_mcu_known(load_board(name))  # an unknown board is refused in one line, naming the known ones
    points = [Point(f, b, s, n) for f in families for b in budget_bytes for s in _unique(seed_values)
              for n in board_names]
    return sorted(points, key=Point.order)


MAX_WORKERS = 64  # LocalCluster processes: each holds a Python, numpy and a simulator; more exhaust file handles


def check_arguments(device: str, workers: int | None, scheduler: str | None, timeout: float,
                    max_latency_ms: float | None = None) -> None:
    if device not in DEVICES:
        raise TinyprotoError(f"--device {device!r}: choose sim (build and validate on the simulated board) or none")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise TinyprotoError(f"--workers must be in 1..{MAX_WORKERS} (worker processes on this machine), got {workers}")
    if workers is not None and scheduler:
        raise TinyprotoError("--workers sizes the LocalCluster; a --scheduler cluster brings its own workers")
    if not timeout > 0:
        raise TinyprotoError(f"--timeout must be a positive number of seconds, got {timeout}")
    if max_latency_ms is not None and not 0 < max_latency_ms < float("inf"):
        raise TinyprotoError(f"--max-latency must be a positive number of milliseconds, got {max_latency_ms}")


# ------------------------------------------------------------------------------------------------ one point (a task)


@dataclass(frozen=True)
class PointSettings:
    """What every point of one sweep is made with, beside its own (model, budget, seed, board)."""

    label: str | None = None  # DATA's label column
    device: str = "sim"  # sim: build and validate each point on the simulated board; none: compile only
    raw_check: bool = False  # validate's on-device input-stage pass too
    max_latency_ms: float | None = None  # `compile --max-latency`
    unknown_rate: str | None = None  # `compile --unknown-rate`
    clip_check: bool = False  # `compile --clip-check`
    holdout_classes: str | None = None  # `compile --holdout-classes`


def run_point(point: dict, data: str, point_dir: str, settings: PointSettings, token: str = "") -> dict:
    """Compile one point into `point_dir` (and build + validate it with device 'sim'); return its result line.

    Runs on a dask worker. Never raises for a point that cannot be made: the error becomes part of the line.
    """
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    p = Point(**point)
    _announce(token, p.id)
    record: dict[str, Any] = {"id": p.id, **asdict(p), "dir": f"{POINTS}/{p.id}", "status": "ok", "stage": None,
                              "error": None}
    seconds: dict[str, float] = {}
    stage = "compile"
    started = time.perf_counter()
    try:
        t = time.perf_counter()
        options = CompileOptions(p.model, p.budget_bytes, p.seed, p.board, Path(point_dir), settings.label,
                                 max_latency_ms=settings.max_latency_ms, unknown_rate=settings.unknown_rate,
                                 clip_check=settings.clip_check, holdout_classes=settings.holdout_classes)
        result = compile_model(data, options)
        seconds["compile"] = time.perf_counter() - t
        record.update(_compile_figures(result.report))
        if settings.device == "sim":
            stage = "build"
            t = time.perf_counter()
            _build(Path(point_dir))
            seconds["build"] = time.perf_counter() - t
            stage = "validate"
            t = time.perf_counter()
            summary = _validate(Path(point_dir), settings.raw_check)
            seconds["validate"] = time.perf_counter() - t
            record["device"] = _device_figures(summary)
            failed = [name for name, check in summary["checks"].items() if check["ok"] is False]
            if failed:
                record.update(status="failed", stage="validate",
                              error="device checks failed: " + "; ".join(
                                  f"{n} ({summary['checks'][n]['detail']})" for n in failed))
    except TinyprotoError as exc:
        record.update(status="failed", stage=stage, error=_one_line(str(exc)))
    except OSError as exc:  # a full disk, a permission: the system's words and the file, as the CLI says them
        record.update(status="failed", stage=stage, error=_one_line(os_error_line(exc)))
    except Exception as exc:  # a bug in one point must not take the sweep down: it is recorded, with its type
        record.update(status="failed", stage=stage, error=_one_line(f"internal error ({type(exc).__name__}: {exc})"))
    seconds["total"] = time.perf_counter() - started
    record["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
    return record


def _announce(token: str, point_id: str) -> None:
    """Tell the driver (dask event topic) that this point is running now: the progress bar's 'running'."""
    if not token:
        return
    try:
        from distributed import get_worker

        get_worker().log_event(TOPIC, {"token": token, "start": point_id})
    except Exception:  # not on a worker, or an old dask: the bar then estimates 'running'
        pass


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _build(point_dir: Path) -> None:
    import io

    from rich.console import Console

    from tinyproto.pipeline.firmware import build_model_dir

    build_model_dir(point_dir, None, Console(file=io.StringIO(), quiet=True))


def _validate(point_dir: Path, raw_check: bool) -> dict:
    from tinyproto.pipeline.validate import validate

    return validate(point_dir, port=None, raw_check=raw_check)


def _compile_figures(report: dict) -> dict:
    from tinyproto.core.boards import load_board

    board = load_board(report["board"])
    seconds = report["predicted_latency_ms"] / 1000.0
    return {
        "dataset": report["dataset"],
        "model_bytes": report["model_bytes"],
        "n_test": report["n_test"],
        "float_accuracy": report["float_accuracy"],
        "int8_accuracy": report["int8_accuracy"],
        "int8_float_agreement": report["int8_float_agreement"],
        "predicted_cycles": report["predicted_cycles"]["total"],
        "predicted_latency_ms": report["predicted_latency_ms"],
        "predicted_energy_mj_board": board.energy_mj(seconds, board.board_active_current_ma),
        "sram_estimate_bytes": report["sram_estimate"]["estimated_total_bytes"],
        "hyperparameters": report["hyperparameters"],
        "confidence": _judged(report.get("confidence")),
        "device": None,
    }


def _judged(figures: dict | None) -> dict | None:
    """A point's confidence figures (coverage, accuracy on the accepted rows, calibration error), and with held-out
    classes how well the novelty score tells their rows from the known ones (AUROC, share declined)."""
    if not figures:
        return None
    judged = {key: figures.get(key) for key in CONFIDENCE_FIGURES}
    held_out = figures.get("held_out")
    if isinstance(held_out, dict):
        judged["held_out"] = {key: held_out.get(key) for key in HELD_OUT_FIGURES}
    return judged


def _device_figures(summary: dict) -> dict:
    return {
        "accuracy": summary["device_accuracy"],
        "host_accuracy": summary["host_accuracy"],
        "label_agreement": summary["label_agreement"],
        "score_agreement": summary["score_agreement"],
        "cycles_mean": summary["cycles_mean"],
        "latency_ms": summary["latency_ms_mean"],
        "energy_mj_mcu": summary["energy_mj_mcu"],
        "energy_mj_board": summary["energy_mj_board"],
        "flash_bytes": summary["flash_bytes"],
        "sram_static_bytes": summary["sram_static_bytes"],
        "stack_peak_bytes": summary["stack_peak_bytes"],
        "sram_margin_bytes": summary["sram_margin_bytes"],
        "passed": summary["passed"],
        "confidence": _judged(summary.get("confidence")),
        "checks": {name: check["ok"] for name, check in summary["checks"].items()},
    }


# ------------------------------------------------------------------------------------------------ results.jsonl



def record_order(record: dict) -> tuple:
    try:
        return Point(record["model"], record["budget_bytes"], record["seed"], record["board"]).order()
    except (KeyError, TypeError):
        return (len(FAMILIES) + 1, str(record.get("id")), 0, 0, "")

