#!/usr/bin/env python3
"""What --unknown-rate costs on the simulated Uno: one model compiled without and with the option, each built
and validated; prints flash, cycles per inference and the confidence figures of both.

    python tools/bench_confidence.py [DATA] [--models protonn,flynn] [--budget 2kB] [--rate 5%] [--out DIR]

Both directories hold the same integer model (the option only adds the decline threshold), so the differences
are the option's own cost. Every figure comes from validate on the simulator.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path


def measure(data: str, family: str, budget: str, rate: str | None, out: Path) -> dict:
    from rich.console import Console

    from tinyproto.pipeline.compile import compile_model
    from tinyproto.pipeline.firmware import build_model_dir
    from tinyproto.pipeline.validate import validate

    compile_model(data, family, budget, 0, "uno", out, unknown_rate=rate)
    build_model_dir(out, None, Console(file=io.StringIO(), quiet=True))
    return validate(out, raw_check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", default="digits")
    parser.add_argument("--models", default="protonn,flynn")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--rate", default="5%")
    parser.add_argument("--out", type=Path, default=Path("build/bench-confidence"))
    args = parser.parse_args(argv)
    print(f"{'model':8} {'option':14} {'passed':6} {'flash B':>8} {'cycles':>10} {'coverage':>9} "
          f"{'accepted':>9} {'ECE pts':>8}")
    for family in args.models.split(","):
        rows = {}
        for rate in (None, args.rate):
            name = f"{family}-{'unknown' if rate else 'plain'}"
            rows[rate] = v = measure(args.data, family, args.budget, rate, args.out / name)
            c = v["confidence"] or {}
            print(f"{family:8} {('--unknown-rate ' + rate) if rate else 'none':14} {str(v['passed']):6} "
                  f"{v['flash_bytes']:>8} {v['cycles_mean']:>10.1f} {100 * c.get('coverage', 0):>8.1f}% "
                  f"{100 * (c.get('accepted_accuracy') or 0):>8.1f}% {100 * c.get('ece', 0):>8.2f}")
        plain, unknown = rows[None], rows[args.rate]
        print(f"{family:8} {'cost':14} {'':6} {unknown['flash_bytes'] - plain['flash_bytes']:>+8} "
              f"{unknown['cycles_mean'] - plain['cycles_mean']:>+10.1f} "
              f"({100 * (unknown['cycles_mean'] / plain['cycles_mean'] - 1):+.2f} % cycles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
