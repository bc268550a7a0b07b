"""`tinyproto sweep`: compile (and with --device sim build and validate) a grid of (model, budget, seed, board)
points as independent tasks on dask.distributed, and collect one result line per point.

    DIR/sweep.json       what was swept (data fingerprint, device) and each run's cluster and wall time
    DIR/results.jsonl    one JSON line per finished point, appended (fsync'ed) by the driver as it finishes
    DIR/points/<id>/     the model directory of every point (compile's files, build.json, validation.json)

Each task writes its own model directory and returns a small dict; only the driver writes results.jsonl, so an
interrupted sweep loses nothing that finished, and `--resume` runs only the points without a line (a torn last
line, a kill mid-write, is dropped). A point that fails (a budget too small for the data, a build error, a
failed device check) gets a line with its stage and error and does not stop the sweep. When every point has
its line, results.jsonl is rewritten once (atomically) in grid order, so the same inputs give the same file
whatever the completion order; all wall times are in each line's "seconds" and in sweep.json, nowhere else.

The sweep directory follows tinyproto's safety rules (tinyproto/modeldir.py): it is refused if it holds files
tinyproto did not write, it is locked while the sweep runs, and its outputs are recorded in its manifest.
With --scheduler the workers must see DIR (and a DATA file) at the same absolute path: a shared filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.sweep_files import CONFIG, POINTS, RESULTS, read_results

SWEEP_FORMAT = "tinyproto-sweep"
SWEEP_FORMAT_VERSION = 1
FAMILIES = families.names()
MAX_SEED = 2**32 - 1  # numpy's seed range (the CLI's --seed accepts the same)
DEVICES = ("sim", "none")
DEFAULT_BUDGETS = "0.5kB,1kB,2kB,4kB,8kB"
DEFAULT_TIMEOUT_S = 1800.0  # longest wait for the next point to finish (a point is compile + build + validate)
CONNECT_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 20.0
POLL_S = 0.2
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


def kb(n_bytes: int | float) -> str:
    """512 -> '0.5kB', 2048 -> '2kB' (1 kB = 1024 B, as budgets are written)."""
    return f"{n_bytes / 1024:g}kB"


def _items(text: str, option: str) -> list[str]:
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(not item for item in items):
        raise TinyprotoError(f"{option} {text!r}: give a comma-separated list without empty items")
    return items


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


def parse_grid(models: str, budgets: str, seeds: str, boards: str) -> list[Point]:
    """Every (model, budget, seed, board) point, in grid order; each item is checked here, before any work."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.budget import parse_budget

    families = _unique(_items(models, "--models"))
    for family in families:
        if family not in FAMILIES:
            raise TinyprotoError(f"--models: unknown model {family!r}; choose from {', '.join(FAMILIES)}")
    budget_bytes = _unique([parse_budget(b) for b in _items(budgets, "--budgets")])
    seed_values = []
    for text in _items(seeds, "--seeds"):
        if not (text.isascii() and text.isdigit() and int(text) <= MAX_SEED):
            raise TinyprotoError(f"--seeds: {text!r} is not a seed (an integer from 0 to {MAX_SEED})")
        seed_values.append(int(text))
    board_names = _unique(_items(boards, "--boards"))
    for name in board_names:
        load_board(name)  # an unknown board is refused in one line, naming the known ones
    points = [Point(f, b, s, n) for f in families for b in budget_bytes for s in _unique(seed_values)
              for n in board_names]
    return sorted(points, key=Point.order)


def check_arguments(device: str, workers: int | None, scheduler: str | None, timeout: float) -> None:
    if device not in DEVICES:
        raise TinyprotoError(f"--device {device!r}: choose sim (build and validate on the simulated board) or none")
    if workers is not None and workers < 1:
        raise TinyprotoError(f"--workers must be at least 1, got {workers}")
    if workers is not None and scheduler:
        raise TinyprotoError("--workers sizes the LocalCluster; a --scheduler cluster brings its own workers")
    if not timeout > 0:
        raise TinyprotoError(f"--timeout must be a positive number of seconds, got {timeout}")


# ------------------------------------------------------------------------------------------------ one point (a task)


