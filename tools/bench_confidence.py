#!/usr/bin/env python3
"""What the confidence stage costs on the simulated Uno: one integer model per family, written three ways and
each built and validated on the simulator:

- ``none``: the model without its calibration: the confidence stage compiled out (the firmware's tp_judge is
  the stub that answers confidence 0 and the label, so the serial protocol keeps its shape);
- ``confidence``: with its calibration (every model compile writes);
- ``threshold``: with the calibration and the --unknown-rate threshold, without the clip check (measured only for
  a model that keeps one: its difference to ``unknown`` is the check's own cost);
- ``unknown``: with the calibration and the --unknown-rate threshold (and the clip check, with --clip-check, when the
  model keeps one).

    python tools/bench_confidence.py [DATA] [--models protonn,flynn,bnc,bloom] [--budget 2kB] [--rate 5%]
                                     [--seed 0] [--holdout-classes 8,9] [--clip-check] [--out DIR]

The three directories hold the same integer model (same weights, same scores), so the differences are the
stage's own cost, and the generated model hash's: the hash's four bytes are constants of the HELLO answer, which
avr-gcc loads with one instruction each unless one equals a constant already in a register, so two firmware of
different hashes can differ by a few bytes beside the stage. Flash is the firmware's (avr-size), `tp_judge` the
function's own bytes (avr-nm), cycles the
mean the simulator measured over every test vector, and `predicted` the cost model's figure; every row is
bit-exact or the run says so. A second table gives what the device answered with the stage (validation.json,
from the device's own answers): accuracy and calibration error (10 bins) of the known-class rows, the share of them
answered and right among those, and, with --holdout-classes (those classes' rows go to the test split only, as
`compile --holdout-classes`), the novelty score's AUROC and the share of held-out rows declined.

With --goals, the goals of the confidence stage instead, on every data set and held-out set named:

    python tools/bench_confidence.py --goals digits:8,9 digits:3,5 digits:0 digits:1,7 segment:sky ... [--device]

one model per family and DATA:CLASSES (those classes held out of training, --rate asked; the table names the clip
check each model keeps, its side and the count it declines above, or -), compile's figures of
the known and held-out test rows (the host reference; with --device each model is also built and validated on the
simulated Uno, and the figures are the device's own, every vector compared), each checked against its goal:
novelty AUROC (ProtoNN and FlyNN 0.90, BNC and Bloom features 0.85), for ProtoNN and FlyNN at least 45 % of the
held-out rows declined and the accuracy on the accepted known rows above the model's accuracy on all of them, and
for every family a calibration error (10 bins) of at most 5 points. A missed goal is marked with `!`.

With --goals and --feature-range W,..., a host-only probe instead (nothing of it is in tinyproto): what a range check
per input feature would add beside each model's novelty score, the training rows' int8 minimum and maximum of
every feature on the model's own input stage, each widened by W times that span a side (rounded up); a row beyond
it in any feature ranks above every row inside (by how far beyond), then by the novelty score:

    python tools/bench_confidence.py --goals iris:2 wine:2 --feature-range 0,0.1,0.25

per model and W: the novelty AUROC without and with the check, the held-out and known test rows it puts beyond the
range (declined on top of the threshold's), and the share of the fold models' validation rows beyond their own
training rows' range (what a solver deciding the check on validation rows, as the clip check is, would see).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

VARIANTS = ("none", "confidence", "threshold", "unknown")
# the goals of the confidence stage: the novelty AUROC per family, and which families must also decline at least
# DECLINED of the held-out rows and be more accurate on the rows they answer
AUROC_GOAL = {"protonn": 0.90, "flynn": 0.90, "bnc": 0.85, "bloom": 0.85}
DECLINE_GOAL_FAMILIES = ("protonn", "flynn")
DECLINED_GOAL = 0.45
ECE_GOAL = 0.05


def fit(data: str, family: str, budget: str, rate: str, seed: int, holdout: str | None = None,
        clip_check: bool = False):
    """(fitted, trained_on) of the model compile would write with --unknown-rate rate (and --holdout-classes)."""
    from tinyproto import families
    from tinyproto.core.boards import load_board
    from tinyproto.core.budget import parse_budget
    from tinyproto.core.confidence import parse_rate
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.core.folds import Folds
    from tinyproto.families import SolveOptions
    from tinyproto.pipeline.compile import Fitted, TrainedOn, hold_out

    board = load_board("uno")
    dataset = load_dataset(data)
    sp = split(dataset)
    if holdout is not None:
        sp = hold_out(sp, holdout)
    budget_bytes = parse_budget(budget)
    options = SolveOptions(budget_bytes, seed, None, board.f_cpu_hz, n_jobs=1,
                           folds=Folds.standard(sp.X_train, sp.y_train, seed), clip_check=clip_check)
    clf, model, info = families.fit_judged(family, sp.X_train, sp.y_train, options, parse_rate(rate))
    info["max_latency_ms"] = None
    return Fitted(clf, model, info), TrainedOn(dataset, sp, seed, budget_bytes, board)


def variant(model, name: str):
    """The same integer model without its calibration (none), without its threshold (confidence), without its clip
    check (threshold), or as fitted."""
    import dataclasses

    from tinyproto.families.judging import is_judged, make_judged

    if name == "unknown":
        return model
    if name == "threshold":
        return make_judged(model, dataclasses.replace(model.calibration, clip_side=None, clip_above=None))
    if name == "confidence":
        return make_judged(model, dataclasses.replace(model.calibration, unknown_above=None, unknown_rate=None,
                                                      range_low=None, range_high=None, clip_side=None,
                                                      clip_above=None))
    plain = type(model).__mro__[1] if is_judged(model) else type(model)
    return plain(**{f.name: getattr(model, f.name) for f in dataclasses.fields(plain)})


def function_bytes(elf: Path, suffix: str) -> int:
    """The size avr-nm gives the function whose name ends with suffix (the model's prefix comes first, e.g.
    digits_judge for tp_judge), 0 when there is none (e.g. inlined)."""
    out = subprocess.run(["avr-nm", "--size-sort", "-S", str(elf)], check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "Tt" and parts[3].endswith(suffix):
            return int(parts[1], 16)
    return 0


def measure(fitted, on, out: Path) -> dict:
    from rich.console import Console

    from tinyproto.families import predict_cycles
    from tinyproto.pipeline.compile import write_model_directory
    from tinyproto.pipeline.firmware import build_model_dir
    from tinyproto.pipeline.validate import validate

    write_model_directory(fitted, on, out)
    build = build_model_dir(out, None, Console(file=io.StringIO(), quiet=True))
    v = validate(out, raw_check=False)
    return {"passed": bool(v["passed"]), "flash": int(build["flash_bytes"]),
            "judge": function_bytes(out / build["elf"], "_judge"), "cycles": float(v["cycles_mean"]),
            "predicted": float(predict_cycles(fitted.model)["total"]),
            "confidence": v.get("confidence") or {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", default="digits")
    parser.add_argument("--models", default="protonn,flynn,bnc,bloom")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--rate", default="5%")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout-classes", default=None)
    parser.add_argument("--clip-check", action="store_true", help="as compile --clip-check")
    parser.add_argument("--out", type=Path, default=Path("build/bench-confidence"))
    parser.add_argument("--goals", nargs="+", metavar="DATA:CLASSES", default=None,
                        help="check the goals on these data sets, each with these classes held out")
    parser.add_argument("--device", action="store_true", help="with --goals: build and validate every model")
    parser.add_argument("--feature-range", default=None, metavar="W,...",
                        help="with --goals: the host-only probe of a per-feature range check widened by W a side")
    args = parser.parse_args(argv)
    if args.goals and args.feature_range is not None:
        return feature_range_probe(args)
    if args.goals:
        return goals(args)
    from tinyproto.pipeline.compile import Fitted

    judged = []
    print(f"{'model':8} {'variant':10} {'bit-exact':9} {'flash B':>8} {'tp_judge B':>10} {'cycles':>10} "
          f"{'predicted':>10} {'pred err':>8}")
    for family in args.models.split(","):
        fitted, on = fit(args.data, family, args.budget, args.rate, args.seed, args.holdout_classes,
                          args.clip_check)
        rows = {}
        for name in VARIANTS:
            if name == "threshold" and not fitted.model.calibration.has_clips:
                continue  # the same model as "unknown"
            model = variant(fitted.model, name)
            rows[name] = r = measure(Fitted(fitted.clf, model, fitted.info), on, args.out / f"{family}-{name}")
            print(f"{family:8} {name:10} {str(r['passed']):9} {r['flash']:>8} {r['judge']:>10} {r['cycles']:>10.1f} "
                  f"{r['predicted']:>10.0f} {100 * (r['predicted'] / r['cycles'] - 1):>+7.2f}%", flush=True)
        base = rows["none"]
        measured = [name for name in VARIANTS[1:] if name in rows]
        for name in measured:
            r = rows[name]
            print(f"{family:8} {'+' + name:10} {'':9} {r['flash'] - base['flash']:>+8} {'':>10} "
                  f"{r['cycles'] - base['cycles']:>+10.1f} {'':>10} "
                  f"({100 * (r['cycles'] / base['cycles'] - 1):+.2f} % cycles)", flush=True)
        judged += [(family, name, rows[name]["confidence"]) for name in measured]
    print_judged(judged)
    return 0


def goal_row(family: str, figures: dict) -> tuple[list[str], int]:
    """The goal columns of one model's figures (a missed goal marked `!`) and how many it missed."""
    held = figures.get("held_out") or {}
    auroc, declined = held.get("auroc"), held.get("declined")
    strict = family in DECLINE_GOAL_FAMILIES
    checks = [
        (f"{auroc:.3f}", auroc is not None and auroc >= AUROC_GOAL[family]),
        (f"{100 * declined:.1f} %", not strict or declined >= DECLINED_GOAL),
        (f"{100 * figures['accepted_accuracy']:.2f} % / {100 * figures['accuracy']:.2f} %",
         not strict or figures["accepted_accuracy"] > figures["accuracy"]),
        (f"{100 * figures['ece']:.2f}", figures["ece"] <= ECE_GOAL),
    ]
    return [text + ("" if met else " !") for text, met in checks], sum(not met for _, met in checks)


