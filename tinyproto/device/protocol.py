"""Host side of the tinyproto serial protocol, version 2 (docs/design.md, "Serial protocol"): opening a port and
handshaking (open_port, open_device), plus every name of the codec (tinyproto/device/codec.py: constants, frames,
messages) and the client (tinyproto/device/client.py), so callers import one module.

Layer: device.
"""

from __future__ import annotations

import errno
import time

from tinyproto.core.errors import TinyprotoError
from tinyproto.device.client import DeviceClient, _closed_at
from tinyproto.device.codec import *  # noqa: F401,F403 - the protocol's public names, re-exported
from tinyproto.device.codec import _HELLO, DEFAULT_TIMEOUT, READ_SLICE, DeviceSilent, SerialPort  # noqa: F401 - _HELLO: tests


# ---- opening a port ----------------------------------------------------------------------------------------

_MISSING = {errno.ENOENT, errno.ENODEV, errno.ENXIO}
_BUSY = {errno.EBUSY, errno.EAGAIN, errno.EWOULDBLOCK}
_DENIED = {errno.EACCES, errno.EPERM}


def _open_error(port_url: str, exc: Exception) -> TinyprotoError:
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in _MISSING or "No such file" in text:
        return TinyprotoError(
            f"serial port {port_url} does not exist — is the Uno plugged in? (list ports: "
            "python -m serial.tools.list_ports)"
        )
    if code in _BUSY or "lock" in text.lower() or "busy" in text.lower():
        return TinyprotoError(
            f"serial port {port_url} is busy — close the serial monitor or other program that has it open"
        )
    if code == errno.ECONNREFUSED:
        return TinyprotoError(f"nothing accepts connections at {port_url} (connection refused)")
    if "Inappropriate ioctl" in text or "Is a directory" in text or "(22, 'Invalid argument')" in text:
        return TinyprotoError(f"{port_url} is not a serial port (not a terminal device); give the board's port, "
                              "e.g. /dev/ttyACM0 or /dev/ttyUSB0")
    if code in _DENIED:
        return TinyprotoError(f"no permission to open {port_url} — add your user to the 'dialout' group")
    return TinyprotoError(f"cannot open serial port {port_url}: {text}")


# Opening a board's port resets it (DTR pulls RESET low through a capacitor) only if the port was closed long
# enough before: the capacitor recharges in ~1 ms on an Uno, and a simulated board notices the close by polling.
# A reopen of a port this process closed waits out the rest of this gap, so it is a reset on both.
RESET_GAP_S = 0.05


def _wait_reset_gap(port_url: str) -> None:
    closed = _closed_at.get(port_url)
    if closed is not None:
        left = RESET_GAP_S - (time.monotonic() - closed)
        if left > 0:
            time.sleep(left)


def _check_not_held(port_url: str) -> None:
    """Another program holding the port (a serial monitor, avrdude) would share its bytes: refuse, naming it.
    A simulator holding both ends of its pty is the device, not another program (see port_holders)."""
    from tinyproto.device.port_checks import check_port_free

    check_port_free(port_url, must_be_terminal=False)  # pyserial's open says it if the port is no terminal


def open_port(port_url: str, baud: int = 115200) -> SerialPort:
    """Open a pyserial URL (``/dev/ttyACM0``, ``/dev/pts/N``, ``loop://``, ``socket://host:port``) for
    exclusive use; each failure becomes one clear TinyprotoError."""
    import serial  # pyserial; imported here so that `tinyproto --help` stays fast

    _check_not_held(port_url)
    _wait_reset_gap(port_url)
    try:
        return serial.serial_for_url(
            port_url, baudrate=baud, timeout=READ_SLICE, write_timeout=5.0, exclusive=True
        )
    except ValueError as exc:  # unknown URL scheme, unsupported baud rate
        raise TinyprotoError(f"cannot open {port_url}: {exc}") from exc
    except (serial.SerialException, OSError) as exc:
        raise _open_error(port_url, exc) from exc


# A bootloader that starts the sketch only after a silence (Board.boot_quiet_s: the Mega's stk500v2) takes a byte that
# arrives earlier for the start of an upload and stays in its command loop until several seconds pass without one:
# a HELLO sent too early is then never answered, however often it is sent again. On a real board the quiet wait is
# exact. A simulated chip on a busy host runs slower than the wall clock, so its bootloader may not have had its
# second when the wait ends (the Mega on the board simulator at a load of 10 on 2 cores). So while no HELLO is
# answered, the host starts again: it closes the port, reopens it (a reset) and waits twice as long in silence.
QUIET_ROUNDS = 3  # waits of 1, 2 and 4 times boot_quiet_s
QUIET_LISTEN_S = 2.0  # how long a round but the last sends HELLOs


def open_device(
    port_url: str,
    baud: int = 115200,
    handshake_timeout: float = 10.0,
    n_retries: int = 3,
    timeout: float = DEFAULT_TIMEOUT,
    boot_quiet_s: float = 0.0,
    rx_ring: int | None = None,
) -> DeviceClient:
    """Open the port and complete the HELLO handshake (retried until ``handshake_timeout`` s, which covers the
    Uno's reset + bootloader: no fixed sleep, the first answer ends the wait); the returned client's ``info``
    holds the device's Hello. The deadline leaves room for a bootloader's 1 s window on a simulated board that
    runs at a quarter of real time or slower (a busy host); only a board that never answers waits it out.
    boot_quiet_s: the silence the board's bootloader needs after the reset before the sketch starts; while no
    HELLO is answered, the port is reopened (a reset) and the silence doubled, QUIET_ROUNDS times in all.
    rx_ring: the firmware's receive ring (build.json's rx_ring_bytes), how far ahead a window may send; None
    assumes the smallest ring a firmware has (wire.RX_RING_MIN)."""
    rounds = QUIET_ROUNDS if boot_quiet_s > 0 else 1
    for round_ in range(rounds):
        port = open_port(port_url, baud)
        client = DeviceClient(port, n_retries=n_retries, timeout=timeout, rx_ring=rx_ring)
        last = round_ == rounds - 1
        try:
            time.sleep(boot_quiet_s * 2 ** round_)  # a board whose bootloader waits for silence
            client.handshake(handshake_timeout if last else min(QUIET_LISTEN_S, handshake_timeout))
        except DeviceSilent:
            client.close()  # the next open is a reset (open_port waits out RESET_GAP_S)
            if last:
                raise
            continue
        except BaseException:
            port.close()
            raise
        return client
    raise AssertionError("unreachable")
