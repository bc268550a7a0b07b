#!/usr/bin/env python3
"""Fuzz benchmark of the device firmware: build each libFuzzer harness with clang (ASan + UBSan), run it to a
number of executions from a seed corpus of valid frames, and print one table.

    python tools/fuzz/run_fuzz.py [--firmware all|inference|learning|learning-digits ...] [--runs N] [--seconds S]
                                  [--seed N] [--model DIR] [--firmware-dir DIR] [--workdir DIR] [--no-lines]

Firmwares (harness, model):
  inference        tools/fuzz/fuzz_serial.c, the protocol tests' fake model (tests/fixtures/protocol);
  inference-stream the same fake model as a streaming family of 150 features (chunks fed as they arrive);
  learning         tools/fuzz/fuzz_learn.c, tools/fuzz/models/bc_b3_seeded (3-bit counts, seeded M);
  learning-digits  tools/fuzz/fuzz_learn.c, tools/fuzz/models/digits_b1_stored (1-bit counts, M in flash);
  learning-ee-end  bc_b3_seeded, its EEPROM record ending exactly at the EEPROM's last byte;
  learning-no-ee   digits_b1_stored, its record one byte too long for the EEPROM: no EEPROM messages.
`all` (the default) runs every one (several names run those), each to --runs executions (default 10^6) unless
--seconds runs out first.
--model replaces the model of a single firmware: the fixture's flat layout, a directory holding only
tinyproto_model.h (+ an optional `cflags` file; the runtime then comes from --firmware-dir), or a generated
project (include/tinyproto_model.h, runtime .c files in lib/tinyproto/; src/main.c is the app and is skipped).
--firmware-dir (default firmware/) is the application under test: tp_main.c and its parts (tp_transport.c,
tp_measure.c, tp_learn.c), tp_serial.c and the runtime. include/tinyproto_sizes.h is generated for the model.

--seed is libFuzzer's -seed (one process, no parallel jobs). A run is reproducible: the same seed, firmware, model
and clang on one machine give the same executions and crashes wherever the checkout, the firmware directory and
--workdir are (addresses feed libFuzzer's value profile, so the harness is built from fixed relative paths and
run with address randomisation off, a fixed environment and no corpus reload; see run()).
Output: one line per firmware, "NAME: N executions in T s (R exec/s), C crashes", then the table with the
coverage libFuzzer reports (cov: instrumented edges reached) and, unless --no-lines, the line coverage of the
firmware sources reached by the final corpus (llvm-cov). Exit status 0 clean, 1 crash (the crashing input is
kept in the work directory), 2 clang / libFuzzer missing or build failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FUZZ_DIR = Path(__file__).resolve().parent
FIRMWARE = ROOT / "firmware"
DEFAULT_MODEL = ROOT / "tests" / "fixtures" / "protocol"
# Files of the device application itself: taken from the firmware directory, never from the model directory.
APP_PARTS = ("tp_main.c", "tp_transport.c", "tp_measure.c", "tp_learn.c")  # the harnesses #include these
APP_FILES = {"main.c", "tp_serial.c", *APP_PARTS}
CLANG_NAMES = ("clang", "clang-16", "clang-15", "clang-14")
SANITIZE = "-fsanitize=fuzzer,address,undefined"
MAX_LEN = 2048
# Harness operations of fuzz_learn.c (record types it does not send to the device).
HOP_REBOOT, HOP_TAMPER, HOP_PLANT = 0xEE, 0xED, 0xEC


class FuzzSetupError(Exception):
    """clang or libFuzzer is missing, or a harness does not build."""


@dataclass(frozen=True)
class Target:
    name: str
    harness: Path
    model: Path
    learning: bool
    eeprom_edge: int | None = None  # learning: put the record's last byte this many bytes past the EEPROM's end
    cflags: tuple[str, ...] = ()  # extra -D switches of the model (the streaming fake model's)


LEARN_BC = FUZZ_DIR / "models" / "bc_b3_seeded"
LEARN_DIGITS = FUZZ_DIR / "models" / "digits_b1_stored"
EEPROM_BYTES = 1024  # the Uno's, and the host build's default TP_EEPROM_BYTES
TARGETS = {
    "inference": Target("inference", FUZZ_DIR / "fuzz_serial.c", DEFAULT_MODEL, False),
    # the fake model streaming 150 features: 3 PREDICT / 10 PREDICT_RAW chunks per vector, fed as they arrive
    "inference-stream": Target("inference-stream", FUZZ_DIR / "fuzz_serial.c", DEFAULT_MODEL, False,
                               cflags=("-DTP_STREAMABLE=1", "-DTP_N_FEATURES=150")),
    "learning": Target("learning", FUZZ_DIR / "fuzz_learn.c", LEARN_BC, True),
    "learning-digits": Target("learning-digits", FUZZ_DIR / "fuzz_learn.c", LEARN_DIGITS, True),
    # both sides of the "record fits the EEPROM" check: the last record byte is the last EEPROM byte, or one past
    # it (then the firmware has no EEPROM messages at all)
    "learning-ee-end": Target("learning-ee-end", FUZZ_DIR / "fuzz_learn.c", LEARN_BC, True, eeprom_edge=0),
    "learning-no-ee": Target("learning-no-ee", FUZZ_DIR / "fuzz_learn.c", LEARN_DIGITS, True, eeprom_edge=1),
}


@dataclass(frozen=True)
class Shape:
    """What the seeds need to know about a model."""

    n_features: int
    n_classes: int


@dataclass
class Result:
    name: str
    executions: int
    seconds: float
    crashes: list[Path]
    edges: int | None
    lines: float | None = None

    @property
    def rate(self) -> float:
        return self.executions / self.seconds if self.seconds > 0 else 0.0


# ---- building ------------------------------------------------------------------------------------------------


def find_clang() -> str:
    for name in CLANG_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise FuzzSetupError(
        "clang not found — install clang and libFuzzer (Debian: apt-get install clang libclang-rt-14-dev)"
    )


def header_define(include: Path, name: str, default: int | None = None) -> int | None:
    text = (include / "tinyproto_model.h").read_text()
    match = re.search(rf"#define\s+{name}\s+\(?(\d+)", text)
    return int(match.group(1)) if match else default


def model_files(model: Path, firmware: Path = FIRMWARE) -> tuple[Path, list[Path]]:
    """(include directory, model + runtime .c sources) of a model directory. A directory with a header only (the
    committed learning models) is built with the runtime of the firmware under test."""
    include = next((d for d in (model, model / "include") if (d / "tinyproto_model.h").is_file()), None)
    if include is None:
        raise FuzzSetupError(f"no tinyproto_model.h in {model} or {model / 'include'}")
    dirs = [d for d in (model, model / "src", model / "lib" / "tinyproto") if d.is_dir()]
    sources = sorted(p for d in dirs for p in d.glob("*.c") if p.name not in APP_FILES)
    if not sources:
        family = "tp_flynn.c" if header_define(include, "TP_FAMILY_FLYNN") else "tp_protonn.c"
        sources = [firmware / family, firmware / "tp_input.c"]
    if not any(p.name == "tp_judge.c" for p in sources):  # a model written before the confidence stage
        sources.append(firmware / "tp_judge.c")
    return include, sources


def model_cflags(model: Path, learning: bool) -> list[str]:
    """The model's `cflags` file (learning switches + layout key), or the learning switches alone."""
    path = model / "cflags"
    if path.is_file():
        return path.read_text().split()
    return ["-DTP_FLYNN_LEARN", "-DTP_NO_RAW_INPUT"] if learning else []


