"""CLI commands that touch firmware and boards: build, flash, validate, run. Heavy imports stay inside. Layer: cli."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tinyproto.pipeline.firmware import build_model_dir
from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.options import (IntRange, not_blank, MODEL_DIR, board_option, budget_option, data_argument,
                                    label_option, model_option, out_option, seed_option, training_options,
                                    upload_port_option)


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


def check_ports(port: str | None, upload_port: str | None) -> None:
    """Refuse a --port / --upload-port that cannot be a board's (missing, not a serial device, held by another
    program) in one line, before any long work and before avrdude blames the board."""
    from tinyproto.device.port_checks import check_port_usable

    for usable in dict.fromkeys(p for p in (port, upload_port) if p is not None):
        check_port_usable(usable)


def print_build(console, info: dict, path: Path) -> None:
    from rich.table import Table

    table = Table(title=f"firmware for {path} (built with {info['tool']}, env {info['env']})", show_header=False)
    table.add_row("flash", f"{info['flash_bytes']} of {info['flash_available_bytes']} B "
                  f"({100 * info['flash_bytes'] / info['flash_available_bytes']:.1f} %), "
                  f"model data {info['model_bytes']} B")
    table.add_row("SRAM static (.data + .bss)", f"{info['sram_static_bytes']} of {info['sram_bytes']} B "
                  f"(.data {info['data_bytes']}, .bss {info['bss_bytes']}); stack peak is measured by validate")
    table.add_row("ELF", info["elf"])
    console.print(table)


@click.command("build")
@click.argument("model_dir", type=MODEL_DIR)
@click.option("--env", default=None, callback=not_blank,
              help="PlatformIO environment (named after the board): <board>_sim, the default, works offline (system "
                   "avr-gcc); <board> uses the official atmelavr platform. E.g. uno_sim, nano_sim, mega2560.")
def build_command(model_dir: Path, env: str | None) -> None:
    """Build the firmware of MODEL_DIR (PlatformIO; avr-gcc directly if PlatformIO is missing) and report flash /
    SRAM."""
    console = _console()
    print_build(console, build_model_dir(model_dir, env, console), model_dir)


@click.command("flash")
@click.argument("model_dir", type=MODEL_DIR)
@click.option("--port", default=None, callback=not_blank,
              help="Serial port of a board, e.g. /dev/ttyACM0, or of a simulated one (tinyproto "
                   "board-sim): avrdude through its bootloader, protocol and speed from the board file.")
@upload_port_option
@click.option("--sim", is_flag=True, help="'Flash' the simulated Uno: start it with the ELF and check the handshake.")
def flash_command(model_dir: Path, port: str | None, upload_port: str | None, sim: bool) -> None:
    """Put MODEL_DIR's firmware on a board (--port) or on the simulated Uno (--sim, the default without --port)."""
    import time

    from tinyproto.core.boards import load_board
    from tinyproto.device.flash import flash_port
    from tinyproto.device.protocol import check_model, open_device
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.pipeline.validate import check_firmware, load_build_info
    from tinyproto.core.modeldir import load_model_dir

    if (port or upload_port) and sim:
        raise TinyprotoError("give either --port (a real board) or --sim, not both")
    md = load_model_dir(model_dir)
    from tinyproto.core.outdir import tidy

    tidy(md.path)  # what a killed run left there (core/outdir.py, "leftovers")
    board = load_board(md.board)
    from tinyproto.device.flash import upload_target

    upload_port = upload_target(board, port, upload_port)
    check_ports(port, upload_port)
    model = families.load_int_model(md)
    build = load_build_info(md)
    check_firmware(md, build)  # flash exactly what `build` made from this model.json
    console = _console()
    if port:
        # The path of a physical board, also for a simulated one (tinyproto board-sim): avrdude
        # through the bootloader, then reopen the port (a reset) and wait for the firmware's HELLO.
        started = time.monotonic()
        with console.status(f"flashing {upload_port} with avrdude -c {board.upload_protocol}...", spinner="dots"):
            result = flash_port(board, upload_port, build.hex)
        with console.status(f"waiting for the firmware on {port} after the reset...", spinner="dots"), \
                open_device(port, baud=build.serial_baud or board.serial_baud,
                            boot_quiet_s=board.boot_quiet_s) as client:
            check_model(client.info, md.model_hash, model.n_features, model.n_classes, model.family_id,
                        board.f_cpu_hz)
        written = f"{result.bytes_written} B" if result.bytes_written is not None else build.hex.name
        where = f" on {port}" if port != result.upload_port else ""  # the Leonardo: Serial1, not its USB port
        console.print(f"flashed {written} to {result.upload_port} with avrdude -c {board.upload_protocol} -b "
                      f"{board.upload_speed} in {result.seconds:.1f} s; after the reset the board answers with model "
                      f"{md.meta['model_hash']}{where} ({time.monotonic() - started:.1f} s in all)")
        return
    with SimulatedUno(build.elf, board=board) as uno, \
            open_device(uno.port, baud=build.serial_baud or board.serial_baud) as client:
        check_model(client.hello(), md.model_hash, model.n_features, model.n_classes, model.family_id,
                        board.f_cpu_hz)
    console.print(f"simulated Uno started with {build.elf}: handshake OK, model {md.meta['model_hash']} "
                  "(the simulator stops again; validate --sim starts its own)")


