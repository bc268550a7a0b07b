#!/usr/bin/env python3
"""The CPU time (user + sys) of each test of a run, its own processes included, and where a run's CPU goes.

A pytest plugin: each test's CPU is the growth, over its setup, call and teardown, of the CPU of the pytest process
(a pytest-xdist worker) and of every live process below it (the fork server's commands, a compile's solver workers,
a dask cluster, a simulated board), a process reaped during the test counted in its parent's. Wall time under load
says little (a test of a second idle takes three beside other jobs); CPU is the yardstick of a shared machine.

    PYTHONPATH=$PWD/tools .venv/bin/python -m pytest -q -p cpu_per_test     # writes /tmp/cpu_per_test.jsonl
    .venv/bin/python tools/cpu_per_test.py /tmp/cpu_per_test.jsonl          # the total and the costliest tests

PYTHONPATH must be absolute: a relative entry makes the interpreters that test_build starts in a deleted working
directory fail at start-up. CPU_PER_TEST=FILE writes another file (one JSON line per test, appended: remove the file
before a run). A process that leaves the tree (a daemon re-parented to init) is counted only up to then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

DEFAULT = "/tmp/cpu_per_test.jsonl"
_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """Seconds of CPU of `root` and its live descendants, with what each has reaped (Linux /proc)."""
    children: dict[int, list[int]] = {}
    own: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(name))
        own[int(name)] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += own.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = tree_cpu(os.getpid()), time.monotonic()
    yield
    cpu, wall = tree_cpu(os.getpid()) - cpu, time.monotonic() - wall
    with open(os.environ.get("CPU_PER_TEST", DEFAULT), "a") as out:
        out.write(json.dumps({"test": item.nodeid, "cpu": round(cpu, 2), "wall": round(wall, 2),
                              "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, nargs="?", default=Path(DEFAULT), help=f"the run's lines ({DEFAULT})")
    parser.add_argument("--top", type=int, default=30, help="list this many of the costliest tests (30)")
    args = parser.parse_args()
    try:
        rows = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
        rows = [{"test": str(r["test"]), "cpu": float(r["cpu"]), "wall": float(r["wall"])} for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {args.file} is not a file of this plugin's lines ({exc.__class__.__name__}: {exc})",
              file=sys.stderr)
        return 1
    total = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} s of CPU")
    by_file: Counter[str] = Counter()
    for r in rows:
        by_file[r["test"].split("::")[0]] += r["cpu"]
    print("\n  CPU s  file")
    for name, cpu in by_file.most_common(args.top):
        print(f"{cpu:7.1f}  {name}")
    print("\n  CPU s   wall s  test")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:args.top]:
        print(f"{r['cpu']:7.1f} {r['wall']:8.1f}  {r['test']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
