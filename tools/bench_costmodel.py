#!/usr/bin/env python3
"""The cost models against the simulator, on shapes drawn at random: predicted vs measured cycles per inference.

Draws --shapes shapes (seeded) across the four families, input widths (4 to 784 features), W / M layouts
(ProtoNN: dense, bitmap and column-coded W, with and without a projection offset; FlyNN: seeded or stored M,
narrow or wide, with and without the sign split; BNC: dense, bitmap or seeded W; Bloom: any k and m) and boards
(the 16 MHz Uno and the 8 MHz Pro Mini), gives each random contents, builds its firmware for the simulated
board and measures every inference exactly from the simulator's GPIOR0 cycle markers: the span of the timed call
(GPIOR0 = 1 .. 2) less the span of the empty calibration call (17 .. 18) the firmware subtracts from its own
Timer1 figure, summed over a vector's chunks for a streaming family. Every score is compared with the numpy
reference. Prints one row per shape (predicted, measured, error %) and per family the largest |error| and the
share of shapes within 3 % (COST_MODEL_TOLERANCE, the headroom --max-latency keeps).

The cost model predicts the mean over random inputs; the benchmark estimates that mean from random vectors: 32,
and more where their cycles spread so widely that the mean of 32 is not within SE_TARGET (0.5 %) of the
expectation by its standard error (a FlyNN heap of ties among few hash inputs: one vector's cycles can differ by
20 %), up to MAX_VECTORS. Each row prints the vectors run and the measured mean's standard error in %.

    nice -n 10 python tools/bench_costmodel.py --shapes 200 --cache build/costmodel-bench.json
    python tools/bench_costmodel.py --shapes 12             # a quick run
    python tools/bench_costmodel.py --families flynn --shapes 40 --seed 3
    python tools/bench_costmodel.py --shapes 40 --widths 784 9000   # images, sensor windows of 3 x 3,000 samples
    python tools/bench_costmodel.py --shapes 200 --seed 7302 --only flynn-057   # one shape of a draw, alone

Measurements are cached (--cache, keyed by each shape, its board and the runtime sources' digest), so a refit of
the constants re-prints the table without rebuilding; a change to firmware/ re-measures. Builds call avr-gcc
directly with the project's flags (one compiler call per firmware, no PlatformIO start-up).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto
sys.path.insert(0, str(REPO / "tools"))

from tinyproto import families  # noqa: E402
from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.core.cost import COST_MODEL_TOLERANCE  # noqa: E402
from tinyproto.core.inputstage import InputStage  # noqa: E402
from tinyproto.core.wire import n_chunks  # noqa: E402

BOARDS = ("uno", "pro_mini_3v3")  # 16 MHz and 8 MHz
FAMILIES = ("protonn", "flynn", "bnc", "bloom")
N_VECTORS = 32  # random int8 vectors per shape at least; the cost model predicts their mean (FlyNN's top-rho heap is
# data-dependent: one vector's cycles spread by up to ~5 % around it, so 4 vectors left a shape's mean ~2.5 % noisy)
SE_TARGET = 0.005  # more vectors while the measured mean's standard error is above this share of it ...
MAX_VECTORS = 1024  # ... up to this many (seed 7302's flynn-057, five hash inputs: sd 10.7 % of the mean, so the
# mean of its 32 vectors was 3.1 standard errors, 5.3 %, below the mean of 2,048: about 460 vectors make it 0.5 %)
MARK_START, MARK_CALIBRATE = 1, 17


# ---------------------------------------------------------------- drawing shapes


WIDTHS = (4, 784)  # the default range of input widths


def draw_width(rng, widths: tuple[int, int] = WIDTHS) -> int:
    """Log-uniform over widths (default 4..784 features, with the narrow / wide boundaries (64, 128, 256) well
    covered; --widths 784 9000 draws images and long sensor windows)."""
    return int(round(math.exp(rng.uniform(math.log(widths[0]), math.log(widths[1])))))


def _stage(rng, d: int) -> InputStage:
    if rng.random() < 0.5:
        return InputStage.shared(127.5, 127 / 127.5, d)
    return InputStage.from_standardisation(rng.normal(size=d), rng.uniform(0.5, 2, size=d), 0.03)


def draw_protonn(rng, d: int) -> tuple[dict, object]:
    from tinyproto.families.protonn.quantize import IntProtoNN, kernel_table
    from tinyproto.families.protonn.shapes import (
        DIMENSIONS,
        PROTOS_PER_CLASS,
        TABLE_SIZES,
    )

    L = int(rng.integers(2, 11))
    D = int(rng.choice(DIMENSIONS))
    m = int(min(L * rng.choice(PROTOS_PER_CLASS), 200))
    layout = str(rng.choice(["dense", "sparse", "column"] if d > 16 else ["dense", "sparse"]))
    if layout == "dense":
        W = rng.integers(-127, 128, size=(D, d))
    elif layout == "sparse":
        W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < rng.choice([0.05, 0.1, 0.25, 0.5]))
    else:  # one weight per feature (column-coded) and a few extra
        W = np.zeros((D, d), dtype=np.int64)
        W[rng.integers(0, D, size=d), np.arange(d)] = rng.integers(1, 128, size=d)
        extra = rng.choice(D * d, size=int(rng.choice([0.0, 0.1, 0.3]) * d), replace=False)
        W.flat[extra] = rng.integers(1, 128, size=extra.size) * rng.choice([-1, 1], size=extra.size)
    W[np.arange(D), rng.integers(0, d, size=D)] = rng.integers(1, 128, size=D)  # no row all zero
    shared = bool(rng.random() < 0.5)
    stage = InputStage.shared(127.5, 1.0, d) if shared else InputStage.from_standardisation(
        np.zeros(d), np.ones(d), 1 / 32)
    offset = rng.integers(-300, 300, size=D).astype(np.int16) if shared and rng.random() < 0.7 else None
    gamma = float(rng.choice([0.05, 0.01, 0.002, 0.0005]))
    table, shift = kernel_table(gamma=gamma, b_scale=1.0, size=int(rng.choice(TABLE_SIZES)))
    model = IntProtoNN(list(range(L)), stage, W.astype(np.int8), rng.integers(-60, 61, size=(m, D)).astype(np.int8),
                       rng.integers(-127, 128, size=(m, L)).astype(np.int8), proj_shift=int(rng.integers(-2, 15)),
                       table=table, table_shift=shift, scales={}, offset=offset)
    return {"layout": f"{model.w_encoding}{'+offset' if offset is not None else ''}", "D": D, "m": m, "L": L}, model


def draw_flynn(rng, d: int) -> tuple[dict, object]:
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.solver import DECAY_GRID, RHO_GRID, S_GRID
    from tinyproto.families.flynn.seeded_index import seeded_indices

    split = bool(rng.random() < 0.6)
    n_in = 2 * d if split else d
    s = int(min(rng.choice((1,) + S_GRID), n_in))
    rho = int(rng.choice(RHO_GRID))
    bits = int(rng.integers(1, 5))
    L = int(rng.integers(2, 11))
    store = bool(rng.random() < 0.4)
    per_row = s * (2 if n_in > 256 else 1) if store else 0  # flash bytes of a stored row
    m_max = min(4096, (14000 * 8) // (L * bits + 8 * per_row))
    m_min = max(16, 2 * rho)
    if m_max < m_min:
        rho, m_min = 8, 16
    m = int(round(math.exp(rng.uniform(math.log(m_min), math.log(max(m_min, m_max))))))
    seed = int(rng.integers(1, 65536))
    decay = float(rng.choice(DECAY_GRID)) if bits > 1 else 1.0
    model = IntFlyNN(list(range(L)), _stage(rng, d), split, seed, seeded_indices(seed, m, s, n_in), rho, bits,
                     rng.integers(0, 1 << bits, size=(L, m)), decay, store)
    layout = f"{'stored' if store else 'seeded'}{'+split' if split else ''}"
    return {"layout": layout, "m": m, "s": s, "rho": rho, "bits": bits, "L": L}, model


def draw_bnc(rng, d: int) -> tuple[dict, object]:
    from calibrate_costmodel import bnc_shape_model

    from tinyproto.families.bnc.solver import (
        BITS_GRID,
        DENSITY_GRID,
        WIDE_FEATURES,
        seeded_rows,
    )

    L = int(rng.integers(2, 11))
    r = int(rng.choice(BITS_GRID))
    seeded = d > WIDE_FEATURES and rng.random() < 0.5 and bool(seeded_rows(d))
    K = int(rng.choice(seeded_rows(d))) if seeded else 0  # the solver's: a segment d / K fits a byte
    density = 0.0 if seeded else float(rng.choice(DENSITY_GRID + (1.0 / d,)))
    m = int(rng.integers(L, max(L + 1, min(300, 8 * L * int(rng.integers(1, 5))))))
    stage = str(rng.choice(["feature", "shared"]))
    model = bnc_shape_model(d, r, m, L, density, K, stage, 0, int(rng.integers(0, 2**31)))
    layout = f"seeded K={K}" if K else ("dense" if density == 1.0 else f"sparse {density:.3g}")
    return {"layout": layout, "r": r, "m": m, "L": L}, model


def draw_bloom(rng, d: int) -> tuple[dict, object]:
    from calibrate_costmodel import bloom_shape_model

    from tinyproto.families.bloom.solver import K_CANDIDATES, MAX_SLOTS

    L = int(rng.integers(2, 11))
    k = int(rng.choice(K_CANDIDATES))
    m = int(rng.integers(8, MAX_SLOTS + 1))
    stage = str(rng.choice(["feature", "shared"]))
    model = bloom_shape_model(d, k, m, L, stage, 0, int(rng.integers(0, 2**31)))
    return {"layout": f"k={k}", "m": m, "L": L}, model


DRAW = {"protonn": draw_protonn, "flynn": draw_flynn, "bnc": draw_bnc, "bloom": draw_bloom}


def fits(model, board) -> bool:
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.compile import check_fits_board

    try:
        check_fits_board(model, board)
    except TinyprotoError:
        return False
    flash = sum(a.nbytes for a in model.carrays())
    return flash <= 20_000  # the runtime and the app need the rest of the 32 kB


def draw_shapes(n: int, seed: int, family_names, boards, widths: tuple[int, int] = WIDTHS) -> list[dict]:
    """n shapes, round-robin over the families (each draw redrawn until the runtime can hold it and it fits its
    board; a family that fits no draw in 100 at these widths is left out of that slot, with a line saying so)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        family = family_names[i % len(family_names)]
        board = str(boards[int(rng.integers(0, len(boards)))])
        for _ in range(100):
            d = draw_width(rng, widths)
            try:
                spec, model = DRAW[family](rng, d)
            except ValueError:  # a shape the runtime cannot hold (e.g. BNC beyond 65,535 stored weights): redraw
                continue
            if fits(model, load_board(board)):
                break
        else:
            print(f"{family}-{i:03d}: no {family} shape of {widths[0]}..{widths[1]} features fits {board} in 100 "
                  "draws; left out", file=sys.stderr)
            continue
        out.append(dict(spec, name=f"{family}-{i:03d}", family=family, d=model.n_features, board=board, model=model,
                        xseed=int(rng.integers(0, 2**31))))
    return out


