"""`tinyproto validate`: stream every held-out vector to the device and prove device == host reference.

Per vector the device returns its label, the full int32 score vector and the cycles of the inference;
each is compared with the numpy integer reference. What is validated is bound together before the first
vector is sent: model.json must hash to its recorded model hash, the test vectors must be the ones compile
wrote (sha256) and agree with the host reference recomputed from model.json, the firmware must be the one
build recorded (sha256) and built from this model, and the device must answer with this model's hash.

Results are appended (fsync'ed) to `validation.jsonl`, whose first line records that binding, so `--resume`
continues only a run of the very same model, vectors, firmware and target. Every check validation makes
(scores, labels, completeness, the on-device input stage, the simulator's cycle markers, SRAM, and the
--max-latency the model was compiled with, against the measured mean) is listed in
validation.json under `checks`, and any failed one makes the command exit non-zero.
Layer: pipeline.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinyproto.core.boards import Board, load_board
from tinyproto.core.confidence import UNKNOWN_LABEL, auroc, judged_figures
from tinyproto.core.cost import lower_bound_cycles
from tinyproto.families import predict_cycles
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.measured import PLAUSIBLE_FACTOR, cycle_problem, plausible_cycles, ratio, stack_problem
from tinyproto.core.manifest import record_outputs
from tinyproto.core.modeldir import ModelDir, load_model_dir
from tinyproto.core.safe_io import Unreadable, file_sha256, read_json, read_text_file, resolved, write_json
from tinyproto.core.outdir import locked
from tinyproto.pipeline.journal import JOURNAL, JOURNAL_NEW, Journal
from tinyproto import families

PROGRESS_EVERY = 25  # vectors between rewrites of validation.json during a run
MAX_MISMATCHES_REPORTED = 5
SUMMARY = "validation.json"
_HEADER_HASH = re.compile(r"#define\s+TP_MODEL_HASH\s+0x([0-9A-Fa-f]{8})UL")


@dataclass(frozen=True)
class BuildInfo:
    elf: Path
    hex: Path
    flash_bytes: int
    sram_static_bytes: int
    tool: str
    firmware_sha256: str | None
    model_hash: str | None
    serial_baud: int | None = None  # the rate built into the firmware (None: a build.json from before it was kept)
    rx_ring: int | None = None  # its receive ring in bytes (None: a build.json from before the ring was sized)


def _inside(model_dir: ModelDir, relative: object, what: str) -> Path:
    again = f"run `tinyproto build {model_dir.path}` again"
    if not isinstance(relative, str) or os.path.isabs(relative) or "\0" in relative or not relative.strip():
        raise TinyprotoError(f"{model_dir.path / 'build.json'} is damaged: {what} {str(relative)[:40]!r}; {again}")
    root = model_dir.path.resolve()
    path = resolved(model_dir.path / relative, f"build.json's {what}", again)
    if not path.is_relative_to(root):
        named = Path(os.path.normpath(root / relative))
        if named.is_relative_to(root):  # build.json names a file inside; that file is a link out of the directory
            raise TinyprotoError(f"firmware {model_dir.path / relative} leads out of the model directory through a "
                                 f"symbolic link: not the file `tinyproto build` wrote; {again}")
        raise TinyprotoError(f"{model_dir.path / 'build.json'} points {what} outside the model directory; {again}")
    return path


def load_build_info(model_dir: ModelDir) -> BuildInfo:
    path = model_dir.path / "build.json"
    if not os.path.lexists(path):
        raise TinyprotoError(f"{model_dir.path} has no firmware yet; run `tinyproto build {model_dir.path}` first")
    raw = read_json(path, "the build record")
    model_dir.require_report()
    elf = _inside(model_dir, raw.get("elf"), "elf")
    hex_path = _inside(model_dir, raw.get("hex"), "hex")
    sizes = [raw.get(k) for k in ("flash_bytes", "sram_static_bytes")]
    if not all(_is_count(v) for v in sizes):
        raise TinyprotoError(f"{path} is damaged: flash_bytes / sram_static_bytes are not byte counts")
    if not elf.is_file():
        raise TinyprotoError(f"firmware {elf} is missing; run `tinyproto build {model_dir.path}` again")
    problem = build_record_problem(model_dir, raw)
    if problem:
        raise TinyprotoError(f"{path} does not match the model directory (damaged, or a file changed since the "
                             f"build): {problem}; run `tinyproto build {model_dir.path}` again")
    return BuildInfo(elf, hex_path, sizes[0], sizes[1], str(raw.get("tool", "?")), raw.get("firmware_sha256"),
                     raw.get("model_hash"), raw.get("serial_baud"), raw.get("rx_ring_bytes"))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 24


def build_record_problem(model_dir: ModelDir, raw: dict) -> str | None:
    """What in build.json disagrees with the files it was built from, or None. Every value build writes is
    checked against its source: the environment and the serial rate against platformio.ini, the receive ring
    against include/tinyproto_sizes.h, the board's memory against its board file, the model's bytes against
    report.json, and the section sizes against each other and the board. (A record of an older tinyproto lacks
    serial_baud, rx_ring_bytes or the section sizes: what is missing is not compared.)"""
    from tinyproto.device.project import parser_of, project_baud, project_rx_ring

    if not all(_is_count(raw.get(key)) for key in ("flash_bytes", "sram_static_bytes")):
        return "flash_bytes / sram_static_bytes are not byte counts"
    env = raw.get("env")
    known = [name[4:] for name in parser_of(model_dir.path).sections() if name.startswith("env:")]
    if not isinstance(env, str) or env not in known:
        return f"env {str(env)[:40]!r} is none of platformio.ini's environments ({', '.join(known) or 'none'})"
    if not isinstance(raw.get("tool"), str) or raw["tool"] not in ("platformio", "avr-gcc"):
        return f"tool {str(raw.get('tool'))[:40]!r} is not platformio or avr-gcc"
    board = load_board(model_dir.board)
    expected = {"flash_available_bytes": (board.flash_bytes_for_sketch, f"the {board.name} board file's"),
                "sram_bytes": (board.sram_bytes, f"the {board.name} board file's"),
                "model_bytes": (model_dir.report.get("model_bytes"), "report.json's"),
                "serial_baud": (project_baud(model_dir.path, env) or board.serial_baud,
                                f"the rate platformio.ini's {env} builds in"),
                "rx_ring_bytes": (project_rx_ring(model_dir.path), "include/tinyproto_sizes.h's TP_RX_RING")}
    for key, (value, source) in expected.items():
        if key in raw and not (_is_count(raw[key]) and raw[key] == value):
            return f"{key} is {json.dumps(raw[key])[:40]}, not {source} {value}"
    parts = {key: raw.get(key) for key in ("text_bytes", "data_bytes", "bss_bytes")}
    if all(key in raw for key in parts):
        if not all(_is_count(v) for v in parts.values()):
            return "text_bytes / data_bytes / bss_bytes are not byte counts"
        if raw["flash_bytes"] != parts["text_bytes"] + parts["data_bytes"]:
            return f"flash_bytes {raw['flash_bytes']} is not text_bytes + data_bytes"
        if raw["sram_static_bytes"] != parts["data_bytes"] + parts["bss_bytes"]:
            return f"sram_static_bytes {raw['sram_static_bytes']} is not data_bytes + bss_bytes"
    if raw["flash_bytes"] > board.flash_bytes_for_sketch or raw["sram_static_bytes"] >= board.sram_bytes:
        return (f"its sizes ({raw['flash_bytes']} B of flash, {raw['sram_static_bytes']} B of SRAM) exceed the "
                f"{board.title}")
    return None


def header_model_hash(model_dir: Path) -> str | None:
    """TP_MODEL_HASH of the generated header now on disk (what the next build compiles in)."""
    header = Path(model_dir) / "include" / "tinyproto_model.h"
    try:
        match = _HEADER_HASH.search(read_text_file(header, "the generated header", limit=1 << 24))
    except Unreadable:
        raise  # there but unreadable: said so, not "no longer matches the built firmware"
    except TinyprotoError:
        return None  # missing, a FIFO or a device in its place: no hash, so it matches no firmware
    return f"0x{match.group(1).upper()}" if match else None


def check_firmware(model_dir: ModelDir, build: BuildInfo) -> None:
    """The ELF must be the one `build` made, from this model.json, and the sources not changed since."""
    directory = model_dir.path
    if build.firmware_sha256 is None or build.model_hash is None:
        raise TinyprotoError(f"{directory / 'build.json'} predates firmware binding; run `tinyproto build {directory}`")
    if file_sha256(build.elf) != build.firmware_sha256:
        raise TinyprotoError(f"firmware {build.elf} changed after `tinyproto build`; build it again")
    if build.model_hash != model_dir.meta["model_hash"]:
        raise TinyprotoError(f"the firmware was built for model {build.model_hash}, but model.json holds "
                             f"{model_dir.meta['model_hash']}; run `tinyproto build {directory}` again")
    if header_model_hash(directory) != build.model_hash:
        raise TinyprotoError(f"include/tinyproto_model.h no longer matches the built firmware; run "
                             f"`tinyproto build {directory}` again")


def checked_vectors(model_dir: ModelDir, model):
    """test_vectors.npz, refused unless it is what compile wrote and agrees with the host reference."""
    path = model_dir.path / "test_vectors.npz"
    vectors = model_dir.vectors()  # (refused unless it is the file compile wrote)
    vectors.check_shapes(model.n_features, model.n_classes, path)
    if not np.array_equal(model.input_stage.quantize(vectors.X_raw), vectors.xq):
        raise TinyprotoError(f"{path}: its int8 inputs are not the input stage of model.json applied to its raw inputs")
    scores = model.scores(vectors.xq.astype(np.int8))
    if not (np.array_equal(scores, vectors.scores) and np.array_equal(model.labels(scores), vectors.labels)):
        raise TinyprotoError(f"{path}: its reference scores are not what model.json computes; run compile again")
    held_out = vectors.y == UNKNOWN_LABEL  # a class held out of training (compile --holdout-classes)
    if held_out.all() or vectors.y[~held_out].min() < 0 or vectors.y[~held_out].max() >= model.n_classes:
        raise TinyprotoError(f"{path}: true labels outside the model's {model.n_classes} classes")
    confidence, decided = families.judge(model, scores, vectors.labels, vectors.xq)
    if not (np.array_equal(confidence, vectors.confidence) and np.array_equal(decided, vectors.decided)):
        raise TinyprotoError(f"{path}: its reference confidence and decisions are not what model.json computes; "
                             "run compile again")
    return vectors


def binding_of(model_dir: ModelDir, build: BuildInfo, target: str) -> dict:
    return {
        "model_hash": model_dir.meta["model_hash"],
        "vectors_sha256": file_sha256(model_dir.path / "test_vectors.npz"),
        "firmware_sha256": build.firmware_sha256,
        "target": target,
    }


# ------------------------------------------------------------------------------------------------ checks


def _row_ok(row: dict, vectors) -> tuple[bool, bool, bool, bool]:
    """(label equal, scores equal, confidence equal, unknown decision equal), always recomputed from the device's
    values, never read from a file. The decision is the label tp_judge answered: the class, or 255 (unknown)."""
    i = row["i"]
    return (row["label"] == int(vectors.labels[i]), row["scores"] == [int(s) for s in vectors.scores[i]],
            row.get("confidence") == int(vectors.confidence[i]), row.get("decided") == int(vectors.decided[i]))


def _raw_input_check(client, vectors, progress: Callable[[int], None] | None) -> dict:
    """The on-device input stage: raw float32 features in, compare its int8 vector, score vector and label with
    the host's."""
    diffs, labels_changed, scores_changed, n = [], 0, 0, 0
    for i, result in enumerate(client.predict_raw_many(vectors.X_raw)):
        n += 1  # the answers counted, not the vectors asked for: the check wants one for every vector
        diffs.append(np.abs(np.asarray(result.x, dtype=np.int16) - vectors.xq[i].astype(np.int16)))
        labels_changed += (int(result.label) != int(vectors.labels[i]) or int(result.decided) != int(vectors.decided[i])
                           or int(result.confidence) != int(vectors.confidence[i]))
        scores_changed += not np.array_equal(result.scores, vectors.scores[i])
        if progress:
            progress(1)
    diff = np.concatenate(diffs) if diffs else np.zeros(0)
    return {
        "n_vectors": n,
        "n_inputs": int(diff.size),
        "inputs_per_vector": int(vectors.xq.shape[1]),  # the columns the model reads (InputStage.kept), sent each
        "inputs_differing": int(np.count_nonzero(diff > 0)),
        "inputs_differing_by_more_than_1_lsb": int(np.count_nonzero(diff > 1)),
        "labels_changed": labels_changed,
        "score_vectors_changed": scores_changed,
    }