def clip_check(model) -> str:
    """The model's clip check as the goals table gives it: the side and the count it declines above, or -."""
    calibration = getattr(model, "calibration", None)
    if calibration is None or not calibration.has_clips:
        return "-"
    return f"{calibration.clip_side} > {calibration.clip_above}"


def goals(args) -> int:
    """The goals table (Markdown): one row per data set, held-out classes and family."""
    from rich.console import Console

    from tinyproto.pipeline.compile import write_model_directory
    from tinyproto.pipeline.firmware import build_model_dir
    from tinyproto.pipeline.validate import validate

    print("| data | held out | family | coverage | novelty AUROC | held-out declined | accepted / all accuracy "
          "| ECE (points) | clip check | device |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    missed = failed = 0
    for spec in args.goals:
        data, _, held = spec.partition(":")
        for family in args.models.split(","):
            fitted, on = fit(data, family, args.budget, args.rate, args.seed, held, args.clip_check)
            out = args.out / f"{data}-{held.replace(',', '_')}-{family}"
            figures = write_model_directory(fitted, on, out).report["confidence"]
            device = "-"
            if args.device:
                build_model_dir(out, None, Console(file=io.StringIO(), quiet=True))
                v = validate(out, raw_check=False)
                figures = v["confidence"]
                device = "bit-exact" if v["passed"] else "FAILED"
                failed += not v["passed"]
            cells, n_missed = goal_row(family, figures)
            missed += n_missed
            print(f"| {data} | {held} | {family} | {100 * figures['coverage']:.1f} % | " + " | ".join(cells)
                  + f" | {clip_check(fitted.model)} | {device} |", flush=True)
    print(f"\n{missed} goal(s) missed" + (f"; {failed} model(s) NOT bit-exact on the device" if failed else ""))
    return 1 if failed else 0


def feature_range_probe(args) -> int:
    """The --feature-range probe's table (Markdown): one row per data set, held-out classes, family and widening."""
    import numpy as np

    from tinyproto import families
    from tinyproto.core.confidence import auroc
    from tinyproto.core.folds import Folds

    def bounds(xq, widen: float):
        low, high = xq.min(axis=0), xq.max(axis=0)
        pad = np.ceil(widen * (high - low)).astype(np.int64)
        return low - pad, high + pad

    def beyond(xq, low, high):
        return (np.maximum(low - xq, 0) + np.maximum(xq - high, 0)).sum(axis=1)

    print("| data | held out | family | widened | novelty AUROC: score / + range | held-out rows beyond "
          "| known test rows beyond | fold validation rows beyond |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.goals:
        data, _, held = spec.partition(":")
        for family in args.models.split(","):
            fitted, on = fit(data, family, args.budget, args.rate, args.seed, held, args.clip_check)
            model, sp = fitted.model, on.split
            quantize = model.input_stage.quantize
            x_train = quantize(sp.X_train).astype(np.int64)
            x_test = quantize(sp.X_test).astype(np.int64)
            known = np.isin(sp.y_test, np.asarray(model.classes))
            scores = model.scores(x_test)
            labels = np.asarray(model.labels(scores))
            novelty = np.asarray(families.novelty_score(model, scores, labels, x_test), dtype=np.float64)
            folds = Folds.standard(sp.X_train, sp.y_train, args.seed).splits()
            for widen in (float(w) for w in args.feature_range.split(",")):
                out = beyond(x_test, *bounds(x_train, widen))
                ranked = np.where(out > 0, 2.0**40 + out, novelty)
                fold_out = np.concatenate([beyond(x_train[va], *bounds(x_train[tr], widen)) > 0 for tr, va in folds])
                print(f"| {data} | {held} | {family} | {widen:g} | {auroc(novelty[~known], novelty[known]):.3f} / "
                      f"{auroc(ranked[~known], ranked[known]):.3f} | {100 * (out[~known] > 0).mean():.1f} % | "
                      f"{100 * (out[known] > 0).mean():.1f} % | {100 * (fold_out > 0).mean():.1f} % |", flush=True)
    return 0


def print_judged(judged: list) -> None:
    """The device's figures of the variants with a table (percent; ECE in points)."""
    def pct(value) -> str:
        return "-" if value is None else f"{100 * value:.2f}"

    print(f"\n{'model':8} {'variant':10} {'accuracy':>8} {'ECE':>5} {'answered':>8} {'right':>7} {'AUROC':>6} "
          f"{'declined':>8}")
    for family, name, figures in judged:
        held = figures.get("held_out") or {}
        auroc = "-" if held.get("auroc") is None else f"{held['auroc']:.3f}"
        print(f"{family:8} {name:10} {pct(figures.get('accuracy')):>8} {pct(figures.get('ece')):>5} "
              f"{pct(figures.get('coverage')):>8} {pct(figures.get('accepted_accuracy')):>7} {auroc:>6} "
              f"{pct(held.get('declined')):>8}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