def eeprom_flags(target: Target, include: Path) -> list[str]:
    """-DTP_FLYNN_EEPROM_ADDR placing the record's end `eeprom_edge` bytes past the end of the EEPROM."""
    if target.eeprom_edge is None:
        return []
    bits = header_define(include, "TP_FLYNN_M") * header_define(include, "TP_N_CLASSES") * header_define(
        include, "TP_FLYNN_BITS")
    record = _wire().EEPROM_HEADER_BYTES + (bits + 7) // 8  # the record's header + packed counts
    return [f"-DTP_FLYNN_EEPROM_ADDR={EEPROM_BYTES - record + target.eeprom_edge}u"]


def sizes_include(include: Path, out_dir: Path) -> Path:
    """A directory holding include/tinyproto_sizes.h for this model, generated as `tinyproto compile` does (a
    model directory without one, e.g. the committed fixtures, gets it here)."""
    sizes = out_dir / "sizes"
    sizes.mkdir(parents=True, exist_ok=True)
    (sizes / "tinyproto_sizes.h").write_text(_render().render_sizes_header(header_define(include, "TP_N_CLASSES", 2)))
    return sizes


def compile_harness(clang: str, target: Target, firmware: Path, out: Path, extra: list[str],
                    fixed_paths: bool = False) -> None:
    """Build one harness into `out`. fixed_paths: the same binary wherever the checkout, the firmware and the work
    directory are (the fuzz build: the sanitizers keep source file names in the loaded data, whose addresses the
    value profile compares): every directory is read through a link of a fixed name in out's directory, so the
    compiler only ever sees the same relative paths."""
    include, sources = model_files(target.model, firmware)
    sizes = sizes_include(include, out.parent)
    folders = [firmware, include, sizes, target.harness.parent, *(p.parent for p in sources)]
    place = {folder: str(folder) for folder in folders}
    cwd, fixed = None, []
    if fixed_paths:  # also the directory the debug information names (symbolised reports allocate its strings)
        fixed = ["-fdebug-compilation-dir=."]
        cwd = out.parent / "src"
        shutil.rmtree(cwd, ignore_errors=True)
        cwd.mkdir(parents=True)
        for folder in dict.fromkeys(folders):
            place[folder] = f"d{len(list(cwd.iterdir()))}"
            (cwd / place[folder]).symlink_to(folder.resolve(), target_is_directory=True)

    def at(path: Path) -> str:
        return f"{place[path.parent]}/{path.name}"

    cmd = [
        clang, "-g", "-O1", "-std=c99", "-Wall", "-Wextra", "-Werror", "-DTP_HOST",
        *model_cflags(target.model, target.learning), *eeprom_flags(target, include), *target.cflags, *extra, *fixed,
        f"-I{place[firmware]}", f"-I{place[include]}", f"-I{place[sizes]}",
        at(target.harness), at(firmware / "tp_serial.c"), *map(at, sources),
        "-o", str(out.resolve()),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        if re.search(r"libclang_rt\.fuzzer|fuzzer.*(not found|No such file)|cannot find.*fuzzer", result.stderr):
            raise FuzzSetupError(
                "clang's libFuzzer runtime is missing — install it (Debian: apt-get install libclang-rt-14-dev)"
            )
        raise FuzzSetupError(f"building the {target.name} fuzz harness failed:\n{result.stderr.strip()}")


def build(clang: str, target: Target, firmware: Path, work: Path) -> Path:
    exe = work / f"fuzz_{target.name}"
    compile_harness(clang, target, firmware, exe, [SANITIZE, "-fno-sanitize-recover=all"], fixed_paths=True)
    return exe


# ---- seeds: valid sessions from the host's protocol code -------------------------------------------------------


def _protocol():
    sys.path.insert(0, str(ROOT))
    from tinyproto.device import protocol

    return protocol


def _wire():
    sys.path.insert(0, str(ROOT))
    from tinyproto.core import wire

    return wire


def _render():
    sys.path.insert(0, str(ROOT))
    from tinyproto.core import render

    return render


def _chunks(type_: int, seq: int, data: bytes, item: int = 1, head: bytes = b"") -> list[tuple[int, int, bytes]]:
    """One vector as the host client sends it: chunks of `first u16 | data` (LEARN: label first)."""
    wire = _wire()
    per = wire.CHUNK_BYTES // item
    n = len(data) // item
    return [(type_, (seq + k) & 0xFF, head + struct.pack("<H", first) + data[first * item : (first + per) * item])
            for k, first in enumerate(range(0, n, per))]


def _vector(shape: Shape, k: int) -> bytes:
    """A deterministic int8 feature vector (k-th of a fixed sequence), extremes included."""
    return bytes(((i * 37 + k * 101) % 256) for i in range(shape.n_features))


def _raw(frames: list[tuple[int, int, bytes]]) -> bytes:
    """Raw-mode input: a 0x00 resync and the host's encoding of each frame."""
    P = _protocol()
    return b"\x01" + b"".join(b"\x00" + P.encode_frame(t, s, p) for t, s, p in frames)


def _records(frames: list[tuple[int, int, bytes]]) -> bytes:
    """Record-mode input: [type][seq][len][payload] per frame (payload clipped to 255 bytes)."""
    return b"\x00" + b"".join(bytes((t, s, len(p[:255]))) + p[:255] for t, s, p in frames)


def inference_seeds(shape: Shape) -> dict[str, bytes]:
    P = _protocol()
    frames = [
        (P.MSG_HELLO, 1, b""),
        *_chunks(P.MSG_PREDICT, 2, bytes(i % 256 for i in range(shape.n_features))),
        *_chunks(P.MSG_PREDICT_RAW, 40, struct.pack("<f", 1.0) * shape.n_features, item=4),
        (P.MSG_STATS, 4, b""),
    ]
    seeds = {"raw_session": _raw(frames), "raw_garbage": b"\x01\x12\x34\x00\xff\xff" + _raw(frames)[1:8]
             + _raw(frames)[1:]}  # fmt: skip
    seeds.update({f"record_{t:02x}": _records([(t, s, p)]) for t, s, p in frames})
    return seeds


def learning_seeds(shape: Shape) -> dict[str, bytes]:
    """Every learning message alone, and sessions that reach the interesting states: learned counts saved and
    loaded back, a saved record tampered with (CRC and layout key), a record of saturated counts and n_samples,
    a reboot between save and load."""
    P = _protocol()
    learn = [c for k in range(4) for c in _chunks(P.MSG_LEARN, 100 + 20 * k, _vector(shape, k),
                                                     head=bytes((k % shape.n_classes,)))]
    read_all = (P.MSG_READ_COUNTS, 20, struct.pack("<HB", 0, 255))
    save, load, clear = (P.MSG_EEPROM_SAVE, 21, b""), (P.MSG_EEPROM_LOAD, 22, b""), (P.MSG_CLEAR, 23, b"")
    predicts = _chunks(P.MSG_PREDICT, 24, _vector(shape, 9))
    tamper_crc = (HOP_TAMPER, 0, struct.pack("<HB", 14, 0x01))  # first count byte of a record at address 0
    tamper_key = (HOP_TAMPER, 0, struct.pack("<HB", 2, 0x80))
    plant_full = (HOP_PLANT, 0, b"\xff" * 4 + b"\xff" * 250)
    reboot = (HOP_REBOOT, 0, b"")
    singles = [(P.MSG_HELLO, 1, b""), (P.MSG_STATS, 2, b""), predicts[0], learn[0], read_all,
               (P.MSG_READ_COUNTS, 3, struct.pack("<HB", 1, 7)), clear, save, load]  # fmt: skip
    seeds = {f"record_{t:02x}_{i}": _records([(t, s, p)]) for i, (t, s, p) in enumerate(singles)}
    seeds.update({
        "learn_save_load": _records([*learn, save, clear, load, read_all, *predicts]),
        "tampered_crc": _records([*learn[:2], save, tamper_crc, clear, load, read_all]),
        "tampered_key": _records([learn[0], save, tamper_key, load]),
        "saturated": _records([plant_full, load, *learn, read_all, save, *predicts]),
        "reboot": _records([*learn[:2], save, reboot, load, read_all]),
        "clear_learn": _records([clear, *learn, learn[0], read_all]),
        "raw_session": _raw([(P.MSG_HELLO, 1, b""), *learn[:2], read_all, save, clear, load, *predicts]),
    })  # fmt: skip
    return seeds


def write_seeds(seeds: Path, target: Target, include: Path) -> None:
    overrides = {f.split("=")[0][2:]: int(f.split("=")[1]) for f in target.cflags if "=" in f}
    shape = Shape(overrides.get("TP_N_FEATURES", header_define(include, "TP_N_FEATURES", 4)),
                  overrides.get("TP_N_CLASSES", header_define(include, "TP_N_CLASSES", 2)))
    seeds.mkdir(parents=True, exist_ok=True)
    for name, data in (learning_seeds if target.learning else inference_seeds)(shape).items():
        (seeds / name).write_bytes(data[:MAX_LEN])


# ---- running -----------------------------------------------------------------------------------------------


ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): this process's addresses, and those of what it executes, are fixed


