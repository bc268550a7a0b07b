"""Options out of range or blank, refused in one line before any work: a blank --port that would have flashed the
simulator, budgets larger than any board, board names that are paths, options that would be silently ignored or
never finish, and an --out nobody may write."""

from __future__ import annotations


import pytest

from helpers import refused

# ---------------------------------------------------------------------------------------------------- blank values


IRIS = ["iris", "--budget", "1kB"]


@pytest.mark.parametrize("option", ["--out", "--port", "--upload-port", "--scheduler", "--ports", "MODEL_DIR"])
@pytest.mark.parametrize("value", ["", "  "])
def test_blank_option_values_are_refused(work, compiled, option, value):
    """--port "$PORT" with PORT unset used to flash the simulator instead (and --out "" meant the cwd)."""
    model = compiled("iris", "1kB")
    args = {
        "--out": ["compile", *IRIS, "--out", value],
        "--port": ["flash", str(model), "--port", value],
        "--upload-port": ["flash", str(model), "--port", "/dev/null", "--upload-port", value],
        "--scheduler": ["federate", "iris", "--parties", "2", "--scheduler", value],
        "--ports": ["federate", "iris", "--parties", "2", "--backend", "port", "--ports", value],
        "MODEL_DIR": ["validate", value],
    }[option]
    refused(args, "empty", work, code=2)

# ---------------------------------------------------------------------------------------------------- out of range


OPTION_CASES = {
    "budget-400-digits": (["compile", "iris", "--budget", "9" * 400], "larger than any board"),
    "budget-over-a-gigabyte": (["compile", "iris", "--budget", "2000000kB"], "larger than any board"),
    "board-relative-path": (["compile", "iris", "--board", "../boards/uno"], "unknown board"),
    "board-absolute-path": (["compile", "iris", "--board", "/etc/passwd"], "unknown board"),
    "federate-more-workers-than-parties": (["federate", "iris", "--parties", "2", "--workers", "100000"], "--workers"),
    "unknown-rate-full-width-digit": (["compile", "iris", "--unknown-rate", "\uff15%"], "--unknown-rate"),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_option_out_of_range(work, case):
    args, keyword = OPTION_CASES[case]
    refused(args, keyword, work, code=1)


def _number_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every command that takes a number, read from the commands."""
    import click

    from tinyproto.cli import main

    ctx = click.Context(main)
    found = []
    for name in main.list_commands(ctx):
        for param in main.get_command(ctx, name).params:
            if isinstance(param, click.Option) and isinstance(param.type, (click.types.IntParamType,
                                                                           click.types.FloatParamType)):
                found.append((name, max(param.opts, key=len)))
    return found


@pytest.mark.parametrize("value", ["\uff12", "\u0662", "1_0"])
def test_every_number_option_takes_the_digits_0_to_9_only(work, value):
    """click reads '２' (full-width), '٢' (Arabic-Indic) and '1_0' as numbers, as Python's int and float do: --seed ２
    trained with seed 2 where sweep --seeds ２ and --budget ２kB were refused."""
    options = _number_options()
    assert {("compile", "--seed"), ("federate", "--parties"), ("board-sim", "--count")} <= set(options)
    for command, option in options:
        refused([command, option, value], option, work, code=2)


@pytest.mark.parametrize("spelling", ["ProtoNN", "FLYNN", "Auto"])
def test_a_family_name_in_any_case_is_the_family(work, spelling):
    """--model is case-blind: the refusal that follows is about the budget, not an unknown model."""
    refused(["compile", "iris", "--model", spelling, "--budget", "0kB"], "budget", work, code=1)


def test_out_on_a_place_nobody_may_write_is_refused_before_training(work):
    """access() says yes to root on /sys; the refusal came after training, from the rename."""
    refused(["compile", "iris", "--budget", "1kB", "--out", "/sys/kernel/tinyproto-out"], "cannot write", work)


FLAG_CASES = {
    "learn-no-flash-on-the-simulator": (["learn", "{model}", "--no-flash"], "--no-flash", 1),
    "sweep-raw-check-without-device": (["sweep", "iris", "--raw-check", "--device", "none", "--out", "s"],
                                       "--raw-check", 1),
    "build-env-empty": (["build", "{model}", "--env", ""], "empty", 2),
    # an unset shell variable (--max-bytes "$MAX") was read as no limit; learn --data "" as the built-in default
    "sweep-max-bytes-empty": (["sweep", "iris", "--device", "none", "--out", "s", "--max-bytes", ""], "empty", 2),
    "report-max-bytes-empty": (["report", "{model}", "--max-bytes", ""], "empty", 2),
    "learn-data-empty": (["learn", "{model}", "--data", ""], "empty", 2),
    "board-sim-100000-boards": (["board-sim", "--count", "100000"], "--count", 2),
    "board-sim-no-boards": (["board-sim", "--count", "0"], "--count", 2),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_an_option_that_would_be_silently_ignored_or_never_finish(work, compiled, case):
    args, keyword, code = FLAG_CASES[case]
    model = compiled("iris", "1kB")
    refused([a.format(model=model) for a in args], keyword, work, code=code)


# ---------------------------------------------------------------------------------------------------- start-up


START_UP = """
import runpy, sys
def run(*args):
    sys.argv = ["tinyproto", *args]
    try:
        runpy.run_module("tinyproto", run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code
run("compile", "--help")
own = ("tinyproto.cli.main", "tinyproto.cli.options")
print("other commands:", sorted(m for m in sys.modules if m.startswith("tinyproto.cli.") and m not in own))
run("--help")
heavy = ("numpy", "sklearn", "jinja2", "matplotlib", "dask", "rich")
print("heavy:", sorted(name for name in heavy if name in sys.modules))
"""


def test_help_and_the_options_choices_import_no_numpy_nor_the_other_commands():
    """Every command's options (--model's choices come from the family registry) and help are there without numpy,
    scikit-learn, jinja2 or dask, and a command imports no other command's module: `tinyproto --help`, a usage
    error or `boards` cost a tenth of a second of CPU, not a quarter (numpy) or more."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run([sys.executable, "-c", START_UP], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "other commands: []" in lines and lines[-1] == "heavy: []", result.stdout


def test_every_command_a_cli_module_defines_is_a_command_of_tinyproto():
    """The group imports each command's module when it is asked for (cli/main._COMMANDS): a command added to a
    module but not to that table would be missing from `tinyproto --help` and unreachable."""
    import importlib
    import pkgutil

    import click

    import tinyproto.cli
    from tinyproto.cli import main

    defined = set()
    for module in pkgutil.iter_modules(tinyproto.cli.__path__):
        namespace = vars(importlib.import_module(f"tinyproto.cli.{module.name}"))
        defined |= {value.name for value in namespace.values()
                    if isinstance(value, click.Command) and not isinstance(value, click.Group)}
    listed = main.list_commands(click.Context(main))
    assert sorted(defined) == listed
    assert all(main.get_command(click.Context(main), name).name == name for name in listed)