def _progress_factory(progress):
    def factory(label: str, total: int):
        task = progress.add_task(label, total=total)
        return lambda n: progress.advance(task, n)

    return factory


def run_validation(model_dir: Path, port: str | None, resume: bool, raw: bool, as_json: bool,
                   baud: int | None = None) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tinyproto.pipeline.validate import validate

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_console(stderr=True), transient=as_json) as progress:
        return validate(model_dir, port=port, resume=resume, raw_check=raw,
                        progress_factory=_progress_factory(progress), baud=baud)


def finish_validation(summary: dict, model_dir: Path, as_json: bool) -> None:
    from tinyproto.cli.tables import print_validation_report

    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        print_validation_report(_console(), summary, model_dir)
    failed = [f"{name} ({check['detail']})" for name, check in summary["checks"].items() if check["ok"] is False]
    if failed:
        raise TinyprotoError(f"validation failed: {'; '.join(failed)} (details in {model_dir / 'validation.json'})")


@click.command("validate")
@click.argument("model_dir", type=MODEL_DIR)
@click.option("--port", default=None, callback=not_blank,
              help="Serial port of a real, flashed Uno (e.g. /dev/ttyACM0).")
@click.option("--sim", is_flag=True, help="Use the simulated Uno (the default when no --port is given).")
@click.option("--json", "as_json", is_flag=True, help="Print validation.json instead of the table.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from validation.jsonl.")
@click.option("--no-raw", is_flag=True, help="Skip the check of the on-device input stage (raw float features).")
@click.option("--baud", default=None, type=IntRange(min=1),
              help="Serial line speed (default: the rate the firmware was built for, build.json). To fall back to a "
                   "slower one, build for it: `tinyproto run ... --baud 115200` or `compile --baud`.")
def validate_command(model_dir: Path, port: str | None, sim: bool, as_json: bool, resume: bool, no_raw: bool,
                     baud: int | None) -> None:
    """Stream every test vector of MODEL_DIR to the device and compare label AND score vector with the host.

    Exits non-zero if any vector disagrees. Writes validation.json (accuracy, cycles, latency, energy,
    flash, SRAM, stack peak) into MODEL_DIR.
    """
    if port and sim:
        raise TinyprotoError("give either --port (a real board) or --sim, not both")
    summary = run_validation(model_dir, port, resume, not no_raw, as_json, baud)
    finish_validation(summary, model_dir, as_json)


@click.command("run")
@data_argument
@model_option
@budget_option
@seed_option
@board_option
@out_option("Model directory (default build/<data>).")
@label_option
@click.option("--port", default=None, callback=not_blank,
              help="A real board: flash it and validate there instead of the simulator.")
@upload_port_option
@training_options
def run_command(data: str, family: str, budget: str, seed: int, board: str, out: Path | None, label: str | None,
                port: str | None, upload_port: str | None, max_latency: float | None, baud: int | None,
                jobs: int | None, unknown_rate: str | None, clip_check: bool, holdout_classes: str | None) -> None:
    """The whole loop: compile DATA under --budget, build, flash (or simulate), validate, print the reports.

    DATA is a built-in data set (digits [default], digits16, digits28, breast_cancer, wine, iris, segment), a CSV
    file with a header row (numeric features, label in the last column or --label NAME) or an .npz file with
    arrays X and y.
    """
    from tinyproto.core.boards import load_board
    from tinyproto.pipeline.compile import CompileOptions, compile_model
    from tinyproto.device.flash import flash_port
    from tinyproto.cli.tables import print_compile_report

    target = load_board(board).with_baud(baud)  # an unknown board (or a rate it cannot make) is refused now
    from tinyproto.device.flash import upload_target

    upload_port = upload_target(target, port, upload_port)
    check_ports(port, upload_port)  # a missing, busy or wrong port is refused before the compile, not after it
    from tinyproto.device.piohome import require_tool

    require_tool("avr-gcc")  # the build's default environment uses the system toolchain: say so before training
    from tinyproto.device.build import check_platformio_path, platformio_available

    if platformio_available():  # a directory PlatformIO cannot build in is refused before training, not after it
        check_platformio_path(Path(out) if out is not None else Path("build"))
    console = _console()
    with console.status("training under the budget...", spinner="dots"):
        options = CompileOptions(family, budget, seed, board, out, label, max_latency_ms=max_latency, baud=baud,
                                 jobs=jobs, unknown_rate=unknown_rate, clip_check=clip_check,
                                 holdout_classes=holdout_classes)
        result = compile_model(data, options, progress=lambda m: console.print(f"[dim]· {m}[/dim]"))
    print_compile_report(console, result.report, result.out_dir)
    info = build_model_dir(result.out_dir, None, console)
    print_build(console, info, result.out_dir)
    if port:
        flash_port(target, upload_port, result.out_dir / info["hex"])
    summary = run_validation(result.out_dir, port, False, True, False)
    finish_validation(summary, result.out_dir, False)
