"""Is a serial port usable, and is it free: checks made before any long work, and the scan of /proc for the
other programs that hold a port open (what `fuser` does). Layer: device."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import termios

from tinyproto.core.errors import TinyprotoError

MEMORY_DEVICES_MAJOR = 1  # Linux: /dev/null, /dev/zero, /dev/urandom, ... (shared by every process, no tty)


def port_holders(port: str) -> list[tuple[int, str]]:
    """(pid, program) of the other processes that have `port` open, from /proc (what `fuser` does). Processes of
    other users are invisible without privileges; pyserial's exclusive lock catches those that lock.

    For a pseudo-terminal (/dev/pts/N, a simulated board) a process that also holds its master side is the
    device itself -- a simulator keeping its own slave open, like tools/simuno's ELF mode or simavr's uart_pty --
    and not counted."""
    try:
        wanted = os.stat(os.path.realpath(port))
    except OSError:
        return []
    if not stat.S_ISCHR(wanted.st_mode) or os.major(wanted.st_rdev) == MEMORY_DEVICES_MAJOR:
        return []  # not a serial line (a file; /dev/null, /dev/zero): opening it says what is wrong
    pts_index = _pts_index(os.path.realpath(port))
    holders = []
    own = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        holds_slave = holds_master = False
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if st.st_rdev == wanted.st_rdev and st.st_ino == wanted.st_ino and st.st_dev == wanted.st_dev:
                holds_slave = True
            elif pts_index is not None and _is_master_of(entry.name, fd, pts_index):
                holds_master = True
        if holds_slave and not holds_master:
            holders.append((int(entry.name), _program(entry.name)))
    return holders


def _pts_index(path: str) -> int | None:
    match = re.fullmatch(r"/dev/pts/(\d+)", path)
    return int(match.group(1)) if match else None


def _is_master_of(pid: str, fd: str, index: int) -> bool:
    """fd of process pid is /dev/ptmx for pts `index` (Linux shows `tty-index:` in its fdinfo)."""
    try:
        if not os.readlink(f"/proc/{pid}/fd/{fd}").endswith("ptmx"):
            return False
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="utf-8") as info:
            return f"tty-index:\t{index}\n" in info.read()
    except OSError:
        return False


def _program(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
            return comm.read().strip()
    except OSError:
        return "?"


def check_port_free(port: str, must_be_terminal: bool = True) -> None:
    """A port another program holds is refused: two programs on one serial line corrupt each other's bytes."""
    if "://" in port:
        return
    if must_be_terminal:
        _check_is_terminal(port)
    holders = port_holders(port)
    if holders:
        who = ", ".join(f"{name} (pid {pid})" for pid, name in holders[:3])
        raise TinyprotoError(f"serial port {port} is in use by {who}; close it first (a serial monitor, "
                             "another tinyproto or avrdude run)")


def check_port_usable(port: str) -> None:
    """Refuse, in one line and before any long work (a build), a --port that cannot be the board's: missing, not
    a character device, not openable (permission, a dead device) or not a terminal, or held by another program.
    A pyserial URL (rfc2217://, socket://) is checked when it is opened."""
    if "://" in port:
        return
    try:
        mode = os.stat(port).st_mode
    except FileNotFoundError:
        raise TinyprotoError(f"serial port {port} does not exist; is the board plugged in? "
                             "(try ls /dev/ttyACM* /dev/ttyUSB*)") from None
    except OSError as exc:
        raise TinyprotoError(f"cannot use serial port {port}: {exc.strerror}") from None
    if not stat.S_ISCHR(mode):
        raise TinyprotoError(f"{port} is not a serial port (not a character device); give the board's port, "
                             "e.g. /dev/ttyACM0 or /dev/ttyUSB0")
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        hint = " (add yourself to the dialout group)" if exc.errno == errno.EACCES else ""
        raise TinyprotoError(f"cannot open serial port {port}: {exc.strerror}{hint}") from None
    os.close(fd)
    check_port_free(port)


def _check_is_terminal(port: str) -> None:
    """/dev/null, a regular file or a directory given as --port: say so, instead of blaming whoever has it open."""
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return  # avrdude's own open reports why (missing, permission)
    try:
        is_terminal = os.isatty(fd)
    finally:
        os.close(fd)
    if not is_terminal:
        raise TinyprotoError(f"{port} is not a serial port (not a terminal device); give the board's port, "
                             "e.g. /dev/ttyACM0 or /dev/ttyUSB0")


def has_modem_lines(port: str) -> bool | None:
    """Whether `port` has DTR/RTS (TIOCMGET works): a USB-serial bridge does, a pseudo-terminal (a simulated
    board) does not. None if the port cannot be opened to ask or is no terminal."""
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not os.isatty(fd):
            return None
        fcntl.ioctl(fd, termios.TIOCMGET, b"\0\0\0\0")
        return True
    except OSError as exc:
        return False if exc.errno in (errno.ENOTTY, errno.EINVAL) else None
    finally:
        os.close(fd)