# ---------------------------------------------------------------- measuring


def runtime_digest() -> str:
    """The firmware sources' digest: a cached measurement is valid only for the same runtime. The input stage
    (tp_input.c) runs outside the timed call (PREDICT sends int8 inputs), so it does not take part."""
    h = hashlib.sha256()
    for path in sorted((REPO / "firmware").glob("*")) + sorted((REPO / "templates").glob("*.j2")):
        if path.is_file() and path.name != "tp_input.c":
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


def shape_key(shape: dict) -> str:
    from tinyproto.core.render import model_hash

    return f"{shape['board']}:{model_hash(shape['model']):08X}:{shape['xseed']}"


def build(model, project: Path, board_name: str, stage_markers: bool = False) -> Path:
    """The model's firmware for the simulated board, built by one avr-gcc call with the project's flags
    (stage_markers: the bench build of tools/bench_latency.py, whose GPIOR0 writes split tp_predict into stages)."""
    from bench_latency import write_project

    from tinyproto.device.build import _c_sources, _compile_with_avr_gcc

    write_project(model, project, stage_markers, load_board(board_name))
    env = f"{board_name}_sim"
    elf, _ = _compile_with_avr_gcc(project, env, _c_sources(project / "src", project / "lib"),
                                   project / ".pio" / "build" / env, None)
    return elf


