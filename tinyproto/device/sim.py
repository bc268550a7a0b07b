"""The simulated Arduino Uno (and the other boards: ATmega328P, ATmega2560, ATmega32U4 at the board's clock):
tools/simuno (a small C program on libsimavr) driven from Python.

`SimulatedUno(elf)` starts simuno on a fresh pseudo-terminal; `.port` is a path pyserial opens like the USB
port of a real board, so the same `DeviceClient` talks to both. The simulation is cycle-exact (the firmware's
Timer1 figures are exact) and the firmware's GPIOR0 writes are reported with their cycle (`.markers()`), which
cross-checks the Timer1 measurement of an inference (the firmware writes 1 just before, 2 just after).
`SimulatedUno(elf, eeprom=path)` keeps the simulated EEPROM in a file (loaded at start if it exists, written when
the simulator stops), so stopping and starting again is a power cycle that keeps the EEPROM.

The simulator leaves nothing on disk: its stderr and markers go to anonymous files (unlinked from the start),
and simuno exits by itself when this process dies, however abruptly (its --parent-pipe reaches EOF).

simuno is compiled on first use with the host gcc against libsimavr (its static archive where installed, see
_LINK_CHOICES) into a per-user cache (`$TINYPROTO_CACHE`, else `$XDG_CACHE_HOME/tinyproto`, else
`~/.cache/tinyproto`), keyed by the hash of the source and the build commands.

`python -m tinyproto.device.sim [simuno options] firmware.elf` builds simuno if needed and runs it
(the generated platformio.ini uses this as `test_testing_command`).

This is the fast path (`--sim`): the ELF is loaded straight into the chip. For the path of a physical board
(avrdude, the bootloader, the reset on open) see tinyproto.device.board_sim, simuno's board mode.
Layer: device.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.resources import resource_dir

APT_SIM_PACKAGES = "gcc libsimavr-dev"
_SIMAVR_HEADER = Path("/usr/include/simavr/sim_avr.h")
_START_TIMEOUT_S = 10.0  # ELF loading takes milliseconds; this only catches a wedged start
_STOP_TIMEOUT_S = 3.0

# simuno's exit codes (see tools/simuno/simuno.c)
EXIT_DONE = 0
EXIT_USAGE = 1
EXIT_CRASH = 2
EXIT_TIMEOUT = 3
EXIT_PARENT_GONE = 4
_EXIT_REASONS = {
    EXIT_DONE: "the firmware finished (it slept with interrupts off; is this the pio test firmware?)",
    EXIT_USAGE: "simuno could not load the firmware",
    EXIT_CRASH: "the firmware crashed",
    EXIT_TIMEOUT: "the cycle limit was reached",
    EXIT_PARENT_GONE: "its parent closed the control pipe",
}


def check_image_file(path: Path, what: str = "the simulated board's EEPROM image") -> None:
    """A simulated chip's memory image (EEPROM, flash) is read at start and written at exit: missing (blank), or a
    regular file. A directory there was kept and the memory silently not used (or called "another board's"); a
    link would have the simulator write through it into a file tinyproto did not write."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a symbolic link" if path.is_symlink() else "a directory" if path.is_dir() else "not a regular file"
        raise TinyprotoError(f"{path} ({what}) is {kind}; move it away (a missing image is a blank memory)")


def tinyproto_cache_dir() -> Path:
    """Root of tinyproto's per-user cache (simulator binaries, the offline PlatformIO home): a directory, or a path
    where one can be made (one clear line otherwise, naming the variable that chose it)."""
    explicit = os.environ.get("TINYPROTO_CACHE")
    if explicit:  # a relative path is the working directory's: PlatformIO, run in the model directory, gets it whole
        return _usable_cache(Path(os.path.abspath(Path(explicit).expanduser())), f"TINYPROTO_CACHE={explicit}")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(os.path.expanduser(xdg)):
        return _usable_cache(Path(xdg).expanduser() / "tinyproto", f"XDG_CACHE_HOME={xdg}")
    # The XDG spec: a relative XDG_CACHE_HOME is invalid and ignored (it was taken from the working directory, where
    # PlatformIO, run in the model directory, found no home and tried to download one)
    return _usable_cache(_home() / ".cache" / "tinyproto", "the cache directory")