def run_point(point: dict, data: str, label: str | None, device: str, point_dir: str, raw_check: bool,
              token: str = "") -> dict:
    """Compile one point into `point_dir` (and build + validate it with device 'sim'); return its result line.

    Runs on a dask worker. Never raises for a point that cannot be made: the error becomes part of the line.
    """
    from tinyproto.pipeline.compile import compile_model

    p = Point(**point)
    _announce(token, p.id)
    record: dict[str, Any] = {"id": p.id, **asdict(p), "dir": f"{POINTS}/{p.id}", "status": "ok", "stage": None,
                              "error": None}
    seconds: dict[str, float] = {}
    stage = "compile"
    started = time.perf_counter()
    try:
        t = time.perf_counter()
        result = compile_model(data, p.model, str(p.budget_bytes), p.seed, p.board, Path(point_dir), label)
        seconds["compile"] = time.perf_counter() - t
        record.update(_compile_figures(result.report))
        if device == "sim":
            stage = "build"
            t = time.perf_counter()
            _build(Path(point_dir))
            seconds["build"] = time.perf_counter() - t
            stage = "validate"
            t = time.perf_counter()
            summary = _validate(Path(point_dir), raw_check)
            seconds["validate"] = time.perf_counter() - t
            record["device"] = _device_figures(summary)
            failed = [name for name, check in summary["checks"].items() if check["ok"] is False]
            if failed:
                record.update(status="failed", stage="validate",
                              error="device checks failed: " + "; ".join(
                                  f"{n} ({summary['checks'][n]['detail']})" for n in failed))
    except TinyprotoError as exc:
        record.update(status="failed", stage=stage, error=_one_line(str(exc)))
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
        "device": None,
    }


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
        "checks": {name: check["ok"] for name, check in summary["checks"].items()},
    }


# ------------------------------------------------------------------------------------------------ results.jsonl