def inputs_counted(raw: dict) -> str:
    """What the raw-input check's count of int8 inputs counts: every vector's inputs the model reads, which may be
    fewer than the data's features (a column no weight reads is never sent): "0 of 27000 int8 inputs" for digits'
    450 test vectors of 64 features said nothing of the 60 the model reads."""
    per, width = raw.get("inputs_per_vector"), raw.get("data_features")
    if not isinstance(per, int):  # a summary written before these were recorded
        return ""
    if isinstance(width, int) and width != per:
        return f" ({raw['n_vectors']} vectors x {per}: the model reads {per} of the data's {width} features)"
    return f" ({raw['n_vectors']} vectors x {per} features)"


def _checks(n: int, n_total: int, n_scores_ok: int, n_labels_ok: int, raw: dict | None, raw_skipped: bool,
            markers: dict | None, sram_margin: int | None, finished: bool, latency: dict | None = None,
            cycles_problem: str | None = None, n_confidence_ok: int = 0, n_decided_ok: int = 0,
            stats_problem: str | None = None, cycles_range: str = "1..2^32-2") -> dict:
    """Every check validation makes, each {ok, detail}; `ok` None means skipped on the user's request."""
    checks = {
        "complete": {"ok": finished and n == n_total, "detail": f"{n} of {n_total} vectors measured"
                     + ("" if finished else ", run interrupted")},
        "scores": {"ok": n > 0 and n_scores_ok == n, "detail": f"{n_scores_ok} of {n} score vectors identical"},
        "labels": {"ok": n > 0 and n_labels_ok == n, "detail": f"{n_labels_ok} of {n} labels identical"},
        "confidence": {"ok": n > 0 and n_confidence_ok == n,
                       "detail": f"{n_confidence_ok} of {n} confidence bytes identical"},
        "unknown": {"ok": n > 0 and n_decided_ok == n,
                    "detail": f"{n_decided_ok} of {n} answers (class or unknown) identical"},
    }
    checks["cycles"] = {"ok": n > 0 and cycles_problem is None,
                        "detail": cycles_problem or (f"every one of {n} inferences reported a cycle count in "
                                                     f"{cycles_range}" if n else "nothing measured")}
    if raw_skipped:
        checks["raw_input"] = {"ok": None, "detail": "on request (--no-raw)"}
    elif raw is None:
        checks["raw_input"] = {"ok": False, "detail": "not run"}
    else:
        scores_changed = raw.get("score_vectors_changed", 0)
        checks["raw_input"] = {"ok": raw["inputs_differing"] == 0 and raw["labels_changed"] == 0
                               and scores_changed == 0 and raw["n_vectors"] == n_total,
                               "detail": f"{raw['inputs_differing']} of {raw['n_inputs']} int8 inputs"
                                         f"{inputs_counted(raw)}, "
                                         f"{scores_changed} score vectors and {raw['labels_changed']} labels (or "
                                         "their confidence or unknown decision) differ "
                                         "through the on-device input stage"}
    if markers is not None:
        checks["cycle_markers"] = {"ok": markers_agree(markers), "detail": markers_detail(markers)}
    if stats_problem is not None:
        checks["sram"] = {"ok": False, "detail": stats_problem}
    else:
        checks["sram"] = {"ok": sram_margin is not None and sram_margin >= 0,
                          "detail": "stack peak not measured" if sram_margin is None
                          else f"margin {sram_margin} B (static + measured stack peak "
                               f"{'within' if sram_margin >= 0 else 'over'} the board's SRAM)"}
    if latency is not None:
        checks["latency_limit"] = latency
    return checks


