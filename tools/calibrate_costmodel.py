#!/usr/bin/env python3
"""Fit the ProtoNN cost model's cycles-per-unit constants from measurements on the simulated Uno.

Builds synthetic ProtoNN models whose shapes vary one term at a time (rows, bitmap density, prototypes,
classes, dense W), runs a few random vectors on the cycle-exact simulator, and fits the constants of
the family's cost model.PN_CYCLES by non-negative least squares. Prints the fit and each model's
measured vs predicted cycles. Paste the constants into tinyproto/families/<name>/cost.py when the C code changes.

    python tools/calibrate_costmodel.py
    python tools/calibrate_costmodel.py --flynn MODEL_DIR ...   # FLY_CYCLES from compiled FlyNN models
    python tools/calibrate_costmodel.py --flynn-shapes 40 --cache build/flynn-shapes.json
                                                   # FLY_CYCLES from FlyNN shapes drawn at random (seed 1000)
    python tools/calibrate_costmodel.py --flynn-wide-stored 36 --cache build/flynn-wide-stored.json
                                                   # FLY_CYCLES' wide stored-M terms, the rest held
    python tools/calibrate_costmodel.py --flynn-wide-seeded 16 --cache build/flynn-wide-seeded.json
                                                   # FlyNN's WIDE_SEEDED_CYCLES, per layout, function by function
    python tools/calibrate_costmodel.py --flynn-seeded-scan   # a narrow seeded M's offer cycles, walked in its code
    python tools/calibrate_costmodel.py --flynn-lookup-layouts 24 --cache build/flynn-lookup-layouts.json
                                                   # FlyNN's LOOKUP_LAYOUTS: the lookup beyond ten classes
    python tools/calibrate_costmodel.py --flynn-heap 60 --cache build/flynn-heap.json
                                                   # FLY_CYCLES' terms around the heap, the rest held
    python tools/calibrate_costmodel.py --protonn-dense-rows 40 --cache build/protonn-dense-rows.json
                                                   # PN_CYCLES' dense_row_c, the rest held
    python tools/calibrate_costmodel.py --wide     # PN_STREAM_CYCLES' fitted term: a row-major W's offset rows
    python tools/calibrate_costmodel.py --protonn-c --cache build/protonn-c.json
                                                   # PN_C_ROWS_CYCLES: row-major W over d > 511 features
    python tools/calibrate_costmodel.py --bloom-feed   # Bloom's FEED_CYCLES: tp_stream_feed per feature and chunk
    python tools/calibrate_costmodel.py --bloom --cache build/cal-bloom.json   # BLOOM_CYCLES, FEED_CYCLES held
"""

from __future__ import annotations

import json
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto, not another one installed in the environment

from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.device.build import build_project, render_platformio_ini  # noqa: E402
from tinyproto.families.protonn.cost import PN_CYCLES, protonn_cost_terms  # noqa: E402
from tinyproto.device.protocol import open_device  # noqa: E402
from tinyproto.device.sim import SimulatedUno  # noqa: E402
from tinyproto.core.inputstage import InputStage  # noqa: E402
from tinyproto.families.protonn.quantize import IntProtoNN, kernel_table  # noqa: E402
from tinyproto.core.render import write_sources  # noqa: E402
from tinyproto import families  # noqa: E402

# (features d, d_hat, prototypes m, classes L, W density, table size, projection shift: > 0 right, < 0 left
#  [, kernel gamma])
SHAPES = [
    (16, 4, 8, 2, 0.3, 32, 7), (16, 12, 8, 2, 0.3, 32, 9), (64, 4, 8, 2, 0.3, 32, 10), (64, 4, 8, 2, 0.9, 32, 0),
    (64, 4, 40, 2, 0.3, 32, 3), (64, 4, 8, 10, 0.3, 32, 12), (64, 12, 60, 10, 0.4, 64, 10), (30, 10, 20, 2, 0.2, 32, 9),
    (32, 8, 16, 4, 1.0, 16, -2), (8, 3, 6, 3, 1.0, 16, 8), (64, 20, 100, 10, 0.5, 64, 7), (128, 6, 12, 3, 0.1, 32, 11),
    (64, 40, 40, 3, 0.3, 32, 9), (100, 8, 200, 5, 0.05, 64, 5), (16, 4, 33, 2, 1.0, 16, 14),
    (20, 36, 10, 2, 1.0, 32, 8),
    (180, 10, 30, 4, 0.1, 32, 10), (13, 5, 7, 2, 0.6, 16, 1), (16, 70, 12, 2, 0.5, 32, 9), (24, 16, 90, 3, 0.3, 32, 6),
    (40, 17, 50, 4, 0.5, 16, 10), (48, 2, 64, 6, 1.0, 64, 16), (64, 12, 60, 10, 0.4, 256, 10),
    (200, 6, 12, 3, 1.0, 32, 12), (96, 10, 20, 4, 0.04, 32, 9), (16, 3, 256, 4, 0.5, 32, 20),
    (30, 12, 30, 2, 1.0, 32, 10), (64, 8, 40, 7, 0.4, 64, 11), (40, 6, 24, 1, 0.5, 32, 9),
    (64, 12, 60, 10, 0.4, 64, 10, 0.002), (30, 30, 20, 2, 0.2, 32, 9, 0.001), (96, 10, 20, 4, 0.1, 32, 9, 0.0005),
    (64, 12, 60, 10, 0.4, 64, 10, 0.01), (16, 200, 20, 2, 1.0, 32, 0), (16, 100, 10, 2, 1.0, 32, 4, 0.0003),
]
N_VECTORS = 6
# Terms held at their hand count (the cycles of the asm instructions, see firmware/tp_protonn.c): left free, nnls
# trades them against the terms they always occur with, and mispredicts shapes unlike the calibration set.
HAND_COUNTS = {"dense_mac": 9, "dense_load": 2, "dense_step": 4, "kernels_frame": 1, "kernels_proto": 1,
               "dist_term": 13, "dist_term_reg": 11,
               "score_term": 8, "score_load": 2, "score_step": 4, "nonzero": 13, "clear_bit": 3, "rshift_asm": 2,
               "mask_step": 6, "offset_rescale": 1, "dense_z_row": 13, "dense_z_in": 3, "dense_z_group": 4,
               "dense_z_frame": 1, "fixed": 61, "proto_reg": 21, "proto_reg_reach_low": 1, "reach_index_reg": 1,
               "dist_step": 3, "stream_projection": 1, "dense_c_project": 1, "c_bitmap_row": 67, "c_bitmap_byte": 14,
               "c_bitmap_bit": 10, "c_bitmap_nonzero": 17, "c_rows_project": 1}


def synthetic_model(d: int, D: int, m: int, L: int, density: float, table_size: int, proj_shift: int,
                    *rest) -> IntProtoNN:
    *options, rng = rest
    gamma = options[0] if options else 0.05  # small gamma: a table reaching past 0xFFFF
    W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < density)
    B = rng.integers(-60, 61, size=(m, D))
    Z = rng.integers(-127, 128, size=(m, L))
    table, shift = kernel_table(gamma=gamma, b_scale=1.0, size=table_size)
    stage = InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32)
    return IntProtoNN(list(range(L)), stage, W.astype(np.int8), B.astype(np.int8), Z.astype(np.int8),
                      proj_shift=proj_shift, table=table, table_shift=shift, scales={})


def measure(model: IntProtoNN, workdir: Path, rng) -> float:
    write_sources(model, workdir, "synthetic", 0, 1 << 20)
    ini = render_platformio_ini(load_board("uno"))
    if model.n_features > 180:  # the raw-input frame buffer would exceed 1 KB
        ini = ini.replace("-DTP_SIMULATED=1", "-DTP_SIMULATED=1 -DTP_NO_RAW_INPUT=1")
    (workdir / "platformio.ini").write_text(ini)
    try:
        result = build_project(workdir)
    except Exception:  # PlatformIO's shared home can be mid-update by a parallel build: one retry
        result = build_project(workdir)
    cycles = []
    with SimulatedUno(result.elf) as uno, open_device(uno.port) as client:
        for _ in range(N_VECTORS):
            cycles.append(client.predict(rng.integers(-127, 128, size=model.n_features).astype(np.int8)).cycles)
    return float(np.mean(cycles))


def flynn_model_dirs(model_dirs: list[Path], n_vectors: int = 40) -> list[tuple[str, object, np.ndarray]]:
    """(label, model, int8 vectors) of compiled FlyNN model directories (their held-out vectors)."""
    from tinyproto.core.modeldir import load_model_dir

    out = []
    for path in model_dirs:
        model_dir = load_model_dir(path)
        out.append((path.name, families.load_int_model(model_dir), model_dir.vectors().xq[:n_vectors]))
    return out


FLYNN_CALIBRATION_SEED = 1000  # the benchmark (tools/bench_costmodel.py) draws with seed 0: other shapes