def _fixed_addresses() -> None:
    """In the fuzzer's process before exec: no address-space randomisation, where the kernel allows it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).personality(ADDR_NO_RANDOMIZE)
    except (OSError, AttributeError):
        pass


def fuzzer_env() -> dict[str, str]:
    """The fuzzer's whole environment: the sanitizers' and LLVM's own settings only. The strings of the environment
    sit on the stack above main's frame, so any other variable (a test runner's, a longer TMPDIR) moves every stack
    address, which the value profile compares."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("ASAN_", "UBSAN_", "LSAN_", "LLVM_"))}
    symbolizer = shutil.which("llvm-symbolizer") or shutil.which("llvm-symbolizer-14")
    if symbolizer and "ASAN_SYMBOLIZER_PATH" not in env:
        env["ASAN_SYMBOLIZER_PATH"] = symbolizer  # readable crash reports without a PATH
    return env


def run(exe: Path, work: Path, runs: int, seconds: int, seed: int) -> tuple[int, float, list[Path], int | None]:
    """(executions, wall seconds, crash artifacts, edges covered) of one bounded libFuzzer run.

    A run is reproducible: the same seed, harness binary and machine give the same executions and the same
    crash. libFuzzer's value profile feeds on compared values, addresses among them, so the fuzzer runs with
    address randomisation off, a fixed environment (fuzzer_env) and arguments that do not depend on where the
    work directory is (relative to it), and without re-reading the corpus directory on a timer (-reload=0: that
    serves parallel jobs, which run_fuzz does not start)."""
    corpus = work / "corpus"
    corpus.mkdir(exist_ok=True)
    cmd = [
        f"./{exe.relative_to(work)}", f"-seed={seed}", f"-runs={runs}", f"-max_total_time={seconds}",
        f"-max_len={MAX_LEN}",
        # value profiling rewards inputs that get closer on a comparison: that is how an off-by-one length or
        # offset check gets crossed without a seed sitting on the boundary (a planted READ_COUNTS off-by-one
        # survived 300k runs without it and fell in ~30k with it; tests/test_fuzz.py plants it)
        "-use_value_profile=1", "-reload=0", "-print_final_stats=1", "-artifact_prefix=./", "corpus", "seeds",
    ]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=work, env=fuzzer_env(),
                            preexec_fn=_fixed_addresses)
    elapsed = time.monotonic() - start
    match = re.search(r"stat::number_of_executed_units:\s*(\d+)", result.stderr)
    executions = int(match.group(1)) if match else 0
    edges = [int(v) for v in re.findall(r"\bcov: (\d+)", result.stderr)]
    crashes = sorted(p for p in work.iterdir() if re.match(r"(crash|leak|timeout|oom)-", p.name))
    if result.returncode != 0 and not crashes:
        crashes = [exe]  # died without an artifact: still a failure
    if crashes:
        sys.stderr.write(result.stderr[-4000:])
    return executions, elapsed, crashes, (edges[-1] if edges else None)