def _home() -> Path:
    """The user's home: $HOME when it is an absolute path, else the account's (HOME unset, empty or relative made
    the cache '/.cache' or one below the working directory)."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return Path(home)
    import pwd

    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        raise TinyprotoError(f"HOME={home!r} is not an absolute path and this user has no home in the password "
                             "database: set HOME, or point TINYPROTO_CACHE at a directory") from None


def _usable_cache(path: Path, chosen_by: str) -> Path:
    """`path` unless it, or the nearest of its parents that exists, is not a directory (a file, /dev/null): then
    every later mkdir would fail with 'File exists' or 'Not a directory' naming only a path."""
    for where in (path, *path.parents):
        if os.path.lexists(where) or where.is_symlink():
            if not where.is_dir():
                what = "" if where == path else f" ({where} is not a directory)"
                raise TinyprotoError(f"{chosen_by}: {path} is not a directory{what}; tinyproto keeps its simulator "
                                     "and PlatformIO home there: point TINYPROTO_CACHE at a directory")
            break
    try:  # a home nobody may write (HOME=/proc, a read-only mount) said only "No such file or directory: /proc/.cache"
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TinyprotoError(f"{chosen_by}: cannot create {path} ({exc.strerror}); tinyproto keeps its simulator and "
                             "PlatformIO home there: point TINYPROTO_CACHE at a directory you can write") from None
    return path


def simulator_source() -> Path:
    return resource_dir("tools") / "simuno" / "simuno.c"


# How simuno links libsimavr, first choice first. libsimavr's static archive (Debian's libsimavr-dev ships it)
# runs the simulated chip about an eighth faster than the shared library: its code is not position-independent,
# so every access to the core's globals and every call between its functions is direct (no GOT, no PLT), and the
# simulator runs one such call per simulated instruction. The archive needs libelf, linked by its runtime name
# (libelf-dev's unversioned libelf.so is not a prerequisite). The shared library is the fallback.
_LINK_CHOICES = (
    ["-Wl,-Bstatic", "-lsimavr", "-Wl,-Bdynamic", "-l:libelf.so.1"],
    ["-lsimavr"],
)


def _compile_command(source: Path, output: Path, link: list[str]) -> list[str]:
    return ["gcc", "-O2", "-std=gnu99", "-Wall", "-Wextra", "-o", str(output), str(source), *link]


def _simulator_digest(source: Path) -> str:
    """The cache key of a simuno binary: its source and every way of building it (a change to either is a new
    binary, never a stale one)."""
    recipe = repr([_compile_command(Path("simuno.c"), Path("simuno"), link) for link in _LINK_CHOICES])
    return hashlib.sha256(source.read_bytes() + recipe.encode()).hexdigest()[:16]


def _check_build_prerequisites() -> None:
    if shutil.which("gcc") is None:
        raise TinyprotoError(
            f"the simulated Uno needs a host C compiler; install it with: sudo apt-get install {APT_SIM_PACKAGES}"
        )
    if not _SIMAVR_HEADER.is_file():
        raise TinyprotoError(
            f"the simulated Uno needs libsimavr's headers ({_SIMAVR_HEADER} is missing); "
            f"install them with: sudo apt-get install {APT_SIM_PACKAGES}"
        )


def ensure_simulator() -> Path:
    """Path of a simuno binary built from the current tools/simuno/simuno.c (compiled once per source hash)."""
    source = simulator_source()
    binary = tinyproto_cache_dir() / f"simuno-{_simulator_digest(source)}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    _check_build_prerequisites()
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a private name and rename: parallel first uses (test workers) never see a half-written file.
    fd, tmp_name = tempfile.mkstemp(prefix=binary.name + ".", suffix=".tmp", dir=binary.parent)
    os.close(fd)
    try:
        for link in _LINK_CHOICES:
            result = subprocess.run(_compile_command(source, Path(tmp_name), link), check=False, capture_output=True,
                                    encoding="utf-8", errors="replace")
            if result.returncode == 0:
                break
        if result.returncode != 0:
            detail = "\n".join(result.stderr.strip().splitlines()[:12])
            hint = f" (install: sudo apt-get install {APT_SIM_PACKAGES})" if "simavr" in detail else ""
            raise TinyprotoError(f"could not compile the simulated Uno{hint}:\n{detail}")
        os.chmod(tmp_name, 0o755)
        os.replace(tmp_name, binary)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return binary


DEFAULT_MCU = "atmega328p"
DEFAULT_F_CPU_HZ = 16_000_000


def chip_of_elf(elf_path: Path) -> tuple[str, int]:
    """(mcu, f_cpu_hz) of a firmware built in a generated project: board_build.mcu / board_build.f_cpu of the
    environment the ELF was built in (<project>/.pio/<build dir>/<env>/firmware.elf); the Uno's chip otherwise."""
    import configparser

    elf_path = Path(elf_path).resolve()
    env = elf_path.parent.name
    for project in elf_path.parents:
        ini = project / "platformio.ini"
        if not ini.is_file():
            continue
        parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
        try:
            parser.read(ini)
        except (configparser.Error, UnicodeDecodeError):
            break
        sections = [f"env:{env}", "env"]
        mcu = next((parser.get(sec, "board_build.mcu") for sec in sections
                    if parser.has_option(sec, "board_build.mcu")), DEFAULT_MCU)
        f_cpu = next((parser.get(sec, "board_build.f_cpu") for sec in sections
                      if parser.has_option(sec, "board_build.f_cpu")), str(DEFAULT_F_CPU_HZ))
        try:
            return mcu.strip(), int(f_cpu.strip().rstrip("UuLl"))
        except ValueError:
            break
    return DEFAULT_MCU, DEFAULT_F_CPU_HZ