def latency_limit_check(report: dict, cycles, f_cpu_hz: int, cycles_problem: str | None = None) -> dict | None:
    """The model was compiled with --max-latency: the measured mean latency must keep it (the solver promised it
    from the cost model's prediction, with headroom; this is where the device answers). None without a limit."""
    limit = report.get("max_latency_ms")
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < float("inf"):
        return {"ok": False, "detail": f"report.json's max_latency_ms is not a positive number: {limit!r}"}
    if len(cycles) == 0:
        return {"ok": False, "detail": f"--max-latency {limit:g} ms: nothing measured"}
    problem = cycles_problem or cycle_problem(cycles)
    if problem:
        return {"ok": False, "detail": f"--max-latency {limit:g} ms: not measured ({problem})"}
    mean_ms, max_ms = 1000.0 * ratio(float(np.mean(cycles)), f_cpu_hz), 1000.0 * ratio(float(np.max(cycles)), f_cpu_hz)
    return {"ok": mean_ms <= limit,
            "detail": f"mean {mean_ms:.3f} ms {'within' if mean_ms <= limit else 'over'} --max-latency {limit:g} ms "
                      f"(slowest vector {max_ms:.3f} ms)"}


@dataclass(frozen=True)
class ValidationSubject:
    """What a validation checks: the model directory, its model and vectors as validate() loaded them, the board,
    the firmware it runs and where (a port, or "sim")."""

    model_dir: ModelDir
    model: Any
    vectors: Any
    board: Board
    build: BuildInfo
    target: str


