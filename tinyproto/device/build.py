"""Build the generated PlatformIO project: `pio run` (offline platform by default), or avr-gcc directly.

Environments of the generated platformio.ini (templates/platformio.ini.j2), named after the board
(boards/<name>.json; the Uno's are shown):

    uno          official `atmelavr` platform (internet needed once); flashes/tests a real Uno
    uno_offline  tinyproto's dev-platform `tinyproto-avr` (installed in tinyproto's PlatformIO home) + system avr-gcc
    uno_sim      uno_offline whose `upload` is a no-op and whose `pio test` runs in the simulated Uno

`env=None` everywhere means the project's own default (`default_envs`, the board's `<name>_sim`), so a Nano's
project builds `nano_sim` and an existing Uno project keeps building `uno_sim`.

The file names no path of the checkout, the virtualenv or a home directory (a model directory can be moved,
copied to another user or machine): the platform is found by name in tinyproto's PlatformIO home
(tinyproto.device.piohome), which `core_dir = ~/...` names, and the simulator's test command is
`python3 -m tinyproto.device.sim`. PlatformIO runs with every update check and telemetry switched off: nothing
is downloaded for the offline environments. Without PlatformIO (or SCons) the same sources are compiled with
avr-gcc directly, with the same flags.

The modules around it: tinyproto.device.project (platformio.ini, flags, the avr-gcc fallback), .piohome (the
PlatformIO home), .piotest (`pio test`); their public names are re-exported here.
Layer: device.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.manifest import remake_advice
from tinyproto.core.ledger import FirmwareSizes
# Re-exported: callers import the build's public names from here.
from tinyproto.device.piohome import (  # noqa: F401
    APT_AVR,
    REQUIRED_TOOLS,
    offline_platform_dir,
    pio_core_dir,
    pio_environment,
    pio_toolchain_dir,
    platformio_available,
    prepare_pio_core,
    require_tool,
)
from tinyproto.device.piotest import render_pio_test, run_pio_test  # noqa: F401
from tinyproto.device.project import (  # noqa: F401
    C_FLAGS,
    DEFAULT_ENV,
    PIO_RUN_TIMEOUT_S,
    SIM_TEST_TIMEOUT_CYCLES,
    TEST_BUILD_DIR,
    Progress,
    _c_sources,
    _check_env,
    _compile_with_avr_gcc,
    _first_errors,
    build_failure,
    _read_ini,
    _run,
    _say,
    _uses_system_toolchain,
    parser_of,
    project_default_env,
    render_platformio_ini,
    resolve_env,
    sim_test_command,
)

__all__ = [
    "APT_AVR", "C_FLAGS", "DEFAULT_ENV", "REQUIRED_TOOLS", "SIM_TEST_TIMEOUT_CYCLES", "TEST_BUILD_DIR", "BuildResult",
    "build_project", "firmware_sizes", "offline_platform_dir", "parse_avr_size", "parser_of", "pio_core_dir",
    "pio_environment", "pio_toolchain_dir", "platformio_available", "prepare_pio_core", "render_pio_test",
    "render_platformio_ini", "resolve_env", "run_pio_test", "sim_test_command",
]  # fmt: skip


@dataclass(frozen=True)
class BuildResult:
    elf: Path
    hex: Path
    sizes: FirmwareSizes
    tool: str  # "platformio" or "avr-gcc"
    log: str


# ---------------------------------------------------------------------------------------------------------
# avr-size


@functools.lru_cache(maxsize=None)
def avr_gcc_knows(mcu: str) -> bool | None:
    """Whether the system's avr-gcc (which tinyproto builds with, through its offline PlatformIO platform or
    directly) has a device spec for `mcu` (<prefix>/lib/gcc/avr/<version>/device-specs/specs-<mcu>, read from the
    disk: no compiler is started for a compile); None without avr-gcc or its device-specs (nothing to check)."""
    gcc = shutil.which("avr-gcc")
    if gcc is None:
        return None
    prefix = Path(os.path.realpath(gcc)).parent.parent
    spec_dirs = [d for d in prefix.glob("lib/gcc/avr/*/device-specs") if d.is_dir()]
    if not spec_dirs:
        return None
    return any((d / f"specs-{mcu}").is_file() for d in spec_dirs)


# What the device app reads of the MCU (firmware/tp_transport.c, tp_measure.c, tp_main.c): a USART (0 or 1) for
# the serial protocol, the 16-bit Timer1 that counts an inference's cycles, and GPIOR0 for the simulator's markers.
DEVICE_APP_REGISTERS = (("UDR0", "UDR1"), ("TCCR1A",), ("TCCR1B",), ("TCNT1",), ("TIFR1",), ("TIMSK1",),
                        ("GPIOR0",))


@functools.lru_cache(maxsize=None)
def mcu_lacks(mcu: str) -> tuple[str, ...] | None:
    """The registers of DEVICE_APP_REGISTERS that avr-libc's <avr/io.h> does not define for `mcu` (an ATtiny85 has
    no USART and an 8-bit Timer1), from avr-gcc's preprocessor (about 40 ms); None without avr-gcc or when it
    cannot tell (nothing to check)."""
    gcc = shutil.which("avr-gcc")
    if gcc is None:
        return None
    try:
        result = subprocess.run([gcc, f"-mmcu={mcu}", "-E", "-dM", "-x", "c", "-"], input="#include <avr/io.h>\n",
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    defined = set(re.findall(r"^#define (\w+)", result.stdout, re.M))
    return tuple(" or ".join(group) for group in DEVICE_APP_REGISTERS if not defined.intersection(group))


def check_mcu_known(board) -> None:
    """A board file naming an MCU avr-gcc does not know (atmega9999), or one without what the device app needs (an
    ATtiny85: no USART), is refused before anything is written: compile wrote its project, and the build failed
    on a page of PlatformIO's log."""
    if avr_gcc_knows(board.mcu) is False:
        raise TinyprotoError(f"boards/{board.name}.json names the MCU {board.mcu!r}, which avr-gcc does not know (it "
                             f"has no device-specs/specs-{board.mcu}); fix the board file's mcu")
    lacking = mcu_lacks(board.mcu)
    if lacking:
        raise TinyprotoError(
            f"boards/{board.name}.json names the MCU {board.mcu!r}, which lacks what tinyproto's device app needs "
            f"(a USART for the serial protocol and the 16-bit Timer1; it has no {', '.join(lacking)}); choose a "
            "board with an ATmega328P, ATmega2560 or ATmega32U4 (`tinyproto boards`)")