def line_coverage(clang: str, target: Target, firmware: Path, work: Path) -> float | None:
    """Percent of the firmware's lines (app, framing, model runtime) the final corpus executes: a build with
    clang's source coverage replays the corpus once. None if llvm-profdata / llvm-cov are not installed."""
    tools = [shutil.which(n) or shutil.which(f"{n}-14") for n in ("llvm-profdata", "llvm-cov")]
    if not all(tools):
        return None
    exe = work / f"cov_{target.name}"
    compile_harness(clang, target, firmware, exe, ["-fsanitize=fuzzer", "-fprofile-instr-generate",
                                                   "-fcoverage-mapping"])
    raw, data = work / "cov.profraw", work / "cov.profdata"
    env = dict(os.environ, LLVM_PROFILE_FILE=str(raw))
    subprocess.run([str(exe), "-runs=0", f"-max_len={MAX_LEN}", str(work / "corpus"), str(work / "seeds")],
                   capture_output=True, env=env, timeout=600)
    subprocess.run([tools[0], "merge", "-sparse", str(raw), "-o", str(data)], check=True, capture_output=True)
    _, sources = model_files(target.model, firmware)
    if "-DTP_NO_RAW_INPUT" in model_cflags(target.model, target.learning):
        sources = [p for p in sources if p.name != "tp_input.c"]  # linked, but only PREDICT_RAW calls it
    app = [str(firmware / name) for name in APP_PARTS if target.learning or name != "tp_learn.c"]
    files = [*app, str(firmware / "tp_serial.c"), *map(str, sources)]
    report = subprocess.run([tools[1], "report", str(exe), f"-instr-profile={data}", *files],
                            capture_output=True, text=True, check=True).stdout
    total = re.search(r"^TOTAL(?:\s+\S+){6}\s+(\d+)\s+(\d+)\s+([\d.]+)%", report, re.M)
    return float(total.group(3)) if total else None