@dataclass
class Measured:
    """What a validation run has measured so far: a row per vector index, and the run-wide figures."""

    rows: dict[int, dict]
    stack_peak: int | None = None
    stats_problem: str | None = None  # what is wrong with the device's STATS figures (then stack_peak is None)
    markers: dict | None = None  # the simulator's GPIOR0 cross-check
    raw: dict | None = None  # the raw-input check
    line: dict | None = None  # the serial line's figures (LineMeter.summary)
    raw_skipped: bool = False
    finished: bool = False


def held_out_figures(ordered: list[dict], known: np.ndarray, model, xq: np.ndarray) -> dict:
    """The device's answers on the rows of classes held out of training: the novelty score's AUROC (held-out
    against known rows, from the device's own scores; a range check's signal, which the device does not send, from
    the rows' int8 inputs) and the share it answered unknown."""
    scores = np.array([r["scores"] for r in ordered], dtype=np.int64)
    labels = np.array([r["label"] for r in ordered], dtype=np.int64)
    score = families.novelty_score(model, scores, labels, np.asarray(xq)[[r["i"] for r in ordered]])
    decided = np.array([r.get("decided", -1) for r in ordered])
    return {"rows": int((~known).sum()), "auroc": auroc(score[~known], score[known]),
            "declined": float(np.mean(decided[~known] == UNKNOWN_LABEL))}


