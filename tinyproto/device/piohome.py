"""tinyproto's offline PlatformIO home: one per user, `<cache>/pio-core` (see tools/pio/README.md).

Everything a generated platformio.ini needs offline is *installed* here, under the names PlatformIO looks up,
so the project names no path of this installation:

    platforms/tinyproto-avr            a copy of tools/pio/tinyproto-avr  (platform = tinyproto-avr)
    packages/toolchain-atmelavr        package.json + bin/ links to the system avr-* tools
    packages/tool-scons                PyPI's SCons as PlatformIO's core package
    packages/framework-arduino-avr     Debian's arduino-core-avr (links), when it is installed

A generated platformio.ini says `core_dir = ~/.cache/tinyproto/pio-core` (PlatformIO expands `~` for whoever
runs it), so `pio run` / `pio test` work in a model directory copied to another path, user or machine once
tinyproto has prepared that user's home (`tinyproto build` does, or `python -m tinyproto.device.piohome`).
tinyproto's own runs pass PLATFORMIO_CORE_DIR, which PlatformIO prefers over the file's core_dir, so a
TINYPROTO_CACHE elsewhere works too. The user's own ~/.platformio is never touched.
Layer: device.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.resources import IMPORT_ROOT, resource_dir
from tinyproto.device.sim import tinyproto_cache_dir

APT_AVR = "sudo apt-get install gcc-avr avr-libc binutils-avr"
# What the generated platformio.ini names as PlatformIO's home: the default cache location, written with `~` so
# the file holds no user's home (tinyproto_cache_dir() without TINYPROTO_CACHE / XDG_CACHE_HOME).
CORE_DIR_IN_INI = "~/.cache/tinyproto/pio-core"
PLATFORM_NAME = "tinyproto-avr"
ARDUINO_CORE = Path("/usr/share/arduino/hardware/arduino/avr")  # Debian's arduino-core-avr
APT_ARDUINO = "sudo apt-get install arduino-core-avr"
_TOOLCHAIN_TOOLS = (
    "avr-gcc", "avr-g++", "avr-cpp", "avr-as", "avr-ld", "avr-ar", "avr-ranlib", "avr-nm", "avr-objcopy",
    "avr-objdump", "avr-size", "avr-strip", "avr-readelf", "avr-addr2line", "avr-c++filt", "avr-gcc-ar",
    "avr-gcc-nm", "avr-gcc-ranlib", "avr-gdb",
)  # fmt: skip
REQUIRED_TOOLS = ("avr-gcc", "avr-objcopy", "avr-size")


def offline_platform_dir() -> Path:
    """The dev-platform's source in this installation (installed into the home as a copy)."""
    return resource_dir("tools") / "pio" / PLATFORM_NAME


def pio_core_dir() -> Path:
    """PlatformIO's home for tinyproto: `<cache>/pio-core`."""
    return tinyproto_cache_dir() / "pio-core"


def pio_toolchain_dir() -> Path:
    """The installed toolchain-atmelavr package: package.json + bin/ symlinks to the system avr-* tools."""
    return pio_core_dir() / "packages" / "toolchain-atmelavr"


def arduino_framework_dir() -> Path:
    """The installed framework-arduino-avr package (Debian's Arduino core), for `framework = arduino`."""
    return pio_core_dir() / "packages" / "framework-arduino-avr"


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise TinyprotoError(f"{name} not found: the AVR toolchain is missing; install it with: {APT_AVR}")
    return path


def platformio_available() -> bool:
    """PlatformIO and SCons (which PlatformIO would otherwise download as tool-scons) importable here."""
    return importlib.util.find_spec("platformio") is not None and importlib.util.find_spec("SCons") is not None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock file: parallel builds (test workers) prepare the shared home one at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_if_changed(path: Path, content: bytes) -> None:
    """Atomic per file (a PlatformIO run of another process reads either the old or the new file)."""
    if not path.is_file() or path.is_symlink() or path.read_bytes() != content:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, path)


def _symlink(link: Path, target: Path) -> None:
    """Atomic: a new link is renamed over the old one, so the name never disappears for a concurrent reader."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    tmp = link.with_name(link.name + ".tmp-link")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _piopm(kind: str, name: str, version: str, owner: str | None) -> bytes:
    """.piopm: the metadata PlatformIO writes for packages it installed itself; with it our folders count as
    installed `owner/name@version` (owner "platformio" where the platform manifest asks for that owner)."""
    spec = {"owner": owner, "id": None, "name": name, "requirements": None, "uri": None}
    return json.dumps({"type": kind, "name": name, "version": version, "spec": spec}).encode()


def _install_tool_scons(core: Path) -> None:
    """PyPI's SCons as PlatformIO's core package tool-scons (PlatformIO runs <pkg>/scons.py with its Python);
    its version is inside the core's requirement (~4.41101.0)."""
    template = resource_dir("tools") / "pio" / "tool-scons"
    package = core / "packages" / "tool-scons"
    package.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((template / "package.json").read_text(encoding="utf-8"))
    _write_if_changed(package / "package.json", (template / "package.json").read_bytes())
    _write_if_changed(package / "scons.py", (template / "scons.py").read_bytes())
    _write_if_changed(package / ".piopm", _piopm("tool", "tool-scons", manifest["version"], "platformio"))
    scons_spec = importlib.util.find_spec("SCons")
    assert scons_spec is not None and scons_spec.submodule_search_locations
    _symlink(package / "SCons", Path(next(iter(scons_spec.submodule_search_locations))))