def fuzz_one(clang: str, target: Target, firmware: Path, work: Path, args: argparse.Namespace) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    exe = build(clang, target, firmware, work)
    write_seeds(work / "seeds", target, model_files(target.model, firmware)[0])
    executions, elapsed, crashes, edges = run(exe, work, args.runs, args.seconds, args.seed)
    result = Result(target.name, executions, elapsed, crashes, edges)
    if args.lines and not crashes:
        result.lines = line_coverage(clang, target, firmware, work)
    return result


def print_table(results: list[Result], runs: int) -> None:
    print(f"\n{'firmware':<16} {'executions':>11} {'exec/s':>8} {'crashes':>7} {'cov (edges)':>11} {'lines':>7}")
    for r in results:
        lines = f"{r.lines:.1f}%" if r.lines is not None else "-"
        edges = str(r.edges) if r.edges is not None else "-"
        short = "" if r.executions >= runs or r.crashes else "  (time limit before --runs)"
        print(f"{r.name:<16} {r.executions:>11} {r.rate:>8.0f} {len(r.crashes):>7} {edges:>11} {lines:>7}{short}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--firmware", nargs="+", choices=["all", *TARGETS], default=["all"],
                        help="which harnesses (default all)")
    parser.add_argument("--runs", type=int, default=1_000_000, help="executions per firmware (default 10^6)")
    parser.add_argument("--seconds", type=int, default=900, help="time limit per firmware")
    parser.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (deterministic runs)")
    parser.add_argument("--model", type=Path, help="model directory for a single --firmware")
    parser.add_argument("--firmware-dir", type=Path, default=FIRMWARE, help="the application under test")
    parser.add_argument("--workdir", type=Path, help="keep builds, corpora and crashes here")
    parser.add_argument("--no-lines", dest="lines", action="store_false", help="skip the line-coverage replay")
    args = parser.parse_args(argv)

    names = list(TARGETS) if "all" in args.firmware else list(dict.fromkeys(args.firmware))
    if args.model is not None and len(names) != 1:
        parser.error("--model needs a single --firmware")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tp-fuzz-"))
    results = []
    try:
        clang = find_clang()
        for name in names:
            target = TARGETS[name]
            if args.model is not None:
                target = replace(target, model=args.model)
            r = fuzz_one(clang, target, args.firmware_dir.resolve(), work / name, args)
            print(f"{r.name}: {r.executions} executions in {r.seconds:.1f} s ({r.rate:.0f} exec/s), "
                  f"{len(r.crashes)} crashes", flush=True)
            for path in r.crashes:
                print(f"crash input: {path}")
            results.append(r)
    except FuzzSetupError as exc:
        print(f"run_fuzz: {exc}", file=sys.stderr)
        return 2
    print_table(results, args.runs)
    crashed = any(r.crashes for r in results)
    if args.workdir is None and not crashed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