def flynn_random_shapes(n: int, seed: int = FLYNN_CALIBRATION_SEED) -> list[tuple[str, object, np.ndarray]]:
    """n FlyNN shapes drawn as tools/bench_costmodel.py draws them (another seed), with 6 random vectors each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import draw_flynn, draw_width, fits

    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        spec, model = draw_flynn(rng, draw_width(rng))
        if not fits(model, load_board("uno")):
            continue
        xq = rng.integers(-127, 128, size=(6, model.n_features)).astype(np.int8)
        label = f"fly{len(out):02d}-d{model.n_features}-{spec['layout']}-m{spec['m']}-s{spec['s']}-r{spec['rho']}" \
                f"-b{spec['bits']}-L{spec['L']}"
        out.append((label, model, xq))
    return out


WIDE_STORED_SEED = 2000
WIDE_STORED_TERMS = ("wide_stored_index", "wide_stored_pair", "wide_stored_mirror")


def fit_on_drawn(kind: str, n: int, seed: int, select, table: dict, free: tuple, terms_of,
                 cache: Path | None) -> None:
    """Fit the constants `free` of a family's cost table, every other one held, on n shapes drawn by the
    benchmark's drawer (another seed than the benchmark's 0) that `select` keeps, each measured as the benchmark
    measures: its GPIOR0 spans over 32 random vectors, less the device app's judge stage. Prints the constants
    and each shape's error with the current and with the fitted values."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import DRAW, draw_width, fits, judge_stage_cycles, measure, streams_of

    rng = np.random.default_rng(seed)
    shapes = []
    while len(shapes) < n:
        spec, model = DRAW[kind](rng, draw_width(rng))
        if select(model) and fits(model, load_board("uno")):
            shapes.append((f"{kind[:2]}{len(shapes):02d}-{model_hash_hex(model)}", spec, model,
                           int(rng.integers(0, 2**31))))
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    measured, rows, held = [], [], []
    for name, spec, model, xseed in shapes:
        path = f"judge-{'streamed' if streams_of(model) else 'buffered'}"
        if path not in done:
            with tempfile.TemporaryDirectory() as tmp:
                done[path] = judge_stage_cycles(model, "uno", Path(tmp))
        if name not in done:
            with tempfile.TemporaryDirectory() as tmp:
                done[name] = measure({"model": model, "xseed": xseed, "board": "uno", "name": name}, Path(tmp) / "p")
            if cache is not None:
                cache.write_text(json.dumps(done, indent=0))
        terms = terms_of(model)
        measured.append(float(np.mean(done[name]["cycles"])) - done[path])
        rows.append([terms.get(t, 0) for t in free])
        held.append(sum(c * table[t] for t, c in terms.items() if t not in free))
    b, A, o = np.array(measured), np.array(rows, dtype=float), np.array(held)
    values, _ = nnls(A / b[:, None], (b - o) / b)
    print("\n".join(f'    "{t}": {v:.1f},' for t, v in zip(free, values)))
    now = A @ np.array([table[t] for t in free]) + o
    fitted = A @ np.round(values) + o
    print(f"{'shape':<22}{'d':>5}  {'layout':<18}{'size':<30}{'measured':>10}{'current %':>10}{'fitted %':>10}")
    for (name, spec, model, _), meas, cur, fit in zip(shapes, b, now, fitted):
        size = " ".join(f"{k}={v}" for k, v in spec.items() if k != "layout")
        print(f"{name:<22}{model.n_features:>5}  {spec['layout']:<18}{size:<30}{meas:>10.0f}"
              f"{100 * (cur - meas) / meas:>+10.2f}{100 * (fit - meas) / meas:>+10.2f}")
    for label, pred in (("current", now), ("fitted", fitted)):
        err = np.abs(pred - b) / b
        print(f"{label}: {int(np.sum(err <= 0.03))} of {n} within 3 %, max {100 * err.max():.2f} %")


def calibrate_flynn_wide_stored(n: int, cache: Path | None) -> None:
    """--flynn-wide-stored N: FLY_CYCLES' wide stored-M terms (over 256 hash inputs, M's 16-bit indices in flash),
    the rest held, on N such shapes (seed 2000)."""
    from tinyproto.families.flynn import cost

    fit_on_drawn("flynn", n, WIDE_STORED_SEED, lambda m: m.store_M and m.n_hash_inputs > cost.WIDE_INPUTS,
                 cost.FLY_CYCLES, WIDE_STORED_TERMS, cost.flynn_cost_terms, cache)


WIDE_SEEDED_SEED = 6000


def calibrate_flynn_wide_seeded(n: int, cache: Path | None) -> None:
    """--flynn-wide-seeded N: WIDE_SEEDED_CYCLES, the projection of a seeded M over more than 256 hash inputs
    (tp_flynn_project with its __umulhisi3 calls, less the lookup's), for each layout avr-gcc compiles it in (with or
    without the sign split, s = 1, 2 or more; a power-of-two input count keeps FLY_CYCLES' terms). N shapes of each
    layout drawn by the benchmark's drawer (seed 6000, 200 .. 784 features), 8 random vectors each on the profiling
    simulator, the heap's steps counted on those very vectors; non-negative least squares on relative errors. Then
    N more shapes of each (seed 6001) are predicted with the fitted table: the held-out error."""
    from tinyproto.families.flynn import cost

    fit_wide_layouts("ws", WIDE_SEEDED_SEED, n, cache, cost.WIDE_SEEDED_CYCLES, cost.WIDE_SEEDED_UNITS,
                     cost.wide_seeded_term, lambda m: (not m.store_M and m.n_hash_inputs & (m.n_hash_inputs - 1)))


def calibrate_flynn_wide_stored_layouts(n: int, cache: Path | None) -> None:
    """--flynn-wide-stored-layouts N: WIDE_STORED_CYCLES, the projection of a stored M over more than 256 hash
    inputs for each layout (with or without the sign split, s = 1, 2 or more), as --flynn-wide-seeded fits its
    table: N shapes of each layout (seed 2100), N more held out (seed 2101)."""
    from tinyproto.families.flynn import cost

    fit_wide_layouts("wst", WIDE_STORED_LAYOUT_SEED, n, cache, cost.WIDE_STORED_CYCLES, cost.WIDE_STORED_UNITS,
                     cost.wide_stored_term, lambda m: m.store_M)


WIDE_STORED_LAYOUT_SEED = 2100


def fit_wide_layouts(tag: str, seed0: int, n: int, cache: Path | None, layouts, units, term, select) -> None:
    """A table of cycles per unit for each layout of a wide (over 256 hash inputs) FlyNN projection that `select`
    keeps: N shapes of each layout drawn by the benchmark's drawer (seed0, 200 .. 784 features), 8 random vectors
    each on the profiling simulator, tp_flynn_project with its __umulhisi3 calls less the lookup's, the heap's steps
    counted on those very vectors; non-negative least squares on relative errors. Then N more shapes of each (seed0
    + 1) are predicted with the fitted table: the held-out error."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import DRAW, draw_width, fits
    from profile_firmware import build_profiling_simulator

    from tinyproto.families.flynn import cost

    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}

    def measured_rows(layout, seed):
        rng = np.random.default_rng(seed)
        shapes = []
        while len(shapes) < n:
            spec, model = DRAW["flynn"](rng, draw_width(rng, (200, 784)))
            if (select(model) and model.n_hash_inputs > cost.WIDE_INPUTS
                    and cost.wide_seeded_layout(model.sign_split, model.indices.shape[1]) == layout
                    and fits(model, load_board("uno"))):
                shapes.append((f"{tag}{seed}-{model_hash_hex(model)}", spec, model, int(rng.integers(0, 2**31))))
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            simulator = None
            for name, spec, model, xseed in shapes:
                xq = np.random.default_rng(xseed).integers(-127, 128, size=(8, model.n_features)).astype(np.int8)
                if name not in done:
                    simulator = simulator or build_profiling_simulator(Path(tmp))
                    done[name] = profile_shape(model, xq, "uno", Path(tmp) / name, simulator)["functions"]
                    if cache is not None:
                        cache.write_text(json.dumps(done, indent=0))
                f = done[name]
                L, b = model.n_classes, model.bits
                lookup_mul = model.n_winners * (cost.LOOKUP_CYCLES[(L, b)][2] if (L, b) in cost.LOOKUP_CYCLES
                                                else 22 * bool((L * b) & (L * b - 1)))
                cycles = f.get("tp_flynn_project", 0.0) + f.get("__umulhisi3", 0.0) - lookup_mul
                terms = cost.flynn_cost_terms(model, x=xq)
                rows.append((name, spec, [terms[term(layout, t)] for t in units], cycles))
        return rows

    print(f"{tag.upper()}_CYCLES = {{  # (sign split, s class): " + ", ".join(units))
    report = []
    for layout in layouts:
        fit_rows = measured_rows(layout, seed0)
        A = np.array([r[2] for r in fit_rows])
        b = np.array([r[3] for r in fit_rows])
        values, _ = nnls(A / b[:, None], np.ones_like(b))
        values = np.round(values, 1)
        print(f"    {layout}: ({', '.join(f'{v:g}' for v in values)}),", flush=True)
        for seed, rows in (("fit", fit_rows), ("held out", measured_rows(layout, seed0 + 1))):
            A = np.array([r[2] for r in rows])
            b = np.array([r[3] for r in rows])
            err = 100 * (A @ values - b) / b
            report.append(f"{layout} {seed}: {len(b)} shapes, max |err| {np.abs(err).max():.2f} %")
    print("}")
    print("\n".join(report))


DENSE_ROWS_SEED = 3000
HEAP_SEED = 4000
# The FlyNN terms around the top-rho heap that are not hand counts: the caller's side of a sift (the row's key, the
# call, the floor it returns), the first rho rows appended, and the fixed rest of an inference.
HEAP_CALLER_TERMS = ("fixed", "heap_fill", "heap_call_seeded", "heap_call_stored")


# Which firmware functions each FlyNN term's work runs in (avr-gcc inlines tp_flynn_block / tp_flynn_pattern into
# tp_flynn_project, tp_flynn_fill into tp_predict); the rest of tp_predict is the lookup and the fixed work.
FLY_FUNCTIONS = {"project": "tp_flynn_project", "sift": "tp_flynn_sift", "heapify": "tp_flynn_heapify",
                 "lookup": "tp_flynn_lookup"}
FLY_FUNCTION_HELD = ("sift", "sift_level_pair", "sift_level_left", "sift_right", "sift_stop_pair", "sift_stop_left",
                     "sift_stop_leaf", "sift_wide_compare", "heapify", "heapify_fixed")


def profile_shape(model, xq: np.ndarray, board: str, workdir: Path, simulator: Path, per_vector: int = 1) -> dict:
    """Per vector of xq: the cycles of every firmware function (the profiling simuno, tools/profile_firmware.py)
    and the timed call's GPIOR0 span, less the empty call's (bench_costmodel.marker_cycles, per_vector timed calls
    a vector: its chunks for a streamed model); every score checked."""
    import bisect
    import collections

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import build, marker_cycles
    from bench_latency import firmware_ring
    from profile_firmware import ASLEEP, functions_of, profiling

    elf = build(model, workdir, board)
    profile = workdir / "profile.txt"
    ring = firmware_ring(model, load_board(board))
    with profiling(simulator, profile), SimulatedUno(elf) as uno, open_device(uno.port, rx_ring=ring) as client:
        client.hello()
        answers = [client.predict(x) for x in xq]
        markers = uno.markers()
    if not np.array_equal(np.array([a.scores for a in answers]), model.scores(xq)):
        raise AssertionError("device scores differ from the numpy reference")
    addresses, names = functions_of(elf)
    cycles = collections.Counter()
    for line in profile.read_text().splitlines():
        pc, _, spent = (int(field, 16) if k == 0 else int(field) for k, field in enumerate(line.split()))
        if pc != ASLEEP:
            cycles[names[bisect.bisect_right(addresses, pc) - 1]] += spent
    return {"functions": {k: v / len(xq) for k, v in cycles.items()},
            "cycles": float(np.mean(marker_cycles(markers, per_vector)))}


def calibrate_flynn_functions(n: int, cache: Path | None) -> None:
    """--flynn-functions N: FLY_CYCLES function by function on N FlyNN shapes drawn with seed 4000 (the benchmark's
    drawer): each shape's 32 random vectors run on the profiling simulator, which gives the cycles of
    tp_flynn_project (the hashing and the caller's side of the heap), tp_flynn_sift and tp_flynn_heapify (hand
    counts, checked here) and the rest of the timed call (less the judge stage: tp_predict's input copy, the
    lookup, the fixed work). The heap's steps are counted on the very vectors measured. Each group's terms are
    fitted by non-negative least squares on relative errors, the hand counts (FLY_HELD) held."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import DRAW, draw_width, fits
    from profile_firmware import build_profiling_simulator

    from tinyproto.families.flynn import cost

    rng = np.random.default_rng(HEAP_SEED)
    shapes = []
    while len(shapes) < n:
        spec, model = DRAW["flynn"](rng, draw_width(rng))
        if fits(model, load_board("uno")):
            shapes.append((f"fl{len(shapes):02d}-{model_hash_hex(model)}", spec, model, int(rng.integers(0, 2**31))))
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    judge = 30  # the device app's judge stage, buffered (tools/bench_costmodel.py measures it)
    groups = {"project": [], "sift": [], "heapify": [], "lookup": [], "rest": []}
    with tempfile.TemporaryDirectory() as tmp:
        simulator = None
        for name, spec, model, xseed in shapes:
            xq = np.random.default_rng(xseed).integers(-127, 128, size=(32, model.n_features)).astype(np.int8)
            if name not in done:
                simulator = simulator or build_profiling_simulator(Path(tmp))
                done[name] = profile_shape(model, xq, "uno", Path(tmp) / name, simulator)
                if cache is not None:
                    cache.write_text(json.dumps(done, indent=0))
                print(name, round(done[name]["cycles"]), flush=True)
            functions = done[name]["functions"]
            measured = {k: functions.get(f, 0.0) for k, f in FLY_FUNCTIONS.items()}
            # libgcc's 16x16 -> 32-bit multiply (22 cycles with its ret) serves the lookup's row offset where avr-gcc
            # multiplies (LOOKUP_CYCLES says where), and a wide seeded M's proposal map: the rest is the projection's
            L, b = model.n_classes, model.bits
            lookup_mul = model.n_winners * (cost.LOOKUP_CYCLES[(L, b)][2] if (L, b) in cost.LOOKUP_CYCLES
                                            else 22 * bool((L * b) & (L * b - 1)))
            measured["project"] += functions.get("__umulhisi3", 0.0) - lookup_mul
            measured["lookup"] += lookup_mul
            # the rest of the timed call, less the Timer1 overflow interrupts among its cycles (40 each)
            overflows = done[name]["cycles"] // 65536 * 40
            measured["rest"] = done[name]["cycles"] - judge - overflows - sum(measured.values())
            terms = cost.flynn_cost_terms(model, x=xq)
            # the lookup's terms by its parts (what an (L, b) beyond LOOKUP_CYCLES takes), fitted on every shape
            terms = {**{k: 0.0 for k in cost.FLY_STAGES["lookup"]}, **{k: v for k, v in terms.items()
                     if k not in cost.FLY_STAGES["lookup"]}, **cost.lookup_terms(L, b, model.n_winners, table=False),
                     "class_argmin": terms["class_argmin"]}
            for group, cycles in measured.items():
                groups[group].append((name, spec, model, cycles, terms))
    stage_of = {t: g for g, names in cost.FLY_STAGES.items() for t in names}
    group_terms = {
        "project": [t for t in cost.FLY_CYCLES if stage_of.get(t) == "hashing"],
        "sift": [t for t in FLY_FUNCTION_HELD if t.startswith("sift")],
        "heapify": ["heapify", "heapify_fixed"],
        "lookup": [t for t in cost.FLY_STAGES["lookup"] if t != "class_argmin"],
    }
    group_terms["rest"] = [t for t in cost.FLY_CYCLES if not any(t in v for v in group_terms.values())]
    for group, names in group_terms.items():
        rows = groups[group]
        b = np.array([r[3] for r in rows])
        A = np.array([[r[4].get(t, 0.0) for t in names] for r in rows])
        held = [i for i, t in enumerate(names) if t in FLY_FUNCTION_HELD or t in cost.FLY_HELD]
        free = [i for i in range(len(names)) if i not in held]
        values = np.array([float(cost.FLY_CYCLES[t]) for t in names])
        if free:
            used = [i for i in free if A[:, i].any()]
            rest = b - A[:, held] @ values[held]
            values[used], _ = nnls(A[:, used] / b[:, None], rest / b)
        now = A @ np.array([float(cost.FLY_CYCLES[t]) for t in names])
        fitted = A @ np.round(values, 1)
        err_now, err_fit = (100 * (now - b) / b), (100 * (fitted - b) / b)
        print(f"\n{group}: {len(b)} shapes, current max |err| {np.abs(err_now).max():.2f} %, "
              f"fitted {np.abs(err_fit).max():.2f} %")
        for i, t in enumerate(names):
            if A[:, i].any():
                print(f'    "{t}": {values[i]:.1f},{"  (held)" if i in held else ""}')
        worst = np.argsort(-np.abs(err_fit))[:5]
        for k in worst:
            r = rows[k]
            print(f"    {r[0]:<16}{' '.join(f'{a}={v}' for a, v in r[1].items()):<52}{b[k]:>9.0f}"
                  f"{err_now[k]:>+8.2f}{err_fit[k]:>+8.2f}")