def _install_toolchain(package: Path) -> None:
    template = resource_dir("tools") / "pio" / "toolchain-atmelavr"
    bin_dir = package / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((template / "package.json").read_text(encoding="utf-8"))
    _write_if_changed(package / "package.json", (template / "package.json").read_bytes())
    _write_if_changed(package / ".piopm", _piopm("tool", "toolchain-atmelavr", manifest["version"], "platformio"))
    for tool in _TOOLCHAIN_TOOLS:
        found = shutil.which(tool)
        if found is None:
            continue
        target = Path(found).resolve()
        if bin_dir.resolve() in target.parents:
            continue  # PATH already points into our own package: keep the existing link
        _symlink(bin_dir / tool, target)


def _install_platform(core: Path) -> None:
    """A copy (not a link to this installation: the home outlives checkouts and virtualenvs) of the dev-platform;
    files the source no longer has are removed."""
    source = offline_platform_dir()
    target = core / "platforms" / PLATFORM_NAME
    wanted = {p.relative_to(source) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    for rel in sorted(wanted):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(target / rel, (source / rel).read_bytes())
    version = json.loads((source / "platform.json").read_text(encoding="utf-8"))["version"]
    _write_if_changed(target / ".piopm", _piopm("platform", PLATFORM_NAME, version, None))
    for path in sorted(target.rglob("*"), reverse=True):
        rel = path.relative_to(target)
        if path.is_file() and rel not in wanted and rel.name != ".piopm" and "__pycache__" not in rel.parts:
            path.unlink()


def _install_arduino_framework(package: Path) -> None:
    """Debian's Arduino core as the package framework-arduino-avr (links to its cores, variants, libraries)."""
    package.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "framework-arduino-avr", "version": "1.8.7",
                "description": "tinyproto: Debian's arduino-core-avr (/usr/share/arduino/hardware/arduino/avr)"}
    _write_if_changed(package / "package.json", json.dumps(manifest).encode())
    _write_if_changed(package / ".piopm", _piopm("framework", "framework-arduino-avr", "1.8.7", "platformio"))
    for name in ("cores", "variants", "libraries"):
        _symlink(package / name, ARDUINO_CORE / name)


def prepare_pio_core() -> Path:
    """Creates or refreshes (idempotently, under a lock) tinyproto's PlatformIO home; returns it."""
    for tool in REQUIRED_TOOLS:
        require_tool(tool)
    core = pio_core_dir()
    with _locked(tinyproto_cache_dir() / "pio-prepare.lock"):
        _install_tool_scons(core)
        _install_toolchain(pio_toolchain_dir())
        # Projects generated before the home was portable name the toolchain by this absolute path.
        _symlink(tinyproto_cache_dir() / "pio-toolchain-atmelavr", pio_toolchain_dir())
        _install_platform(core)
        if (ARDUINO_CORE / "cores").is_dir():
            _install_arduino_framework(arduino_framework_dir())
    return core


def pio_environment(core: Path) -> dict[str, str]:
    """Environment for PlatformIO: our home, no network side trips, tinyproto importable by the test command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORMIO_") or k == "PLATFORMIO_UPLOAD_PORT"}
    env.update(
        PLATFORMIO_CORE_DIR=str(core),
        PLATFORMIO_SETTING_ENABLE_TELEMETRY="no",
        PLATFORMIO_SETTING_CHECK_PLATFORMIO_INTERVAL="3650",
        PLATFORMIO_DISABLE_UPGRADE_CHECK="true",
        PLATFORMIO_DISABLE_PROGRESSBAR="true",
        PLATFORMIO_NO_ANSI="true",
        PYTHONPATH=os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH", "")) if p),
        # PlatformIO and SCons are Python: under a locale that is not UTF-8 (LC_ALL=C) they read a project path
        # with a non-ASCII name as ASCII and fail ("An unexpected error occurred"); the names are UTF-8 on disk
        PYTHONUTF8="1",
    )
    return env


def main() -> None:
    """`python -m tinyproto.device.piohome`: prepare this user's PlatformIO home and print where it is."""
    try:
        print(prepare_pio_core())
    except TinyprotoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
