"""`tinyproto sweep` and `tinyproto report`: the accuracy / bytes / latency frontier. Layer: cli."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.options import (FLOAT, INT, label_option, not_blank, shown, TextPath, unknown_rate_option,
                                   clip_check_option, holdout_classes_option)
from tinyproto.pipeline.sweep import DEFAULT_BUDGETS, DEFAULT_TIMEOUT_S, SweepOptions, SweepProgress, sweep
from tinyproto.pipeline.sweep_points import DEVICES, check_arguments
from tinyproto.pipeline.sweep_files import RESULTS


@click.command("sweep")
@click.argument("data", default="digits", required=False)
@click.option("--models", default=",".join(families.names()), show_default=True,
              help="Model families, comma-separated (default: every family).")
@click.option("--budgets", default=DEFAULT_BUDGETS, show_default=True,
              help="Budgets, comma-separated, each like 2kB, 1.5kB, 2048B (1 kB = 1024 bytes).")
@click.option("--seeds", default="0", show_default=True, help="Training seeds, comma-separated.")
@click.option("--boards", default="uno", show_default=True, help="Target boards (boards/<name>.json), comma-separated.")
@click.option("--device", type=click.Choice(DEVICES, case_sensitive=False), default="sim", show_default=True,
              help="sim: build every point and validate it on the simulated board; none: compile only "
                   "(latency and energy are then the cost model's predictions).")
@click.option("--raw-check", is_flag=True,
              help="With --device sim, also run validate's on-device input-stage check (doubles the device time).")
@click.option("--scheduler", default=None, callback=not_blank, metavar="ADDRESS",
              help="A running dask scheduler (e.g. tcp://10.0.0.5:8786); its workers must see --out at the same "
                   "path. Default: a LocalCluster on this machine.")
@click.option("--workers", type=INT, default=None,
              help="LocalCluster worker processes (default: one per CPU, at most one per point).")
@click.option("--out", type=TextPath(path_type=Path), required=True,
              help="Sweep directory: results.jsonl, sweep.json and the points' model directories (points/).")
@click.option("--resume", is_flag=True, help="Continue an interrupted sweep in --out: run only the points "
                                             "without a line in results.jsonl (also points added to the grid, and "
                                             "compiled points whose directory in points/ is gone).")
@label_option
@click.option("--timeout", type=FLOAT, default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds to wait for the next point to finish before giving up (the finished ones are kept).")
@click.option("--max-latency", "max_latency", type=FLOAT, default=None, metavar="MS",
              help="Compile every point with this latency limit (as `compile --max-latency`): only models predicted "
                   "to run within MS ms on the point's board; a point that cannot is recorded as failed.")
@unknown_rate_option
@clip_check_option
@holdout_classes_option
@click.option("--max-bytes", default=None, callback=not_blank, help="For the recommendation: largest model, e.g. 2kB.")
@click.option("--max-ms", type=FLOAT, default=None, help="For the recommendation: longest latency in ms.")
def sweep_command(data: str, models: str, budgets: str, seeds: str, boards: str, device: str, raw_check: bool,
                  scheduler: str | None, workers: int | None, out: Path, resume: bool, label: str | None,
                  timeout: float, max_latency: float | None, unknown_rate: str | None, clip_check: bool,
                  holdout_classes: str | None, max_bytes: str | None, max_ms: float | None) -> None:
    """Compile DATA at every (model, budget, seed, board) point, in parallel on dask, and collect the results.

    \b
    Each point is an independent task: compile, and with --device sim (the default) build and validate on
    the simulated board. Every finished point appends one line to OUT/results.jsonl at once; its model
    directory stays in OUT/points/. A point that fails is recorded with its error. Then
    `tinyproto report OUT` draws the figures.

    \b
    Examples:
      tinyproto sweep digits --budgets 0.5kB,1kB,2kB,4kB,8kB --out build/sweep-digits
      tinyproto sweep data.csv --models flynn --seeds 0,1,2 --device none --out build/sweep
      tinyproto sweep digits --out build/sweep-digits --resume
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tinyproto.core.budget import parse_budget
    from tinyproto.pipeline.report_data import load_sweep, print_summary

    max_bytes_n = parse_budget(max_bytes, "--max-bytes") if max_bytes else None  # refused now, not after the sweep
    if max_ms is not None and not max_ms > 0:
        raise TinyprotoError(f"--max-ms must be a positive number of milliseconds, got {max_ms}")
    check_arguments(device, workers, scheduler, timeout, max_latency)
    if raw_check and device != "sim":  # nothing runs on a device: the check would silently not happen
        raise TinyprotoError("--raw-check checks the on-device input stage: it needs --device sim")
    console = Console(stderr=True)
    with Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("[green]{task.fields[ok]} ok[/green] · [red]{task.fields[failed]} failed[/red] · "
                             "{task.fields[running]} running"), TimeElapsedColumn(),
                  TextColumn("[dim]{task.fields[last]}[/dim]"), console=console) as bar:
        task = bar.add_task("points", total=None, ok=0, failed=0, running=0, last="")

        def show(state: SweepProgress) -> None:
            bar.update(task, total=state.total, completed=state.done, ok=state.done - state.failed,
                       failed=state.failed, running=state.running, last=state.last[-60:])

        options = SweepOptions(models, budgets, seeds, boards, device, scheduler, workers, resume, label, raw_check,
                               timeout, max_latency, unknown_rate, clip_check, holdout_classes)
        result = sweep(data, out, options, show)
    failed = [r for r in result.records if r.get("status") != "ok"]
    where = result.cluster or {}
    console.print(f"{result.ran} points run in {result.seconds:.1f} s"
                  + (f" on {where['workers']} dask workers ({where['scheduler']})" if where else "")
                  + (f", {result.skipped} already done" if result.skipped else "")
                  + (f"; {len(failed)} failed (see results.jsonl)" if failed else ""))
    for record in failed[:5]:
        console.print(f"[red]failed[/red] {record['id']} ({record.get('stage')}): {record.get('error')}")
    print_summary(Console(), load_sweep(result.out_dir), max_bytes_n, max_ms)
    click.echo(f"wrote {shown(result.out_dir / RESULTS)}; `tinyproto report {shlex.quote(shown(result.out_dir))}` "
               "draws the figures")
    # A refused budget is an answer; a device that disagrees with the host, or a sweep with no answer, is not.
    disagreeing = [r["id"] for r in failed if r.get("stage") == "validate"]
    if disagreeing:
        raise TinyprotoError(f"{len(disagreeing)} points failed validation on the device "
                             f"({', '.join(disagreeing[:3])}); "
                             f"see {result.out_dir / RESULTS}")
    if result.records and len(failed) == len(result.records):
        reasons = {str(r.get("error")) for r in failed}
        why = f": {reasons.pop()}" if len(reasons) == 1 else ""  # one cause (a budget no model fits): say it
        raise TinyprotoError(f"every point of the sweep failed{why}; see {result.out_dir / RESULTS}")