# The device app's judge stage (firmware/tp_main.c calls tp_judge after tp_predict, or after tp_stream_end, inside
# the timed call): not the family's code, so not in the family's cost model. Removed to measure it: the wrapper
# returns tp_predict's label (tp_predict_judged), the last chunk stores nothing (tp_feed_step).
JUDGE_CALLS = {
    False: ("    uint8_t label = tp_predict(x, scores);\n"
            "    tp_judged[1] = tp_judge(&tp_buf.i32[TP_SCORES_AT / 4u], label, &tp_judged[0]);\n"
            "    return label;\n", "    return tp_predict(x, scores);\n"),
    True: ("    tp_judged[1] = tp_judge(scores, label, &tp_judged[0]);\n", ""),
}


def judge_stage_cycles(model, board_name: str, workdir: Path) -> int:
    """Cycles the device app's judge stage adds to every timed inference of this model (its runtime: the stub of a
    model without calibration, the benchmark's kind), measured: the same firmware built with and without the
    tp_judge call, the same vector on both. The same code for every model of one app path (buffered or streamed)."""
    from tinyproto.device.build import _c_sources, _compile_with_avr_gcc

    x = np.zeros((1, model.n_features), dtype=np.int8)
    figures = []
    for judged in (True, False):
        project = workdir / ("judged" if judged else "unjudged")
        build(model, project, board_name)
        main_c = project / "src" / "main.c"
        text = main_c.read_text()
        streams = bool(model.defines().get("TP_STREAMABLE", 0))
        old, new = JUDGE_CALLS[streams]
        if not judged:
            if text.count(old) != 1:
                raise AssertionError("tp_main.c's judge call is not where the benchmark expects it")
            main_c.write_text(text.replace(old, new))
        env = f"{board_name}_sim"
        elf, _ = _compile_with_avr_gcc(project, env, _c_sources(project / "src", project / "lib"),
                                       project / ".pio" / "build" / env, None)
        figures.append(measure_elf(elf, model, x, board_name=board_name)[0][0])
    return int(figures[0] - figures[1])


