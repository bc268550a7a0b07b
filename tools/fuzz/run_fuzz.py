#!/usr/bin/env python3
"""Build tools/fuzz/fuzz_serial.c with clang's libFuzzer + ASan + UBSan and run it for a bounded time.

    python tools/fuzz/run_fuzz.py [--runs N] [--seconds S] [--model DIR] [--workdir DIR]

The model defaults to the protocol tests' fake (tests/fixtures/protocol); a generated model directory works too
(include/tinyproto_model.h, runtime .c files in lib/tinyproto/; src/main.c is the app and comes from firmware/). Prints one summary line
"fuzz_serial: N executions in T s (R exec/s), C crashes"; exit status 0 clean, 1 crash (the crashing input is
kept in the work directory), 2 clang / libFuzzer missing or build failure.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "firmware"
HARNESS = Path(__file__).resolve().parent / "fuzz_serial.c"
DEFAULT_MODEL = ROOT / "tests" / "fixtures" / "protocol"
# Files of the device application itself: taken from firmware/, never from the model directory.
APP_FILES = {"main.c", "tp_main.c", "tp_serial.c"}
CLANG_NAMES = ("clang", "clang-16", "clang-15", "clang-14")


class FuzzSetupError(Exception):
    """clang or libFuzzer is missing, or the harness does not build."""


def find_clang() -> str:
    for name in CLANG_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise FuzzSetupError(
        "clang not found — install clang and libFuzzer (Debian: apt-get install clang libclang-rt-14-dev)"
    )


def model_files(model: Path) -> tuple[Path, list[Path]]:
    """(include directory, model .c sources) of a model directory: the fixture's flat layout, or a generated
    project (include/tinyproto_model.h, runtime in lib/tinyproto/, src/main.c = the app, skipped)."""
    include = next((d for d in (model, model / "include") if (d / "tinyproto_model.h").is_file()), None)
    if include is None:
        raise FuzzSetupError(f"no tinyproto_model.h in {model} or {model / 'include'}")
    dirs = [d for d in (model, model / "src", model / "lib" / "tinyproto") if d.is_dir()]
    sources = sorted(p for d in dirs for p in d.glob("*.c") if p.name not in APP_FILES)
    if not sources:
        raise FuzzSetupError(f"no model .c files (tp_predict, tp_input_quantize) in {model}")
    return include, sources


def build(clang: str, model: Path, out: Path) -> Path:
    include, sources = model_files(model)
    exe = out / "fuzz_serial"
    cmd = [
        clang, "-g", "-O1", "-std=c99", "-Wall", "-Wextra", "-Werror", "-DTP_HOST",
        "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
        f"-I{FIRMWARE}", f"-I{include}", str(HARNESS), str(FIRMWARE / "tp_serial.c"), *map(str, sources),
        "-o", str(exe),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        if re.search(r"libclang_rt\.fuzzer|fuzzer.*(not found|No such file)|cannot find.*fuzzer", result.stderr):
            raise FuzzSetupError(
                "clang's libFuzzer runtime is missing — install it (Debian: apt-get install libclang-rt-14-dev)"
            )
        raise FuzzSetupError(f"building the fuzz harness failed:\n{result.stderr.strip()}")
    return exe


def n_features(include: Path) -> int:
    text = (include / "tinyproto_model.h").read_text()
    match = re.search(r"#define\s+TP_N_FEATURES\s+\(?(\d+)", text)
    return int(match.group(1)) if match else 4


def write_seeds(seeds: Path, features: int) -> None:
    """A few well-formed sessions so the fuzzer starts inside the dispatcher, not at the CRC wall."""
    sys.path.insert(0, str(ROOT))
    from tinyproto.device.protocol import encode_frame

    seeds.mkdir(parents=True, exist_ok=True)
    frames = [
        (0x01, 1, b""),
        (0x02, 2, bytes(range(features))),
        (0x03, 3, b"\x00\x00\x80\x3f" * features),
        (0x04, 4, b""),
    ]
    stream = b"".join(b"\x00" + encode_frame(t, s, p) for t, s, p in frames)
    (seeds / "raw_session").write_bytes(b"\x01" + stream)
    (seeds / "raw_garbage").write_bytes(b"\x01" + b"\x12\x34\x00\xff\xff" + stream[:7] + stream)
    for t, s, p in frames:  # record mode: [type][seq][len][payload], payload clipped to 255 bytes
        p = p[:255]
        (seeds / f"record_{t:02x}").write_bytes(b"\x00" + bytes((t, s, len(p))) + p)


def run(exe: Path, work: Path, runs: int, seconds: int) -> tuple[int, float, list[Path]]:
    corpus = work / "corpus"
    corpus.mkdir(exist_ok=True)
    cmd = [
        str(exe), f"-runs={runs}", f"-max_total_time={seconds}", "-max_len=2048", "-print_final_stats=1",
        f"-artifact_prefix={work}/", str(corpus), str(work / "seeds"),
    ]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    elapsed = time.monotonic() - start
    match = re.search(r"stat::number_of_executed_units:\s*(\d+)", result.stderr)
    executions = int(match.group(1)) if match else 0
    crashes = sorted(work.glob("crash-*")) + sorted(work.glob("leak-*")) + sorted(work.glob("timeout-*"))
    if result.returncode != 0 and not crashes:
        sys.stderr.write(result.stderr[-4000:])
        crashes = [exe]  # died without an artifact: still a failure
    elif crashes:
        sys.stderr.write(result.stderr[-4000:])
    return executions, elapsed, crashes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200_000, help="stop after this many executions")
    parser.add_argument("--seconds", type=int, default=60, help="stop after this many seconds")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory (default: fake model)")
    parser.add_argument("--workdir", type=Path, help="keep the build, corpus and crashes here")
    args = parser.parse_args(argv)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="tp-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        clang = find_clang()
        exe = build(clang, args.model, work)
        write_seeds(work / "seeds", n_features(model_files(args.model)[0]))
    except FuzzSetupError as exc:
        print(f"run_fuzz: {exc}", file=sys.stderr)
        return 2
    executions, elapsed, crashes = run(exe, work, args.runs, args.seconds)
    rate = executions / elapsed if elapsed > 0 else 0.0
    print(f"fuzz_serial: {executions} executions in {elapsed:.1f} s ({rate:.0f} exec/s), {len(crashes)} crashes")
    for path in crashes:
        print(f"crash input: {path}")
    if args.workdir is None and not crashes:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
