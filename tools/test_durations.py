#!/usr/bin/env python3
"""Writes tests/durations.json, the measured seconds of the tests that take a second or more, from the JUnit XML
of a whole run. tests/conftest.py orders a pytest-xdist run by it, longest first, so the workers end together.

    .venv/bin/python -m pytest -q --junitxml=/tmp/suite.xml
    .venv/bin/python tools/test_durations.py /tmp/suite.xml

A test's time is JUnit's: setup, call and teardown (a test that made a shared fixture first carries its cost).
The file is rewritten whole: rerun both commands when tests are added or have become faster or slower.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from slow_tests import junit_times

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "tests" / "durations.json"


def durations(junit: Path, seconds: float) -> dict[str, float]:
    return {node: round(time, 1) for node, time in sorted(junit_times(junit).items()) if time >= seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML of a whole run (pytest --junitxml)")
    parser.add_argument("--seconds", type=float, default=1.0, help="list the tests this long or longer (default 1)")
    args = parser.parse_args()
    try:
        measured = durations(args.junit, args.seconds)
    except (OSError, ET.ParseError) as exc:
        print(f"error: cannot read {args.junit}: {exc}", file=sys.stderr)
        return 1
    FILE.write_text(json.dumps(measured, indent=0) + "\n")
    print(f"{len(measured)} tests of {args.seconds:g} s or more, {sum(measured.values()):.0f} s in all, "
          f"written to {FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