def summarise(subject: ValidationSubject, measured: Measured) -> dict:
    """validation.json from the rows measured so far."""
    model_dir, model, vectors, board, build = (subject.model_dir, subject.model, subject.vectors, subject.board,
                                               subject.build)
    rows, stack_peak, markers, raw = measured.rows, measured.stack_peak, measured.markers, measured.raw
    n_total = len(vectors.labels)
    ordered = [rows[i] for i in sorted(rows)]
    oks = [_row_ok(r, vectors) for r in ordered]
    cycles = np.array([r["cycles"] for r in ordered], dtype=np.float64)
    n = len(ordered)
    device_labels = np.array([r["label"] for r in ordered], dtype=np.int64)
    truth = vectors.y[[r["i"] for r in ordered]]
    host_labels = vectors.labels[[r["i"] for r in ordered]]
    predicted = predict_cycles(model)
    bound = lower_bound_cycles(model)
    plausible = plausible_cycles(bound, predicted["total"])
    basis = (f" (within {PLAUSIBLE_FACTOR}x of the cost model's {predicted['total']} cycles, above the MAC lower "
             f"bound {bound})")
    cycles_range = "1..2^32-2" if plausible is None else f"{plausible[0]}..{plausible[1]}{basis}"
    cycles_problem = cycle_problem(cycles.tolist(), plausible, basis)
    cycles_mean = float(cycles.mean()) if n else 0.0
    trusted_mean = cycles_mean if n and cycles_problem is None else None  # figures derived from cycles need it
    seconds = ratio(trusted_mean, board.f_cpu_hz)
    sram_margin = board.sram_bytes - (build.sram_static_bytes + stack_peak) if stack_peak is not None else None
    n_labels_ok, n_scores_ok = sum(ok[0] for ok in oks), sum(ok[1] for ok in oks)
    if raw is not None:  # the data's width beside the inputs the model reads (the check's detail says both)
        raw = {**raw, "data_features": int(model.input_stage.n_inputs or model.n_features)}
    checks = _checks(n, n_total, n_scores_ok, n_labels_ok, raw, measured.raw_skipped, markers, sram_margin,
                     measured.finished, latency_limit_check(model_dir.report, cycles, board.f_cpu_hz, cycles_problem),
                     cycles_problem, sum(ok[2] for ok in oks), sum(ok[3] for ok in oks), measured.stats_problem,
                     cycles_range)
    known = truth != UNKNOWN_LABEL
    summary = {
        "board": board.name,
        "target": subject.target,
        "passed": all(c["ok"] is not False for c in checks.values()),
        "checks": checks,
        "complete": checks["complete"]["ok"],
        "n_vectors": n,
        "label_agreement": n_labels_ok / n if n else 0.0,
        "score_agreement": n_scores_ok / n if n else 0.0,
        "device_accuracy": float(np.mean(device_labels[known] == truth[known])) if known.any() else 0.0,
        "host_accuracy": float(np.mean(host_labels[known] == truth[known])) if known.any() else 0.0,
        # the device's own answers: coverage, accuracy on accepted rows, calibration error (known rows)
        "confidence": judged_figures([r.get("confidence", 0) for r in ordered],
                                     [r.get("decided", r["label"]) for r in ordered], device_labels, truth,
                                     known) if known.any() and families.calibrated(model) else None,
        "cycles_mean": cycles_mean,
        "cycles_max": int(cycles.max()) if n else 0,
        "cycles_min": int(cycles.min()) if n else 0,
        "latency_ms_mean": 1000.0 * seconds if seconds is not None else None,
        "f_cpu_hz": board.f_cpu_hz,
        "sram_bytes": board.sram_bytes,
        "energy_mj_mcu": board.energy_mj(seconds, board.mcu_active_current_ma) if seconds is not None else None,
        "energy_mj_board": board.energy_mj(seconds, board.board_active_current_ma) if seconds is not None else None,
        "energy_note": ("model: V x I_active x latency with datasheet / board figures (boards/%s.json), "
                        "not a meter" % board.name),
        "predicted_cycles": predicted["total"],
        "predicted_error": ratio(predicted["total"] - trusted_mean, trusted_mean) if trusted_mean else None,
        "lower_bound_cycles": bound,
        "measured_over_bound": ratio(trusted_mean, bound),
        "flash_bytes": build.flash_bytes,
        "flash_available_bytes": board.flash_bytes_for_sketch,
        "sram_static_bytes": build.sram_static_bytes,
        "stack_peak_bytes": stack_peak,
        "sram_margin_bytes": sram_margin,
        "model_bytes": model_dir.report.get("model_bytes"),
        "budget_bytes": model_dir.report.get("budget_bytes"),
        "model_hash": model_dir.meta["model_hash"],
        "mismatches": [
            {"vector": r["i"], "device_label": r["label"], "host_label": int(vectors.labels[r["i"]]),
             "device_scores": r["scores"], "host_scores": [int(s) for s in vectors.scores[r["i"]]],
             "device_confidence": r.get("confidence"), "host_confidence": int(vectors.confidence[r["i"]]),
             "device_decided": r.get("decided"), "host_decided": int(vectors.decided[r["i"]])}
            for r, ok in zip(ordered, oks) if not all(ok)
        ][:MAX_MISMATCHES_REPORTED],
    }
    if summary["confidence"] is not None and not known.all():
        summary["confidence"]["held_out"] = held_out_figures(ordered, known, model, vectors.xq)
    if markers is not None:
        summary["simulator_marker_cycles"] = markers
    if raw is not None:
        summary["raw_input"] = raw
    if measured.line is not None:
        summary["line"] = measured.line
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