def parse_avr_size(text: str) -> FirmwareSizes:
    """`avr-size -A -d firmware.elf` output -> FirmwareSizes (.noinit counts as .bss: both are static SRAM)."""
    sections: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(\.\w+)\s+(\d+)\s+\d+\s*$", line)
        if match:
            sections[match.group(1)] = sections.get(match.group(1), 0) + int(match.group(2))
    if ".text" not in sections:
        raise TinyprotoError(f"could not read section sizes from avr-size output:\n{text.strip()[:400]}")
    return FirmwareSizes(
        text_bytes=sections[".text"],
        data_bytes=sections.get(".data", 0),
        bss_bytes=sections.get(".bss", 0) + sections.get(".noinit", 0),
    )


def firmware_sizes(elf: Path) -> FirmwareSizes:
    result = _run([require_tool("avr-size"), "-A", "-d", str(elf)])
    if result.returncode != 0:
        raise TinyprotoError(f"avr-size failed on {elf}: {result.stderr.strip()}")
    return parse_avr_size(result.stdout)


# ---------------------------------------------------------------------------------------------------------
# Building


def check_platformio_path(project_dir: Path) -> None:
    """Refuse a project directory PlatformIO cannot build in, in one line: a path that is not UTF-8 text (a
    directory reached through such a name from the working directory: pio failed with "An unexpected error
    occurred"), or one holding a tab or a run of spaces, which PlatformIO reads as one space (it built in, and wrote,
    another directory). `run` asks before training; the build asks again."""
    project_dir = Path(os.path.abspath(project_dir))
    try:
        os.fsencode(project_dir).decode("utf-8")
    except UnicodeDecodeError:
        shown = os.fsencode(project_dir).decode("utf-8", "backslashreplace")
        raise TinyprotoError(f"PlatformIO cannot build in {shown}: its path is not UTF-8 text, which PlatformIO "
                             "fails on; rename the directory, or move the model to a path that is") from None
    run = re.search(r"\t|  +", str(project_dir))
    if run:
        shown = str(project_dir).replace("\t", "\\t")
        what = "a tab" if "\t" in run.group() else f"{len(run.group())} spaces in a row"
        raise TinyprotoError(f"PlatformIO cannot build in {shown}: its path holds {what}, which PlatformIO turns into "
                             "one space (it would write to another directory); rename the directory")