@click.command("report")
@click.argument("directory", type=TextPath(path_type=Path, file_okay=False))
@click.option("--max-bytes", default=None, callback=not_blank, help="For the recommendation: largest model, e.g. 2kB.")
@click.option("--max-ms", type=FLOAT, default=None, help="For the recommendation: longest latency per inference, ms.")
def report_command(directory: Path, max_bytes: str | None, max_ms: float | None) -> None:
    """Draw the figures of DIRECTORY (a `tinyproto sweep` directory or one model directory) into a
    self-contained DIRECTORY/report.html (no network needed) and DIRECTORY/figures/*.png; print the
    accuracy / bytes Pareto frontier and a one-line recommendation.

    \b
    Examples:
      tinyproto report build/sweep-digits --max-bytes 2kB --max-ms 5
      tinyproto report build/digits
    """
    from rich.console import Console

    from tinyproto.core.budget import parse_budget
    from tinyproto.pipeline.htmlreport import FIGURES, write_report

    if max_ms is not None and not max_ms > 0:
        raise TinyprotoError(f"--max-ms must be a positive number of milliseconds, got {max_ms}")
    limit = parse_budget(max_bytes, "--max-bytes") if max_bytes else None
    result = write_report(directory, limit, max_ms, console=Console())
    click.echo(f"wrote {result.html} and {len(result.figures)} figures in {result.html.parent / FIGURES}")
