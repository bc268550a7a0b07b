"""`tinyproto sweep`: compile (and with --device sim build and validate) a grid of (model, budget, seed, board)
points as independent tasks on dask.distributed, and collect one result line per point.

    DIR/sweep.json       what was swept (data fingerprint, device) and each run's cluster and wall time
    DIR/results.jsonl    one JSON line per finished point, appended (fsync'ed) by the driver as it finishes
    DIR/points/<id>/     the model directory of every point (compile's files, build.json, validation.json)

Each task writes its own model directory and returns a small dict; only the driver writes results.jsonl, so an
interrupted sweep loses nothing that finished, and `--resume` runs only the points without a line (a torn last
line, a kill mid-write, is dropped) and the compiled points whose model directory is gone. A point that fails (a
budget too small for the data, a build error, a failed device check) gets a line with its stage and error and does
not stop the sweep. When every point has
its line, results.jsonl is rewritten once (atomically) in grid order, so the same inputs give the same file
whatever the completion order; all wall times are in each line's "seconds" and in sweep.json, nowhere else.

The sweep directory follows tinyproto's safety rules (tinyproto/core/manifest.py): it is refused if it holds files
tinyproto did not write, it is locked while the sweep runs, and its outputs are recorded in its manifest.
With --scheduler the workers must see DIR (and a DATA file) at the same absolute path: a shared filesystem.
Layer: pipeline.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.sweep_files import (CONFIG, POINTS, RESULTS, SWEEP_FORMAT, SWEEP_FORMAT_VERSION, ResultsFile,
                                            _rewrite_in_order, check_points_agree, is_drawn, read_config,
                                            read_results)
from tinyproto.pipeline.sweep_points import (TOPIC, Point, PointSettings, _one_line, check_arguments, parse_grid,
                                             record_order, run_point)

DEFAULT_BUDGETS = "0.5kB,1kB,2kB,4kB,8kB"
DEFAULT_TIMEOUT_S = 1800.0  # longest wait for the next point to finish (a point is compile + build + validate)
CONNECT_TIMEOUT_S = 30.0
POLL_S = 0.2


# ------------------------------------------------------------------------------------------------ the sweep directory


def data_fingerprint(dataset) -> str:
    import numpy as np

    digest = hashlib.sha256()
    X = np.ascontiguousarray(dataset.X, dtype=np.float64)
    digest.update(str(X.shape).encode())
    digest.update(X.tobytes())
    digest.update("\x00".join(map(str, np.asarray(dataset.y).tolist())).encode())
    return digest.hexdigest()


def _binding(dataset, o: SweepOptions, unknown_rate: float | None, held_out: list[str] | None) -> dict:
    """What must be the same for --resume to continue a sweep (the grid itself may grow): the data, where points
    are checked, and every option each point is compiled with (unknown_rate parsed, held_out the classes named)."""
    binding = {"dataset": dataset.name, "data_sha256": data_fingerprint(dataset), "device": o.device,
               "raw_check": o.raw_check if o.device == "sim" else None}
    # each option below is absent when not given, so sweeps written before it existed still resume
    if o.max_latency_ms is not None:
        binding["max_latency_ms"] = o.max_latency_ms
    if unknown_rate is not None:
        binding["unknown_rate"] = unknown_rate
    if o.clip_check:
        binding["clip_check"] = True
    if held_out is not None:
        binding["holdout_classes"] = held_out
    return binding


def _open_sweep_dir(out: Path, binding: dict, resume: bool) -> dict:
    """Check and prepare DIR (inside its lock): a new sweep, or --resume of the same one. Returns sweep.json."""
    from tinyproto.core.manifest import record_outputs, write_manifest, MANIFEST
    from tinyproto.core.safe_io import write_json

    config_path = out / CONFIG
    if (out / "model.json").exists():
        raise TinyprotoError(f"--out {out} is a model directory; give a new directory for the sweep")
    if config_path.exists():
        config = read_config(config_path)  # (its format version checked there, for report too)
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
    """A dask client on a LocalCluster of worker processes (default: one per CPU, at most one per point; training
    is Python and numpy, so threads would share one GIL) or on the running cluster at `scheduler`: the one way
    tinyproto opens a cluster (core/dask_cluster.py). Every wait there has a timeout."""
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        raise TinyprotoError("tinyproto sweep needs dask.distributed: pip install 'dask[distributed]'")
    from tinyproto.core.dask_cluster import DaskCluster, cpu_count

    n_workers = workers or max(1, min(n_points, cpu_count()))
    with DaskCluster(scheduler, n_workers, processes=True, timeout=CONNECT_TIMEOUT_S) as cluster:
        yield cluster.client, cluster.describe()


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


@dataclass(frozen=True)
class SweepOptions:
    """How `tinyproto sweep` runs: the grid, where each point runs and is checked, and how long it may take."""

    models: str = ",".join(families.names())  # comma lists, as on the command line
    budgets: str = DEFAULT_BUDGETS
    seeds: str = "0"
    boards: str = "uno"
    device: str = "sim"  # where each point is validated: sim, or none
    scheduler: str | None = None  # a running dask scheduler; None: a LocalCluster of `workers` processes
    workers: int | None = None
    resume: bool = False  # run only the points DIR/results.jsonl does not hold yet
    label: str | None = None  # DATA's label column
    raw_check: bool = False
    timeout: float = DEFAULT_TIMEOUT_S  # seconds without a finished point before the sweep gives up
    max_latency_ms: float | None = None  # every point compiled with this latency limit (`compile --max-latency`)
    unknown_rate: str | None = None  # every point compiled with this decline rate (`compile --unknown-rate`)
    clip_check: bool = False  # and with the clip check (`compile --clip-check`)
    holdout_classes: str | None = None  # these classes kept out of every point's training (`--holdout-classes`)

    def point_settings(self) -> PointSettings:
        return PointSettings(self.label, self.device, self.raw_check, self.max_latency_ms, self.unknown_rate,
                             self.clip_check, self.holdout_classes)


def sweep(data: str, out: Path, options: SweepOptions | None = None,
          progress: Callable[[SweepProgress], None] | None = None) -> SweepResult:
    """Run every point of the grid not yet in DIR/results.jsonl; see the module doc. A point that cannot meet
    options.max_latency_ms is a failed point."""
    from tinyproto.core.confidence import held_out_classes, parse_rate
    from tinyproto.core.datasets import BUILTIN, load_dataset
    from tinyproto.core.outdir import check_output_dir, locked

    from tinyproto.core.dask_cluster import refuse_in_a_worker_importing_main

    refuse_in_a_worker_importing_main("tinyproto's sweep()")  # before any file is touched
    o = options or SweepOptions()
    check_arguments(o.device, o.workers, o.scheduler, o.timeout, o.max_latency_ms)
    points = parse_grid(o.models, o.budgets, o.seeds, o.boards)
    out = check_output_dir(out)  # refuses a DIR holding files tinyproto did not write, before the data is read
    if o.device == "sim":  # every point is built there: a DIR PlatformIO cannot build in failed every point
        from tinyproto.device.build import check_platformio_path, platformio_available

        if platformio_available():
            check_platformio_path(out)
    dataset = load_dataset(data, label=o.label)  # a bad DATA is refused here, not once per point on the workers
    # workers may run in another directory: a file is passed by its absolute path, a built-in set by its name
    # (load_dataset reads a built-in name first, even where a file or directory of that name sits in the cwd)
    data_ref = data if data in BUILTIN else os.path.abspath(data)
    rate = None if o.unknown_rate is None else parse_rate(o.unknown_rate)  # refused now, not once per point
    if o.clip_check and rate is None:
        raise TinyprotoError("--clip-check is part of --unknown-rate: give both (e.g. --unknown-rate 5% --clip-check)")
    held_out = None  # refused now too: a class the data does not hold, or too few classes left to train on
    if o.holdout_classes is not None:
        held_out = [str(c) for c in held_out_classes(o.holdout_classes, dataset.y)]
    binding = _binding(dataset, o, rate, held_out)
    created = _create_dirs(out)
    started = time.perf_counter()
    began = threading.Event()  # set once points are handed to the workers: from then on DIR is resumable
    with locked(out, "sweep"):  # refused here (in use by another run): nothing of ours to take back
        try:
            return _sweep_locked(out, points, data_ref, o, binding, started, progress, began)
        except BaseException:
            if not began.is_set():  # refused before any point ran (no scheduler, no cluster, Ctrl-C)
                _remove_if_unused(out, created)
            raise


def _create_dirs(out: Path) -> list[Path]:
    """Create `out` and its missing parents; return those this call created (outermost first). Each is made
    with an atomic mkdir, so "created" means no other run had it: only those may be removed on failure."""
    missing = []
    for folder in [out, *out.parents]:
        if os.path.lexists(folder):
            break
        missing.append(folder)
    created = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:  # another run made it meanwhile: it is theirs
            continue
        except OSError as exc:
            raise TinyprotoError(f"cannot create --out {out}: {exc.strerror}") from None
        created.append(folder)
    return created


def _remove_if_unused(out: Path, created: list[Path]) -> None:
    """After a failure, with the lock still held: remove the --out this sweep created if no point was recorded
    in it (nothing worth resuming) and nothing but tinyproto's files is in it; then its parents we created."""
    from tinyproto.core.manifest import LOCK, foreign_entries

    if out not in created:
        return
    try:  # the lock in it is ours: this run made the directory and took it (a refused --resume left it behind)
        if read_results(out / RESULTS) or [entry for entry in foreign_entries(out) if entry != LOCK]:
            return
    except (TinyprotoError, OSError):
        return
    shutil.rmtree(out, ignore_errors=True)
    for folder in reversed(created[:-1]):
        try:
            os.rmdir(folder)  # only if still empty
        except OSError:
            break


