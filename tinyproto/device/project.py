"""The generated PlatformIO project: its platformio.ini (templates/platformio.ini.j2, rendered and read back), its
compiler flags, and the avr-gcc compile of its sources used when PlatformIO is missing.

The file names no path of the checkout, the virtualenv or a home directory, so a model directory can be moved
or copied to another user or machine: the dev-platform is named `tinyproto-avr` and found in tinyproto's
PlatformIO home (tinyproto.device.piohome), which the file's `core_dir = ~/.cache/tinyproto/pio-core` names for
whoever runs `pio`; the simulator's test command starts with `python3` (see SIM_TEST_PYTHON).
Layer: device.
"""

from __future__ import annotations

import configparser
import functools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from tinyproto.core.errors import TinyprotoError, cwd_exists
from tinyproto.core.manifest import remake_advice
from tinyproto.core.outdir import private_scratch
from tinyproto.core.render import jinja_env
from tinyproto.core.safe_io import MAX_JSON_BYTES, read_bytes_file
from tinyproto.device.piohome import CORE_DIR_IN_INI, PLATFORM_NAME, require_tool

Progress = Callable[[str], None]

DEFAULT_ENV = "uno_sim"
# Flags of every build, PlatformIO or not (the dev-platform adds -mmcu/-DF_CPU/-Os/sections the same way).
C_FLAGS = ["-Os", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-ffunction-sections", "-fdata-sections"]
LINK_FLAGS = ["-Wl,--gc-sections"]
LINK_LIBS = ["-lm"]
# `pio test` builds its test program into build_dir/<env>/firmware.elf; a separate build_dir keeps it from
# overwriting the device firmware that `pio run` (build_project) put in .pio/build/<env>/.
TEST_BUILD_DIR = Path(".pio") / "test-build"
# A simulated `pio test` that has not finished after this many cycles (20 s of Uno time) has hung.
SIM_TEST_TIMEOUT_CYCLES = 320_000_000
PIO_RUN_TIMEOUT_S = 900  # the official platform may download a toolchain on first use
# The interpreter word of the simulated test command: whichever python3 runs `pio test`; the project's test
# runner (templates/pio_test_custom_runner.py) puts PlatformIO's own interpreter there when it has tinyproto.
SIM_TEST_PYTHON = "python3"


# ---------------------------------------------------------------------------------------------------------
# platformio.ini


def sim_test_command(board=None) -> list[str]:
    """`pio test -e <board>_sim`'s test_testing_command, one argument per item (PlatformIO interpolates ${...}):
    the board's chip at the board's clock. No absolute path: see SIM_TEST_PYTHON."""
    mcu = board.mcu if board is not None else "atmega328p"
    f_cpu = board.f_cpu_hz if board is not None else 16_000_000
    return [
        SIM_TEST_PYTHON, "-m", "tinyproto.device.sim", "--stdio", "--mcu", mcu, "--freq", str(f_cpu),
        "--timeout-cycles", str(SIM_TEST_TIMEOUT_CYCLES),
        "${platformio.build_dir}/${this.__env__}/firmware.elf",
    ]  # fmt: skip


def render_platformio_ini(board) -> str:
    """platformio.ini text for `board` (a tinyproto.core.boards.Board): environments <name>, <name>_offline,
    <name>_sim."""
    from tinyproto.core.wire import frame_buffer_limit

    return jinja_env().get_template("platformio.ini.j2").render(
        board=board,
        max_buf=frame_buffer_limit(board.sram_bytes),
        platform_name=PLATFORM_NAME,
        core_dir=CORE_DIR_IN_INI,
        sim_test_command=sim_test_command(board),
    )


def render_arduino_platformio_ini(board, name: str | list[str], sketch: str | None = None) -> str:
    """platformio.ini of an Arduino export (`tinyproto export --arduino`): the library `name` (or libraries) beside
    it, the example sketch as the source (the library's own, or the folder `sketch` of an export of several
    models), `framework = arduino` offline (<board>_offline, the default) and official (<board>)."""
    names = [name] if isinstance(name, str) else list(name)
    src_dir = sketch if sketch is not None else f"{names[0]}/examples/{names[0]}"
    return jinja_env().get_template("arduino_platformio.ini.j2").render(
        board=board, names=names, src_dir=src_dir, sketch_path=f"{src_dir}/{src_dir.rsplit('/', 1)[-1]}.ino",
        platform_name=PLATFORM_NAME, core_dir=CORE_DIR_IN_INI)


def _read_ini(project_dir: Path) -> configparser.ConfigParser:
    ini = project_dir / "platformio.ini"
    if not os.path.lexists(ini):
        raise TinyprotoError(f"{project_dir} is not a PlatformIO project (no platformio.ini); "
                             f"{remake_advice(project_dir)}")
    # read here, not by parser.read(), which skips a file it cannot open: an unreadable platformio.ini was a
    # project of no environments ("env 'uno_sim' is none of platformio.ini's environments (none)")
    text = read_bytes_file(ini, "the PlatformIO project file", MAX_JSON_BYTES)
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        parser.read_string(text.decode("utf-8"), str(ini))
    except (configparser.Error, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0][:120]
        raise TinyprotoError(f"{ini} is damaged ({first}); {remake_advice(project_dir)}") from None
    return parser


def parser_of(project_dir: Path) -> configparser.ConfigParser:
    return _read_ini(Path(project_dir))


def _env_option(parser: configparser.ConfigParser, env: str, key: str, default: str = "") -> str:
    """An option of [env:NAME], following `extends` and falling back to [env] like PlatformIO does
    (only the `${env.<key>}` interpolation is resolved: it is the one the generated file uses)."""
    common = parser.get("env", key, fallback=default).strip() if parser.has_section("env") else default
    section = f"env:{env}"
    seen = set()
    while parser.has_section(section) and section not in seen:
        seen.add(section)
        if parser.has_option(section, key):
            return parser.get(section, key).strip().replace(f"${{env.{key}}}", common)
        section = parser.get(section, "extends", fallback="").strip()
    return common


def project_default_env(parser: configparser.ConfigParser) -> str:
    """The project's `default_envs` (first one), else DEFAULT_ENV: `<board>_sim` in generated projects."""
    value = parser.get("platformio", "default_envs", fallback="").replace(",", " ").split()
    return value[0] if value else DEFAULT_ENV


def resolve_env(project_dir: Path, env: str | None) -> str:
    """`env`, or the project's default environment when None."""
    return env if env else project_default_env(_read_ini(Path(project_dir)))


def _check_env(parser: configparser.ConfigParser, env: str) -> None:
    if not parser.has_section(f"env:{env}"):
        known = [s[4:] for s in parser.sections() if s.startswith("env:")]
        raise TinyprotoError(f"unknown PlatformIO environment {env!r}; this project has: {', '.join(known)}")


def _uses_system_toolchain(parser: configparser.ConfigParser, env: str) -> bool:
    platform = _env_option(parser, env, "platform")
    return platform == PLATFORM_NAME or platform.startswith(("symlink://", "file://"))


# ---------------------------------------------------------------------------------------------------------
# avr-gcc without PlatformIO


# The tool's group leader: a shell that runs the tool and, when SIGTERM reaches it, ends the whole group; util-linux's
# setpriv has Linux send it that SIGTERM when tinyproto dies (the parent-death signal), so a `kill -9` of tinyproto
# ends what it started too: `pio run` went on building into .pio/, beside the next run's build, or hung.
_GROUP_GUARD = 'trap \'trap "" TERM; kill -TERM 0; exit 143\' TERM; "$@" & wait $!'


def _run(command: list[str], timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    """A build tool's run, its output captured. The tool leads a process group of its own, and whatever ends this
    call early (Ctrl-C, SIGTERM, a timeout) ends that whole group: `pio run` starts scons, scons the compilers,
    which kept building into .pio/ after tinyproto had said it was interrupted (subprocess.run kills only pio).
    So does tinyproto's own death by SIGKILL (_GROUP_GUARD).
    Its TMPDIR is a private scratch directory, removed when the tool ends (a killed run's by the next run): the
    compilers' temporary files (cc*.s, cc*.o, cc*.ld, cc*.le) of a group ended mid-link stayed in $TMPDIR."""
    env = dict(kwargs.pop("env", None) or os.environ)
    with private_scratch("tinyproto-tool-") as scratch:
        env["TMPDIR"] = str(scratch)
        if "cwd" not in kwargs and not cwd_exists():  # PlatformIO failed with "An unexpected error occurred"
            kwargs["cwd"] = scratch  # the command names its files by absolute paths (a relative one could not be)
        with subprocess.Popen([*_group_guard(), *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, encoding="utf-8", errors="replace", process_group=0, env=env,
                              **kwargs) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except BaseException:
                _end_group(process)
                raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@functools.lru_cache(maxsize=None)
def _group_guard() -> tuple[str, ...]:
    """The words before a tool's command that end its group with tinyproto (nothing without setpriv or /bin/sh).
    (Not a preexec_fn calling prctl: Python then runs its fork handlers, and a Ctrl-C inside one was lost.)"""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not os.path.exists("/bin/sh"):
        return ()
    return (setpriv, "--pdeathsig", "TERM", "/bin/sh", "-c", _GROUP_GUARD, "tinyproto-tool")


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the tool's process group, SIGKILL to whatever of it is left after a moment; then reap the tool."""
    for signo, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, signo)
        except ProcessLookupError:
            pass  # the group is gone
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass


def build_failure(tool: str, log: str, where: Path) -> str:
    """The one line a failed build says: the disk being full (the compiler's and SCons' own words for it are pages
    of "can't write ... to section" and a traceback), else the compiler's first errors."""
    full = no_space_line(log, where)
    if full:
        return f"firmware build failed ({tool}): {full}"
    return f"firmware build failed ({tool}):\n{_first_errors(log)}"


def no_space_line(log: str, where: Path) -> str | None:
    """What a tool's log of a full disk means, in one clause, or None. The compilers write their temporary files
    in the tool's TMPDIR (_run: a scratch directory in the temporary directory), so a full $TMPDIR reads the same
    as a full `where` (a 200 kB TMPDIR was reported as a cut "can't write 60 bytes to section ... because:")."""
    import tempfile

    if "No space left on device" not in log and "Disk quota exceeded" not in log:
        return None
    return (f"no space left on the device that holds {where} or the temporary directory {tempfile.gettempdir()}; "
            "free some space (or set TMPDIR to a directory with room) and run the command again")


def _first_errors(log: str, limit: int = 12) -> str:
    """The compiler's first error lines (what the user needs), else the end of the log."""
    lines = log.splitlines()
    # not -Werror, not "errors"; "*** [target] Error" is make/SCons (a row of stars is PlatformIO's banner)
    wanted = re.compile(r"\berror\b|undefined reference|\*\*\* \[", re.IGNORECASE)
    hits = [i for i, line in enumerate(lines) if wanted.search(line)]
    if hits:
        start = max(0, hits[0] - 1) if "In function" in lines[max(0, hits[0] - 1)] else hits[0]
        return "\n".join(lines[start : start + limit])
    return "\n".join(lines[-limit:])


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def project_baud(project_dir: Path, env: str) -> int | None:
    """The serial rate the environment builds into the firmware (-DTP_BAUD=...), None if it names none."""
    for flag in _env_option(_read_ini(Path(project_dir)), env, "build_flags").split():
        if flag.startswith("-DTP_BAUD="):
            digits = flag.split("=", 1)[1].rstrip("UuLl")
            return int(digits) if digits.isdigit() else None
    return None


_RX_RING_DEFINE = re.compile(r"^#define\s+TP_RX_RING\s+([0-9]{1,5})u?\s*$", re.MULTILINE)


def project_rx_ring(project_dir: Path) -> int:
    """The serial receive ring the project's firmware is built with (TP_RX_RING of include/tinyproto_sizes.h,
    which compile sized to the SRAM the model leaves free); 0 when the header defines none (no ring)."""
    from tinyproto.core.safe_io import read_text_file

    text = read_text_file(Path(project_dir) / "include" / "tinyproto_sizes.h", "the generated sizes header",
                          limit=1 << 20)
    match = _RX_RING_DEFINE.search(text)
    return int(match.group(1)) if match else 0


def _project_flags(parser: configparser.ConfigParser, env: str) -> list[str]:
    mcu = _env_option(parser, env, "board_build.mcu", "atmega328p")
    f_cpu = _env_option(parser, env, "board_build.f_cpu", "16000000UL")
    extra = [flag for flag in _env_option(parser, env, "build_flags").split() if flag.startswith("-D")]
    return [f"-mmcu={mcu}", f"-DF_CPU={f_cpu}", *C_FLAGS, *extra]


def _c_sources(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders if folder.is_dir() for p in folder.rglob("*.c"))


def _compile_with_avr_gcc(
    project_dir: Path, env: str, sources: list[Path], out_dir: Path, progress: Progress | None
) -> tuple[Path, str]:
    """One avr-gcc call compiling and linking `sources` with the project's flags -> out_dir/firmware.elf."""
    parser = _read_ini(project_dir)
    includes = [project_dir / "include", *sorted(p for p in (project_dir / "lib").glob("*") if p.is_dir())]
    out_dir.mkdir(parents=True, exist_ok=True)
    elf = out_dir / "firmware.elf"
    command = [
        require_tool("avr-gcc"), *_project_flags(parser, env), *[f"-I{p}" for p in includes],
        *map(str, sources), *LINK_FLAGS, "-o", str(elf), *LINK_LIBS,
    ]  # fmt: skip
    _say(progress, f"avr-gcc: compiling {len(sources)} files")
    result = _run(command, cwd=project_dir)
    log = " ".join(command) + "\n" + result.stdout + result.stderr
    if result.returncode != 0:
        raise TinyprotoError(build_failure("avr-gcc", log, out_dir))
    return elf, log
