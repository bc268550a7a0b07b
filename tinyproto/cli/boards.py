"""`tinyproto boards` and `tinyproto board-sim`: the boards --board accepts, and simulated boards that behave
like real ones at their port. Layer: cli."""

from __future__ import annotations

from pathlib import Path

import json

import click

from tinyproto.core.boards import all_boards, boards_table_rows

from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.options import IntRange, TextPath
from tinyproto.device.board_sim import serve


MAX_BOARDS = 64  # each board is a simulator process with its own pty; 100000 of them never finished starting


@click.command("board-sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--board", "board_name", default="uno", show_default=True,
              help="A board file (boards/NAME.json) or an MCU with a simulated bootloader (atmega2560).")
@click.option("--count", default=1, show_default=True, type=IntRange(1, MAX_BOARDS),
              help="How many boards (each its own port and state).")
@click.option("--state", type=TextPath(path_type=Path, file_okay=False), default=None,
              help="Directory for flash.bin / eeprom.bin (one sub-directory per board with --count > 1). "
                   "Default: <tinyproto cache>/boards/<name>.")
@click.option("--fresh", is_flag=True, help="Start with erased flash and EEPROM (a new chip with its bootloader).")
def board_sim_command(board_name: str, count: int, state: Path | None, fresh: bool) -> None:
    """A simulated board that behaves like the real one at its serial port: its real bootloader, a reset when the
    port is opened, real-time pacing, flash and EEPROM kept across starts. Prints `<name> <port>` per board, then
    runs until Ctrl-C or SIGTERM. Upload with avrdude / `tinyproto flash DIR --port PORT` as to a physical board."""
    try:
        code = serve(board_name, count, state, fresh)
    except TinyprotoError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code)


@click.command("boards")
@click.option("--json", "as_json", is_flag=True, help="Print every board file's facts as JSON.")
def boards_command(as_json: bool) -> None:
    """List the boards --board accepts (boards/<name>.json): chip, clock, supply, memories, serial and upload
    speeds, and the active currents the energy model uses (their sources are in the files)."""
    if as_json:
        import dataclasses

        click.echo(json.dumps([dataclasses.asdict(b) for b in all_boards()], indent=2))
        return
    headers = ("board", "MCU", "clock", "supply", "SRAM B", "flash B", "EEPROM B", "serial", "upload",
               "I MCU/board")
    rows = [headers, *boards_table_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    for row in rows:  # plain columns: readable in a narrow terminal and in a pipe
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    click.echo("sources of every figure: the board files (tinyproto boards --json, boards/<name>.json)")