LOOKUP_SEED = 4100


def _profiled_lookups(classes, bits, m: int, n_vectors: int, cache: Path | None):
    """(L, b, {rho: [tp_flynn_lookup's cycles, __umulhisi3's]}) for every L of classes and b of bits, rho = 8 and
    64: a narrow stored M of m random rows over 200 inputs, N random vectors, on the profiling simulator; each shape
    profiled once (cache: a JSON file kept between runs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_firmware import build_profiling_simulator

    from tinyproto.families.flynn.quantize import IntFlyNN

    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    d = 200
    rng = np.random.default_rng(LOOKUP_SEED)
    indices = rng.integers(0, d, size=(m, 1))
    xq = rng.integers(-127, 128, size=(n_vectors, d)).astype(np.int8)
    with tempfile.TemporaryDirectory() as tmp:
        simulator = None
        for L in classes:
            for b in bits:
                cycles = {}
                for rho in (8, 64):
                    key = f"L{L}-b{b}-rho{rho}-d{d}-m{m}-{n_vectors}"
                    if key not in done:
                        simulator = simulator or build_profiling_simulator(Path(tmp))
                        model = IntFlyNN(list(range(L)), InputStage.shared(127.5, 1.0, d), False, 1, indices, rho, b,
                                         rng.integers(0, 1 << b, size=(L, m)), 0.5 if b > 1 else 1.0, True)
                        functions = profile_shape(model, xq, "uno", Path(tmp) / key, simulator)["functions"]
                        done[key] = [functions["tp_flynn_lookup"], functions.get("__umulhisi3", 0.0)]
                        if cache is not None:
                            cache.write_text(json.dumps(done, indent=0))
                    cycles[rho] = done[key]
                yield L, b, cycles


def calibrate_flynn_lookup(n_vectors: int, cache: Path | None) -> None:
    """--flynn-lookup N: tp_flynn_lookup's cycles for each (classes, count bits) of LOOKUP_CYCLES' range, read off
    the profiling simulator. Its code is a function of L and b alone (rho is the loop's bound, M the filters'
    address: tests/test_costmodel.py), so two builds of a narrow stored M (no other caller of __umulhisi3, which
    serves the row offset when avr-gcc multiplies) with rho = 8 and 64 on N random vectors give its cycles once and
    per winner (the winners' bit offsets (j L b) mod 8 as random rows give them); prints LOOKUP_CYCLES."""
    from tinyproto.families.flynn.cost import LOOKUP_BITS, LOOKUP_CLASSES

    out = {}
    # m = 512: few ties between rows, so the winners' rows, and their bit offsets, are as random as a model's
    for L, b, cycles in _profiled_lookups(LOOKUP_CLASSES, LOOKUP_BITS, 512, n_vectors, cache):
        per_winner = (sum(cycles[64]) - sum(cycles[8])) / 56
        out[(L, b)] = (round(sum(cycles[8]) - 8 * per_winner, 1), round(per_winner, 2), round(cycles[64][1] / 64, 2))
        print(L, b, out[(L, b)], flush=True)
    print("LOOKUP_CYCLES = {")
    for (L, b), values in out.items():
        print(f"    ({L}, {b}): {values},")
    print("}")


LOOKUP_LAYOUT_CLASSES = (11, 12, 13, 16, 20, 24, 32, 40, 61, 64, 100, 120, 128, 136, 200)


def calibrate_flynn_lookup_layouts(n_vectors: int, cache: Path | None) -> None:
    """--flynn-lookup-layouts N: LOOKUP_LAYOUTS' cycles (tp_flynn_lookup beyond LOOKUP_CYCLES' ten classes), read
    off the profiling simulator as --flynn-lookup does (rho = 8 and 64, a narrow stored M of 128 rows, N random
    vectors) for 11 to 200 classes and 1 to 4 count bits: per layout, the line W + C L through the cycles per winner
    less the hand-counted refills and shifts (LOOKUP_REFILL, LOOKUP_ALIGN_BIT), and O + P L through the cycles once
    (128 classes, a layout of one L: W and O alone). Prints LOOKUP_LAYOUTS and each shape's error against the cost
    model."""
    from tinyproto.families.flynn import cost

    points: dict[tuple, list] = {}
    for L, b, functions in _profiled_lookups(LOOKUP_LAYOUT_CLASSES, cost.LOOKUP_BITS, 128, n_vectors, cache):
        cycles = {rho: sum(pair) for rho, pair in functions.items()}
        per_winner = (cycles[64] - cycles[8]) / 56
        held = cost.lookup_per_winner(L, b, 0.0, 0.0)
        points.setdefault(cost.lookup_layout(L, b), []).append((L, b, cycles[8] - 8 * per_winner, per_winner,
                                                               per_winner - held))
    print("LOOKUP_LAYOUTS = {  # (bits, shift, aligned): (W, C, O, P)")
    for layout, rows in sorted(points.items()):
        ls = np.array([[1.0, r[0]] for r in rows]) if len(rows) > 1 else np.array([[1.0, 0.0]])  # 128: one L
        w, c = np.linalg.lstsq(ls, np.array([r[4] for r in rows]), rcond=None)[0]
        o, p = np.linalg.lstsq(ls, np.array([r[2] for r in rows]), rcond=None)[0]
        print(f"    {layout}: ({w:.2f}, {c:.2f}, {o:.1f}, {p:.2f}),  # L = {[r[0] for r in rows]}")
    for rows in points.values():
        for L, b, once, per_winner, _ in rows:
            for rho in (8, 64):
                predicted = sum(n * cost.FLY_CYCLES[k] for k, n in cost.lookup_terms(L, b, rho).items())
                measured = once + rho * per_winner
                print(f"L={L} b={b} rho={rho}: measured {measured:.0f}, predicted {predicted:.0f} "
                      f"({100 * (predicted / measured - 1):+.2f} %)")


# ---------------------------------------------------------------- FlyNN's narrow seeded scan, walked in its code

AVR_CYCLES = {"ldd": 2, "std": 2, "st": 2, "ld": 2, "mul": 2, "sbiw": 2, "adiw": 2, "rjmp": 2, "call": 4}


def avr_listing(elf: Path, function: str) -> dict[int, tuple]:
    """avr-objdump of one function: address -> (mnemonic, operands, bytes, branch target or None)."""
    import re
    import subprocess

    out = subprocess.run(["avr-objdump", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    listing, inside = {}, False
    for line in out.splitlines():
        head = re.match(r"^([0-9a-f]+) <(.*)>:", line)
        if head:
            inside = head.group(2) == function
            continue
        row = re.match(r"^\s*([0-9a-f]+):\s+((?:[0-9a-f]{2} )+)\s*(\S+)\s*([^;]*)", line)
        if inside and row:
            target = re.search(r"; 0x([0-9a-f]+)", line)
            listing[int(row.group(1), 16)] = (row.group(3), [o.strip() for o in row.group(4).split(",") if o.strip()],
                                              len(row.group(2).split()), int(target.group(1), 16) if target else None)
    return listing


def offer_walk_bounds(listing: dict) -> tuple[int, int]:
    """A narrow seeded tp_flynn_project's group offers: from its rows-left test (cpi 4) to its loop step (the two
    loads before the test of more than 4 rows left)."""
    addresses = sorted(listing)
    start = next(a for a in addresses if listing[a][0] == "cpi" and int(listing[a][1][1], 0) == 4)
    end = next(k for k, a in enumerate(addresses) if listing[a][0] in ("cpi", "sbiw") and int(listing[a][1][1], 0) == 5)
    return start, addresses[end - 2]


def walk_offers(listing: dict, start: int, stop: int, outcomes: str, rho: int, left: int = 100) -> int:
    """Cycles of one group's path from start to stop (callees aside) when its rows' outcomes are `outcomes` (S, R,
    A, H: cost.OFFER_OUTCOMES) and `left` rows are left. Branches are decided by what they test: a compare with
    r24 (the floor, tp_flynn_sift's return) is the next row's floor test; an immediate 2..5 against an unknown
    register, the rows left; rho - 1 or rho against an unknown register, the heap's fill count (an equality: it is
    full now, H; an ordering: it was full, R); registers loaded with constants are followed."""
    at, cycles, row, known, test, steps = start, 0, -1, {}, None, 0
    while at != stop:
        steps += 1
        if steps > 5000:
            raise RuntimeError("the walk does not reach the loop step")
        op, args, size, target = listing[at]
        after = at + size
        if op == "ldi":
            known[args[0]] = int(args[1], 0)
        elif op == "mov" and args[1] in known:
            known[args[0]] = known[args[1]]
        elif op in ("cp", "cpi", "cpse"):
            x, y = args
            xv, yv = known.get(x), int(y, 0) if op == "cpi" else known.get(y)
            if op == "cp" and x == "r24":
                row += 1
                test = {"lt": row < len(outcomes) and outcomes[row] != "S"}  # floor < sum
            elif op == "cpi" and xv is None and yv in (2, 3, 4, 5):
                test = {"lt": left < yv, "eq": left == yv}
            elif (xv is None) != (yv is None) and (xv if yv is None else yv) in (rho - 1, rho):
                k = xv if yv is None else yv
                if op == "cpse" or listing[after][0] in ("breq", "brne"):
                    test = {"eq": outcomes[row] == "H"}
                else:  # filled < K, or K < filled
                    test = {"lt": outcomes[row] != "R" if xv is None else outcomes[row] == "R"}
                    if k != (rho if xv is None else rho - 1):
                        raise RuntimeError(f"an ordering with {k} at {at:x}")
            elif xv is not None and yv is not None:
                test = {"lt": xv < yv, "eq": xv == yv}
            else:
                raise RuntimeError(f"a compare the walk does not know at {at:x}: {op} {args}")
            if op == "cpse":
                skip = test["eq"]
                cycles += 1 + (listing[after][2] // 2 if skip else 0)
                at = after + listing[after][2] if skip else after
                continue
        elif args and args[0] in known and op not in ("cpc", "st", "std", "push"):
            del known[args[0]]
        if op in ("brcs", "brlo", "brcc", "brsh", "breq", "brne"):
            taken = {"brcs": test.get("lt"), "brlo": test.get("lt"), "breq": test.get("eq")}.get(op)
            if taken is None:
                taken = {"brcc": test.get("lt"), "brsh": test.get("lt"), "brne": test.get("eq")}[op]
                if taken is None:
                    raise RuntimeError(f"{op} after another kind of test at {at:x}")
                taken = not taken
            cycles += 2 if taken else 1
            at = target if taken else after
            continue
        if op in ("ret", "reti", "ijmp", "brlt", "brge", "brmi", "brpl"):
            raise RuntimeError(f"{op} at {at:x}")
        cycles += AVR_CYCLES.get(op, 1)
        at = target if op == "rjmp" else after
    return cycles


def calibrate_flynn_seeded_scan() -> None:
    """--flynn-seeded-scan: a narrow seeded M's tp_flynn_project compiled for M = 228, 229, 230 and 231 (its
    layouts by M mod 4) over 20 hash inputs, rho = 32, and each group's offer cycles walked in the code for every
    outcome tuple, and for the last group's rows left; compared with cost.SEEDED_OFFER_CYCLES and SEEDED_LAST_*."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import build

    from tinyproto.families.flynn import cost
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.seeded_index import seeded_indices

    rng, rho, differ = np.random.default_rng(0), 32, 0
    with tempfile.TemporaryDirectory() as tmp:
        for m in (228, 229, 230, 231):
            model = IntFlyNN([0, 1, 2], InputStage.shared(127.5, 1.0, 10), True, 11, seeded_indices(11, m, 1, 20), rho,
                             2, rng.integers(0, 4, size=(3, m)), 0.5, False)
            listing = avr_listing(build(model, Path(tmp) / f"m{m}", "uno"), "tp_flynn_project")
            start, stop = offer_walk_bounds(listing)
            walked = tuple(walk_offers(listing, start, stop, p, rho) for p in cost.SEEDED_OFFER_PATTERNS)
            left = m % 4 or 4
            last = {p: walk_offers(listing, start, stop, p, rho, left) for p in cost.SEEDED_OFFER_PATTERNS}
            layout = cost.seeded_layout(m)
            table = dict(zip(cost.SEEDED_OFFER_PATTERNS, cost.SEEDED_OFFER_CYCLES[layout]))
            if left == 1:
                held = {p: cost.SEEDED_LAST_ONE[p] for p in cost.SEEDED_LAST_ONE}
                last = {p: last[p] for p in held}
            else:
                held = {p: table[p] + cost.SEEDED_LAST_EXTRA[layout] for p in table}
            same = walked == cost.SEEDED_OFFER_CYCLES[layout] and last == held
            differ += not same
            print(f"M = {m} (layout {layout}): {'as held' if same else 'DIFFERENT'}")
            print("    offers", walked)
            print("    last group", last)
    print("every layout as held" if not differ else f"{differ} layouts differ from cost.py")


KERNELS_SEED = 5000
PN_KERNEL_TERMS = ("kernels_frame", "kernels_proto", "dist_term", "dist_step", "fixed_reg", "proto_reg",
                   "proto_reg_reach_low", "reach_index_reg", "dist_term_reg")
PN_SCORE_TERMS = ("class", "score_group", "score_load", "score_step", "score_term")


def calibrate_protonn_functions(n: int, cache: Path | None) -> None:
    """--protonn-functions N: PN_CYCLES and PN_STREAM_CYCLES function by function on N ProtoNN shapes drawn with
    seed 5000 (the benchmark's drawer; those that run the assembly distances and scores, D <= 255 and m <= 256):
    each shape's 32 random vectors on the profiling simulator, which gives tp_protonn_kernels' cycles (the
    distance terms), tp_protonn_scores' (the score terms) and the rest of the timed call less the judge stage (the
    projection and the fixed work, every chunk's for a streamed W). Each group's terms are fitted by non-negative
    least squares on relative errors, the hand counts (HAND_COUNTS) held."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import DRAW, draw_width, fits, streams_of
    from profile_firmware import build_profiling_simulator

    from tinyproto.core.wire import n_chunks
    from tinyproto.families.protonn import cost

    rng = np.random.default_rng(KERNELS_SEED)
    shapes = []
    while len(shapes) < n:
        spec, model = DRAW["protonn"](rng, draw_width(rng))
        if cost.protonn_uses_asm(model) and fits(model, load_board("uno")):
            shapes.append((f"pn{len(shapes):02d}-{model_hash_hex(model)}", spec, model, int(rng.integers(0, 2**31))))
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    table = {**cost.PN_CYCLES, **cost.PN_STREAM_CYCLES, **cost.PN_C_ROWS_CYCLES}
    groups = {"kernels": PN_KERNEL_TERMS, "scores": PN_SCORE_TERMS,
              "rest": tuple(t for t in table if t not in PN_KERNEL_TERMS + PN_SCORE_TERMS)}
    data = {g: ([], []) for g in groups}
    with tempfile.TemporaryDirectory() as tmp:
        simulator = None
        for name, spec, model, xseed in shapes:
            if name not in done:
                xq = np.random.default_rng(xseed).integers(-127, 128, size=(32, model.n_features)).astype(np.int8)
                simulator = simulator or build_profiling_simulator(Path(tmp))
                streams = streams_of(model)
                done[name] = profile_shape(model, xq, "uno", Path(tmp) / name, simulator,
                                           n_chunks(model.n_features) if streams else 1)
                if cache is not None:
                    cache.write_text(json.dumps(done, indent=0))
            functions = done[name]["functions"]
            judge = 27 if streams_of(model) else 30  # the device app's judge stage (tools/bench_costmodel.py)
            measured = {"kernels": functions.get("tp_protonn_kernels", 0.0),
                        "scores": functions.get("tp_protonn_scores", 0.0)}
            measured["rest"] = done[name]["cycles"] - judge - measured["kernels"] - measured["scores"]
            terms = cost.protonn_cost_terms(model)
            for g, names in groups.items():
                data[g][0].append([terms.get(t, 0) for t in names])
                data[g][1].append(measured[g])
    for g, names in groups.items():
        A, b = np.array(data[g][0], dtype=float), np.array(data[g][1])
        values = np.array([float(table[t]) for t in names])
        free = [i for i, t in enumerate(names) if t not in HAND_COUNTS and A[:, i].any()]
        held = [i for i in range(len(values)) if i not in free]
        values[free], _ = nnls(A[:, free] / b[:, None], (b - A[:, held] @ values[held]) / b)
        now = A @ np.array([float(table[t]) for t in names])
        fitted = A @ np.round(values)
        print(f"\n{g}:")
        print("\n".join(f'    "{t}": {v:.1f},{"" if i in free else "  (held)"}' for i, (t, v) in
                        enumerate(zip(names, values)) if A[:, i].any()))
        for label, pred in (("current", now), ("fitted", fitted)):
            err = 100 * (pred - b) / b
            print(f"{label}: max |err| {np.abs(err).max():.2f} %, "
                  f"within 3 %: {int(np.sum(np.abs(err) <= 3))} of {len(b)}")
            for k in np.argsort(-np.abs(err))[:4]:
                name, spec, *_ = shapes[k]
                print(f"    {name:<16}{' '.join(f'{a}={v}' for a, v in spec.items()):<50}{b[k]:>8.0f}{err[k]:>+8.2f}")


def calibrate_flynn_heap(n: int, cache: Path | None) -> None:
    """--flynn-heap N: FLY_CYCLES' terms around the heap (HEAP_CALLER_TERMS), every other one held (the sift's
    steps are hand counts), on N FlyNN shapes drawn with seed 4000."""
    from tinyproto.families.flynn import cost

    fit_on_drawn("flynn", n, HEAP_SEED, lambda m: True, cost.FLY_CYCLES, HEAP_CALLER_TERMS, cost.flynn_cost_terms,
                 cache)


def calibrate_protonn_dense_rows(n: int, cache: Path | None) -> None:
    """--protonn-dense-rows N: PN_CYCLES' dense_row_c (a dense W's row rescaled in C: the group kernel stores its
    sum, the rescale reads it back), every other constant held, on N dense row-major shapes drawn with seed 3000."""
    from tinyproto.families.protonn import cost

    table = {**cost.PN_CYCLES, **cost.PN_STREAM_CYCLES, **cost.PN_C_ROWS_CYCLES}
    fit_on_drawn("protonn", n, DENSE_ROWS_SEED, lambda m: cost.protonn_uses_asm_rows(m) and m.w_dense, table,
                 ("dense_row_c",), cost.protonn_cost_terms, cache)


def measure_flynn_stages(model, xq: np.ndarray) -> dict:
    """Timer1 cycles (normal build) and the stages (GPIOR0 stage markers, bench build) of one FlyNN model on the
    simulated Uno, every score checked against the numpy reference; avr-gcc builds (tools/bench_costmodel.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import build
    from bench_latency import firmware_ring, run_firmware, stage_spans

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for marked in (False, True):
            elf = build(model, Path(tmp) / ("marked" if marked else "normal"), "uno", stage_markers=marked)
            predictions, markers, _ = run_firmware(elf, xq, None, firmware_ring(model, load_board("uno")))
            scores = np.array([p.scores for p in predictions], dtype=np.int64)
            if not np.array_equal(scores, model.scores(xq)):
                raise AssertionError("device scores differ from the numpy reference")
            if marked:
                per = stage_spans(markers)
                out["stages"] = {k: float(np.mean([p.get(k, 0) for p in per]))
                                 for k in sorted({k for p in per for k in p})}
            else:
                out["cycles_mean"] = float(np.mean([p.cycles for p in predictions]))
    return out


def calibrate_flynn(models: list[tuple[str, object, np.ndarray]], cache: Path | None = None) -> None:
    """FLY_CYCLES from FlyNN models measured stage by stage (GPIOR0 markers) on the simulator."""

    from tinyproto.core.render import model_hash
    from tinyproto.families.flynn.cost import FLY_CYCLES, FLY_HELD, FLY_STAGES, flynn_cost_terms

    names = list(FLY_CYCLES)
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    rows, measured, labels, stages = [], [], [], []
    for label, model, xq in models:
        key = f"{model_hash(model):08X}:{zlib.crc32(xq.tobytes()):08X}"
        if key not in done:
            done[key] = dict(measure_flynn_stages(model, xq), label=label)
            if cache is not None:
                cache.write_text(json.dumps(done, indent=1))
        r = done[key]
        terms = flynn_cost_terms(model)
        rows.append([terms[n] for n in names])
        measured.append(r["cycles_mean"])
        stages.append(r["stages"])
        labels.append(label)
        print(f"{label}: {r['cycles_mean']:.0f} cycles  stages {r['stages']}", flush=True)
    # each stage (GPIOR0 markers) against its own terms (the asm hand counts held), then "fixed" as the mean
    # remainder; terms no calibration model exercises keep their current value
    A = np.array(rows, dtype=float)
    fitted = {n: float(FLY_CYCLES[n]) for n in FLY_HELD}
    for stage, group in FLY_STAGES.items():
        free = [n for n in group if n not in FLY_HELD and A[:, names.index(n)].any()]
        held = [n for n in group if n not in free]
        target = np.array([st[stage] for st in stages], dtype=float)
        target -= sum(A[:, names.index(n)] * (fitted.get(n, FLY_CYCLES[n])) for n in held)
        weight = 1.0 / np.maximum(np.array(measured), 1.0)  # relative errors: small models count as much
        values, _ = nnls(A[:, [names.index(n) for n in free]] * weight[:, None], target * weight)
        fitted.update(zip(free, values))
        fitted.update({n: float(FLY_CYCLES[n]) for n in held if n not in fitted})
    # The normal build's total less the predicted stages: the calls outside the stages, and minus the bench
    # build's marker writes (two per sift, which the stage fits charged to the heap terms): fixed + k x sifts.
    predicted_stages = A @ np.array([fitted.get(n, 0.0) if n != "fixed" else 0.0 for n in names])
    sifts = A[:, names.index("sift")]
    (fitted["fixed"], per_sift), *_ = np.linalg.lstsq(np.column_stack([np.ones(len(sifts)), sifts]) / np.array(
        measured)[:, None], (np.array(measured) - predicted_stages) / np.array(measured), rcond=None)
    for name in ("heap_call_seeded", "heap_call_stored"):  # the sift's steps are hand counts: the caller's side
        fitted[name] += per_sift
    consts = np.array([round(fitted[n]) for n in names], dtype=float)
    print("\nFLY_CYCLES = {")
    for name, value in zip(names, consts):
        print(f'    "{name}": {value:.0f},')
    print("}\n")
    for name, meas, pred in zip(labels, measured, A @ consts):
        print(f"{name:<32}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}")


# (d_hat, kept features, extra nonzeros per feature (None: random density 0.4), shared stage with offset,
#  projection shift, prototypes, classes): column-coded W (one nonzero per feature + extras) and row-major W
# with a projection offset
WIDE_SHAPES = [
    (10, 400, 0.4, True, 12, 40, 10), (12, 300, 0.2, False, 9, 20, 3), (20, 600, 0.5, True, 10, 30, 5),
    (10, 150, 1.0, False, 13, 20, 4), (16, 784, 0.2, True, 6, 20, 3), (8, 400, 0.4, True, 12, 40, 10),
    (6, 300, 0.2, False, 9, 20, 3), (4, 700, 0.1, True, 11, 10, 2), (8, 200, 1.0, False, 8, 30, 4),
    (10, 64, None, True, 10, 40, 10), (5, 20, None, True, 9, 20, 3), (12, 100, None, True, 12, 30, 4),
    (10, 500, 0.0, False, 12, 40, 10), (7, 784, 0.0, True, 12, 30, 10),
    (30, 25, 1.0, False, 8, 6, 2), (40, 60, 0.5, False, 10, 10, 3), (30, 80, 0.3, True, 11, 10, 3),
    (25, 40, 1.0, True, 9, 20, 2), (64, 30, 1.0, False, 12, 8, 2),
]


def wide_model(D: int, d: int, extra, shared: bool, proj_shift: int, m: int, L: int, rng) -> IntProtoNN:
    if extra is None:
        W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < 0.4)
    else:
        W = np.zeros((D, d), dtype=np.int64)
        W[rng.integers(0, D, size=d), np.arange(d)] = rng.integers(1, 128, size=d)
        flat = rng.choice(D * d, size=int(extra * d), replace=False)
        W.flat[flat] = rng.integers(1, 128, size=flat.size) * rng.choice([-1, 1], size=flat.size)
    table, shift = kernel_table(gamma=0.05, b_scale=1.0, size=32)
    stage = (InputStage.shared(127.5, 1.0, d) if shared else
             InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32))
    offset = rng.integers(-300, 300, size=D).astype(np.int16) if shared else None
    return IntProtoNN(list(range(L)), stage, W.astype(np.int8), rng.integers(-60, 61, size=(m, D)).astype(np.int8),
                      rng.integers(-127, 128, size=(m, L)).astype(np.int8), proj_shift=proj_shift, table=table,
                      table_shift=shift, scales={}, offset=offset)


def calibrate_protonn_c(cache: Path | None, n: int = 14, seed: int = 1000) -> None:
    """PN_C_ROWS_CYCLES with the other constants held: ProtoNN shapes drawn as tools/bench_costmodel.py draws them
    (another seed) with a row-major W (dense or bitmap) over 512 .. 784 features."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import draw_protonn, fits

    from tinyproto.families.protonn.cost import PN_C_ROWS_CYCLES, PN_STREAM_CYCLES, predict_cycles

    rng = np.random.default_rng(seed)
    shapes = []
    while len(shapes) < n:
        _, model = draw_protonn(rng, int(rng.integers(512, 785)))
        if model.w_encoding in ("dense", "bitmap") and fits(model, load_board("uno")):
            shapes.append(model)
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    names = list(PN_C_ROWS_CYCLES)
    rows, rest, measured = [], [], []
    for i, model in enumerate(shapes):
        key = model_hash_hex(model)
        if key not in done:
            with tempfile.TemporaryDirectory() as tmp:
                done[key] = measure_vectors(model, shape_vectors(model.n_features, i), Path(tmp) / "p").tolist()
            if cache is not None:
                cache.write_text(json.dumps(done, indent=1))
        cycles = float(np.mean(done[key][:N_RANDOM]))
        terms = protonn_cost_terms(model)
        held = sum(count * {**PN_CYCLES, **PN_STREAM_CYCLES}.get(name, 0) for name, count in terms.items()
                   if name not in PN_C_ROWS_CYCLES)
        rows.append([terms.get(name, 0) for name in names])
        rest.append(held)
        measured.append(cycles)
        print(f"d={model.n_features} D={model.n_components} m={model.n_prototypes} {model.w_encoding}: {cycles:.0f} "
              f"cycles", flush=True)
    A, b, held = np.array(rows, dtype=float), np.array(measured), np.array(rest)
    fitted, _ = nnls(A / b[:, None], (b - held) / b)
    print("\nPN_C_ROWS_CYCLES = {")
    for name, value in zip(names, fitted):
        print(f'    "{name}": {round(value)},')
    print("}\n")
    for model, meas, pred in zip(shapes, b, held + A @ np.round(fitted)):
        print(f"d={model.n_features:<4} D={model.n_components:<3} m={model.n_prototypes:<4}{model.w_encoding:>8}"
              f"{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>+8.2f}{predict_cycles(model)['total']:>10}")


def calibrate_wide() -> None:
    """PN_STREAM_CYCLES' fitted term (offset_row) with every other held: the streamed projection and the offset
    rescale are counted (stream_projection_cycles, offset_rescale_cycles)."""
    from tinyproto.families.protonn.cost import PN_STREAM_CYCLES, predict_cycles

    rng = np.random.default_rng(1)
    names = [name for name in PN_STREAM_CYCLES if name not in HAND_COUNTS]  # the counted units held
    rows, rest, measured, models = [], [], [], []
    for shape in WIDE_SHAPES:
        model = wide_model(*shape, rng)
        with tempfile.TemporaryDirectory() as tmp:
            cycles = measure(model, Path(tmp), rng)
        terms = protonn_cost_terms(model)
        held = sum(count * {**PN_CYCLES, **PN_STREAM_CYCLES}.get(name, 0) for name, count in terms.items()
                   if name not in names)
        rows.append([terms.get(n, 0) for n in names])
        rest.append(held)
        measured.append(cycles)
        models.append(model)
        print(f"shape {shape} ({model.w_encoding}): {cycles:.0f} cycles", flush=True)
    A, b, held = np.array(rows, dtype=float), np.array(measured), np.array(rest, dtype=float)
    weight = 1.0 / b
    fitted, _ = nnls(A * weight[:, None], (b - held) * weight)
    print("\nPN_STREAM_CYCLES = {")
    for name, value in zip(names, fitted):
        print(f'    "{name}": {round(value)},')
    print("}\n")
    for shape, model, meas, pred in zip(WIDE_SHAPES, models, b, held + A @ np.round(fitted)):
        print(f"{str(shape):<40}{model.w_encoding:>12}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}"
              f"{predict_cycles(model)['total']:>10}")


# ================================================================ BNC and Bloom features (--bnc / --bloom)
# Synthetic models of every layout each runtime has (BNC: dense / bitmap / seeded W; Bloom: byte and 16-bit draws),
# narrow (one 64-feature chunk of protocol v2) and wide (several chunks), both input stages (the stage runs
# outside the timed call, so it must not change the cycles: the sweep shows it), measured through the device app
# on the simulated Uno (every score compared with the numpy reference), then each cost model's constants fitted by
# non-negative least squares on relative errors. Measurements are cached in a JSON file (--cache) so a refit does
# not rebuild.

# BNC: (name, d, r, m, classes, density (0: seeded), K (seeded weights per row), stage, kept raw width or 0)
BNC_SHAPES = [
    ("dense-4", 4, 8, 6, 2, 1.0, 0, "feature", 0), ("dense-13", 13, 11, 9, 3, 1.0, 0, "shared", 0),
    ("dense-30", 30, 24, 40, 2, 1.0, 0, "feature", 0), ("dense-64", 64, 32, 30, 10, 1.0, 0, "feature", 0),
    ("dense-48-r48", 48, 48, 184, 7, 1.0, 0, "feature", 0), ("sparse-16", 16, 16, 20, 4, 0.5, 0, "feature", 0),
    ("sparse-64", 64, 64, 30, 10, 0.25, 0, "feature", 0), ("sparse-40-r8", 40, 8, 159, 2, 0.5, 0, "shared", 0),
    ("sparse-64-r24", 64, 24, 60, 10, 0.25, 0, "feature", 0),
    ("sparse-50-r96", 50, 96, 12, 3, 0.125, 0, "feature", 0), ("sparse-33-m300", 33, 40, 300, 5, 0.3, 0, "shared", 0),
    ("seeded-64-K16", 64, 32, 30, 10, 0.0, 16, "feature", 0), ("seeded-19-K8", 19, 64, 40, 7, 0.0, 8, "feature", 0),
    ("seeded-13-K13", 13, 9, 5, 2, 0.0, 13, "shared", 0), ("seeded-50-K12", 50, 24, 20, 4, 0.0, 12, "feature", 0),
    ("seeded-64-K24", 64, 16, 30, 3, 0.0, 24, "feature", 0), ("seeded-40-K8", 40, 16, 12, 3, 0.0, 8, "feature", 0),
    ("seeded-60-K7", 60, 40, 30, 5, 0.0, 7, "shared", 0), ("seeded-32-K5", 32, 8, 9, 2, 0.0, 5, "feature", 0),
    ("dense-8-r16", 8, 16, 10, 2, 1.0, 0, "feature", 0), ("dense-20-r8", 20, 8, 50, 3, 1.0, 0, "shared", 0),
    ("dense-56-r16", 56, 16, 12, 4, 1.0, 0, "feature", 0), ("sparse-24-r32", 24, 32, 15, 3, 0.5, 0, "feature", 0),
    ("sparse-60-m100", 60, 12, 100, 6, 0.3, 0, "shared", 0),
    ("dense-90-r16-m100", 90, 16, 100, 10, 1.0, 0, "feature", 0),
    ("sparse-500-r12", 500, 12, 40, 5, 0.15, 0, "shared", 0),
    ("seeded-640-K10", 640, 40, 30, 10, 0.0, 10, "shared", 0),
    ("seeded-400-K9", 400, 20, 25, 4, 0.0, 9, "feature", 0), ("dense-100", 100, 16, 20, 3, 1.0, 0, "feature", 0),
    ("dense-130-r8", 130, 8, 10, 2, 1.0, 0, "shared", 0), ("dense-200", 200, 24, 15, 4, 1.0, 0, "feature", 0),
    ("dense-784-r8", 784, 8, 30, 10, 1.0, 0, "shared", 0), ("dense-65", 65, 40, 20, 5, 1.0, 0, "feature", 0),
    ("sparse-100", 100, 32, 30, 4, 0.25, 0, "feature", 0), ("sparse-200", 200, 32, 30, 4, 0.25, 0, "feature", 0),
    ("sparse-256", 256, 16, 40, 10, 0.5, 0, "shared", 0), ("sparse-784", 784, 16, 20, 10, 0.05, 0, "shared", 0),
    ("sparse-784-r8", 784, 8, 60, 10, 0.02, 0, "shared", 784), ("sparse-129", 129, 64, 20, 3, 0.1, 0, "feature", 0),
    ("sparse-300-m280", 300, 20, 280, 4, 0.1, 0, "feature", 400), ("sparse-72", 72, 48, 25, 6, 0.3, 0, "feature", 0),
    ("seeded-784-K8", 784, 128, 63, 10, 0.0, 8, "shared", 0),
    ("seeded-784-K16", 784, 64, 40, 10, 0.0, 16, "shared", 0),
    ("seeded-784-K32", 784, 24, 20, 10, 0.0, 32, "shared", 0),
    ("seeded-300-K7", 300, 16, 10, 3, 0.0, 7, "feature", 0),
    ("seeded-256-K16", 256, 96, 41, 10, 0.0, 16, "shared", 784),
    ("seeded-150-K20", 150, 32, 30, 5, 0.0, 20, "feature", 0),
    ("seeded-100-K4", 100, 48, 20, 4, 0.0, 4, "feature", 0),
]
# Bloom: (name, d, k, m, classes, stage, kept raw width or 0)
BLOOM_SHAPES = [
    ("n4-k1-m8", 4, 1, 8, 2, "feature", 0), ("n16-k1-m17", 16, 1, 17, 2, "shared", 0),
    ("n30-k8-m256", 30, 8, 256, 2, "feature", 0), ("n64-k3-m256", 64, 3, 256, 10, "feature", 0),
    ("n64-k2-m100", 64, 2, 100, 10, "shared", 0), ("n40-k7-m120", 40, 7, 120, 6, "feature", 0),
    ("n50-k1-m256", 50, 1, 256, 7, "feature", 0), ("n64-k6-m221", 64, 6, 221, 10, "feature", 0),
    ("n13-k4-m64", 13, 4, 64, 3, "feature", 0), ("n64-k4-m256-L3", 64, 4, 256, 3, "shared", 0),
    ("w100-k3-m256", 100, 3, 256, 10, "feature", 0), ("w128-k2-m200", 128, 2, 200, 5, "feature", 0),
    ("w150-k5-m255", 150, 5, 255, 2, "feature", 0), ("w256-k2-m256", 256, 2, 256, 10, "shared", 0),
    ("w300-k1-m128", 300, 1, 128, 4, "shared", 784), ("w784-k1-m209", 784, 1, 209, 10, "shared", 0),
    ("w784-k2-m256", 784, 2, 256, 10, "shared", 0), ("w500-k4-m256", 500, 4, 256, 3, "feature", 0),
    ("w784-k3-m60", 784, 3, 60, 5, "shared", 0), ("w65-k2-m90", 65, 2, 90, 4, "feature", 0),
    ("x20-k2-m700", 20, 2, 700, 3, "feature", 0), ("x200-k3-m600", 200, 3, 600, 4, "feature", 0),
    ("x64-k3-m300", 64, 3, 300, 10, "feature", 0), ("x50-k1-m400", 50, 1, 400, 3, "feature", 0),
    ("x100-k2-m1000", 100, 2, 1000, 5, "feature", 0), ("x300-k4-m512", 300, 4, 512, 2, "shared", 0),
    ("n32-k5-m160", 32, 5, 160, 4, "feature", 0), ("w200-k8-m256", 200, 8, 256, 10, "feature", 0),
    # long inputs (images, sensor windows of 3 x 300 .. 3 x 3,000 samples): 16 .. 141 chunks, where a chunk's own
    # work (tp_feed_step, tp_stream_feed's frame and set-up) counts apart from the features'
    ("v1000-k1-m256", 1000, 1, 256, 5, "shared", 0), ("v9000-k1-m256", 9000, 1, 256, 5, "shared", 0),
    ("v3000-k2-m200", 3000, 2, 200, 5, "feature", 0), ("v9000-k2-m150", 9000, 2, 150, 3, "shared", 0),
    ("v2000-k4-m256", 2000, 4, 256, 6, "feature", 0), ("v5000-k3-m180", 5000, 3, 180, 5, "shared", 0),
    ("v1500-k6-m256", 1500, 6, 256, 2, "feature", 0), ("v4000-k8-m230", 4000, 8, 230, 4, "shared", 0),
    ("v6000-k1-m120", 6000, 1, 120, 7, "feature", 0),
    # and a few of the smallest (4 .. 8 features, one chunk), whose cycles are mostly the fixed and chunk terms
    ("t5-k1-m12", 5, 1, 12, 5, "feature", 0), ("t6-k2-m20", 6, 2, 20, 3, "shared", 0),
    ("t8-k1-m40", 8, 1, 40, 2, "feature", 0), ("t4-k3-m16", 4, 3, 16, 6, "shared", 0),
    ("w400-k6-m180", 400, 6, 180, 3, "shared", 784), ("n64-k2-m256", 64, 2, 256, 5, "feature", 0),
    ("x400-k2-m700", 400, 2, 700, 3, "feature", 0), ("x100-k3-m1024", 100, 3, 1024, 4, "shared", 0),
]


def _stage(kind: str, d: int, n_raw: int, rng):
    kept = np.sort(rng.choice(n_raw, size=d, replace=False)) if n_raw else None
    if kind == "shared":
        return InputStage.shared(127.5, 127 / 127.5, d, kept=kept, n_inputs=n_raw or None)
    return InputStage.from_standardisation(rng.normal(size=d), rng.uniform(0.5, 2, size=d), 0.03, kept=kept,
                                           n_inputs=n_raw or None)


def bnc_shape_model(d: int, r: int, m: int, L: int, density: float, K: int, stage: str, n_raw: int, seed: int):
    """A valid IntBNC of this shape with random contents (density 0: a seeded W with K weights per row)."""
    from tinyproto.families.bnc.pattern import pattern_mask
    from tinyproto.families.bnc.quantize import IntBNC
    from tinyproto.families.bnc.train import allocate_prototypes

    rng = np.random.default_rng(seed)
    W = rng.integers(-128, 128, size=(r, d))
    pattern_seed = 0
    if K:
        pattern_seed = int(rng.integers(1, 65536))
        W[~pattern_mask(pattern_seed, r, d, K)] = 0
    else:
        W[rng.random((r, d)) > density] = 0
        W[np.arange(r), rng.integers(0, d, size=r)] = rng.choice([-127, 5, 127], size=r)  # no row all zero
    return IntBNC(classes=list(range(L)), input_stage=_stage(stage, d, n_raw, rng), W_q=W,
                  B_bits=rng.integers(0, 2, size=(m, r)), proto_counts=allocate_prototypes(np.full(L, 1000), m),
                  pattern_seed=pattern_seed, per_row=K)


def bloom_shape_model(d: int, k: int, m: int, L: int, stage: str, n_raw: int, seed: int):
    """A valid IntBloom of this shape with random weights and biases (some shapes with 32-bit biases)."""
    from tinyproto.families.bloom.quantize import IntBloom
    from tinyproto.families.bloom.slots import seeded_slots, used_slots

    rng = np.random.default_rng(seed)
    rows = 1 if L == 2 else L
    hash_seed = int(rng.integers(1, 65536))
    used = used_slots(seeded_slots(hash_seed, d, k, m)).size
    bias_limit = 30000 if seed % 2 else 3_000_000  # 16- and 32-bit biases
    return IntBloom(classes=list(range(L)), input_stage=_stage(stage, d, n_raw, rng), seed=hash_seed, n_slots=m,
                    n_hashes=k, weights=rng.integers(-127, 128, size=(rows, used)),
                    bias=rng.integers(-bias_limit, bias_limit, size=rows), weight_step=1.0)


N_RANDOM = 4  # random vectors per shape: their mean is what the cost model predicts


def shape_vectors(d: int, seed: int, n_random: int = N_RANDOM) -> np.ndarray:
    """Random int8 vectors, then the extremes (constant, alternating: the data-dependent branches' range)."""
    rng = np.random.default_rng(seed)
    alt = np.where(np.arange(d) % 2 == 0, 127, -128)
    rows = [rng.integers(-128, 128, size=d) for _ in range(n_random)] + [np.full(d, -128), np.full(d, 127), alt]
    return np.array(rows, dtype=np.int8)


def measure_vectors(model, xq: np.ndarray, workdir: Path, board: str = "uno") -> np.ndarray:
    """Cycles of each vector through the device app on the simulated board (int8 PREDICT chunks, timed by
    Timer1), after checking every score against the numpy reference."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import build  # one avr-gcc call with the project's flags: the firmware PlatformIO builds

    from bench_latency import firmware_ring

    elf = build(model, workdir, board)
    ring = firmware_ring(model, load_board(board))
    with SimulatedUno(elf, markers=False) as uno, open_device(uno.port, rx_ring=ring) as client:
        predictions = [client.predict(x) for x in xq]
    scores = np.array([p.scores for p in predictions], dtype=np.int64)
    if not np.array_equal(scores, model.scores(xq)):
        raise AssertionError("device scores differ from the numpy reference")
    return np.array([p.cycles for p in predictions], dtype=np.float64)


RANDOM_SHAPES = 60  # per family, drawn as tools/bench_costmodel.py draws (another seed), besides the fixed sweep
RANDOM_SEED = 1000


def random_shapes(kind: str, n: int = RANDOM_SHAPES, seed: int = RANDOM_SEED) -> list[tuple]:
    """(name, model) of n shapes drawn at random by the benchmark's drawer (tools/bench_costmodel.py), with another
    seed than the benchmark's: the fit sees the benchmark's kind of shapes, never the benchmark's own."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import DRAW, draw_width, fits

    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        _, model = DRAW[kind](rng, draw_width(rng))
        if fits(model, load_board("uno")):
            out.append((f"random-{len(out):02d}", model))
    return out


def _sweep(kind: str, cache: Path | None) -> list[dict]:
    """Measure every shape of the sweep (or read it from the cache): model, cycles per vector."""
    shapes = BNC_SHAPES if kind == "bnc" else BLOOM_SHAPES
    make = bnc_shape_model if kind == "bnc" else bloom_shape_model
    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    out = []
    fixed = [(name, list(shape), None) for name, *shape in shapes]
    drawn = [(name, [model_hash_hex(model)], model) for name, model in random_shapes(kind)]
    for name, shape, model in fixed + drawn:
        seed = zlib.crc32(name.encode())  # a shape's model and vectors do not depend on the others
        if model is None:
            model = make(*shape, seed=seed)
        if name not in done or done[name]["shape"] != shape or done[name].get("seed") != seed:
            xq = shape_vectors(model.n_features, seed)
            with tempfile.TemporaryDirectory() as tmp:
                cycles = measure_vectors(model, xq, Path(tmp) / "p")
            done[name] = {"shape": shape, "seed": seed, "cycles": cycles.tolist()}
            if cache is not None:
                cache.write_text(json.dumps(done, indent=1))
            print(f"{name}: {cycles.mean():.0f} cycles (min {cycles.min():.0f}, max {cycles.max():.0f})", flush=True)
        out.append({"name": name, "model": model, "cycles": np.array(done[name]["cycles"])})
    return out


def _fit_nnls(rows: list[dict], names: list[str], held: dict[str, float], measured: np.ndarray,
              later: tuple = ()) -> dict[str, float]:
    """Constants for `names` minimising relative errors (nnls); `held` keeps its values (hand counts). Terms in
    `later` (a code path only some shapes take) are fitted second, on those shapes, with the others held."""
    A = np.array([[r.get(n, 0.0) for n in names] for r in rows], dtype=float)
    weight = 1.0 / measured
    fitted = {n: float(held.get(n, 0.0)) for n in names}
    late = [i for i, n in enumerate(names) if n in later]
    takes_late = A[:, late].any(axis=1) if late else np.zeros(len(rows), dtype=bool)
    for group, shapes in (([n for n in names if n not in later], ~takes_late), (list(later), takes_late)):
        free = [names.index(n) for n in group if n not in held and A[shapes, names.index(n)].any()]
        if not free or not shapes.any():
            continue
        known = A[shapes] @ np.array([fitted[n] for n in names])
        values, _ = nnls(A[shapes][:, free] * weight[shapes, None], (measured[shapes] - known) * weight[shapes])
        fitted.update({names[i]: float(v) for i, v in zip(free, values)})
    return fitted


def _report(results: list[dict], before: list[float], after: list[float], held_out: list[float],
            judge: dict[bool, int] | None = None) -> None:
    judge = judge or {False: 0, True: 0}
    print(f"\nmeasured: mean of {N_RANDOM} random vectors (Timer1, less the judge stage); min, max: also over the "
          f"extremes (constant, alternating); held out: the shape's prediction by a fit without it")
    print(f"{'shape':<18}{'d':>5}{'measured':>10}{'min':>8}{'max':>8}{'before':>9}{'err %':>8}{'after':>9}{'err %':>7}"
          f"{'held out %':>11}")
    means = []
    for r, b, a, h in zip(results, before, after, held_out):
        c = r["cycles"] - judge[_streams(r["model"])]
        mean = c[:N_RANDOM].mean()
        means.append(mean)
        print(f"{r['name']:<18}{r['model'].n_features:>5}{mean:>10.0f}{c.min():>8.0f}{c.max():>8.0f}{b:>9.0f}"
              f"{100 * (b - mean) / mean:>+8.1f}{a:>9.0f}{100 * (a - mean) / mean:>+7.2f}"
              f"{100 * (h - mean) / mean:>+11.2f}")
    means = np.array(means)
    print(f"largest error after the fit: {100 * np.max(np.abs(np.array(after) - means) / means):.2f} %, "
          f"held out: {100 * np.max(np.abs(np.array(held_out) - means) / means):.2f} %")


def model_hash_hex(model) -> str:
    from tinyproto.core.render import model_hash

    return f"{model_hash(model):08X}"


def _streams(model) -> bool:
    return bool(model.defines().get("TP_STREAMABLE", 0))


def judge_stage(results: list[dict], cache: Path | None) -> dict[bool, int]:
    """The device app's judge stage inside every timed call (tp_judge's stub: these models carry no calibration),
    buffered and streamed, measured as tools/bench_costmodel.py measures it (the same firmware built with and
    without the call) on the first shape of each path. Not the family's code: the Timer1 figures less it are what
    the family's cost model predicts (compile adds core.cost.judge_cycles for the stage)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import judge_stage_cycles

    done = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    out = {}
    for r in results:
        streams = _streams(r["model"])
        key = f"judge:{'streamed' if streams else 'buffered'}"
        if streams in out:
            continue
        if key not in done:
            with tempfile.TemporaryDirectory() as tmp:
                done[key] = judge_stage_cycles(r["model"], "uno", Path(tmp))
            if cache is not None:
                cache.write_text(json.dumps(done, indent=1))
        out[streams] = int(done[key])
    print("judge stage (subtracted): " + ", ".join(f"{'streamed' if k else 'buffered'} {v}" for k, v in out.items()))
    return out


def calibrate_family(kind: str, cache: Path | None) -> None:
    """--bnc / --bloom: measure the sweep, fit the family's constants, print them and every shape's error."""
    import importlib

    cost = importlib.import_module(f"tinyproto.families.{kind}.cost")
    table = cost.BNC_CYCLES if kind == "bnc" else cost.BLOOM_CYCLES
    terms_of = cost.cost_terms
    results = _sweep(kind, cache)
    judge = judge_stage(results, cache)
    measured = np.array([r["cycles"][:N_RANDOM].mean() - judge[_streams(r["model"])] for r in results])
    rows = [terms_of(r["model"]) for r in results]
    before = [cost.predict_cycles(r["model"])["total"] for r in results]
    names = list(table)
    later = getattr(cost, "FIT_LATER", ())
    fitted = _fit_nnls(rows, names, cost.HAND_COUNTS, measured, later)
    constants = {n: round(fitted[n], 1) for n in names}
    after = [sum(row.get(n, 0.0) * constants[n] for n in names) for row in rows]
    held_out = []  # leave one shape out: how well the terms predict a shape the fit has not seen
    for i, row in enumerate(rows):
        rest = [j for j in range(len(rows)) if j != i]
        loo = _fit_nnls([rows[j] for j in rest], names, cost.HAND_COUNTS, measured[rest], later)
        held_out.append(sum(row.get(n, 0.0) * loo[n] for n in names))
    print(f"\n{'BNC_CYCLES' if kind == 'bnc' else 'BLOOM_CYCLES'} = {{")
    for name, value in constants.items():
        print(f'    "{name}": {value:g},')
    print("}")
    _report(results, before, after, held_out, judge)


def replay_stores(model, xq: np.ndarray) -> tuple[float, float]:
    """Mean MAX stores of a Bloom model on these int8 vectors, exactly as tp_stream_feed makes them (u = x + 128,
    -128 read as -127; a slot stores when u rises above it): (by a feature's last draw, by its other draws)."""
    from tinyproto.families.bloom.slots import seeded_slots

    k = model.n_hashes
    slots = seeded_slots(model.seed, model.n_features, k, model.n_slots)
    last = other = 0
    for x in np.asarray(xq, dtype=np.int64):
        u = np.maximum(x + 128, 1)
        phi = np.zeros(model.n_slots, dtype=np.int64)
        for j, row in enumerate(slots.tolist()):
            for draw, slot in enumerate(row):
                if u[j] > phi[slot]:
                    phi[slot] = u[j]
                    last, other = (last + 1, other) if draw == k - 1 else (last, other + 1)
    return last / len(xq), other / len(xq)


def bloom_feed_cycles(k: int, m: int, d: int, workdir: Path, simulator: Path, n_vectors: int = 4,
                      ranged: bool = False) -> dict:
    """A Bloom model of d features, k hashes and m slots on the profiling simulator: tp_stream_feed's cycles per
    vector (its prefixed name, the benchmark's build), less its MAX stores (replayed on the very vectors: 1 cycle
    each, 3 by a feature's last draw where avr-gcc put that draw after the loop), and the chunks. ranged: the model
    judged with --unknown-rate's range check, whose runtime keeps phi behind the stream's next-feature index
    (firmware/tp_bloom.c, struct tp_bloom_ranged), which avr-gcc addresses otherwise in the feed loop."""
    import bisect
    import collections

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_costmodel import build
    from bench_latency import firmware_ring
    from profile_firmware import functions_of, profiling

    from tinyproto.core.wire import n_chunks

    model = bloom_shape_model(d, k, m, 3, "shared", 0, 7)
    xq = np.random.default_rng(d).integers(-127, 128, size=(n_vectors, d)).astype(np.int8)
    if ranged:
        from tinyproto.core.confidence import Calibration, whole_bins
        from tinyproto.families.judging import make_judged

        signal = model.range_signal(xq)
        low, high = whole_bins(int(signal.min()), int(signal.max()))
        model = make_judged(model, Calibration(100, 5, False, -10, 0.05, 0, low, high))
    elf = build(model, workdir, "uno")
    profile = workdir / "profile.txt"
    ring = firmware_ring(model, load_board("uno"))
    with profiling(simulator, profile), SimulatedUno(elf) as uno, open_device(uno.port, rx_ring=ring) as client:
        client.hello()
        answers = [client.predict(x) for x in xq]
    if not np.array_equal(np.array([a.scores for a in answers]), model.scores(xq)):
        raise AssertionError("device scores differ from the numpy reference")
    addresses, names = functions_of(elf)
    cycles = collections.Counter()
    for line in profile.read_text().splitlines():
        pc, _, spent = line.split()
        cycles[names[bisect.bisect_right(addresses, int(pc, 16)) - 1]] += int(spent)
    feed = sum(v for name, v in cycles.items() if name.endswith("_stream_feed")) / len(xq)
    last, other = replay_stores(model, xq)
    looped_last = k >= 4 and k % 2 == 0  # the last draw inside the draws' loop: its store costs 1 too
    return {"feed": feed - other - (1 if looped_last else 3) * last, "chunks": n_chunks(d), "features": d,
            "stores": other + last}


def calibrate_bloom_feed() -> None:
    """--bloom-feed: FEED_CYCLES, tp_stream_feed's cycles per feature and per chunk for k = 1 .. 8 byte draws, with
    the multiply (m = 200) and without (m = 256), read off the profiling simulator at 640, 650 and 1,280 features
    (stores subtracted): a least-squares line through the three, whose residual is 0 when the loop is what the
    table says."""
    from profile_firmware import build_profiling_simulator

    print("FEED_CYCLES = {  # k: ((per feature, per chunk) with the multiply, (per feature, per chunk) with m = 256)")
    with tempfile.TemporaryDirectory() as tmp:
        simulator = build_profiling_simulator(Path(tmp))
        for k in range(1, 9):
            pair = []
            for m in (200, 256):
                runs = [bloom_feed_cycles(k, m, d, Path(tmp) / f"k{k}-m{m}-d{d}", simulator) for d in (640, 650, 1280)]
                A = np.array([[r["features"], r["chunks"]] for r in runs], dtype=float)
                b = np.array([r["feed"] for r in runs])
                (per_feature, per_chunk), *_ = np.linalg.lstsq(A, b, rcond=None)
                residual = float(np.abs(b - A @ np.array([per_feature, per_chunk])).max())
                pair.append(f"({per_feature:.2f}, {per_chunk:.2f})")
                if residual > 0.5:
                    print(f"    # k = {k}, m = {m}: residual {residual:.1f} cycles: not one line")
            print(f"    {k}: ({pair[0]}, {pair[1]}),", flush=True)
    print("}")


def main() -> None:
    import sys

    if len(sys.argv) > 1 and sys.argv[1] in ("--bnc", "--bloom"):  # [--cache FILE.json]
        cache = Path(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--cache" else None
        calibrate_family(sys.argv[1][2:], cache)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--bloom-feed":
        calibrate_bloom_feed()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--flynn-seeded-scan":
        calibrate_flynn_seeded_scan()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--flynn":
        calibrate_flynn(flynn_model_dirs([Path(p) for p in sys.argv[2:]]))
        return
    counted = {  # FLAG N [--cache FILE.json]: fits on N drawn shapes, measurements cached in FILE
        "--flynn-shapes": lambda n, cache: calibrate_flynn(flynn_random_shapes(n), cache),
        "--flynn-wide-stored": calibrate_flynn_wide_stored,
        "--flynn-wide-seeded": calibrate_flynn_wide_seeded,
        "--flynn-wide-stored-layouts": calibrate_flynn_wide_stored_layouts,
        "--flynn-functions": calibrate_flynn_functions,
        "--flynn-lookup": calibrate_flynn_lookup,
        "--flynn-lookup-layouts": calibrate_flynn_lookup_layouts,
        "--protonn-functions": calibrate_protonn_functions,
        "--flynn-heap": calibrate_flynn_heap,
        "--protonn-dense-rows": calibrate_protonn_dense_rows,
    }
    if len(sys.argv) > 2 and sys.argv[1] in counted:
        cache = Path(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--cache" else None
        counted[sys.argv[1]](int(sys.argv[2]), cache)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--protonn-c":  # [--cache FILE.json]
        calibrate_protonn_c(Path(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--cache" else None)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--wide":
        calibrate_wide()
        return
    rng = np.random.default_rng(0)
    names = list(PN_CYCLES)
    rows, measured = [], []
    for shape in SHAPES:
        model = synthetic_model(*shape, rng)
        with tempfile.TemporaryDirectory() as tmp:
            cycles = measure(model, Path(tmp), rng)
        terms = protonn_cost_terms(model)
        rows.append([terms[n] for n in names])
        measured.append(cycles)
        print(f"shape {shape}: {cycles:.0f} cycles", flush=True)
    A, b = np.array(rows, dtype=float), np.array(measured)
    free = [i for i, n in enumerate(names) if n not in HAND_COUNTS]
    fixed = np.array([HAND_COUNTS.get(n, 0.0) for n in names])
    fitted = fixed.copy()
    weight = 1.0 / b  # relative errors: a small model's error counts as much as a large one's
    fitted[free], _ = nnls(A[:, free] * weight[:, None], (b - A @ fixed) * weight)
    print("\nPN_CYCLES = {")
    for name, value in zip(names, fitted):
        print(f'    "{name}": {round(value)},')
    print("}\n")
    predicted = A @ np.round(fitted)
    print(f"{'shape':<32}{'measured':>10}{'fitted':>10}{'error %':>9}{'current':>10}")
    current = A @ np.array([PN_CYCLES[n] for n in names], dtype=float)
    for shape, meas, pred, cur in zip(SHAPES, b, predicted, current):
        print(f"{str(shape):<32}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}{cur:>10.0f}")


if __name__ == "__main__":
    main()
