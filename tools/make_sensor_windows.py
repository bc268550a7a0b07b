"""Write a set of accelerometer-like sensor windows (3 axes x N samples) of any size, for benchmarks.

Five activities that differ in frequency and amplitude (the shapes of `tests/helpers.sensor_windows`, whose
defaults these are): each row is a window of `--samples` readings per axis at 50 Hz, laid out x..., y..., z...,
gravity on z, a random phase and amplitude per row, Gaussian noise; `--spikes` adds that fraction of single-sample
shocks (up to +-`--spike-size` m/s^2, as a knock on the sensor gives), so the shared scale meets outliers.
Deterministic: the same arguments give byte-identical files.

    python tools/make_sensor_windows.py --rows 2000 --samples 500 --seed 0 --out build/windows.npz
    tinyproto compile build/windows.npz --budget 2kB --model bnc
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

RATE_HZ = 50.0
ACTIVITIES = [(0.3, 0.05), (1.8, 1.0), (3.0, 2.2), (1.4, 1.3), (1.1, 0.7)]  # (frequency Hz, amplitude m/s^2)
GRAVITY = 9.81
NOISE_STD = 0.3


def sensor_windows(rows: int, samples: int, seed: int, spikes: float = 0.0,
                   spike_size: float = 40.0) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (rows, 3 * samples), y int64 (rows,)): rows spread evenly over the five activities."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE_HZ
    X = np.empty((rows, 3 * samples), dtype=np.float32)
    y = np.arange(rows, dtype=np.int64) % len(ACTIVITIES)
    for i, c in enumerate(y):
        freq, amp = ACTIVITIES[c]
        wave = amp * rng.uniform(0.7, 1.3) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3))
        row = np.concatenate([wave + GRAVITY * (axis == 2) + rng.normal(0, NOISE_STD, samples) for axis in range(3)])
        if spikes > 0:
            hit = rng.random(row.size) < spikes
            row[hit] += rng.uniform(-spike_size, spike_size, int(hit.sum()))
        X[i] = row
    order = rng.permutation(rows)
    return X[order], y[order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500, help="number of rows (default 500)")
    parser.add_argument("--samples", type=int, default=500, help="readings per axis (default 500: 1500 columns)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--spikes", type=float, default=0.0, help="fraction of readings hit by a shock (default 0)")
    parser.add_argument("--spike-size", type=float, default=40.0, help="largest shock, m/s^2 (default 40)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the file to write: NAME.npz (arrays X, y), or NAME.csv (the label last)")
    args = parser.parse_args()
    if args.rows < 20 or args.samples < 1:
        parser.error("--rows must be at least 20 and --samples at least 1")
    if not 0.0 <= args.spikes < 1.0:
        parser.error("--spikes must be in [0, 1)")
    X, y = sensor_windows(args.rows, args.samples, args.seed, args.spikes, args.spike_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix.lower() == ".csv":
        header = ",".join([f"{axis}{i}" for axis in "xyz" for i in range(X.shape[1] // 3)] + ["activity"])
        np.savetxt(args.out, np.column_stack([X, y]), delimiter=",", header=header, comments="", fmt="%.6g")
    else:
        args.out = args.out.with_suffix(".npz")  # np.savez adds it anyway: say the name it writes
        np.savez(args.out, X=X, y=y)
    print(f"wrote {args.out}: {X.shape[0]} rows x {X.shape[1]} samples, {len(np.unique(y))} activities")


if __name__ == "__main__":
    main()