def _calibration_span(markers: list[tuple[int, int]]) -> int | None:
    """Cycles between the start-up calibration's GPIOR0 = 17 and 18 (the empty call whose Timer1 count the
    firmware subtracts from every figure), or None when the run's markers do not include it."""
    start = None
    for value, cycle in markers:
        if value == CALIBRATE_MARK:
            start = cycle
        elif value == CALIBRATE_MARK + 1 and start is not None:
            return cycle - start
    return None


CALIBRATE_MARK = 17  # TP_MARK_CALIBRATE in firmware/tp_app.h


def _matched_spans(spans: list[int], device_cycles: list[int], per_vector: int, expected: int | None,
                   may_pass_over: int) -> tuple[list[int | None], list[int], int]:
    """Each vector's marker spans, in order: the `per_vector` consecutive spans (a streaming family's chunks) from
    where the last vector's ended whose sum minus the vector's Timer1 figure is `expected`. Up to `may_pass_over`
    spans may be passed over on the way: timed calls the chip ran for a request the host sent again, because
    the first answer came too late (a busy host) and was dropped; without such requests none may be. Returns
    each vector's span sum - Timer1 (None past the last span; the spans where a match was due when none was
    found), the matched vectors' indices and the spans passed over."""
    diffs: list[int | None] = []
    matched: list[int] = []
    j = passed_over = 0
    for k, cycles in enumerate(device_cycles):
        group = None
        if expected is not None:
            for skip in range(may_pass_over - passed_over + 1):
                if j + skip + per_vector > len(spans):
                    break
                if sum(spans[j + skip : j + skip + per_vector]) - cycles == expected:
                    group = skip
                    break
        if group is not None:
            passed_over += group
            j += group
            matched.append(k)
        elif j + per_vector > len(spans):
            diffs.append(None)
            continue
        diffs.append(sum(spans[j : j + per_vector]) - cycles)
        j += per_vector
    return diffs, matched, passed_over


def _marker_summary(spans: list[int], device_cycles: list[int], calibration_span: int | None,
                    timed_calls: int, first_vector: list[int], requests_sent_again: int = 0) -> dict:
    """Cross-check the device's Timer1 cycles with the simulator's GPIOR0 marker spans, vector by vector.

    Exact, whatever the inference's length: Timer1 runs from before the start marker to after the end marker
    (overflows counted, interrupts off from before the end marker to the read), and the firmware subtracts the
    Timer1 count of an empty call through the same code, so for each timed call span - Timer1 is exactly the
    empty call's marker span (its calibration span). A vector timed in `timed_calls` calls (a streaming family's
    chunks) sums that many spans, so its difference is timed_calls x the calibration span. Each request the
    host sent again (`requests_sent_again`) may have run the model's code again: up to timed_calls spans each
    are passed over (see _matched_spans)."""
    expected = None if calibration_span is None else timed_calls * calibration_span
    diffs, matched, passed_over = _matched_spans(spans, device_cycles, timed_calls, expected,
                                                 requests_sent_again * timed_calls)
    compared = [k for k, diff in enumerate(diffs) if diff is not None]
    exact = set(matched)
    differing = [k for k in compared if k not in exact]
    first = differing[0] if differing else None
    first_span = None if first is None else diffs[first] + device_cycles[first]
    values = [diffs[k] for k in compared]
    return {
        "n_compared": len(compared),
        "n_expected": len(device_cycles),
        "expected_difference": expected,
        "n_exact": len(matched),
        "requests_sent_again": requests_sent_again,
        "spans_passed_over": passed_over,
        "marker_cycles_mean": float(np.mean([diffs[k] + device_cycles[k] for k in compared])) if compared else None,
        "marker_minus_timer1_min": int(min(values)) if values else None,
        "marker_minus_timer1_max": int(max(values)) if values else None,
        "first_differing": None if first is None else {"vector": first_vector[first], "timer1": device_cycles[first],
                                                       "marker_span": first_span},
    }