def parse_markers(text: str) -> list[tuple[int, int]]:
    """simuno's marker lines `<value> <cycle>` -> [(value, cycle)]; a last line without its newline is ignored
    (simuno may be writing it right now)."""
    markers = []
    for line in text.split("\n")[:-1]:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            markers.append((int(parts[0]), int(parts[1])))
    return markers


def read_pty_line(proc: subprocess.Popen, what: str, stderr_text: Callable[[], str], stop_timeout: float) -> str:
    """The pty path from simuno's first line ("PTY /dev/pts/N"), within _START_TIMEOUT_S; shared by the fast
    simulated Uno and the boards with a bootloader (board_sim)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    buffered = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TinyprotoError(f"the simulated {what} did not start within {_START_TIMEOUT_S:.0f} s")
            if not selector.select(timeout=remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                proc.wait(timeout=stop_timeout)
                raise TinyprotoError(f"the simulated {what} exited at start (status {proc.returncode}): "
                                     f"{stderr_text() or 'no reason given'}")
            buffered += chunk
    line = buffered.split(b"\n", 1)[0].decode("ascii", "replace").strip()
    if not line.startswith("PTY "):
        raise TinyprotoError(f"unexpected first line from the simulated {what}: {line!r}")
    return line[4:]


class SimulatedUno:
    """A simulated Uno running `elf_path`, reachable on the pseudo-terminal `.port` while the context is open.

    >>> with SimulatedUno(elf) as uno:
    ...     client = DeviceClient(serial.Serial(uno.port, 115200, timeout=1))
    ...     ...
    ...     uno.markers()  # [(1, cycle_before), (2, cycle_after), ...]
    """

    def __init__(
        self,
        elf_path: Path | str,
        markers: bool = True,
        timeout_cycles: int | None = None,
        eeprom: Path | str | None = None,
        mcu: str | None = None,
        f_cpu_hz: int | None = None,
        board=None,
    ) -> None:
        """`board` (a tinyproto.core.boards.Board) or `mcu` / `f_cpu_hz` name the chip and its clock; without them they
        come from the platformio.ini of the project that built `elf_path` (.pio/build/<env>/firmware.elf), else
        the Uno's ATmega328P at 16 MHz."""
        self.elf_path = Path(elf_path)
        if board is not None:
            mcu = mcu or board.mcu
            f_cpu_hz = f_cpu_hz or board.f_cpu_hz
        if mcu is None or f_cpu_hz is None:
            found_mcu, found_f_cpu = chip_of_elf(self.elf_path)
            mcu = mcu or found_mcu
            f_cpu_hz = f_cpu_hz or found_f_cpu
        self.mcu = mcu
        self.f_cpu_hz = int(f_cpu_hz)
        self.want_markers = markers
        self.timeout_cycles = timeout_cycles
        self.eeprom = Path(eeprom) if eeprom is not None else None  # raw EEPROM image, kept across runs
        self.port: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # Anonymous files (O_TMPFILE): no name in /tmp, so a kill -9 of this process leaves nothing behind.
        self._markers_file = None
        self._stderr_file = None
        self.returncode: int | None = None  # simuno's exit status once it has stopped

    # -- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> SimulatedUno:
        if not self.elf_path.is_file():
            raise TinyprotoError(f"firmware {self.elf_path} does not exist; build it first (tinyproto build)")
        if self.eeprom is not None:
            check_image_file(self.eeprom)
        binary = ensure_simulator()
        self._stderr_file = tempfile.TemporaryFile(prefix="tinyproto-sim-")
        # --parent-pipe: simuno exits when our end of its stdin closes, even if this process is SIGKILLed.
        command = [str(binary), "--pty", "--parent-pipe", "--mcu", self.mcu, "--freq", str(self.f_cpu_hz)]
        pass_fds: tuple[int, ...] = ()
        if self.want_markers:
            self._markers_file = tempfile.TemporaryFile(prefix="tinyproto-sim-")
            pass_fds = (self._markers_file.fileno(),)
            command += ["--markers-fd", str(self._markers_file.fileno())]
        if self.timeout_cycles:
            command += ["--timeout-cycles", str(int(self.timeout_cycles))]
        if self.eeprom is not None:
            command += ["--eeprom", str(self.eeprom.resolve())]
        command.append(str(self.elf_path))
        try:
            # Own process group: a Ctrl-C in the terminal reaches Python, which then stops simuno itself.
            self._proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr_file,
                pass_fds=pass_fds, start_new_session=True,
            )  # fmt: skip
            self.port = self._read_pty_line()
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stopped = self._stopped_reason() if isinstance(exc, (TinyprotoError, OSError)) else None
        from tinyproto.device.codec import DeviceSilent

        # (a request after the handshake went unanswered: the app runs, so the client's own line says what came)
        silent = (stopped is None and isinstance(exc, DeviceSilent) and not exc.answered_before and self.running)
        self._shutdown()
        if stopped is not None:
            # the port vanished or went silent because the simulated chip stopped: say that, not "is it plugged in?"
            # (what failed then is a consequence: its port vanished with it, and the port's own advice, "is the
            # Uno plugged in?", is about a real board)
            raise TinyprotoError(f"{stopped} (while talking to it: {_consequence(exc, self.port)})") from None
        if silent:  # the chip runs this very ELF at the rate it was built for: "is it flashed, the baud?" is wrong
            raise TinyprotoError(f"the simulated board ({self.mcu}) runs {self.elf_path.name} but it never answered "
                                 "the serial protocol: it is not a tinyproto device app, or it hangs before its "
                                 f"serial loop; build it again (tinyproto build){_tail(self.stderr_text())}") from None

    def _stopped_reason(self, grace_s: float = 0.5) -> str | None:
        """Why the simulated chip stopped, or None while it runs (waiting `grace_s`: its pty closes first)."""
        proc = self._proc
        if proc is None:
            return None
        try:
            status = proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return None
        return f"the simulated board ({self.mcu}) stopped: {stopped_text(status)}{_tail(self.stderr_text())}"

    def _read_pty_line(self) -> str:
        return read_pty_line(self._proc, "Uno", self.stderr_text, _STOP_TIMEOUT_S)

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.returncode = proc.returncode
        # Markers and stderr stay readable after exit until the object is garbage collected.

    # -- results -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the firmware to finish (sleep with interrupts off -> 0); returns simuno's exit status."""
        if self._proc is None:
            return self.returncode
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TinyprotoError(f"the simulated firmware did not finish within {timeout} s") from exc

    def ensure_running(self) -> None:
        """Raises a clear TinyprotoError if simuno has stopped (its pty is gone with it)."""
        if self._proc is None or self._proc.poll() is not None:
            status = self.returncode if self._proc is None else self._proc.returncode
            reason = stopped_text(status) if status is not None else "not started"
            raise TinyprotoError(f"the simulated board ({self.mcu}) has stopped: {reason}{_tail(self.stderr_text())}")

    def cpu_seconds(self) -> float | None:
        """Host CPU time (user + system) simuno has used so far, from /proc; None where there is no /proc or it
        has stopped. Validation reports it beside the host's own, so the two processes' shares are known.
        The scheduler's nanoseconds on a CPU (/proc/PID/schedstat) where the kernel keeps them: a small
        validation's simulator can use less than one clock tick (10 ms) of /proc/PID/stat's user + system."""
        if self._proc is None:
            return None
        try:
            return int(Path(f"/proc/{self._proc.pid}/schedstat").read_text(encoding="utf-8").split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            pass
        try:
            fields = Path(f"/proc/{self._proc.pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def pid(self) -> int | None:
        """The simulator's process id while it runs (for a debugger, or to pause it with SIGSTOP)."""
        return self._proc.pid if self.running else None

    def markers(self) -> list[tuple[int, int]]:
        """Every GPIOR0 write so far as (value, cycle); cycles count from reset, exact."""
        if self._markers_file is None:
            raise TinyprotoError("markers were not requested (SimulatedUno(elf, markers=True))")
        return parse_markers(_read_whole(self._markers_file).decode("ascii", "replace"))

    def stderr_text(self) -> str:
        if self._stderr_file is None:
            return ""
        return _read_whole(self._stderr_file).decode("utf-8", "replace").strip()


def stopped_text(status: int) -> str:
    """simuno's exit status in words: halted (sleep with interrupts off), crashed, cycle limit, a signal."""
    if status == EXIT_DONE:
        return ("the firmware finished: it halted (it went to sleep with interrupts off, exit status 0), a firmware "
                "that ends, not one that answers the serial protocol")
    if status == EXIT_CRASH:
        return "the firmware crashed (an invalid instruction or a jump outside the flash, exit status 2)"
    if status < 0:
        return f"the simulator was killed by signal {-status}"
    return f"{_EXIT_REASONS.get(status, 'the simulator ended')} (exit status {status})"


def _consequence(exc: BaseException, port: str | None) -> str:
    """What failed on the host side when the simulated chip had stopped, without advice meant for a real board:
    its pseudo-terminal went away with it."""
    text = str(exc)
    if port and port in text or isinstance(exc, OSError):
        return f"its serial port {port} closed with it"
    return text[:160]


def _tail(text: str) -> str:
    last = " ".join(text.split())[-200:]
    return f"; simulator: {last}" if last else ""


def _read_whole(file) -> bytes:
    """Everything in a file simuno shares with us, read with pread: the shared file offset (where simuno
    appends) must not move."""
    fd = file.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0)


def _signal_group(proc: subprocess.Popen[bytes], signo: int) -> None:
    try:
        os.killpg(proc.pid, signo)  # the whole group: nothing is left behind
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> None:
    """`python -m tinyproto.device.sim [simuno options] firmware.elf`: build simuno if needed, then exec it."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        binary = ensure_simulator()
    except TinyprotoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    os.execv(binary, [str(binary), *args])


if __name__ == "__main__":
    main()
