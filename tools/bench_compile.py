#!/usr/bin/env python3
"""How long `tinyproto compile` takes, per family, and `tinyproto run` (compile, build, validate on the simulator):
wall seconds and CPU seconds (the command's own and its worker processes'), one command at a time.

    python tools/bench_compile.py [DATA] [--models protonn,flynn,bnc,bloom] [--budget 2kB] [--seed 0] [--no-run]
                                  [--jobs N] [--out DIR]

Each command runs in its own process, as a user runs it (the imports included). On a machine shared with other
work the wall time follows the load (printed beside it); the CPU seconds move much less. Each compiled model's
test accuracy (int8, the host reference) and model hash are printed beside its times: the same hash for two worker
counts (--jobs) is the same model, byte for byte.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: compile's own)")
    parser.add_argument("--out", type=Path, default=Path("build/bench-compile"))
    args = parser.parse_args(argv)
    tinyproto = [sys.executable, "-m", "tinyproto"]
    common = [args.data, "--budget", args.budget, "--seed", str(args.seed)]
    if args.jobs is not None:
        common += ["--jobs", str(args.jobs)]
    commands = [(f"compile --model {family}", args.out / family,
                 [*tinyproto, "compile", *common, "--model", family, "--out", str(args.out / family)])
                for family in args.models.split(",")]
    if not args.no_run:
        commands.append(("run", args.out / "run", [*tinyproto, "run", *common, "--out", str(args.out / "run")]))
    print(f"{'command':24} {'exit':>4} {'wall s':>8} {'CPU s':>8} {'load':>6} {'test acc':>9}  model hash")
    for name, out_dir, command in commands:
        code, wall, cpu = timed(command)
        accuracy, digest = model_figures(out_dir) if code == 0 else (None, "")
        shown = f"{100 * accuracy:8.2f}%" if accuracy is not None else f"{'-':>9}"
        print(f"{name:24} {code:>4} {wall:>8.1f} {cpu:>8.1f} {os.getloadavg()[0]:>6.1f} {shown}  {digest[:12]}",
              flush=True)
    return 0


def model_figures(out_dir: Path) -> tuple[float | None, str]:
    """(int8 test accuracy, model hash) from the model directory's report.json."""
    try:
        report = json.loads((out_dir / "report.json").read_text())
    except (OSError, ValueError):
        return None, ""
    return report.get("int8_accuracy"), str(report.get("model_hash", ""))


if __name__ == "__main__":
    sys.exit(main())
