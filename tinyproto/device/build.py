"""Build the generated PlatformIO project: `pio run` (offline platform by default), or avr-gcc directly.

Environments of the generated platformio.ini (templates/platformio.ini.j2), named after the board
(boards/<name>.json; the Uno's are shown):

    uno          official `atmelavr` platform (internet needed once); flashes/tests a real Uno
    uno_offline  tinyproto's local dev-platform (tools/pio/tinyproto-avr) + system avr-gcc; real Uno, offline
    uno_sim      uno_offline whose `upload` is a no-op and whose `pio test` runs in the simulated Uno

`env=None` everywhere means the project's own default (`default_envs`, the board's `<name>_sim`), so a Nano's
project builds `nano_sim` and an existing Uno project keeps building `uno_sim`.

PlatformIO runs with a tinyproto-owned core directory (`<cache>/pio-core-<hash of this installation>`, see
`pio_core_dir`) so the user's own ~/.platformio is never touched, and with every update check and telemetry switched off: nothing is
downloaded for the offline environments. Without PlatformIO (or SCons) the same sources are compiled with
avr-gcc directly, with the same flags.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.device.sim import EXIT_DONE, ensure_simulator, tinyproto_cache_dir
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.ledger import FirmwareSizes
from tinyproto.core.render import jinja_env
from tinyproto.core.resources import IMPORT_ROOT, resource_dir

Progress = Callable[[str], None]

APT_AVR = "sudo apt-get install gcc-avr avr-libc binutils-avr"
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
_TOOLCHAIN_TOOLS = (
    "avr-gcc", "avr-g++", "avr-cpp", "avr-as", "avr-ld", "avr-ar", "avr-ranlib", "avr-nm", "avr-objcopy",
    "avr-objdump", "avr-size", "avr-strip", "avr-readelf", "avr-addr2line", "avr-c++filt", "avr-gcc-ar",
    "avr-gcc-nm", "avr-gcc-ranlib", "avr-gdb",
)  # fmt: skip
_REQUIRED_TOOLS = ("avr-gcc", "avr-objcopy", "avr-size")


@dataclass(frozen=True)
class BuildResult:
    elf: Path
    hex: Path
    sizes: FirmwareSizes
    tool: str  # "platformio" or "avr-gcc"
    log: str


# ---------------------------------------------------------------------------------------------------------
# Paths


def offline_platform_dir() -> Path:
    return resource_dir("tools") / "pio" / "tinyproto-avr"


def pio_core_dir() -> Path:
    """PlatformIO's home for this installation: PlatformIO records the local dev-platform by its path, so two
    installations (checkouts, venvs) sharing one home would overwrite each other's platform link."""
    digest = hashlib.sha256(str(offline_platform_dir().resolve()).encode()).hexdigest()[:12]
    return tinyproto_cache_dir() / f"pio-core-{digest}"


def pio_toolchain_dir() -> Path:
    """The toolchain-atmelavr package: package.json + bin/ symlinks to the system avr-* tools."""
    return tinyproto_cache_dir() / "pio-toolchain-atmelavr"