class ResultsFile:
    """results.jsonl, appended one fsync'ed line per finished point by the driver alone."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def _rewrite_in_order(path: Path, records: list[dict]) -> None:
    """Replace results.jsonl by the same lines in grid order (one atomic rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _record_order(record: dict) -> tuple:
    try:
        return Point(record["model"], record["budget_bytes"], record["seed"], record["board"]).order()
    except (KeyError, TypeError):
        return (len(FAMILIES) + 1, str(record.get("id")), 0, 0, "")


# ------------------------------------------------------------------------------------------------ the sweep directory


def data_fingerprint(dataset) -> str:
    import numpy as np

    digest = hashlib.sha256()
    X = np.ascontiguousarray(dataset.X, dtype=np.float64)
    digest.update(str(X.shape).encode())
    digest.update(X.tobytes())
    digest.update("\x00".join(map(str, np.asarray(dataset.y).tolist())).encode())
    return digest.hexdigest()


def _binding(dataset, device: str, raw_check: bool) -> dict:
    """What must be the same for --resume to continue a sweep (the grid itself may grow)."""
    return {"dataset": dataset.name, "data_sha256": data_fingerprint(dataset), "device": device,
            "raw_check": raw_check if device == "sim" else None}


def _open_sweep_dir(out: Path, binding: dict, resume: bool) -> dict:
    """Check and prepare DIR (inside its lock): a new sweep, or --resume of the same one. Returns sweep.json."""
    from tinyproto.core.modeldir import read_json, record_outputs, write_json, write_manifest, MANIFEST

    config_path = out / CONFIG
    if (out / "model.json").exists():
        raise TinyprotoError(f"--out {out} is a model directory; give a new directory for the sweep")
    if config_path.exists():
        config = read_json(config_path, "the sweep's configuration")
        if config.get("format") != SWEEP_FORMAT or config.get("format_version") != SWEEP_FORMAT_VERSION:
            raise TinyprotoError(f"{config_path} is not a tinyproto sweep of format version {SWEEP_FORMAT_VERSION}")
        if not resume and read_results(out / RESULTS):  # a sweep that never finished a point is simply started
            raise TinyprotoError(f"--out {out} already holds a sweep; add --resume to continue it, or choose "
                                 "another --out")
        if config.get("binding") != binding:
            theirs, ours = config.get("binding", {}), binding
            diff = [k for k in ours if theirs.get(k) != ours[k]]
            raise TinyprotoError(f"{out} is a sweep of other inputs ({', '.join(diff) or 'binding'} "
                                 "differ); use the same DATA and --device, or another --out")
        return config
    if resume:
        raise TinyprotoError(f"nothing to resume: {out} holds no sweep; run without --resume")
    if not (out / MANIFEST).exists():
        write_manifest(out)  # an empty directory becomes a tinyproto directory that owns what the sweep writes
    record_outputs(out, CONFIG, RESULTS, f".{RESULTS}.tmp", POINTS)
    config = {"format": SWEEP_FORMAT, "format_version": SWEEP_FORMAT_VERSION, "binding": binding, "runs": []}
    write_json(config_path, config)
    return config


# ------------------------------------------------------------------------------------------------ dask


@contextmanager
def open_cluster(scheduler: str | None, workers: int | None, n_points: int) -> Iterator[tuple[Any, dict]]:
    """A dask client on a LocalCluster of worker processes (default: one per CPU, at most one per point) or on
    the running cluster at `scheduler`; as tinyproto federate opens it. Every wait here has a timeout."""
    import importlib.util
    import logging

    if importlib.util.find_spec("distributed") is None:
        raise TinyprotoError("tinyproto sweep needs dask.distributed: pip install 'dask[distributed]'")
    import dask
    from distributed import Client, LocalCluster

    cluster = None
    if scheduler:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
        except Exception as exc:  # refused, timed out, or an address dask cannot parse: one line, whatever it is
            raise TinyprotoError(f"cannot reach the dask scheduler at {scheduler} (waited up to "
                                 f"{CONNECT_TIMEOUT_S:g} s): {type(exc).__name__}: {_one_line(str(exc))}") from None
    else:
        n_workers = workers or max(1, min(n_points, os.cpu_count() or 1))
        # worker processes: training is Python and numpy, so threads would share one GIL. Like federate, keep
        # glibc's adaptive malloc trimming (dask's 65536 default slows numpy-heavy work in workers).
        try:
            with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                                  "distributed.comm.timeouts.connect": f"{CONNECT_TIMEOUT_S}s"}):
                cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
            client = Client(cluster, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            if cluster is not None:
                _quietly(cluster.close, timeout=CLOSE_TIMEOUT_S)
            raise TinyprotoError(f"could not start a dask LocalCluster: {_one_line(str(exc))}") from None
    try:
        info = client.scheduler_info()
        n = len(info.get("workers", {}))
        if n == 0:
            try:
                client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                raise TinyprotoError(f"the dask scheduler at {scheduler} has no workers (waited "
                                     f"{CONNECT_TIMEOUT_S:g} s)") from None
            n = len(client.scheduler_info().get("workers", {}))
        threads = sum(w.get("nthreads", 1) for w in client.scheduler_info().get("workers", {}).values())
        yield client, {"scheduler": scheduler or "LocalCluster", "workers": n, "threads": threads,
                       "processes": True if cluster is not None else None}
    finally:  # closing must not hide why we stopped (an error, Ctrl-C); each close has its timeout
        _quietly(client.close, timeout=CLOSE_TIMEOUT_S)
        if cluster is not None:
            _quietly(cluster.close, timeout=CLOSE_TIMEOUT_S)


def _quietly(close: Callable, **kwargs) -> None:
    try:
        close(**kwargs)
    except Exception:
        pass


# ------------------------------------------------------------------------------------------------ the driver


@dataclass
class SweepProgress:
    """What the progress bar shows; the CLI passes a callback that redraws it."""

    total: int
    skipped: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    last: str = ""


@dataclass
class SweepResult:
    out_dir: Path
    records: list[dict]  # every line of results.jsonl, grid order
    ran: int  # points run now (not skipped by --resume)
    skipped: int
    seconds: float
    cluster: dict | None
    complete: bool = True
    missing: list[str] = field(default_factory=list)


def sweep(
    data: str,
    out: Path,
    models: str = ",".join(families.names()),
    budgets: str = DEFAULT_BUDGETS,
    seeds: str = "0",
    boards: str = "uno",
    device: str = "sim",
    scheduler: str | None = None,
    workers: int | None = None,
    resume: bool = False,
    label: str | None = None,
    raw_check: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[SweepProgress], None] | None = None,
) -> SweepResult:
    """Run every point of the grid not yet in DIR/results.jsonl; see the module doc."""
    from tinyproto.core.datasets import load_dataset
    from tinyproto.core.modeldir import check_output_dir, locked

    check_arguments(device, workers, scheduler, timeout)
    points = parse_grid(models, budgets, seeds, boards)
    dataset = load_dataset(data, label=label)  # a bad DATA is refused here, not once per point on the workers
    data_ref = os.path.abspath(data) if Path(data).exists() else data  # workers may run in another directory
    binding = _binding(dataset, device, raw_check)
    out = check_output_dir(out)  # refuses a DIR holding files tinyproto did not write
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with locked(out, "sweep"):
        config = _open_sweep_dir(out, binding, resume)
        (out / POINTS).mkdir(exist_ok=True)
        previous = read_results(out / RESULTS, repair=True)
        done_ids = {r["id"] for r in previous}
        todo = [p for p in points if p.id not in done_ids]
        state = SweepProgress(total=len(points), skipped=len(points) - len(todo))
        state.done = state.skipped
        state.failed = sum(1 for r in previous if r["id"] in {p.id for p in points} and r.get("status") != "ok")
        if progress:
            progress(state)
        cluster_info = None
        results = ResultsFile(out / RESULTS)
        new_records: list[dict] = []
        try:
            if todo:
                with open_cluster(scheduler, workers, len(todo)) as (client, cluster_info):
                    _run_points(client, cluster_info, todo, data_ref, label, device, out, raw_check, timeout,
                                results, new_records, state, progress)
        finally:
            results.close()
            seconds = time.perf_counter() - started
            _record_run(out, config, cluster_info, len(todo), len(new_records), seconds)
        records = sorted(previous + new_records, key=_record_order)
        have = {r["id"] for r in records}
        missing = [p.id for p in points if p.id not in have]
        if not missing:
            _rewrite_in_order(out / RESULTS, records)
    return SweepResult(out, records, len(new_records), state.skipped, seconds, cluster_info, not missing, missing)


