"""The files of a sweep directory, shared by `tinyproto sweep` (which writes them) and `tinyproto report`
(which reads them): sweep.json (the grid and every run), results.jsonl (one line per finished point) and
points/<id>/ (each point's model directory).
Layer: pipeline."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import read_bytes_file

CONFIG = "sweep.json"
RESULTS = "results.jsonl"
POINTS = "points"
MAX_RESULTS_BYTES = 256 << 20  # ~100,000 points; more is not a results file tinyproto wrote


def read_results(path: Path, repair: bool = False) -> list[dict]:
    """The lines of results.jsonl; a torn last line (killed mid-write) is dropped, and cut off with repair."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    data = read_bytes_file(path, "a sweep's results", MAX_RESULTS_BYTES)
    lines = data.split(b"\n")
    records, good_end = [], 0
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)  # the part after the final newline: empty, or a torn line
        if not line.strip():
            good_end += len(line) + (0 if last else 1)
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise ValueError("not a result object")
            if entry.get("status") not in ("ok", "failed") or not isinstance(entry.get("dir"), str):
                raise ValueError("a result object without its status or directory")
        except ValueError as exc:
            if last:
                break  # torn by a kill: that point runs again
            raise TinyprotoError(f"{path}:{number} is not a result line ({str(exc)[:60]}); the sweep directory "
                                 "is damaged, start it again in a new --out") from None
        if last:  # a complete object without its newline: still torn (the newline is written with it)
            break
        records.append(entry)
        good_end += len(line) + 1
    if repair and good_end < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(good_end)
    return records


class ResultsFile:
    """results.jsonl, appended one fsync'ed line per finished point by the driver alone."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def _rewrite_in_order(path: Path, records: list[dict]) -> None:
    """Replace results.jsonl by the same lines in grid order (one atomic rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
