#!/usr/bin/env python3
"""Benchmark on the simulated Uno: compile -> build -> validate, one table row per (model, data, budget).

    python tools/bench_device.py [--models protonn flynn] [--data digits breast_cancer] [--budgets 1kB 2kB]

Columns: int8 accuracy on the device, bit-exact agreement, cycles / latency / energy per inference, the static
cost model's prediction and error, measured / MAC lower bound, flash, static SRAM and measured stack peak.
Goals (issue 3, digits @2 kB ProtoNN): <= 2.0 ms per inference, <= 1.5x the bound, cost model within 10 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto, not another one installed in the environment

from tinyproto.pipeline.compile import CompileOptions, compile_model  # noqa: E402
from tinyproto.pipeline.firmware import build_model_dir  # noqa: E402
from tinyproto.pipeline.validate import validate  # noqa: E402


def run(model: str, data: str, budget: str, workdir: Path) -> dict:
    out = workdir / f"{model}-{data}-{budget}"
    compile_model(data, CompileOptions(model, budget, 0, "uno", out))
    build_model_dir(out, "uno_sim", Console(quiet=True))
    return validate(out, raw_check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["protonn"])
    parser.add_argument("--data", nargs="+", default=["digits", "breast_cancer"])
    parser.add_argument("--budgets", nargs="+", default=["1kB", "2kB"])
    args = parser.parse_args()
    header = (f"{'model':<8}{'data':<14}{'budget':>7}{'bytes':>6}{'acc %':>7}{'exact':>6}{'cycles':>8}{'ms':>7}"
              f"{'pred':>8}{'err %':>7}{'x bound':>8}{'mJ mcu':>8}{'mJ brd':>8}{'flash':>7}{'sram':>6}{'stack':>6}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for data in args.data:
                for budget in args.budgets:
                    v = run(model, data, budget, Path(tmp))
                    exact = "yes" if v["score_agreement"] == 1.0 and v["label_agreement"] == 1.0 else "NO"
                    print(f"{model:<8}{data:<14}{budget:>7}{v['model_bytes']:>6}{100 * v['device_accuracy']:>7.2f}"
                          f"{exact:>6}{v['cycles_mean']:>8.0f}{v['latency_ms_mean']:>7.2f}{v['predicted_cycles']:>8}"
                          f"{100 * v['predicted_error']:>7.1f}{v['measured_over_bound']:>8.2f}"
                          f"{v['energy_mj_mcu']:>8.4f}{v['energy_mj_board']:>8.4f}{v['flash_bytes']:>7}"
                          f"{v['sram_static_bytes']:>6}{v['stack_peak_bytes']:>6}", flush=True)


if __name__ == "__main__":
    main()
