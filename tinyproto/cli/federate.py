"""The `tinyproto federate` command (registered by tinyproto/cli/main.py). Heavy imports stay inside the command.

Layer: cli.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tinyproto.cli.options import FLOAT, INT, label_option, not_blank, BUDGET_HELP, TextPath
from tinyproto.core.errors import TinyprotoError


@click.command("federate")
@click.argument("data", default="digits", required=False)
@click.option("--parties", type=INT, required=True,
              help="Number of parties N; the training rows are divided among them and never leave them.")
@click.option("--split", "split_spec", default="iid", show_default=True,
              help="How the training rows are divided: iid, by-class (each party holds one or a few classes) or "
                   "dirichlet:ALPHA (class proportions ~ Dirichlet(ALPHA); 0.1 is very uneven).")
@click.option("--dp-epsilon", type=FLOAT, default=None,
              help="Differential privacy budget epsilon (> 0) for the released counts (Ram & Sinha, Algorithm 2). "
                   "Without it the federated model equals the central one exactly.")
@click.option("--dp-T", "--dp-t", "dp_T", type=INT, default=None,
              help="Counts each party releases under DP (>= 1); default: L*m/64 of the L*m counts.")
@click.option("--backend", type=click.Choice(["dask", "local", "sim", "port"], case_sensitive=False), default="dask",
              show_default=True,
              help="dask: each party on a dask.distributed worker; local: all parties in this process; sim: each "
                   "party's counts are learned on-device by its own simulated Uno (learning firmware, LEARN / "
                   "READ_COUNTS over serial); port: the same on real Unos (--ports).")
@click.option("--ports", default=None, callback=not_blank, metavar="P1,P2,...",
              help="--backend port: one serial port per party (each board is flashed with the learning firmware).")
@click.option("--scheduler", default=None, callback=not_blank, metavar="ADDRESS",
              help="Address of a running dask scheduler (e.g. tcp://10.0.0.5:8786); default: a LocalCluster.")
@click.option("--workers", type=INT, default=None,
              help="LocalCluster workers (default: min(parties, CPUs)).")
@click.option("--processes", is_flag=True,
              help="LocalCluster workers as processes (parallel, slower start) instead of threads.")
@click.option("--timeout", type=FLOAT, default=None,
              help="Seconds to wait for a dask scheduler's answer or a LocalCluster to start (default 20); every "
                   "all-reduce round waits at most 600 s.")
@click.option("--budget", default="2kB", show_default=True, help=BUDGET_HELP)
@click.option("--seed", default=0, show_default=True, type=INT,
              help="Seed (0..2^32-1) of M, the party split, the validation folds and every party's DP noise.")
@click.option("--board", default="uno", show_default=True, help="Target board (boards/<name>.json).")
@click.option("--out", type=TextPath(path_type=Path), default=None,
              help="Model directory to write (default: build/<data name>-federated). Replaced only on success.")
@label_option
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the summary tables.")
def federate_command(data: str, parties: int, split_spec: str, dp_epsilon: float | None, dp_T: int | None,
                     backend: str, ports: str | None, scheduler: str | None, workers: int | None, processes: bool,
                     timeout: float | None, budget: str, seed: int, board: str, out: Path | None, label: str | None,
                     as_json: bool) -> None:
    """Train one FlyNN on DATA split across --parties parties, without moving their rows, and write a model
    directory exactly like `compile` (then `tinyproto build` / `validate` as usual).

    \b
    The parties agree on everything by all-reduces of sums that add up exactly:
      classes (union) -> hyper-parameters (the budget solver's candidates ranked by K-fold accuracy over
      every party's rows: fold counts and correct tallies are all-reduced) -> standardisation (n, sum x,
      sum x^2 per feature) -> int8 step (exact distributed quantile) -> per-class FlyHash counts (the model).
    Without --dp-epsilon the counts equal those of the same configuration trained on the pooled rows
    (report.json: counts_equal_pooled). The report compares the federated model with what `compile` would
    deploy from the pooled rows (compile_accuracy, compile_model_bytes) on the fixed 25 % test split.
    With --dp-epsilon E [--dp-T T] each party releases only T noisy counts (exponential mechanism +
    Laplace, epsilon_0 = E / (2 T N)); the report lists the privacy parameters. On data sets of a few
    thousand rows DP costs much accuracy at small E (tools/bench_federated.py has the tables).

    \b
    Examples:
      tinyproto federate digits --parties 4 --split dirichlet:0.1 --out build/fed
      tinyproto federate digits --parties 2 --dp-epsilon 16 --dp-T 30 --backend local
      tinyproto federate data.csv --parties 3 --scheduler tcp://127.0.0.1:8786
      tinyproto federate iris --parties 3 --backend sim --out build/fed-sim
      tinyproto federate iris --parties 2 --backend port --ports /dev/ttyACM0,/dev/ttyACM1
    """
    try:
        _run(data, parties, split_spec, dp_epsilon, dp_T, backend, ports, scheduler, workers, processes, timeout,
             budget, seed, board, out, label, as_json)
    except TinyprotoError as exc:  # also one line when used outside the tinyproto group
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:  # the parties were shut down on the way out; --out is written only at the end
        click.echo("error: interrupted; nothing was written", err=True)
        sys.exit(130)


def _run(data, parties, split_spec, dp_epsilon, dp_T, backend, ports, scheduler, workers, processes, timeout,
         budget, seed, board, out, label, as_json) -> None:
    from rich.console import Console

    from tinyproto.pipeline.federate import FederateOptions, check_arguments, federate_model
    from tinyproto.cli.tables import print_compile_report

    options = FederateOptions(parties, split_spec, dp_epsilon, dp_T, backend, scheduler, workers, processes, ports,
                              timeout, seed, budget, board, label)
    check_arguments(options)  # refuse before the spinner starts
    if workers is not None and parties is not None and parties >= 1 and workers > parties:
        # a worker runs one party at a time: more would only be started (100000 of them never finished starting)
        raise TinyprotoError(f"--workers {workers} is more than --parties {parties}; each worker runs a party, "
                             f"give at most {parties}")
    console = Console(stderr=as_json)

    def say(message: str) -> None:
        console.print(f"[dim]· {message}[/dim]")

    with console.status(f"federated training with {parties} parties...", spinner="dots"):
        result = federate_model(data, options, out, say)
    if as_json:
        click.echo(json.dumps(result.report, indent=2))
    else:
        out_console = Console()
        print_compile_report(out_console, result.report, result.out_dir)
        print_federation_report(out_console, result.report)
    check_device_parties(result.report, result.out_dir / "report.json")


def check_device_parties(report: dict, where) -> None:
    """What the parties' devices did, checked like `learn` checks one device: counts other than the host
    reference's, or a figure that is no measurement (0 cycles per learning step), make the command fail after the
    model directory and its report are written (the figure is null there, and named)."""
    parties = (report.get("cluster") or {}).get("device_parties") or []
    differing = [str(p["party"]) for p in parties if not p.get("counts_identical_to_host", True)]
    if differing:
        raise TinyprotoError(f"the devices of parties {', '.join(differing)} did not learn the counts the host "
                             f"computes (details in {where})")
    problems = [f"party {p['party']}: {problem}" for p in parties for problem in p.get("device_figure_problems", [])]
    if problems:
        raise TinyprotoError(f"the devices' figures are not measurements: {'; '.join(problems[:3])} (details in "
                             f"{where})")


def print_federation_report(console, report: dict) -> None:
    from rich.table import Table

    def pct(x: float) -> str:
        return f"{100 * x:.2f} %"

    table = Table(title=f"federated training: {report['parties']} parties, split {report['split']}", show_header=False)
    cluster = report["cluster"]
    if cluster["name"] == "dask":
        table.add_row("backend", f"dask, {cluster['scheduler']}, {cluster['workers']} workers")
    elif cluster["name"] in ("sim", "port"):
        parties = cluster["device_parties"]
        same = sum(p["counts_identical_to_host"] for p in parties)
        where = "simulated Unos" if cluster["name"] == "sim" else ", ".join(cluster["ports"])
        table.add_row("backend", f"{cluster['name']}: counts learned on-device ({where}), read with READ_COUNTS")
        table.add_row("device counts = host reference", f"{same} of {len(parties)} parties")
    else:
        table.add_row("backend", report["backend"])
    table.add_row("rows per party", _per_party(report["party_rows"]))
    table.add_row("classes per party", _per_party(report["party_classes"]))
    sel = report["selection"]
    table.add_row("hyper-parameters", "data-independent default (DP)" if report["dp"] is not None else
                  f"federated selection: {sel['candidates']} candidates, validation accuracy "
                  f"{pct(sel['cv_accuracy'])}, {sel['allreduce_rounds']} all-reduce rounds, "
                  f"{sel['bytes_sent_per_party'] / 1e6:.1f} MB sent per party")
    dp = report["dp"]
    capped = ("" if dp is None or dp.get("T_requested") in (None, dp["T"])
              else " (--dp-T " + str(dp["T_requested"]) + " capped to L x m)")
    table.add_row("differential privacy", "off" if dp is None else
                  f"epsilon {dp['epsilon']:g}, T {dp['T']}{capped}"
                  f", epsilon_0 {dp['epsilon_0']:.3g}, "
                  f"Laplace scale {dp['laplace_scale']:.3g}")
    table.add_row("int8 accuracy, federated", f"{pct(report['accuracy'])}, {report['model_bytes']} B")
    gap = report["accuracy_vs_compile_points"]
    table.add_row("int8 accuracy, compile on pooled rows",
                  f"{pct(report['compile_accuracy'])}, {report['compile_model_bytes']} B "
                  f"(federated {'+' if gap >= 0 else ''}{gap:.2f} points"
                  f"{', same hyper-parameters' if report['hyperparameters_equal_compile'] else ''})")
    table.add_row("deployed model vs compile's", "identical (int_model, model hash and header digests equal)"
                  if report.get("identical_to_compile") else "different (digests differ: see report.json)")
    same = report["counts_equal_pooled"]
    table.add_row("counts" + (" (saturated)" if cluster["name"] in ("sim", "port") else ""),
                  "equal to the same configuration trained on the pooled rows" if same else
                  f"{report['counts_differing_from_pooled']} entries differ from the same configuration trained "
                  "on the pooled rows" + (" (DP noise)" if report["dp"] is not None else ""))
    table.add_row("all-reduce rounds", f"{report['protocol']['allreduce_rounds']} "
                  f"({report['protocol']['quantile_rounds']} for the int8 step)")
    table.add_row("federated time", f"{report['federated_seconds']} s")
    console.print(table)


def _per_party(values: list[int], shown: int = 16) -> str:
    """Every party's figure when they fit on a line or two; for many parties (1,000) their spread instead."""
    if len(values) <= shown:
        return ", ".join(map(str, values))
    ordered = sorted(values)
    return (f"{len(values)} parties: min {ordered[0]}, median {ordered[len(ordered) // 2]}, max {ordered[-1]} "
            "(every party's in report.json)")
