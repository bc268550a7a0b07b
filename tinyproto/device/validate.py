"""`tinyproto validate`: stream every held-out vector to the device and prove device == host reference.

Per vector the device returns its label, the full int32 score vector and the cycles of the inference;
each is compared with the numpy integer reference. Results are appended to `validation.jsonl` as they come
(a killed run keeps what it measured; `--resume` continues from there) and summarised in `validation.json`.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tinyproto.boards import Board, load_board
from tinyproto.device.costmodel import lower_bound_cycles, predict_cycles
from tinyproto.errors import TinyprotoError
from tinyproto.modeldir import ModelDir, load_model_dir, write_json

PROGRESS_EVERY = 25  # vectors between rewrites of validation.json during a run
MAX_MISMATCHES_REPORTED = 5


@dataclass(frozen=True)
class BuildInfo:
    elf: Path
    hex: Path
    flash_bytes: int
    sram_static_bytes: int
    tool: str


def load_build_info(model_dir: ModelDir) -> BuildInfo:
    path = model_dir.path / "build.json"
    if not path.is_file():
        raise TinyprotoError(f"{model_dir.path} has no firmware yet; run `tinyproto build {model_dir.path}` first")
    raw = json.loads(path.read_text())
    elf = model_dir.path / raw["elf"]
    if not elf.is_file():
        raise TinyprotoError(f"firmware {elf} is missing; run `tinyproto build {model_dir.path}` again")
    return BuildInfo(elf, model_dir.path / raw["hex"], raw["flash_bytes"], raw["sram_static_bytes"], raw["tool"])


def _read_done(journal: Path) -> dict[int, dict]:
    done: dict[int, dict] = {}
    if journal.is_file():
        for line in journal.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
            done[row["i"]] = row
    return done


def _compare(i: int, prediction, vectors) -> dict:
    scores = [int(s) for s in prediction.scores]
    return {
        "i": i,
        "label": int(prediction.label),
        "cycles": int(prediction.cycles),
        "label_ok": int(prediction.label) == int(vectors.labels[i]),
        "scores_ok": scores == [int(s) for s in vectors.scores[i]],
        "scores": scores,
    }


def _raw_input_check(client, vectors, progress: Callable[[int], None] | None) -> dict:
    """The on-device input stage: raw float32 features in, compare its int8 vector and label with the host's."""
    diffs, labels_changed = [], 0
    for i in range(len(vectors.labels)):
        result = client.predict_raw(vectors.X_raw[i])
        diffs.append(np.abs(np.asarray(result.x, dtype=np.int16) - vectors.xq[i].astype(np.int16)))
        labels_changed += int(result.label) != int(vectors.labels[i])
        if progress:
            progress(1)
    diff = np.concatenate(diffs) if diffs else np.zeros(0)
    return {
        "n_vectors": len(vectors.labels),
        "n_inputs": int(diff.size),
        "inputs_differing": int(np.count_nonzero(diff > 0)),
        "inputs_differing_by_more_than_1_lsb": int(np.count_nonzero(diff > 1)),
        "labels_changed": labels_changed,
    }


def summarise(model_dir: ModelDir, model, vectors, board: Board, build: BuildInfo, target: str,
              rows: dict[int, dict], stack_peak: int | None, markers: dict | None, raw: dict | None) -> dict:
    """validation.json from the rows measured so far (`model` and `vectors` as validate() loaded them)."""
    n_total = len(vectors.labels)
    ordered = [rows[i] for i in sorted(rows)]
    cycles = np.array([r["cycles"] for r in ordered], dtype=np.float64)
    n = len(ordered)
    device_labels = np.array([r["label"] for r in ordered], dtype=np.int64)
    truth = vectors.y[[r["i"] for r in ordered]]
    host_labels = vectors.labels[[r["i"] for r in ordered]]
    cycles_mean = float(cycles.mean()) if n else 0.0
    seconds = cycles_mean / board.f_cpu_hz
    predicted = predict_cycles(model)
    bound = lower_bound_cycles(model)
    sram_used = build.sram_static_bytes + (stack_peak or 0)
    summary = {
        "board": board.name,
        "target": target,
        "complete": n == n_total,
        "n_vectors": n,
        "label_agreement": float(np.mean([r["label_ok"] for r in ordered])) if n else 0.0,
        "score_agreement": float(np.mean([r["scores_ok"] for r in ordered])) if n else 0.0,
        "device_accuracy": float(np.mean(device_labels == truth)) if n else 0.0,
        "host_accuracy": float(np.mean(host_labels == truth)) if n else 0.0,
        "cycles_mean": cycles_mean,
        "cycles_max": int(cycles.max()) if n else 0,
        "cycles_min": int(cycles.min()) if n else 0,
        "latency_ms_mean": 1000.0 * seconds,
        "energy_mj_mcu": board.energy_mj(seconds, board.mcu_active_current_ma),
        "energy_mj_board": board.energy_mj(seconds, board.board_active_current_ma),
        "energy_note": "model: V x I_active x latency with datasheet / board figures (boards/%s.json), not a meter" % board.name,
        "predicted_cycles": predicted["total"],
        "predicted_error": (predicted["total"] - cycles_mean) / cycles_mean if n else None,
        "lower_bound_cycles": bound,
        "measured_over_bound": cycles_mean / bound if n and bound else None,
        "flash_bytes": build.flash_bytes,
        "flash_available_bytes": board.flash_bytes_for_sketch,
        "sram_static_bytes": build.sram_static_bytes,
        "stack_peak_bytes": stack_peak,
        "sram_margin_bytes": board.sram_bytes - sram_used if stack_peak is not None else None,
        "model_bytes": model_dir.report.get("model_bytes"),
        "budget_bytes": model_dir.report.get("budget_bytes"),
        "model_hash": model_dir.meta["model_hash"],
        "mismatches": [
            {"vector": r["i"], "device_label": r["label"], "host_label": int(vectors.labels[r["i"]]),
             "device_scores": r["scores"], "host_scores": [int(s) for s in vectors.scores[r["i"]]]}
            for r in ordered if not (r["label_ok"] and r["scores_ok"])
        ][:MAX_MISMATCHES_REPORTED],
    }
    if markers is not None:
        summary["simulator_marker_cycles"] = markers
    if raw is not None:
        summary["raw_input"] = raw
    return summary


