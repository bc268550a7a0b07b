"""PlatformIO custom test runner written by tinyproto into <project>/test/test_custom_runner.py.

The test firmware (test/test_model/test_main.c) prints Unity's line format itself, so no Unity library is
needed -- nothing is downloaded and `pio test` works offline. This runner reuses PlatformIO's Unity output
parser and drops the Unity library dependency and its generated config files.

- `pio test -e uno_sim`: test_testing_command runs the ELF in tinyproto's simulated Uno (stdin/stdout);
  a non-zero simulator exit (crash, cycle timeout) fails the run. The command starts with `python3` (the project
  names no interpreter path, so it can move between machines); when the Python running PlatformIO has tinyproto
  (PlatformIO installed beside it, or run by tinyproto), that interpreter runs the simulator instead.
- `pio test -e uno` / `-e uno_offline` (or any env given --upload-port / --test-port): uploads to the board and
  reads its serial port at test_speed. The port may lack modem lines (a pseudo-terminal, e.g. tinyproto's
  simulated board, which resets when the port is opened, as DTR does on an Uno): the DTR/RTS reset pulse is
  then skipped instead of failing with "[Errno 25] Inappropriate ioctl for device". A physical board still
  gets the pulse. The wait for the test output has a deadline.
"""

import errno
import importlib.util
import sys
import time

import click
from platformio.public import UnityTestRunner
from platformio.test.runners.readers.native import NativeTestOutputReader

TEST_OUTPUT_TIMEOUT_S = 120.0  # the test firmware prints everything within seconds of its reset
NO_MODEM_LINES = (errno.ENOTTY, errno.EINVAL)  # what a pty (or a bridge without DTR/RTS) answers to TIOCMBIS


class SimulatorReader(NativeTestOutputReader):
    """test_testing_command with `python3` replaced by PlatformIO's own interpreter when that one has tinyproto."""

    def get_testing_command(self):
        command = list(super().get_testing_command())
        if command and command[0] in ("python3", "python") and importlib.util.find_spec("tinyproto"):
            command[0] = sys.executable
        return command


class CustomTestRunner(UnityTestRunner):
    EXTRA_LIB_DEPS = None  # no throwtheswitch/Unity from the registry

    def configure_build_env(self, env):
        return env  # no unity_config.h / unity_config.c generation

    def _env_option(self, name):
        return self.project_config.get(f"env:{self.test_suite.env_name}", name)

    def _explicit_port(self):
        """--test-port, test_port, --upload-port, upload_port: the board's port when the user named it."""
        for value in (self.options.test_port, self._env_option("test_port"), self.options.upload_port,
                      self._env_option("upload_port")):
            if value:
                return value
        return None

    def stage_testing(self):
        if self.options.without_testing:
            return None
        port = self._explicit_port()
        if self._env_option("test_testing_command") and not (self.options.test_port or self.options.upload_port):
            click.secho("Testing...", bold=True)
            return SimulatorReader(self).begin()  # the simulated Uno runs the ELF (uno_sim)
        click.secho("Testing...", bold=True)
        if port is None:  # a physical board found by PlatformIO's USB ids
            from platformio.test.runners.readers.serial import SerialTestOutputReader

            port = SerialTestOutputReader(self).resolve_test_port()
        return self._read_port(port)

    def _read_port(self, port):
        import serial

        ser = serial.serial_for_url(port, do_not_open=True, baudrate=self.get_test_speed(), timeout=0.1)
        if self.options.monitor_rts is not None:
            ser.rts = self.options.monitor_rts
        if self.options.monitor_dtr is not None:
            ser.dtr = self.options.monitor_dtr
        try:
            ser.open()  # pyserial itself ignores ENOTTY here; opening is already the reset on a simulated board
        except serial.SerialException as exc:
            raise RuntimeError(f"cannot open the test port {port}: {exc}") from exc
        try:
            if not self.options.no_reset:
                self._reset_pulse(ser)
            deadline = time.monotonic() + TEST_OUTPUT_TIMEOUT_S
            while not self.test_suite.is_finished():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no complete test output on {port} within {TEST_OUTPUT_TIMEOUT_S:.0f} s "
                                       "(wrong port or baud rate, or the test firmware did not start)")
                data = ser.read(ser.in_waiting or 1)
                if data:
                    self.on_testing_data_output(data)
        finally:
            ser.close()
        return None

    @staticmethod
    def _reset_pulse(ser):
        """DTR/RTS low then high: the Uno's auto-reset. Skipped on a port without modem lines."""
        ser.reset_input_buffer()
        try:
            ser.dtr = False
            ser.rts = False
            time.sleep(0.1)
            ser.dtr = True
            ser.rts = True
            time.sleep(0.1)
        except OSError as exc:
            if exc.errno not in NO_MODEM_LINES:
                raise