def sim_test_command(board=None) -> list[str]:
    """`pio test -e <board>_sim`'s test_testing_command, one argument per item (PlatformIO interpolates ${...}):
    the board's chip at the board's clock."""
    mcu = board.mcu if board is not None else "atmega328p"
    f_cpu = board.f_cpu_hz if board is not None else 16_000_000
    return [
        sys.executable, "-m", "tinyproto.device.sim", "--stdio", "--mcu", mcu, "--freq", str(f_cpu),
        "--timeout-cycles", str(SIM_TEST_TIMEOUT_CYCLES),
        "${platformio.build_dir}/${this.__env__}/firmware.elf",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# platformio.ini


def render_platformio_ini(board) -> str:
    """platformio.ini text for `board` (a tinyproto.boards.Board): environments <name>, <name>_offline, <name>_sim."""
    return jinja_env().get_template("platformio.ini.j2").render(
        board=board,
        offline_platform_dir=offline_platform_dir().as_posix(),
        offline_toolchain_dir=pio_toolchain_dir().as_posix(),
        pio_core_dir=pio_core_dir().as_posix(),
        sim_test_command=sim_test_command(board),
    )


def _read_ini(project_dir: Path) -> configparser.ConfigParser:
    ini = project_dir / "platformio.ini"
    if not ini.is_file():
        raise TinyprotoError(f"{project_dir} is not a PlatformIO project (no platformio.ini); run tinyproto compile")
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        parser.read(ini)
    except (configparser.Error, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0][:120]
        raise TinyprotoError(f"{ini} is damaged ({first}); run tinyproto compile again") from None
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
    return _env_option(parser, env, "platform").startswith(("symlink://", "file://"))


# ---------------------------------------------------------------------------------------------------------
# avr-size


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
    result = _run([_require_tool("avr-size"), "-A", "-d", str(elf)])
    if result.returncode != 0:
        raise TinyprotoError(f"avr-size failed on {elf}: {result.stderr.strip()}")
    return parse_avr_size(result.stdout)


# ---------------------------------------------------------------------------------------------------------
# The offline PlatformIO home


def _require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise TinyprotoError(f"{name} not found: the AVR toolchain is missing; install it with: {APT_AVR}")
    return path


def platformio_available() -> bool:
    """PlatformIO and SCons (which PlatformIO would otherwise download as tool-scons) importable here."""
    return importlib.util.find_spec("platformio") is not None and importlib.util.find_spec("SCons") is not None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock file: parallel builds (test workers) prepare the shared cache one at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_if_changed(path: Path, content: str) -> None:
    if not path.is_file() or path.read_text() != content:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        os.replace(tmp, path)


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _prepare_tool_scons(core: Path) -> None:
    """PyPI's SCons as PlatformIO's core package tool-scons (PlatformIO runs <pkg>/scons.py with its Python)."""
    template = resource_dir("tools") / "pio" / "tool-scons"
    package = core / "packages" / "tool-scons"
    package.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((template / "package.json").read_text())
    _write_if_changed(package / "package.json", (template / "package.json").read_text())
    _write_if_changed(package / "scons.py", (template / "scons.py").read_text())
    # .piopm: the metadata PlatformIO writes for packages it installed itself; owner "platformio" and a
    # version inside the core's requirement (~4.41101.0) make it count as the installed core package.
    metadata = {
        "type": "tool",
        "name": "tool-scons",
        "version": manifest["version"],
        "spec": {"owner": "platformio", "id": None, "name": "tool-scons", "requirements": None, "uri": None},
    }
    _write_if_changed(package / ".piopm", json.dumps(metadata))
    scons_spec = importlib.util.find_spec("SCons")
    assert scons_spec is not None and scons_spec.submodule_search_locations
    _symlink(package / "SCons", Path(next(iter(scons_spec.submodule_search_locations))))


def _prepare_toolchain(toolchain: Path) -> None:
    template = resource_dir("tools") / "pio" / "toolchain-atmelavr"
    bin_dir = toolchain / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_if_changed(toolchain / "package.json", (template / "package.json").read_text())
    for tool in _TOOLCHAIN_TOOLS:
        found = shutil.which(tool)
        if found is None:
            continue
        target = Path(found).resolve()
        if bin_dir.resolve() in target.parents:
            continue  # PATH already points into our own package: keep the existing link
        _symlink(bin_dir / tool, target)


def prepare_pio_core() -> Path:
    """Creates (idempotently) tinyproto's PlatformIO home and toolchain package; returns the core dir."""
    for tool in _REQUIRED_TOOLS:
        _require_tool(tool)
    core = pio_core_dir()
    with _locked(tinyproto_cache_dir() / "pio-prepare.lock"):
        _prepare_tool_scons(core)
        _prepare_toolchain(pio_toolchain_dir())
    return core


def pio_environment(core: Path) -> dict[str, str]:
    """Environment for PlatformIO: our core dir, no network side trips, tinyproto importable by the test command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORMIO_") or k == "PLATFORMIO_UPLOAD_PORT"}
    env.update(
        PLATFORMIO_CORE_DIR=str(core),
        PLATFORMIO_SETTING_ENABLE_TELEMETRY="no",
        PLATFORMIO_SETTING_CHECK_PLATFORMIO_INTERVAL="3650",
        PLATFORMIO_DISABLE_UPGRADE_CHECK="true",
        PLATFORMIO_DISABLE_PROGRESSBAR="true",
        PLATFORMIO_NO_ANSI="true",
        PYTHONPATH=os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


# ---------------------------------------------------------------------------------------------------------
# Building


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, capture_output=True, text=True, **kwargs)


def _first_errors(log: str, limit: int = 12) -> str:
    """The compiler's first error lines (what the user needs), else the end of the log."""
    lines = log.splitlines()
    wanted = re.compile(r"\berror\b|undefined reference|\*\*\*", re.IGNORECASE)  # not -Werror, not "errors"
    hits = [i for i, line in enumerate(lines) if wanted.search(line)]
    if hits:
        start = max(0, hits[0] - 1) if "In function" in lines[max(0, hits[0] - 1)] else hits[0]
        return "\n".join(lines[start : start + limit])
    return "\n".join(lines[-limit:])


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _build_with_platformio(project_dir: Path, env: str, progress: Progress | None) -> tuple[Path, str]:
    core = prepare_pio_core()
    command = [sys.executable, "-m", "platformio", "run", "-e", env, "-d", str(project_dir)]
    _say(progress, f"PlatformIO: pio run -e {env}")
    try:
        result = _run(command, env=pio_environment(core), timeout=PIO_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TinyprotoError(f"pio run -e {env} did not finish within {PIO_RUN_TIMEOUT_S} s") from exc
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise TinyprotoError(f"firmware build failed (pio run -e {env}):\n{_first_errors(log)}{_offline_hint(log)}")
    return project_dir / ".pio" / "build" / env / "firmware.elf", log


def _offline_hint(log: str) -> str:
    if "HTTPClientError" in log or "InternetConnectionError" in log:
        return "\n(PlatformIO could not download a package: without internet use the <board>_sim or <board>_offline env)"
    return ""


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
        _require_tool("avr-gcc"), *_project_flags(parser, env), *[f"-I{p}" for p in includes],
        *map(str, sources), *LINK_FLAGS, "-o", str(elf), *LINK_LIBS,
    ]  # fmt: skip
    _say(progress, f"avr-gcc: compiling {len(sources)} files")
    result = _run(command, cwd=project_dir)
    log = " ".join(command) + "\n" + result.stdout + result.stderr
    if result.returncode != 0:
        raise TinyprotoError(f"firmware build failed (avr-gcc):\n{_first_errors(log)}")
    return elf, log


def _elf_to_hex(elf: Path) -> Path:
    hex_path = elf.with_suffix(".hex")
    result = _run([_require_tool("avr-objcopy"), "-O", "ihex", "-R", ".eeprom", str(elf), str(hex_path)])
    if result.returncode != 0:
        raise TinyprotoError(f"avr-objcopy failed: {result.stderr.strip()}")
    return hex_path


def build_project(project_dir: Path, env: str | None = None, progress: Progress | None = None) -> BuildResult:
    """Builds the firmware of a generated project; `pio run -e env`, or avr-gcc when PlatformIO is missing.
    env None: the project's default environment (`<board>_sim`)."""
    project_dir = Path(project_dir).resolve()
    parser = _read_ini(project_dir)
    env = env or project_default_env(parser)
    _check_env(parser, env)
    started = time.monotonic()
    if platformio_available():
        tool = "platformio"
        if _uses_system_toolchain(parser, env):
            for name in _REQUIRED_TOOLS:
                _require_tool(name)
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


# ---------------------------------------------------------------------------------------------------------
# pio test


def _c_row(values: np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def render_pio_test(project_dir: Path, xq: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> Path:
    """Writes test/test_model/test_main.c (vectors + expected scores/labels) and the custom test runner."""
    xq = np.asarray(xq)
    scores = np.asarray(scores)
    labels = np.asarray(labels).reshape(-1)
    if xq.ndim != 2 or scores.ndim != 2 or not (len(xq) == len(scores) == len(labels)) or len(xq) == 0:
        raise ValueError("render_pio_test needs xq (n, d), scores (n, L) and labels (n,) with the same n > 0")
    if xq.min() < -128 or xq.max() > 127:
        raise ValueError("xq must hold int8 values")
    if scores.min() < -(2**31) or scores.max() > 2**31 - 1:
        raise ValueError("scores must fit in int32")
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError("labels must be class indices")
    source = jinja_env().get_template("pio_test_main.c.j2").render(
        vectors=[_c_row(row) for row in xq],
        expected_scores=[_c_row(row) for row in scores],
        expected_labels=_c_row(labels),
        n_vectors=len(xq),
    )
    test_dir = Path(project_dir) / "test"
    (test_dir / "test_model").mkdir(parents=True, exist_ok=True)
    (test_dir / "test_model" / "test_main.c").write_text(source)
    shutil.copyfile(resource_dir("templates") / "pio_test_custom_runner.py", test_dir / "test_custom_runner.py")
    return test_dir / "test_model"


def _test_summary_passed(output: str) -> bool:
    """Unity's summary line `N Tests 0 Failures 0 Ignored` followed by OK."""
    match = re.search(r"^(\d+) Tests (\d+) Failures (\d+) Ignored\s*$", output, re.MULTILINE)
    return bool(match) and int(match.group(1)) > 0 and int(match.group(2)) == 0


def _run_sim_test_without_platformio(project_dir: Path, env: str) -> tuple[bool, str]:
    """`pio test -e uno_sim` by hand: avr-gcc builds test/ + lib/, simuno --stdio runs it."""
    sources = _c_sources(project_dir / "test", project_dir / "lib")
    elf, log = _compile_with_avr_gcc(project_dir, env, sources, project_dir / TEST_BUILD_DIR / env, None)
    mcu = _env_option(parser_of(project_dir), env, "board_build.mcu", "atmega328p")
    f_cpu = _env_option(parser_of(project_dir), env, "board_build.f_cpu", "16000000UL").rstrip("UuLl")
    command = [str(ensure_simulator()), "--stdio", "--mcu", mcu, "--freq", f_cpu,
               "--timeout-cycles", str(SIM_TEST_TIMEOUT_CYCLES), str(elf)]
    result = subprocess.run(
        command, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=PIO_RUN_TIMEOUT_S
    )
    output = result.stdout.decode("utf-8", "replace")
    log += output + result.stderr.decode("utf-8", "replace")
    return result.returncode == EXIT_DONE and _test_summary_passed(output), log


def run_pio_test(project_dir: Path, env: str | None = None) -> tuple[bool, str]:
    """Runs the on-device test (`pio test -e env`); returns (passed, log). <board>_sim runs in the simulator."""
    project_dir = Path(project_dir).resolve()
    parser = _read_ini(project_dir)
    env = env or project_default_env(parser)
    _check_env(parser, env)
    if not (project_dir / "test" / "test_model").is_dir():
        raise TinyprotoError(f"{project_dir} has no test/test_model; write it with render_pio_test()")
    simulated = _env_option(parser, env, "upload_protocol") == "simavr"
    if not platformio_available():
        if not simulated:
            raise TinyprotoError("pio test on a real board needs PlatformIO: pip install platformio scons")
        warnings.warn("PlatformIO is not installed: running the test firmware with avr-gcc + simuno", stacklevel=2)
        return _run_sim_test_without_platformio(project_dir, env)
    core = prepare_pio_core()
    if simulated:
        ensure_simulator()  # compile it here, with a clear error, rather than inside pio's test stage
    command = [sys.executable, "-m", "platformio", "test", "-e", env, "-d", str(project_dir)]
    environment = pio_environment(core)
    environment["PLATFORMIO_BUILD_DIR"] = str(project_dir / TEST_BUILD_DIR)
    try:
        result = _run(command, env=environment, timeout=PIO_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TinyprotoError(f"pio test -e {env} did not finish within {PIO_RUN_TIMEOUT_S} s") from exc
    log = result.stdout + result.stderr
    return result.returncode == 0, log