def markers_agree(markers: dict) -> bool:
    return (markers.get("expected_difference") is not None and markers["n_compared"] == markers["n_expected"] > 0
            and markers.get("n_exact") == markers["n_compared"])


def markers_detail(markers: dict) -> str:
    """What the marker check measured, in words that are true whichever way it went."""
    n, total, expected = markers["n_compared"], markers["n_expected"], markers.get("expected_difference")
    if expected is None:
        return f"the simulator reported no start-up calibration markers; {n} of {total} vectors not comparable"
    text = (f"{markers.get('n_exact', 0)} of {total} Timer1 counts equal the simulator's GPIOR0 span minus "
            f"{expected} cycles (the calibration call's span)")
    if n < total:
        text += f"; only {n} spans recorded for {total} vectors"
    if markers.get("spans_passed_over"):
        text += (f"; {markers['spans_passed_over']} spans of requests the host sent again (a late answer) passed "
                 "over")
    first = markers.get("first_differing")
    if first is not None:
        text += (f"; span - Timer1 ranged {markers['marker_minus_timer1_min']}..{markers['marker_minus_timer1_max']}"
                 f" cycles, first at vector {first['vector']} (Timer1 {first['timer1']}, span {first['marker_span']})")
    return text


# ------------------------------------------------------------------------------------------------ the run


def validate(
    path: Path,
    port: str | None = None,
    resume: bool = False,
    raw_check: bool = True,
    progress_factory: Callable[[str, int], Callable[[int], None]] | None = None,
    baud: int | None = None,
) -> dict:
    """Validate the model directory on `port` (a real board) or, when port is None, on the simulated Uno.
    baud: the line's speed; default (and the only one the firmware answers at) the rate it was built for."""
    model_dir = load_model_dir(path)
    with locked(model_dir.path, "validate"):
        record_outputs(model_dir.path, JOURNAL, JOURNAL_NEW, SUMMARY)
        return _validate_locked(model_dir, port, resume, raw_check, progress_factory, baud)


def line_baud(board: Board, build: BuildInfo, baud: int | None) -> int:
    """The rate validation talks at: the firmware's own (build.json), which a different --baud cannot change."""
    built = build.serial_baud or board.serial_baud
    if baud is not None and baud != built:
        board.with_baud(baud)  # a rate the board cannot talk at is refused as such, not suggested as a build
        raise TinyprotoError(f"the firmware was built for {built} baud, not {baud}: build it for {baud} first "
                             f"(tinyproto run ... --baud {baud}, or compile --baud {baud} and build)")
    return built


def no_answer_hint(exc: TinyprotoError, board: Board, baud: int, target: str) -> TinyprotoError:
    """A board silent at a rate above its fallback: say how to fall back, in one line."""
    if baud <= board.serial_baud_fallback or target == "sim" or not str(exc).startswith("no answer"):
        return exc
    if not getattr(exc, "speed_may_help", True):  # its requests echoed: a slower rate would not help
        return exc
    return TinyprotoError(f"no answer from {target} at {baud} baud — if its USB bridge or cable does not carry "
                          f"{baud}, fall back to {board.serial_baud_fallback}: tinyproto run ... --baud "
                          f"{board.serial_baud_fallback} (or compile --baud {board.serial_baud_fallback}, build, "
                          "flash, validate)")


class LineMeter:
    """Bytes each way and wall time of the vector passes: how close validation comes to the line's limit."""

    def __init__(self, client, baud: int) -> None:
        self.client, self.baud = client, baud
        self.passes: dict[str, float] = {}
        self.host_cpu = 0.0  # this process's CPU seconds in the passes
        self._sent0, self._read0 = client.bytes_sent, client._reader.bytes_read

    def timed(self, name: str, work: Callable[[], object]):
        started, cpu = time.perf_counter(), time.process_time()
        result = work()
        self.passes[name] = time.perf_counter() - started
        self.host_cpu += time.process_time() - cpu
        return result

    def summary(self) -> dict:
        sent = self.client.bytes_sent - self._sent0
        read = self.client._reader.bytes_read - self._read0
        bound = max(sent, read) / (self.baud / 10)  # 8N1: 10 bit times a byte; the two directions run at once
        measured = sum(self.passes.values())
        return {
            "baud": self.baud,
            "bytes_to_device": sent,
            "bytes_from_device": read,
            "line_seconds": round(bound, 3),
            "measured_seconds": round(measured, 3),
            "measured_over_line": round(measured / bound, 3) if bound else None,
            "pass_seconds": {k: round(v, 3) for k, v in self.passes.items()},
            "window": bool(getattr(self.client, "windowed", False)),
            "window_restarts": getattr(self.client, "window_restarts", 0),
        }


