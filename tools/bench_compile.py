#!/usr/bin/env python3
"""How long `tinyproto compile` takes, per family, and `tinyproto run` (compile, build, validate on the simulator):
wall seconds and CPU seconds (the command's own and its worker processes'), one command at a time.

    python tools/bench_compile.py [DATA] [--models protonn,flynn,bnc,bloom] [--budget 2kB] [--seed 0] [--no-run]
                                  [--out DIR]

Each command runs in its own process, as a user runs it (the imports included). On a machine shared with other
work the wall time follows the load (printed beside it); the CPU seconds move much less.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def timed(command: list[str]) -> tuple[int, float, float]:
    """(exit code, wall seconds, CPU seconds of the command and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", default="digits")
    parser.add_argument("--models", default="protonn,flynn,bnc,bloom")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-run", action="store_true", help="time compile only, not `tinyproto run`")
    parser.add_argument("--out", type=Path, default=Path("build/bench-compile"))
    args = parser.parse_args(argv)
    tinyproto = [sys.executable, "-m", "tinyproto"]
    common = [args.data, "--budget", args.budget, "--seed", str(args.seed)]
    commands = [(f"compile --model {family}", [*tinyproto, "compile", *common, "--model", family,
                                               "--out", str(args.out / family)])
                for family in args.models.split(",")]
    if not args.no_run:
        commands.append(("run", [*tinyproto, "run", *common, "--out", str(args.out / "run")]))
    print(f"{'command':24} {'exit':>4} {'wall s':>8} {'CPU s':>8} {'load':>6}")
    for name, command in commands:
        code, wall, cpu = timed(command)
        print(f"{name:24} {code:>4} {wall:>8.1f} {cpu:>8.1f} {os.getloadavg()[0]:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
