#!/usr/bin/env python3
"""Write the benchmark pages of the documentation site (docs/benchmarks/) by running the benchmark commands.

    python tools/bench_docs.py                    # every benchmark below (tens of minutes on 2 cores)
    python tools/bench_docs.py --only families    # one of them
    python tools/bench_docs.py --list

Each page gets the table the command printed, exactly, and the provenance that made it: the command, the commit
(with "+ local changes" when the checkout differed from it), the machine (CPU model, cores, memory, OS, Python,
avr-gcc) and the date and wall time. docs/benchmarks/index.md lists every page there is. Nothing here is typed in
by hand: to update a figure, run the script again and commit the pages it wrote.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "benchmarks"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Benchmark:
    name: str  # the page: docs/benchmarks/<name>.md
    title: str
    what: str  # what the table shows, one paragraph
    commands: tuple[str, ...]  # run in order, in a scratch directory; the last one prints the table
    # the page's table from the scratch directory and the last output (default: that output, verbatim)
    render: Callable[[Path, str], str] | None = None


def sweep_table(scratch: Path, _output: str) -> str:
    """One row per sweep point, from the sweep's results.jsonl (every figure as the sweep recorded it)."""
    rows = [json.loads(line) for results in sorted(scratch.glob("sweep-*/results.jsonl"))
            for line in results.read_text().splitlines() if line]
    out = ["| data | budget | family | device accuracy | model bytes | ms / inference | mJ (MCU) | bit-exact |",
           "|---|---:|---|---:|---:|---:|---:|---|"]
    for row in sorted(rows, key=lambda r: (r["dataset"], r["budget_bytes"], r["model"])):
        device = row.get("device") or {}
        if row.get("status") != "ok" or not device:
            out.append(f"| {row['dataset']} | {row['budget_bytes']} B | {row['model']} | failed at "
                       f"{row.get('stage')}: {row.get('error')} | | | | |")
            continue
        exact = "yes" if device.get("score_agreement") == 1.0 and device.get("passed") else "NO"
        out.append(f"| {row['dataset']} | {row['budget_bytes']} B | {row['model']} | {100 * device['accuracy']:.2f} % "
                   f"| {row['model_bytes']} | {device['latency_ms']:.2f} | {device['energy_mj_mcu']:.3f} | {exact} |")
    return "\n".join(out)


BENCHMARKS = (
    Benchmark(
        "families", "All four families at 1 kB and 2 kB on the simulated Uno",
        "Every (family, budget) point compiled with the default search (seed 0), built and validated on the "
        "simulated Uno, every score vector compared with the host reference, on two narrow tables and two "
        "images (8×8 and 28×28 digits). The device accuracy is on each set's held-out 25 %; ms and mJ are per "
        "inference (the energy is the board's model, not a meter).",
        tuple(f"tinyproto sweep {data} --models protonn,flynn,bnc,bloom --budgets 1kB,2kB --out sweep-{data}"
              for data in ("digits", "digits28", "breast_cancer", "segment")),
        sweep_table,
    ),
    Benchmark(
        "protonn-device", "ProtoNN on the simulated Uno",
        "compile → build → validate per (data, budget): device accuracy, bit-exact agreement, cycles and ms per "
        "inference, the static cost model's prediction and its error, measured cycles over the multiply-"
        "accumulate lower bound, energy, flash, static SRAM and measured stack peak.",
        ("python {tools}/bench_device.py --data digits breast_cancer --budgets 1kB 2kB",),
    ),
    Benchmark(
        "protonn-host", "ProtoNN on the host, by budget",
        "Float and int8 (the bit-exact integer reference) accuracy on the held-out split for each budget, the "
        "shape the solver chose, and the search + training time.",
        ("python {tools}/bench_protonn.py --data digits breast_cancer --budgets 1kB 2kB 4kB",),
    ),
)


def _run(command: str, cwd: Path) -> str:
    words = [str(BIN / w) if w in ("tinyproto", "python") else w
             for w in shlex.split(command.format(tools=ROOT / "tools"))]
    env = {**os.environ, "COLUMNS": "100", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    result = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"bench_docs: `{command}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return result.stdout


def _output(command: str, *args: str) -> str:
    try:
        return subprocess.run([command, *args], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# what a figure depends on
CODE = ("tinyproto", "firmware", "templates", "boards", "tools", "pyproject.toml", "setup.py")


def commit() -> str:
    """The commit the figures come from; flagged when the code (not the docs) differed from it."""
    head = _output("git", "rev-parse", "--short=12", "HEAD")
    dirty = _output("git", "status", "--porcelain", "--untracked-files=no", "--", *CODE)
    return head + (" + local changes to the code" if dirty and dirty != "unknown" else "")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f"{pages / 2**30:.1f} GiB"
    except (ValueError, OSError):
        memory = "unknown memory"
    avr_gcc = _output("avr-gcc", "-dumpversion")
    return (f"{cpu}, {os.cpu_count()} cores, {memory}; {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}; avr-gcc {avr_gcc}")


def run_benchmark(bench: Benchmark) -> Path:
    started, made_by = time.time(), commit()
    with tempfile.TemporaryDirectory(prefix=f"bench-{bench.name}-") as scratch:
        outputs = [_run(command, Path(scratch)) for command in bench.commands]
        last = outputs[-1].replace(scratch, "DIR").rstrip()
        commands = "\n".join(f"$ {c.format(tools='tools')}" for c in bench.commands)
        table = bench.render(Path(scratch), last) if bench.render else f"```text\n{commands}\n{last}\n```"
    seconds = time.time() - started
    page = (f"# {bench.title}\n\n{bench.what}\n\n"
            f"| | |\n|---|---|\n| command | `{' && '.join(c.format(tools='tools') for c in bench.commands)}` |\n"
            f"| commit | `{made_by}` |\n| machine | {machine()} |\n"
            f"| date | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} |\n"
            f"| wall time | {seconds:.0f} s (the machine may have been shared: wall times are upper bounds) |\n\n"
            f"Written by `python tools/bench_docs.py --only {bench.name}`.\n\n{table}\n")
    path = PAGES / f"{bench.name}.md"
    path.write_text(page)
    return path


def write_index() -> None:
    rows = []
    for bench in BENCHMARKS:
        if (PAGES / f"{bench.name}.md").is_file():
            rows.append(f"| [{bench.title}]({bench.name}.md) | `python tools/bench_docs.py --only {bench.name}` |")
    (PAGES / "index.md").write_text(
        "# Benchmarks\n\n"
        "Every table in this section was printed by a benchmark command and written here, with the commit, the "
        "machine and the command that made it, by `tools/bench_docs.py`; none is typed in by hand. Figures are on "
        "the fixed split (stratified, 25 % test, seed 0) unless a page says otherwise. The other benchmark scripts "
        "(`tools/bench_*.py`) print their tables to the terminal; the model family pages quote some of them with "
        "their commands.\n\n"
        + ("| benchmark | to run it again |\n|---|---|\n" + "\n".join(rows) + "\n" if rows else
           "No benchmark page has been written in this checkout yet: `python tools/bench_docs.py` writes them.\n"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS])
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for bench in BENCHMARKS:
            print(f"{bench.name:16} {bench.title}")
        return
    PAGES.mkdir(parents=True, exist_ok=True)
    for bench in BENCHMARKS:
        if args.only is None or bench.name in args.only:
            print(f"bench_docs: {bench.name} ...", flush=True)
            print(f"bench_docs: wrote {run_benchmark(bench).relative_to(ROOT)}", flush=True)
    write_index()


if __name__ == "__main__":
    main()
