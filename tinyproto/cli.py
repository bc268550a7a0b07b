"""The `tinyproto` command line: a thin layer over the library (one function per command).

User errors (TinyprotoError) print one line and exit 1; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tinyproto.errors import TinyprotoError

BUDGET_HELP = "Model size limit in flash: 2kB, 2KiB, 1.5kB, 2048B or 2048 (1 kB = 1024 bytes)."


class _Group(click.Group):
    """Turns TinyprotoError into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TinyprotoError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tinyproto")
def main() -> None:
    """tinyproto: train a classifier under a byte budget and run it, in int8 C, on an Arduino Uno.

    \b
    Typical loop:
      tinyproto compile --budget 2kB            # digits -> ProtoNN -> build/digits
      tinyproto build build/digits              # firmware for the Uno (PlatformIO, offline too)
      tinyproto validate build/digits --sim     # run on the simulated Uno, compare with the host
    """


def _progress_printer(console):
    def report(message: str) -> None:
        console.print(f"[dim]· {message}[/dim]")

    return report


@main.command("compile")
@click.argument("data", default="digits", required=False)
@click.option("--model", "family", type=click.Choice(["protonn", "flynn"]), default="protonn", show_default=True,
              help="Model family.")
@click.option("--budget", default="2kB", show_default=True, help=BUDGET_HELP)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for every random choice of training.")
@click.option("--board", default="uno", show_default=True, help="Target board (boards/<name>.json).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Model directory to write (default: build/<data name>). Replaced only on success.")
@click.option("--label", default=None, help="CSV label column (default: the last column).")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the summary table.")
@click.option("--learnable", is_flag=True,
              help="FlyNN only: keep the counts small enough to learn on the device (tinyproto learn): they must fit "
                   "the SRAM beside the learning firmware's buffers, and the EEPROM.")
def compile_command(data: str, family: str, budget: str, seed: int, board: str, out: Path | None,
                    label: str | None, as_json: bool, learnable: bool) -> None:
    """Train a model on DATA within --budget and write its C code, PlatformIO project and report.

    DATA is a built-in data set (digits [default], breast_cancer, wine, iris, segment [needs river]), a CSV file with a header row
    (numeric features, label in the last column or --label COL) or an .npz file with arrays X and y.
    The test split is a fixed stratified 25 % (seed 0); --seed drives training only.
    """
    import json

    from rich.console import Console

    from tinyproto.compile import compile_model
    from tinyproto.report import print_compile_report

    console = Console(stderr=as_json)
    with console.status("training under the budget...", spinner="dots"):
        result = compile_model(data, family, budget, seed, board, out, label, progress=_progress_printer(console),
                               learnable=learnable)
    if as_json:
        click.echo(json.dumps(result.report, indent=2))
    else:
        print_compile_report(Console(), result.report, result.out_dir)


def _register_commands() -> None:
    """The other commands live in their own modules; their heavy imports are inside the commands."""
    from tinyproto.device.commands import build_command, flash_command, run_command, validate_command
    from tinyproto.device.learn_cli import learn_command
    from tinyproto.federate_cli import federate_command

    for command in (run_command, build_command, flash_command, validate_command, learn_command, federate_command):
        main.add_command(command)


_register_commands()
