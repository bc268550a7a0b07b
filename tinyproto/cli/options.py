"""The options every command shares, each spelled, checked and explained once. Layer: cli.

A command takes what it needs: `@data_argument @model_option @budget_option @seed_option @board_option ...`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from tinyproto import families
from tinyproto.core.option_lists import MAX_SEED, plain_digits

class _AsciiNumber:
    """A number option takes the digits 0-9 only (core.option_lists.plain_digits), as --budget and sweep's --seeds
    do."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not plain_digits(value):
            self.fail(f"{value!r} is not a number written with the digits 0-9", param, ctx)
        return super().convert(value, param, ctx)


class _Int(_AsciiNumber, click.types.IntParamType):
    pass


class _Float(_AsciiNumber, click.types.FloatParamType):
    pass


class IntRange(_AsciiNumber, click.IntRange):
    pass


class FloatRange(_AsciiNumber, click.FloatRange):
    pass


INT = _Int()
FLOAT = _Float()
# numpy's seed range: a seed outside it is refused by click in one line, not deep inside training
SEED = IntRange(0, MAX_SEED)
BUDGET_HELP = "Model size limit in flash: 2kB, 2KiB, 1.5kB, 2048B or 2048 (1 kB = 1024 bytes)."


class TextPath(click.Path):
    """A path whose name is text: tinyproto writes its directories' names into JSON, HTML and PlatformIO's
    command lines, which need UTF-8, so a name that is not (a stray Latin-1 byte) is refused here in one line."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("is empty", param, ctx)  # --out "$DIR" with DIR unset: not the current directory
        try:
            os.fsencode(value).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{os.fsdecode(value)!r} is not valid UTF-8 text; rename it", param, ctx)
        return super().convert(value, param, ctx)


def shown(path: Path) -> str:
    """A path as a message shows it: relative to the current directory when it is inside it (build/wine-arduino,
    as the user typed it and as the docs show it), else absolute."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # (RuntimeError: a loop of symbolic links, Python 3.11)
        return str(path)


def not_blank(ctx, param, value):
    """An option given as '' (an unset shell variable: --port "$PORT") is refused, never read as 'not given'."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("is empty", ctx=ctx, param=param)
    return value


MODEL_DIR = TextPath(path_type=Path, file_okay=False)


data_argument = click.argument("data", default="digits", required=False)
model_option = click.option(
    "--model", "family", type=click.Choice([*families.names(), families.AUTO], case_sensitive=False),
    default=families.DEFAULT, show_default=True,
    help="Model family; auto fits every family and keeps the best validated int8 accuracy within the budget.")
budget_option = click.option("--budget", default="2kB", show_default=True, help=BUDGET_HELP)
seed_option = click.option("--seed", default=0, show_default=True, type=SEED,
                           help="Seed for every random choice of training.")
board_option = click.option("--board", default="uno", show_default=True,
                            help="Target board (boards/<name>.json; `tinyproto boards` lists them).")
baud_option = click.option(
    "--baud", default=None, type=IntRange(min=1),
    help="Serial line speed of the firmware (default: the board's fastest exact rate, `tinyproto boards`); give "
         "the board's fallback (e.g. 115200) when its USB bridge or cable does not carry the fast one.")
label_option = click.option(
    "--label", default=None, metavar="NAME",
    help="The CSV column that holds the classes, by its header name (default: the last column); quote a name "
         "with spaces: --label 'heart rate'.")
max_latency_option = click.option(
    "--max-latency", "max_latency", type=FloatRange(0, min_open=True), default=None, metavar="MS",
    help="Only models whose predicted time per inference on --board (the cost model) is within MS ms.")

jobs_option = click.option(
    "--jobs", "jobs", type=IntRange(1), default=None, metavar="N",
    help="Worker processes that validate the solver's candidates (default: 1 inside a dask worker, else "
         "$TINYPROTO_JOBS when set, else every usable core). The model is the same for any N.")

prefix_option = click.option(
    "--prefix", default=None, callback=not_blank, metavar="NAME",
    help="The model's C prefix: every external symbol of its C code is NAME_... (NAME_predict, NAME_input_quantize), "
         "so several models link into one sketch. A lower-case C identifier; default: the data set's name "
         "(breast_cancer -> breast_cancer_predict).")

reserve_sram_option = click.option(
    "--reserve-sram", "reserve_sram", default=None, callback=not_blank, metavar="BYTES",
    help="SRAM your own sketch uses (its globals and stack; 1200, 1.2kB): the model's static SRAM, stack bound and "
         "buffers must fit the rest of the board's, measured by building them with avr-gcc, or compile refuses.")
reserve_flash_option = click.option(
    "--reserve-flash", "reserve_flash", default=None, callback=not_blank, metavar="BYTES",
    help="Flash your own sketch uses (20kB): the model's runtime and data, measured by building them, must fit the "
         "rest of the board's flash, or compile refuses.")


unknown_rate_option = click.option(
    "--unknown-rate", default=None, metavar="SHARE",
    help="Let the device answer 255 (unknown) for inputs unlike the training rows: a threshold on the model's "
         "novelty score declines about this share of known-class rows (5% or 0.05). Without it nothing changes.")
clip_check_option = click.option(
    "--clip-check", is_flag=True, default=False,
    help="With --unknown-rate, also answer 255 for inputs with more than a few int8 values at the clip (beyond the "
         "training range in several features), which the scores of FlyNN, BNC and Bloom features do not see; "
         "about 60-80 B more flash and 10 cycles an input (docs/guides/confidence.md).")
holdout_classes_option = click.option(
    "--holdout-classes", default=None, metavar="CLASSES",
    help="Classes (e.g. 8,9) kept out of training: their rows go to the test split only, and the report gives "
         "how well the novelty score tells them apart (AUROC) and the share declined.")


def training_options(command):
    """The options compile and run share after their own, in this order in --help: the latency limit, the line
    speed, the solver's workers and the confidence stage (unknown rate, clip check, held-out classes)."""
    for option in reversed((max_latency_option, baud_option, jobs_option, unknown_rate_option, clip_check_option,
                            holdout_classes_option)):
        command = option(command)
    return command


def out_option(what: str):
    return click.option("--out", type=TextPath(path_type=Path), default=None, help=what)


upload_port_option = click.option(
    "--upload-port", default=None, callback=not_blank,
    help="Where avrdude uploads, if not --port: the Leonardo's own USB port (it talks on Serial1, --port).")