def marker_cycles(markers: list[tuple[int, int]], per_vector: int) -> list[int]:
    """Per vector: Σ over its timed calls of (span 1 .. 2) - (span of the empty calibration call 17 .. 18)."""
    calibration = [b[1] - a[1] for a, b in zip(markers, markers[1:]) if a[0] == MARK_CALIBRATE and b[0] == 18]
    if len(calibration) != 1:
        raise AssertionError(f"expected one calibration span, found {len(calibration)}")
    spans = [b[1] - a[1] - calibration[0] for a, b in zip(markers, markers[1:]) if a[0] == MARK_START and b[0] == 2]
    return [sum(spans[k : k + per_vector]) for k in range(0, len(spans) - per_vector + 1, per_vector)]


def shape_vectors(shape: dict, n: int) -> np.ndarray:
    """The shape's first n random int8 vectors (any n: a longer draw starts with the shorter one's vectors)."""
    rng = np.random.default_rng(shape["xseed"])
    return rng.integers(-127, 128, size=(n, shape["model"].n_features)).astype(np.int8)


def measure(shape: dict, workdir: Path, start: int = 0, stop: int = N_VECTORS) -> dict:
    """Cycles (markers and Timer1) of the shape's vectors start .. stop - 1 on the simulated board."""
    model = shape["model"]
    elf = build(model, workdir, shape["board"])
    cycles, timer1 = measure_elf(elf, model, shape_vectors(shape, stop)[start:], shape["name"], shape["board"])
    return {"cycles": cycles, "timer1": timer1}


