"""Adds the fast tier's slow tests to tests/slow_tests.txt, from the JUnit XML of a run of that tier.

    .venv/bin/python -m pytest -q -m "not device and not slow" --junitxml=/tmp/fast.xml
    .venv/bin/python tools/slow_tests.py /tmp/fast.xml

A test that took SECONDS or more there (setup and teardown included; default 3) is added; the file's other lines
are kept (delete a line by hand when its test has become fast). tests/conftest.py marks every listed test `slow`,
so the fast tier leaves out what takes seconds although it reaches no device tool and no cluster: mostly shape
searches on the larger data sets.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "slow_tests.txt"
HEADER = ("# Tests of the fast tier's rules that take seconds: tests/conftest.py marks them `slow`.\n"
          "# Written by tools/slow_tests.py from a timed run of the fast tier (see its docstring).\n")


def node_id(classname: str, name: str) -> str:
    """pytest's node id from JUnit's classname (tests.test_x or tests.test_x.TestY) and test name."""
    parts = classname.split(".")
    module = [p for p in parts if p.startswith("test_")][0]
    path = "/".join(parts[: parts.index(module) + 1]) + ".py"
    return "::".join([path, *parts[parts.index(module) + 1:], name])


def junit_times(junit: Path) -> dict[str, float]:
    """Every test's seconds in a JUnit XML (setup, call and teardown), by pytest node id."""
    cases = ET.parse(junit).iter("testcase")
    return {node_id(c.get("classname", ""), c.get("name", "")): float(c.get("time", 0)) for c in cases}


def slow_ids(junit: Path, seconds: float) -> set[str]:
    return {node for node, time in junit_times(junit).items() if time >= seconds}


def listed() -> set[str]:
    if not LIST.exists():
        return set()
    return {line.strip() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML of a fast-tier run (pytest --junitxml)")
    parser.add_argument("--seconds", type=float, default=3.0, help="a test this long or longer is slow (default 3)")
    args = parser.parse_args()
    try:
        new = slow_ids(args.junit, args.seconds)
    except (OSError, ET.ParseError) as exc:
        print(f"error: cannot read {args.junit}: {exc}", file=sys.stderr)
        return 1
    before = listed()
    LIST.write_text(HEADER + "".join(f"{i}\n" for i in sorted(before | new)))
    print(f"{len(new - before)} tests added, {len(before | new)} listed in {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
