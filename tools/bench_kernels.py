#!/usr/bin/env python3
"""What the AVR twins buy: per model directory, the validation firmware built twice from the current runtime,
with the AVR twins (the default) and with the portable reference kernels (-DTP_FORCE_REFERENCE), run on the
simulated Uno over the model's test vectors. Prints, for each build, whether every score vector equals the host
reference's, the mean Timer1 cycles per inference and the firmware's flash bytes.

    python tools/bench_kernels.py MODEL_DIR [MODEL_DIR ...] [--vectors N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench_latency import firmware_ring, run_firmware, write_project  # noqa: E402

from tinyproto import families  # noqa: E402
from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.core.modeldir import load_model_dir  # noqa: E402
from tinyproto.device.build import build_project  # noqa: E402

BUILDS = (("twins", ""), ("reference", "-DTP_FORCE_REFERENCE"))


def measure(model, xq: np.ndarray, reference: np.ndarray, project: Path, flag: str, board) -> dict:
    write_project(model, project, False, board)
    if flag:
        ini = project / "platformio.ini"
        ini.write_text(ini.read_text().replace("-DTP_SIMULATED=1", f"-DTP_SIMULATED=1 {flag}"))
    build = build_project(project, "uno_sim")
    predictions, _, _ = run_firmware(build.elf, xq, None, firmware_ring(model, board))
    scores = np.array([p.scores for p in predictions], dtype=np.int64)
    cycles = np.array([p.cycles for p in predictions], dtype=np.float64)
    return {"exact": bool(np.array_equal(scores, reference)), "cycles": float(cycles.mean()),
            "flash": build.sizes.flash_bytes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dirs", nargs="+", type=Path)
    parser.add_argument("--vectors", type=int, default=50, help="test vectors per model (default 50)")
    args = parser.parse_args()
    print(f"{'model':<16}{'family':<9}{'build':<11}{'exact':>6}{'cycles':>10}{'flash B':>9}{'x twins':>9}")
    with tempfile.TemporaryDirectory(prefix="tp-bench-kernels-") as tmp:
        for path in args.model_dirs:
            model_dir = load_model_dir(path)
            model, vectors = families.load_int_model(model_dir), model_dir.vectors()
            n = min(args.vectors, len(vectors.labels))
            board = load_board(model_dir.meta.get("board", "uno"))
            rows = {name: measure(model, vectors.xq[:n], np.asarray(vectors.scores[:n], dtype=np.int64),
                                  Path(tmp) / path.name / name, flag, board) for name, flag in BUILDS}
            for name, row in rows.items():
                print(f"{path.name:<16}{model.family:<9}{name:<11}{'yes' if row['exact'] else 'NO':>6}"
                      f"{row['cycles']:>10.0f}{row['flash']:>9}{row['cycles'] / rows['twins']['cycles']:>9.2f}")
            if not all(row["exact"] for row in rows.values()):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