def standard_error(cycles) -> float:
    """The standard error of the mean of these per-vector cycles, as a share of the mean."""
    c = np.asarray(cycles, dtype=float)
    return float(c.std(ddof=1) / math.sqrt(c.size) / c.mean()) if c.size > 1 and c.mean() > 0 else 0.0


def vectors_needed(cycles) -> int:
    """How many vectors bring the mean's standard error to SE_TARGET, as far as these cycles' spread tells (at
    least those run, at most MAX_VECTORS)."""
    n = len(cycles)
    if standard_error(cycles) <= SE_TARGET:
        return n
    return min(MAX_VECTORS, max(n, math.ceil(n * (standard_error(cycles) / SE_TARGET) ** 2)))


def measure_elf(elf: Path, model, xq: np.ndarray, name: str = "",
                board_name: str = "uno") -> tuple[list[int], list[int]]:
    """(marker cycles, Timer1 cycles) per vector of xq on the simulated board, every score checked (the host's
    window as far ahead as the firmware's receive ring, which build() renders as compile does)."""
    from bench_latency import firmware_ring

    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    ring = firmware_ring(model, load_board(board_name))
    with SimulatedUno(elf) as sim, open_device(sim.port, rx_ring=ring) as client:
        hello = client.hello()
        predictions = [client.predict(x) for x in xq]
        markers = sim.markers()
    scores = np.array([p.scores for p in predictions], dtype=np.int64)
    if not np.array_equal(scores, model.scores(xq)):
        raise AssertionError(f"{name}: device scores differ from the numpy reference")
    per_vector = n_chunks(model.n_features) if hello.streams else 1
    cycles = marker_cycles(markers, per_vector)
    if len(cycles) != len(xq):
        raise AssertionError(f"{name}: {len(cycles)} marker spans for {len(xq)} vectors")
    return cycles, [int(p.cycles) for p in predictions]


def streams_of(model) -> bool:
    return bool(model.defines().get("TP_STREAMABLE", 0))


def judge_stages(shapes: list[dict], digest: str, cache: dict, cache_path: Path | None) -> dict[bool, int]:
    """The judge stage's cycles for each app path the shapes take (buffered, streamed), measured on the first
    shape of each (cached with the runtime's digest)."""
    out = {}
    for shape in shapes:
        streams = streams_of(shape["model"])
        if streams in out:
            continue
        key = f"{digest}:judge:{'streamed' if streams else 'buffered'}"
        if key not in cache:
            with tempfile.TemporaryDirectory() as tmp:
                cache[key] = judge_stage_cycles(shape["model"], shape["board"], Path(tmp))
            if cache_path is not None:
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                cache_path.write_text(json.dumps(cache, indent=0))
        out[streams] = int(cache[key])
    return out


