#!/usr/bin/env python3
"""Latency benchmark on the simulated Uno: per model, measured cycles, ms, the multiply-accumulate lower bound,
the ratio, and a per-stage breakdown read from GPIOR0 cycle markers (not estimated).

    python tools/bench_latency.py [--models protonn:digits:2kB protonn:breast_cancer:1kB flynn:digits:2kB]
                                  [--model-dir DIR ...] [--vectors N] [--json out.json]

Per model it builds two firmwares from the current runtime (firmware/): the normal one (its Timer1 cycles are
the latency; every score vector is compared with the numpy integer reference) and a bench one with
-DTP_STAGE_MARKERS, whose GPIOR0 writes split tp_predict() into stages (ProtoNN: projection, distances, scores;
FlyNN: input preparation, hashing, top-rho heap, filter lookup) and time the raw-input stage (PREDICT_RAW).
Stage figures are means over the vectors; the bench build's markers add ~1 cycle each, so its total
(`marked`) is a little above the normal build's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.core.wire import RAW_CHUNK_FEATURES, n_chunks  # noqa: E402
from tinyproto.device.build import build_project, render_platformio_ini  # noqa: E402
from tinyproto.core.cost import lower_bound_cycles  # noqa: E402
from tinyproto.families import predict_cycles  # noqa: E402
from tinyproto import families  # noqa: E402

MARK_START, MARK_END = 1, 2
STAGE_NAMES = {
    0x20: "input", 0x30: "projection", 0x31: "distances", 0x32: "scores",
    0x40: "prepare", 0x41: "hashing", 0x42: "top_rho", 0x43: "lookup",
}
CALL = "call"  # from GPIOR0 = 1 to the first stage marker, and from the last stage to GPIOR0 = 2


def firmware_ring(model, board) -> int:
    """The serial receive ring compile renders this model's firmware with on `board` (0: none, stop-and-wait when
    the model leaves too little SRAM), which the host's window must not outrun: open_device(..., rx_ring=this)."""
    from tinyproto.pipeline.compile import rx_ring_of

    return rx_ring_of(model, board)


def write_project(model, project: Path, stage_markers: bool, board) -> None:
    """The model's firmware project from the current runtime sources, optionally with stage markers, with the
    receive ring compile gives this model on this board (firmware_ring), so the bench builds what compile ships."""
    from tinyproto.core.render import write_sources

    write_sources(model, project, "bench", 0, 1 << 20, rx_ring=firmware_ring(model, board))
    ini = render_platformio_ini(board)
    if stage_markers:
        ini = ini.replace("-DTP_SIMULATED=1", "-DTP_SIMULATED=1 -DTP_STAGE_MARKERS=1")
        assert "-DTP_STAGE_MARKERS=1" in ini
    (project / "platformio.ini").write_text(ini)


def stage_spans(markers: list[tuple[int, int]]) -> list[dict[str, int]]:
    """Per inference (GPIOR0 = 1 .. 2): cycles charged to each stage (a span runs to the next marker)."""
    out, current, last, spans = [], None, 0, None
    for value, cycle in markers:
        if value == MARK_START:
            spans, current, last = {}, CALL, cycle
            continue
        if spans is None:
            continue
        spans[current] = spans.get(current, 0) + cycle - last
        last = cycle
        if value == MARK_END:
            spans["total"] = sum(v for k, v in spans.items() if k != "total")
            out.append(spans)
            spans = None
        else:
            current = STAGE_NAMES.get(value, f"0x{value:02x}")
    return out


def input_spans(markers: list[tuple[int, int]]) -> list[int]:
    spans, start = [], None
    for value, cycle in markers:
        if value == 0x20:
            start = cycle
        elif value == 0x2F and start is not None:
            spans.append(cycle - start)
            start = None
    return spans


def run_firmware(elf: Path, xq: np.ndarray, raw: np.ndarray | None, rx_ring: int | None = None
                 ) -> tuple[list, list, list]:
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    with SimulatedUno(elf) as uno, open_device(uno.port, rx_ring=rx_ring) as client:
        predictions = [client.predict(x) for x in xq]
        marks_predict = len(uno.markers())
        if raw is not None:
            for r in raw:
                client.predict_raw(r)
        markers = uno.markers()
    return predictions, markers[:marks_predict], markers[marks_predict:]