def _marker_cycles(markers: list[tuple[int, int]]) -> list[int]:
    """Cycles between each GPIOR0=1 and the following GPIOR0=2 write."""
    spans, start = [], None
    for value, cycle in markers:
        if value == 1:
            start = cycle
        elif value == 2 and start is not None:
            spans.append(cycle - start)
            start = None
    return spans


def validate(
    path: Path,
    port: str | None = None,
    resume: bool = False,
    raw_check: bool = True,
    progress_factory: Callable[[str, int], Callable[[int], None]] | None = None,
) -> dict:
    """Validate the model directory on `port` (a real board) or, when port is None, on the simulated Uno."""
    from tinyproto.device.protocol import check_model, open_device
    from tinyproto.device.sim import SimulatedUno

    model_dir = load_model_dir(path)
    board = load_board(model_dir.meta.get("board", "uno"))
    build = load_build_info(model_dir)
    vectors = model_dir.vectors()
    model = model_dir.int_model()
    journal = model_dir.path / "validation.jsonl"
    rows = _read_done(journal) if resume else {}
    if not resume and journal.exists():
        journal.unlink()
    n_total = len(vectors.labels)
    target = port or "sim"

    with ExitStack() as stack:
        sim = None
        if port is None:
            sim = stack.enter_context(SimulatedUno(build.elf))
            port_url = sim.port
        else:
            port_url = port
        client = stack.enter_context(open_device(port_url, baud=board.serial_baud))
        check_model(client.hello(), model_dir.model_hash, model.n_features, model.n_classes)
        todo = [i for i in range(n_total) if i not in rows]
        spans_before = len(_marker_cycles(sim.markers())) if sim is not None else 0
        tick = progress_factory("vectors", len(todo)) if progress_factory else None
        with journal.open("a") as log:
            for count, i in enumerate(todo, start=1):
                row = _compare(i, client.predict(vectors.xq[i]), vectors)
                rows[i] = row
                log.write(json.dumps(row) + "\n")
                log.flush()
                if tick:
                    tick(1)
                if count % PROGRESS_EVERY == 0:
                    write_json(model_dir.path / "validation.json",
                               summarise(model_dir, model, vectors, board, build, target, rows, None, None, None))
        marker_check = None
        if sim is not None:
            spans = _marker_cycles(sim.markers())[spans_before:]
            marker_check = _marker_summary(spans, [rows[i]["cycles"] for i in todo])
        raw = None
        if raw_check:
            raw_tick = progress_factory("raw inputs", n_total) if progress_factory else None
            raw = _raw_input_check(client, vectors, raw_tick)
        stack_peak = client.stats().stack_peak

    summary = summarise(model_dir, model, vectors, board, build, target, rows, stack_peak, marker_check, raw)
    write_json(model_dir.path / "validation.json", summary)
    return summary


def _marker_summary(spans: list[int], device_cycles: list[int]) -> dict:
    """Cross-check the device's Timer1 cycles with the simulator's GPIOR0 marker spans, vector by vector."""
    n = min(len(spans), len(device_cycles))
    diffs = [spans[k] - device_cycles[k] for k in range(n)]
    return {
        "n_compared": n,
        "marker_cycles_mean": float(np.mean(spans[:n])) if n else None,
        "marker_minus_timer1_min": int(min(diffs)) if diffs else None,
        "marker_minus_timer1_max": int(max(diffs)) if diffs else None,
    }