# ---------------------------------------------------------------- the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=200, help="shapes to draw (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--boards", nargs="+", default=list(BOARDS), choices=BOARDS)
    parser.add_argument("--widths", type=int, nargs=2, default=list(WIDTHS), metavar=("MIN", "MAX"),
                        help="input widths to draw from, log-uniform (default 4 784)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="measure only these shapes of the draw (e.g. flynn-057: the draw is the same)")
    parser.add_argument("--cache", type=Path, default=None, help="JSON file of measurements to reuse and extend")
    parser.add_argument("--json", type=Path, default=None, help="write every row as JSON")
    args = parser.parse_args()
    if args.shapes < 1:
        parser.error("--shapes must be at least 1")
    if not 1 <= args.widths[0] <= args.widths[1] <= 65535:
        parser.error("--widths needs 1 <= MIN <= MAX <= 65535")
    digest = runtime_digest()
    cache = json.loads(args.cache.read_text()) if args.cache is not None and args.cache.exists() else {}
    shapes = draw_shapes(args.shapes, args.seed, args.families, args.boards, tuple(args.widths))
    if args.only is not None:
        unknown = sorted(set(args.only) - {shape["name"] for shape in shapes})
        if unknown:
            parser.error(f"--only: no shape {', '.join(unknown)} in this draw")
        shapes = [shape for shape in shapes if shape["name"] in args.only]
    judge = judge_stages(shapes, digest, cache, args.cache)
    print(f"{len(shapes)} shapes (seed {args.seed}, {args.widths[0]}..{args.widths[1]} features), {N_VECTORS} to "
          f"{MAX_VECTORS} random vectors each (se: the measured mean's standard error), runtime {digest}")
    print("measured: the timed call less the device app's judge stage (tp_judge, not the family's code): "
          + ", ".join(f"{'streamed' if s else 'buffered'} {c} cycles" for s, c in sorted(judge.items())))
    head = (f"{'shape':<12}{'board':<13}{'d':>5}  {'layout':<18}{'size':<26}{'measured':>10}{'predicted':>10}"
            f"{'err %':>8}{'n':>6}{'se %':>6}")
    print(head)
    print("-" * len(head))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            key = f"{digest}:{shape_key(shape)}"
            runs = len(cache[key]["cycles"]) if key in cache else 0
            if key not in cache:
                started = time.perf_counter()
                cache[key] = measure(shape, Path(tmp) / shape["name"])
                cache[key]["seconds"] = round(time.perf_counter() - started, 1)
            while len(cache[key]["cycles"]) < vectors_needed(cache[key]["cycles"]):  # a wide spread: more vectors
                started, have = time.perf_counter(), len(cache[key]["cycles"])
                more = measure(shape, Path(tmp) / f"{shape['name']}-more", have, vectors_needed(cache[key]["cycles"]))
                for name in ("cycles", "timer1"):
                    cache[key][name] = cache[key][name] + more[name]
                cache[key]["seconds"] = round(cache[key].get("seconds", 0) + time.perf_counter() - started, 1)
            if args.cache is not None and len(cache[key]["cycles"]) != runs:
                args.cache.parent.mkdir(parents=True, exist_ok=True)
                args.cache.write_text(json.dumps(cache, indent=0))
            measured = float(np.mean(cache[key]["cycles"])) - judge[streams_of(shape["model"])]
            predicted = float(families.family_of(shape["model"]).predict_cycles(shape["model"])["total"])
            error = 100 * (predicted - measured) / measured
            size = " ".join(f"{k}={shape[k]}" for k in ("D", "r", "m", "s", "rho", "bits", "L") if k in shape)
            n, se = len(cache[key]["cycles"]), 100 * standard_error(cache[key]["cycles"])
            rows.append({"name": shape["name"], "family": shape["family"], "board": shape["board"], "d": shape["d"],
                         "layout": shape["layout"], "size": size, "measured": measured, "predicted": predicted,
                         "error_pct": error, "vectors": n, "se_pct": se})
            flag = "" if abs(error) <= 100 * COST_MODEL_TOLERANCE else "  <-- outside"
            print(f"{shape['name']:<12}{shape['board']:<13}{shape['d']:>5}  {shape['layout']:<18}{size:<26}"
                  f"{measured:>10.0f}{predicted:>10.0f}{error:>+8.2f}{n:>6}{se:>6.2f}{flag}", flush=True)
    print_summary(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


def print_summary(rows: list[dict]) -> None:
    limit = 100 * COST_MODEL_TOLERANCE
    print(f"\n{'family':<10}{'shapes':>7}{'mean err %':>12}{'max |err| %':>13}{'within 3 %':>12}")
    for family in [f for f in FAMILIES if any(r["family"] == f for r in rows)] + ["all"]:
        errors = np.array([r["error_pct"] for r in rows if family == "all" or r["family"] == family])
        within = np.mean(np.abs(errors) <= limit)
        print(f"{family:<10}{errors.size:>7}{errors.mean():>+12.2f}{np.abs(errors).max():>13.2f}{100 * within:>11.1f}%")


if __name__ == "__main__":
    main()