def _sweep_locked(out: Path, points: list[Point], data_ref: str, options: SweepOptions, binding: dict,
                  started: float, progress: Callable[[SweepProgress], None] | None,
                  began: threading.Event) -> SweepResult:
    from tinyproto.core.manifest import record_outputs

    config = _open_sweep_dir(out, binding, options.resume)
    record_outputs(out, CONFIG, RESULTS, f".{RESULTS}.tmp", POINTS)  # also refuses a link planted at one of them
    (out / POINTS).mkdir(exist_ok=True)
    recorded = read_results(out / RESULTS, repair=True)
    check_points_agree(out, recorded, config)  # before a line is dropped or a point runs into a damaged directory
    previous = _forget_lost_points(out, recorded, {p.id for p in points})
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
            with open_cluster(options.scheduler, options.workers, len(todo)) as (client, cluster_info):
                began.set()
                _run_points(client, cluster_info, todo, data_ref, options, out, results, new_records, state, progress)
    finally:
        results.close()
        seconds = time.perf_counter() - started
        _record_run(out, config, cluster_info, len(todo), len(new_records), seconds)
    records = sorted(previous + new_records, key=record_order)
    have = {r["id"] for r in records}
    missing = [p.id for p in points if p.id not in have]
    if not missing:
        _rewrite_in_order(out / RESULTS, records)
    return SweepResult(out, records, len(new_records), state.skipped, seconds, cluster_info, not missing, missing)