def _run_points(client, cluster_info: dict, todo: list[Point], data: str, label: str | None, device: str, out: Path,
                raw_check: bool, timeout: float, results: ResultsFile, new_records: list[dict],
                state: SweepProgress, progress: Callable[[SweepProgress], None] | None) -> None:
    from distributed import as_completed

    token = uuid.uuid4().hex
    started: set[str] = set()
    started_lock = threading.Lock()  # the handler runs on the client's event-loop thread

    def on_event(event) -> None:
        message = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(message, dict) and message.get("token") == token:
            with started_lock:
                started.add(message.get("start"))

    subscribed = False
    try:
        client.subscribe_topic(TOPIC, on_event)
        subscribed = True
    except Exception:
        pass

    futures = {}
    for p in sorted(todo, key=lambda p: -p.budget_bytes):  # the longest points first: fewer idle workers at the end
        future = client.submit(run_point, asdict(p), data, label, device, str(out / POINTS / p.id), raw_check,
                               token, key=f"tinyproto-sweep-{p.id}-{token[:8]}", pure=False, priority=p.budget_bytes)
        futures[future] = p
    finished: set[str] = set()
    pending = as_completed(list(futures))
    last_finish = time.monotonic()
    try:
        while len(finished) < len(todo):
            batch = pending.next_batch(block=False)
            for future in batch:
                p = futures[future]
                record = _collect(future, p, out)
                results.append(record)
                new_records.append(record)
                finished.add(p.id)
                state.done += 1
                state.failed += record["status"] != "ok"
                state.last = f"{p.id}: {record['status']}" + (f" ({record['stage']})" if record["status"] != "ok" else "")
                last_finish = time.monotonic()
            if subscribed:
                with started_lock:
                    state.running = len(started - finished)
            else:
                state.running = min(cluster_info["threads"], len(todo) - len(finished))
            if progress:
                progress(state)
            if not batch:
                if time.monotonic() - last_finish > timeout:
                    raise TinyprotoError(f"no point finished within {timeout:g} s (--timeout); {len(finished)} of "
                                         f"{len(todo)} are recorded in {out / RESULTS}, --resume runs the rest")
                time.sleep(POLL_S)
    finally:
        for future in futures:
            if not future.done():
                future.cancel()
        if subscribed:
            try:
                client.unsubscribe_topic(TOPIC)
            except Exception:
                pass


def _collect(future, p: Point, out: Path) -> dict:
    """The result line of a finished future; a task that died (worker killed, unpicklable) is a failed point."""
    try:
        return future.result(timeout=CONNECT_TIMEOUT_S)
    except TinyprotoError:
        raise
    except Exception as exc:  # KilledWorker, CancelledError, a timeout fetching the result
        return {"id": p.id, **asdict(p), "dir": f"{POINTS}/{p.id}", "status": "failed", "stage": "worker",
                "error": _one_line(f"the task did not return ({type(exc).__name__}: {exc})"),
                "device": None, "seconds": {}}


def _record_run(out: Path, config: dict, cluster: dict | None, n_todo: int, n_ran: int, seconds: float) -> None:
    from tinyproto.core.modeldir import write_json

    runs = list(config.get("runs", []))
    runs.append({"cluster": cluster, "points_to_run": n_todo, "points_finished": n_ran,
                 "wall_seconds": round(seconds, 2)})
    config["runs"] = runs
    write_json(out / CONFIG, config)


# ------------------------------------------------------------------------------------------------ the command


