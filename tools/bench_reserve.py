#!/usr/bin/env python3
"""A model beside a sketch that really uses what was reserved: the figures tests/test_reserve.py checks, printed.

For a model directory compiled with --reserve-sram S --reserve-flash F (its report.json's beside_sketch), builds
with the Arduino IDE's builder a sketch of the user's own sized to use exactly F bytes of flash and S bytes of
SRAM (its globals plus its stack, measured by painting the free SRAM on the simulated Uno), then the same sketch
calling the model (tools/beside_sketch.py), runs it over the first N test vectors and prints the
flash and SRAM of both, what compile predicted, and whether every score equals the host reference's.

    python tools/bench_reserve.py build/digits-beside [--vectors 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from beside_sketch import ANSWER, build, run_lines, size_own_sketch, sram_used  # noqa: E402

from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.core.modeldir import load_model_dir  # noqa: E402
from tinyproto.pipeline.arduino import export_arduino  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--vectors", type=int, default=20)
    args = parser.parse_args()
    model_dir = load_model_dir(args.model_dir)
    beside = model_dir.report.get("beside_sketch")
    if not beside:
        raise SystemExit(f"{args.model_dir} was compiled without --reserve-sram / --reserve-flash")
    sram_reserve, flash_reserve = beside["reserve_sram_bytes"], beside["reserve_flash_bytes"]
    vectors = model_dir.vectors()
    lines = [" ".join(str(np.float32(v)) for v in row) for row in vectors.X_raw[:args.vectors]]
    with tempfile.TemporaryDirectory(prefix="tp-bench-reserve-") as tmp:
        work = Path(tmp)
        export = export_arduino(args.model_dir, work / "export")
        sram, flash, own, used_alone = size_own_sketch(work, export.out_dir, lines, sram_reserve, flash_reserve)
        elf, both = build(work, "Beside", export.out_dir, sram, flash, with_model=True)
        answers = run_lines(elf, lines)
    exact = sum(1 for i, a in enumerate(answers)
                if [int(v) for v in ANSWER.match(a).group(1).split()] == [int(vectors.labels[i]),
                                                                           *vectors.scores[i].tolist()])
    used = max(sram_used(a) for a in answers)
    library = beside["library"]
    print(f"{'':<34}{'flash B':>9}{'SRAM B':>9}")
    print(f"{'the sketch alone (reserved)':<34}{own.flash_bytes:>9}{used_alone:>9}")
    print(f"{'the sketch with the model':<34}{both.flash_bytes:>9}{used:>9}")
    print(f"{'the model in it (measured)':<34}{both.flash_bytes - own.flash_bytes:>9}{used - used_alone:>9}")
    print(f"{'the model (compile, bound)':<34}{library['flash_bytes']:>9}{library['sram_bytes']:>9}")
    board = load_board(model_dir.meta.get("board", "uno"))
    print(f"{board.name + ' (for a sketch)':<34}{board.flash_bytes_for_sketch:>9}{board.sram_bytes:>9}")
    print(f"\nfree SRAM the stack never reached: {2048 - used} B (compile said at least {beside['sram_left_bytes']} B)")
    print(f"vectors: {len(answers)}, bit-exact: {exact}")
    return 0 if exact == len(answers) and 2048 - used >= beside["sram_left_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
