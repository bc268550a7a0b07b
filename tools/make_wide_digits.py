"""Write an MNIST-sized handwritten-digit set (784 pixels, 0..255) of any number of rows, for benchmarks.

Each row is one of sklearn's 1,797 digits (8 x 8), upsampled to 28 x 28 (bilinear, as the built-in `digits28`),
then moved by a random whole-pixel shift, rotated by a small random angle and given a little pixel noise, so the
rows are distinct and the set is harder than `digits28` (whose rows are exact upsamplings). Deterministic: the
same --rows and --seed give byte-identical files.

    python tools/make_wide_digits.py --rows 5000 --seed 0 --out build/digits5k.npz
    tinyproto compile build/digits5k.npz --budget 2kB
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.ndimage import rotate, shift

from tinyproto.core.builtin_sets import upsampled_digits

SIDE = 28
MAX_SHIFT_PX = 2
MAX_ROTATION_DEG = 12.0
NOISE_STD = 8.0  # in pixel units (0..255)


def wide_digits(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (rows, 784) in 0..255, whole numbers; y int64 (rows,)) drawn with `seed`."""
    rng = np.random.default_rng(seed)
    base, labels = upsampled_digits(SIDE)
    picks = rng.integers(0, len(base), size=rows)
    out = np.empty((rows, SIDE * SIDE), dtype=np.float32)
    for i, pick in enumerate(picks):
        image = base[pick].reshape(SIDE, SIDE)
        image = rotate(image, rng.uniform(-MAX_ROTATION_DEG, MAX_ROTATION_DEG), reshape=False, order=1)
        image = shift(image, rng.integers(-MAX_SHIFT_PX, MAX_SHIFT_PX + 1, size=2), order=0)
        image = image + rng.normal(0.0, NOISE_STD, size=image.shape)
        out[i] = np.clip(np.rint(image), 0, 255).reshape(-1)
    return out, np.asarray(labels[picks], dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="number of rows (default 5000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="the .npz file to write (arrays X, y)")
    args = parser.parse_args()
    if args.rows < 20:
        parser.error("--rows must be at least 20")
    X, y = wide_digits(args.rows, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, X=X, y=y)
    print(f"wrote {args.out}: {X.shape[0]} rows x {X.shape[1]} pixels, {len(np.unique(y))} classes")


if __name__ == "__main__":
    main()