def _round_or_none(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _validate_locked(model_dir: ModelDir, port: str | None, resume: bool, raw_check: bool,
                     progress_factory: Callable[[str, int], Callable[[int], None]] | None,
                     baud: int | None = None) -> dict:
    from tinyproto.device.frames import n_chunks
    from tinyproto.device.protocol import DeviceError, check_model, open_device
    from tinyproto.device.sim import SimulatedUno

    board = load_board(model_dir.board)
    model = families.load_int_model(model_dir)
    vectors = checked_vectors(model_dir, model)
    build = load_build_info(model_dir)
    check_firmware(model_dir, build)
    baud = line_baud(board, build, baud)
    n_total = len(vectors.labels)
    target = port or "sim"
    journal = Journal(model_dir.path, binding_of(model_dir, build, target))
    rows = journal.resume(n_total, model.n_classes) if resume else {}
    subject = ValidationSubject(model_dir, model, vectors, board, build, target)
    state = Measured(rows, raw_skipped=not raw_check)

    def write_summary() -> dict:
        summary = summarise(subject, state)
        write_json(model_dir.path / SUMMARY, summary)
        return summary

    try:
        with ExitStack() as stack:
            stack.callback(journal.close)
            if not resume:
                journal.start_new()  # a side file: the previous journal stays until the first new result
            sim = None
            if port is None:
                sim = stack.enter_context(SimulatedUno(build.elf, board=board))
            try:
                client = stack.enter_context(open_device(sim.port if sim else port, baud=baud,
                                                         boot_quiet_s=0.0 if sim else board.boot_quiet_s,
                                                         rx_ring=build.rx_ring))
            except DeviceError as exc:  # a port that opened but stayed silent (not a missing or busy port)
                raise no_answer_hint(exc, board, baud, target) from None
            hello = client.hello()
            meter = LineMeter(client, baud)
            check_model(hello, model_dir.model_hash, model.n_features, model.n_classes, model.family_id, board.f_cpu_hz)
            spans_per_vector = n_chunks(model.n_features) if hello.streams else 1
            todo = [i for i in range(n_total) if i not in rows]
            sent_again_before = client.requests_sent_again
            spans_before = len(_marker_cycles(sim.markers())) if sim is not None else 0  # a --resume's earlier ones
            tick = progress_factory("vectors", len(todo)) if progress_factory else None

            def int8_pass() -> None:
                for count, i in enumerate(todo, start=1):
                    prediction = client.predict(vectors.xq[i])
                    row = {"i": i, "label": int(prediction.label), "cycles": int(prediction.cycles),
                           "scores": [int(s) for s in prediction.scores],
                           "confidence": int(prediction.confidence), "decided": int(prediction.decided)}
                    journal.append(row)
                    rows[i] = row
                    if tick:
                        tick(1)
                    if count % PROGRESS_EVERY == 0:
                        write_summary()

            meter.timed("int8", int8_pass)
            if sim is not None and todo:
                events = sim.markers()
                spans = _marker_cycles(events)[spans_before:]
                state.markers = _marker_summary(spans, [rows[i]["cycles"] for i in todo], _calibration_span(events),
                                                spans_per_vector, todo, client.requests_sent_again - sent_again_before)
            if raw_check:
                raw_tick = progress_factory("raw inputs", n_total) if progress_factory else None
                state.raw = meter.timed("raw", lambda: _raw_input_check(client, vectors, raw_tick))
            state.line = meter.summary()
            if sim is not None:  # the CPU of the two processes (the simulator's, and this one's for the passes)
                state.line |= {"simulator_cpu_seconds": _round_or_none(sim.cpu_seconds()),
                               "host_cpu_seconds": round(meter.host_cpu, 3)}
            stats = client.stats()
            state.stats_problem = stack_problem(stats.stack_peak, stats.static_sram, build.sram_static_bytes,
                                                board.sram_bytes)
            state.stack_peak = stats.stack_peak if state.stats_problem is None else None
        state.finished = True
    finally:
        if rows or state.finished:  # an interrupted run records what it measured, marked incomplete
            summary = write_summary()
    return summary
