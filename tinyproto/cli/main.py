"""The `tinyproto` command line: a thin layer over the library (one function per command).

Every failure ends in one line on stderr and a non-zero exit, never a traceback: a user error
(TinyprotoError) or a system error (OSError: disk full, permission) exits 1, Ctrl-C exits 130, and an
unexpected exception, a bug, exits 70 (EX_SOFTWARE) with its type and message; TINYPROTO_DEBUG=1 shows its
traceback. Click's own usage errors exit 2. SIGTERM and SIGHUP are handled like Ctrl-C, so cleanup runs.
Layer: cli.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

import click

from tinyproto.core.errors import TinyprotoError, os_error_line
from tinyproto.cli.options import (board_option, budget_option, data_argument, label_option, model_option,
                                    out_option, prefix_option, reserve_flash_option, reserve_sram_option, seed_option,
                                    training_options)



INTERNAL_ERROR = 70  # EX_SOFTWARE: distinct from user errors (1) and click's usage errors (2)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# The other commands live in their own modules, each imported when its command runs (or `tinyproto --help` lists
# it), and their heavy imports (numpy, scikit-learn, jinja2, dask) are inside the commands: `tinyproto build --help`
# or a command refused for its arguments does not pay for what compile or sweep import.
_COMMANDS = {
    "run": "device:run_command", "build": "device:build_command", "flash": "device:flash_command",
    "validate": "device:validate_command", "learn": "learn:learn_command", "federate": "federate:federate_command",
    "sweep": "sweep:sweep_command", "report": "sweep:report_command", "board-sim": "boards:board_sim_command",
    "boards": "boards:boards_command", "export": "export:export_command",
}


class _Group(click.Group):
    """Turns every exception into one line on stderr and an exit status (see the module doc)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in _COMMANDS:
            module, attribute = _COMMANDS[name].split(":")
            try:
                command = getattr(importlib.import_module(f"tinyproto.cli.{module}"), attribute)
            except BaseException as exc:  # a signal during the import, as during the CLI's own (tinyproto.__main__)
                if isinstance(exc, KeyboardInterrupt) or _interrupt_behind(exc):
                    _fail("interrupted", 130)
                raise
            self.add_command(command, name)
        return self.commands.get(name)

    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:  # Ctrl-C while click parses the command line: click said "Aborted!", exit 1
            _fail("interrupted", 130)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise  # click's own usage errors and --help already speak one line
        except TinyprotoError as exc:
            _fail(f"error: {exc}", 1)
        except KeyboardInterrupt:
            _fail("interrupted; nothing half-written was left behind", 130)
        except BrokenPipeError:
            sys.stderr.close()  # the reader went away (| head): nothing more to say
            sys.exit(1)
        except OSError as exc:
            _fail(f"error: {os_error_line(exc)}", 1)
        except Exception as exc:
            if _interrupt_behind(exc):  # e.g. Ctrl-C during an extension's import: "ImportError: initialization failed"
                _fail("interrupted; nothing half-written was left behind", 130)
            if os.environ.get("TINYPROTO_DEBUG"):
                raise
            _fail(f"internal error ({type(exc).__name__}: {_one_line(exc)[:200]}); please report it, "
                  "TINYPROTO_DEBUG=1 shows the traceback", INTERNAL_ERROR)


def _interrupt_behind(exc: BaseException) -> bool:
    """True when a KeyboardInterrupt is this exception's cause or context, at any depth: a library that turned the
    user's Ctrl-C into an error of its own was interrupted, it has no bug."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _fail(message: str, code: int) -> None:
    click.echo(_one_line(message), err=True)
    sys.exit(code)


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
    import signal

    if threading.current_thread() is threading.main_thread():  # (not when a test calls us from a thread)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)


def _progress_printer(console):
    def report(message: str) -> None:
        console.print(f"[dim]· {message}[/dim]")

    return report


@main.command("compile")
@data_argument
@model_option
@budget_option
@seed_option
@board_option
@out_option("Model directory to write (default: build/<data name>). Replaced only on success.")
@label_option
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the summary table.")
@click.option("--learnable", is_flag=True,
              help="FlyNN only: keep the counts small enough to learn on the device (tinyproto learn): they must fit "
                   "the SRAM beside the learning firmware's buffers, and the EEPROM.")
@training_options
@prefix_option
@reserve_sram_option
@reserve_flash_option
def compile_command(data: str, family: str, budget: str, seed: int, board: str, out: Path | None,
                    label: str | None, as_json: bool, learnable: bool, max_latency: float | None,
                    baud: int | None, jobs: int | None, unknown_rate: str | None, clip_check: bool,
                    holdout_classes: str | None, prefix: str | None, reserve_sram: str | None,
                    reserve_flash: str | None) -> None:
    """Train a model on DATA within --budget and write its C code, PlatformIO project and report.

    DATA is a built-in data set (digits [default], digits16, digits28, breast_cancer, wine, iris, segment), a CSV
    file with a header row (numeric features, label in the last column or --label NAME) or an .npz file with
    arrays X and y.
    The test split is a fixed stratified 25 % (seed 0); --seed drives training only.
    """
    import json

    from rich.console import Console

    from tinyproto.pipeline.compile import CompileOptions, compile_model
    from tinyproto.cli.tables import print_compile_report

    console = Console(stderr=as_json)
    where = os.path.abspath(out) if out is not None and _is_cwd(out) else None
    here = _inode(Path(where)) if where else None
    with console.status("training under the budget...", spinner="dots"):
        options = CompileOptions(family, budget, seed, board, out, label, learnable=learnable,
                                 max_latency_ms=max_latency, baud=baud, jobs=jobs, unknown_rate=unknown_rate,
                                 clip_check=clip_check, holdout_classes=holdout_classes, prefix=prefix,
                                 reserve_sram=reserve_sram, reserve_flash=reserve_flash)
        result = compile_model(data, options, progress=_progress_printer(console))
    if as_json:
        click.echo(json.dumps(result.report, indent=2))
        for warning in result.report["warnings"]:  # also where a person reads, not only inside the JSON
            click.echo(f"warning: {warning}", err=True)
    else:
        print_compile_report(Console(), result.report, result.out_dir)
    if here is not None and _inode(Path(where)) != here:
        # the old directory was swapped out from under the shell that runs us: its `ls` would show nothing
        click.echo(f"note: {where} was replaced by a new directory; run `cd {where}` to see it", err=True)


def _is_cwd(path: Path) -> bool:
    try:
        return os.path.samefile(path, ".")
    except OSError:
        return False


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
