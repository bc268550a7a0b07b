"""Federated (no DP) against compile on the pooled rows: is the deployed model identical (int_model, model hash,
header digests)? One row per (data set, parties, split).

    python tools/bench_federated_identity.py [--data digits,segment] [--parties 1,128,1000]
                                             [--splits iid,dirichlet:0.3,by-class]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tinyproto.pipeline.federate import FederateOptions, federate_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="digits,segment")
    ap.add_argument("--parties", default="1,128,1000")
    ap.add_argument("--splits", default="iid,dirichlet:0.3,by-class")
    args = ap.parse_args()
    print("| data | parties | split | identical to compile | federated accuracy | compile accuracy | seconds |")
    print("|---|---|---|---|---|---|---|")
    for data in args.data.split(","):
        for parties in [int(p) for p in args.parties.split(",")]:
            for split in args.splits.split(","):
                started = time.perf_counter()
                with tempfile.TemporaryDirectory() as scratch:
                    options = FederateOptions(parties=parties, split_spec=split, backend="local")
                    r = federate_model(data, options, out=Path(scratch) / "fed").report
                print(f"| {data} | {parties} | {split} | {'yes' if r['identical_to_compile'] else 'NO'} | "
                      f"{100 * r['accuracy']:.2f} % | {100 * r['compile_accuracy']:.2f} % | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