def bench_model(model, xq: np.ndarray, reference_scores: np.ndarray, raw: np.ndarray | None, workdir: Path,
                board_name: str = "uno") -> dict:
    """Measure one integer model on the simulated board: normal build (cycles, bit-exactness) + marker build."""
    board = load_board(board_name)
    result: dict = {}
    for marked in (False, True):
        project = workdir / ("marked" if marked else "normal")
        if project.exists():
            shutil.rmtree(project)
        write_project(model, project, marked, board)
        try:
            build = build_project(project, "uno_sim")
        except Exception:  # PlatformIO's shared home can be mid-update by a parallel build: one retry
            build = build_project(project, "uno_sim")
        predictions, markers, raw_markers = run_firmware(build.elf, xq, raw if marked else None,
                                                         firmware_ring(model, board))
        scores = np.array([p.scores for p in predictions], dtype=np.int64)
        exact = bool(np.array_equal(scores, np.asarray(reference_scores, dtype=np.int64)))
        if not marked:
            cycles = np.array([p.cycles for p in predictions], dtype=np.float64)
            result.update(exact=exact, cycles_mean=float(cycles.mean()), cycles_min=int(cycles.min()),
                          cycles_max=int(cycles.max()), flash_bytes=build.sizes.flash_bytes)
        else:
            result["exact_marked"] = exact
            per = stage_spans(markers)
            names = sorted({k for p in per for k in p})
            result["stages"] = {k: float(np.mean([p.get(k, 0) for p in per])) for k in names}
            spans = input_spans(raw_markers)
            if spans:  # raw floats arrive in chunks, each converted on its own: sum one vector's chunks
                per_vector = n_chunks(model.n_features, RAW_CHUNK_FEATURES)
                result["stages_input_raw"] = float(np.mean([sum(spans[k : k + per_vector]) for k in
                                                            range(0, len(spans) - per_vector + 1, per_vector)]))
    bound = lower_bound_cycles(model)
    seconds = result["cycles_mean"] / board.f_cpu_hz
    result.update(
        lower_bound=bound,
        over_bound=result["cycles_mean"] / bound if bound else None,
        ms=1000.0 * seconds,
        energy_mj_mcu=board.energy_mj(seconds, board.mcu_active_current_ma),
        predicted=predict_cycles(model)["total"],
    )
    result["predicted_error"] = (result["predicted"] - result["cycles_mean"]) / result["cycles_mean"]
    return result


def bench_model_dir(path: Path, workdir: Path, n_vectors: int | None) -> dict:
    from tinyproto.core.modeldir import load_model_dir

    model_dir = load_model_dir(path)
    model = families.load_int_model(model_dir)
    vectors = model_dir.vectors()
    n = len(vectors.labels) if n_vectors is None else min(n_vectors, len(vectors.labels))
    result = bench_model(model, vectors.xq[:n], vectors.scores[:n], vectors.X_raw[: min(n, 20)], workdir,
                         model_dir.meta.get("board", "uno"))
    labels = np.asarray(vectors.labels[:n])
    result.update(family=model.family, model_bytes=model_dir.report.get("model_bytes"), n_vectors=n,
                  accuracy=float(np.mean(labels == vectors.y[:n])))
    return result


def print_table(rows: list[tuple[str, dict]], header: bool = True) -> None:
    head = (f"{'model':<28}{'acc %':>6}{'exact':>6}{'cycles':>8}{'ms':>7}{'bound':>7}{'x bnd':>6}{'pred':>8}"
            f"{'err %':>6}{'mJ':>7}  stages (cycles, marker build)")
    if header:
        print(head)
        print("-" * len(head))
    for name, r in rows:
        stages = "  ".join(f"{k} {v:.0f}" for k, v in r["stages"].items() if k != "total")
        if "stages_input_raw" in r:
            stages += f"  | input(raw) {r['stages_input_raw']:.0f}"
        exact = "yes" if r["exact"] and r["exact_marked"] else "NO"
        print(f"{name:<28}{100 * r['accuracy']:>6.1f}{exact:>6}{r['cycles_mean']:>8.0f}{r['ms']:>7.2f}"
              f"{r['lower_bound']:>7}{r['over_bound']:>6.2f}{r['predicted']:>8}{100 * r['predicted_error']:>6.1f}"
              f"{r['energy_mj_mcu']:>7.3f}  {stages}  (marked {r['stages']['total']:.0f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["protonn:digits:2kB", "protonn:breast_cancer:1kB",
                                                        "flynn:digits:2kB"],
                        help="family:data:budget, compiled with seed 0 for the uno")
    parser.add_argument("--model-dir", nargs="*", default=[], type=Path, help="already compiled model directories")
    parser.add_argument("--vectors", type=int, default=None, help="first N test vectors only (default all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [(p.name, p) for p in args.model_dir]
        for spec in args.models if not args.model_dir else []:
            family, data, budget = spec.split(":")
            out = Path(tmp) / spec.replace(":", "-")
            compile_model(data, CompileOptions(family, budget, 0, "uno", out))
            dirs.append((spec, out))
        for name, path in dirs:
            work = Path(tmp) / "work"
            work.mkdir(exist_ok=True)
            rows.append((name, bench_model_dir(path, work, args.vectors)))
            print_table(rows[-1:], header=len(rows) == 1)
    if args.json:
        args.json.write_text(json.dumps(dict(rows), indent=1))


if __name__ == "__main__":
    main()