def _forget_lost_points(out: Path, previous: list[dict], grid: set[str]) -> list[dict]:
    """The result lines a resumed sweep keeps: a compiled point of the grid whose model directory is gone (deleted
    by hand, or moved) runs again, so its line is dropped, and results.jsonl rewritten without it at once (a kill
    before the point's new line would otherwise leave two lines for it)."""
    lost = [r for r in previous if r["id"] in grid and is_drawn(r) and not (out / r["dir"] / "model.json").is_file()]
    if not lost:
        return previous
    kept = [r for r in previous if r not in lost]
    _rewrite_in_order(out / RESULTS, kept)
    return kept


def _run_points(client, cluster_info: dict, todo: list[Point], data: str, options: SweepOptions, out: Path,
                results: ResultsFile, new_records: list[dict], state: SweepProgress,
                progress: Callable[[SweepProgress], None] | None) -> None:
    from distributed import as_completed

    timeout = options.timeout

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
    settings = options.point_settings()
    for p in sorted(todo, key=lambda p: -p.budget_bytes):  # the longest points first: fewer idle workers at the end
        future = client.submit(run_point, asdict(p), data, str(out / POINTS / p.id), settings, token,
                               key=f"tinyproto-sweep-{p.id}-{token[:8]}", pure=False, priority=p.budget_bytes)
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
                state.last = (f"{p.id}: {record['status']}"
                              + (f" ({record['stage']})" if record["status"] != "ok" else ""))
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
    from tinyproto.core.safe_io import write_json

    runs = list(config.get("runs", []))
    runs.append({"cluster": cluster, "points_to_run": n_todo, "points_finished": n_ran,
                 "wall_seconds": round(seconds, 2)})
    config["runs"] = runs
    write_json(out / CONFIG, config)


# ------------------------------------------------------------------------------------------------ the command


