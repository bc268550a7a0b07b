#!/usr/bin/env python3
"""Validation speed benchmark: for each data set and family, the wall time of `tinyproto compile`, `build` and
`validate` (every test vector, int8 and raw passes, bit-exact), the serial line's lower bound for the bytes that
validation moved (the larger direction's bytes / (baud / 10): 8N1 is 10 bit times a byte) and measured / bound.

    python tools/bench_validate.py [--sets digits digits28 /tmp/d5k.npz] [--families protonn flynn bnc bloom]
                                   [--baud 115200] [--board-sim] [--json rows.json]

The generated set is `python tools/make_wide_digits.py --rows 5000 --out /tmp/d5k.npz` (5,000 x 784, seeded).
Every command runs as a user runs it (the CLI in a subprocess), so the times include PlatformIO's and Python's
start-up. "sim" validates on the simulated board (free-running: simulated time runs ahead of the wall clock, so
measured / line may be below 1); --board-sim also flashes the firmware through the real bootloader of a board
simulator paced to real time (`tinyproto board-sim`, `tinyproto flash --port`) and validates on its port, where
the line's lower bound is a real-time bound. Columns: s = seconds of wall time, cpu = user + system seconds of
the commands and their children (the machine's load shows as wall >> cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINYPROTO = [sys.executable, "-m", "tinyproto"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(args: list[str], what: str) -> tuple[float, float, str]:
    """(wall s, cpu s, stdout) of one tinyproto command; exits with its error if it fails."""
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    result = subprocess.run([*TINYPROTO, *args], capture_output=True, text=True, check=False, cwd=REPO)
    wall, cpu = time.perf_counter() - wall0, _children_cpu() - cpu0
    if result.returncode != 0:
        sys.exit(f"{what} failed ({' '.join(args)}): {result.stderr.strip()[-600:]}")
    return wall, cpu, result.stdout


class BoardSim:
    """`tinyproto board-sim` in the background: its port, until stop()."""

    def __init__(self, state: Path) -> None:
        self.proc = subprocess.Popen([*TINYPROTO, "board-sim", "--fresh", "--state", str(state)], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if len(line) != 2:
            self.stop()
            sys.exit(f"tinyproto board-sim did not start: {self.proc.stderr.read()[-400:]}")
        self.port = line[1]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def line_of(model_dir: Path) -> dict:
    summary = json.loads((model_dir / "validation.json").read_text())
    if not summary["passed"]:
        sys.exit(f"validation of {model_dir} failed: {summary['checks']}")
    return summary["line"] | {"n_vectors": summary["n_vectors"]}


def bench(data: str, family: str, work: Path, baud: int | None, board_sim: bool) -> list[dict]:
    name = Path(data).stem
    out = work / f"{name}-{family}"
    extra = ["--baud", str(baud)] if baud else []
    rows = []
    c_wall, c_cpu, _ = timed(["compile", data, "--model", family, "--budget", "2kB", "--out", str(out), *extra],
                             "compile")
    b_wall, b_cpu, _ = timed(["build", str(out)], "build")
    v_wall, v_cpu, _ = timed(["validate", str(out), "--sim", "--json"], "validate")
    rows.append({"set": name, "family": family, "target": "sim", "compile_s": c_wall, "compile_cpu": c_cpu,
                 "build_s": b_wall, "build_cpu": b_cpu, "validate_s": v_wall, "validate_cpu": v_cpu,
                 **line_of(out)})
    if board_sim:
        sim = BoardSim(work / f"board-{name}-{family}")
        try:
            f_wall, f_cpu, _ = timed(["flash", str(out), "--port", sim.port], "flash")
            v_wall, v_cpu, _ = timed(["validate", str(out), "--port", sim.port, "--json"], "validate --port")
        finally:
            sim.stop()
        rows.append({"set": name, "family": family, "target": "board-sim", "compile_s": None, "compile_cpu": None,
                     "build_s": f_wall, "build_cpu": f_cpu, "validate_s": v_wall, "validate_cpu": v_cpu,
                     **line_of(out)})
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'set':<10} {'family':<8} {'target':<9} {'compile s':>9} {'build s':>8} {'valid. s':>8} {'v. cpu':>6} "
            f"{'host':>5} {'sim':>5} {'vectors':>7} {'baud':>8} {'line s':>7} {'passes s':>8} {'x line':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
        print(f"{r['set']:<10} {r['family']:<8} {r['target']:<9} {compile_s:>9} {r['build_s']:>8.1f} "
              f"{r['validate_s']:>8.1f} {r['validate_cpu']:>6.1f} {_cpu(r.get('host_cpu_seconds')):>5} "
              f"{_cpu(r.get('simulator_cpu_seconds')):>5} {r['n_vectors']:>7} {r['baud']:>8} "
              f"{r['line_seconds']:>7.1f} {r['measured_seconds']:>8.1f} {r['measured_over_line']:>6}")
    print("build s on a board-sim row: `tinyproto flash` through the real bootloader (avrdude); v. cpu: the validate "
          "command and its children; host / sim: CPU s of validate's passes and of the simulated board (simuno); "
          "passes s: the int8 and raw passes of validate; x line = passes s / line s")


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["digits", "digits28", "/tmp/d5k.npz"])
    parser.add_argument("--families", nargs="+", default=["protonn", "flynn", "bnc", "bloom"])
    parser.add_argument("--baud", type=int, default=None, help="build and validate at this rate (default: the board's)")
    parser.add_argument("--board-sim", action="store_true", help="also flash and validate on a paced board simulator")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    for data in args.sets:
        if data.endswith(".npz") and not os.path.exists(data):
            sys.exit(f"{data} is missing: python tools/make_wide_digits.py --rows 5000 --out {data}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_validate.") as tmp:
        for data in args.sets:
            for family in args.families:
                before = os.getloadavg()[0]
                rows += bench(data, family, Path(tmp), args.baud, args.board_sim)
                # the machine's load beside each row (on stderr: the table holds only what the commands did)
                print(f"done: {Path(data).stem} {family} (1-min load average {before:.2f} before, "
                      f"{os.getloadavg()[0]:.2f} after)", file=sys.stderr, flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