def _build_with_platformio(project_dir: Path, env: str, progress: Progress | None) -> tuple[Path, str]:
    check_platformio_path(project_dir)
    core = prepare_pio_core()
    command = [sys.executable, "-m", "platformio", "run", "-e", env, "-d", str(project_dir)]
    _say(progress, f"PlatformIO: pio run -e {env}")
    try:
        result = _run(command, env=pio_environment(core), timeout=PIO_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TinyprotoError(f"pio run -e {env} did not finish within {PIO_RUN_TIMEOUT_S} s") from exc
    finally:
        remove_scons_leftovers(project_dir / ".pio")
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise TinyprotoError(f"{build_failure(f'pio run -e {env}', log, project_dir / '.pio')}{_offline_hint(log)}")
    return project_dir / ".pio" / "build" / env / "firmware.elf", log


def remove_scons_leftovers(pio_dir: Path) -> None:
    """Remove the temporary file SCons writes its signature database through (.sconsign<version>.tmp, renamed to
    .sconsign<version>.dblite): a build that a full disk, a timeout or a kill stopped mid-write leaves it in .pio/,
    which only tinyproto's builds write. Regular files of that name only."""
    for leftover in [*pio_dir.glob(".sconsign*.tmp"), *pio_dir.glob("build/*/.sconsign*.tmp")]:
        try:
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink()
        except OSError:
            pass


def _offline_hint(log: str) -> str:
    if "HTTPClientError" in log or "InternetConnectionError" in log:
        return ("\n(PlatformIO could not download a package: "
                "without internet use the <board>_sim or <board>_offline env)")
    return ""


def _elf_to_hex(elf: Path) -> Path:
    hex_path = elf.with_suffix(".hex")
    result = _run([require_tool("avr-objcopy"), "-O", "ihex", "-R", ".eeprom", str(elf), str(hex_path)])
    if result.returncode != 0:
        raise TinyprotoError(f"avr-objcopy failed: {result.stderr.strip()}")
    return hex_path


def build_project(project_dir: Path, env: str | None = None, progress: Progress | None = None) -> BuildResult:
    """Builds the firmware of a generated project; `pio run -e env`, or avr-gcc when PlatformIO is missing.
    env None: the project's default environment (`<board>_sim`)."""
    project_dir = Path(project_dir).resolve()
    for part in ("src", "include", "lib"):  # a file in a directory's place: SCons fails with its own traceback
        where = project_dir / part
        if (where.exists() or where.is_symlink()) and not where.is_dir():
            raise TinyprotoError(f"{where} is not a directory, where the generated project keeps its "
                                 f"{'sources' if part == 'src' else 'headers' if part == 'include' else 'library'}; "
                                 f"move it away and {remake_advice(project_dir)}")
    parser = _read_ini(project_dir)
    env = env or project_default_env(parser)
    _check_env(parser, env)
    started = time.monotonic()
    if platformio_available():
        tool = "platformio"
        if _uses_system_toolchain(parser, env):
            for name in REQUIRED_TOOLS:
                require_tool(name)
        elf, log = _build_with_platformio(project_dir, env, progress)
    else:
        tool = "avr-gcc"
        message = "PlatformIO (with SCons) is not installed: building with avr-gcc directly, same flags"
        warnings.warn(message, stacklevel=2)
        _say(progress, message)
        sources = _c_sources(project_dir / "src", project_dir / "lib")
        elf, log = _compile_with_avr_gcc(project_dir, env, sources, project_dir / ".pio" / "build" / env, progress)
        _elf_to_hex(elf)  # always: a .hex left by an earlier PlatformIO build would be stale
    if not elf.is_file():
        raise TinyprotoError(f"the build reported success but {elf} does not exist")
    hex_path = elf.with_suffix(".hex")
    if not hex_path.is_file():
        hex_path = _elf_to_hex(elf)
    sizes = firmware_sizes(elf)
    _say(progress, f"built {elf.name} with {tool} in {time.monotonic() - started:.1f} s")
    return BuildResult(elf=elf, hex=hex_path, sizes=sizes, tool=tool, log=log)


