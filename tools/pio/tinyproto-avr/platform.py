"""PlatformIO dev-platform class for tinyproto's offline AVR platform (see builder/main.py).

PlatformIO looks the class up by name: platform "tinyproto-avr" -> `TinyprotoavrPlatform`.
"""

from platformio.public import PlatformBase


class TinyprotoavrPlatform(PlatformBase):
    def is_embedded(self):
        # Embedded: `pio test` builds firmware.elf and then runs test_testing_command (the simulator)
        # or reads the board's serial port; it never tries to execute the ELF on the host.
        return True

    def on_run_err(self, line):
        # avrdude reports progress on stderr; show it as normal output, not as an error.
        if "avrdude" in line:
            self.on_run_out(line)
        else:
            super().on_run_err(line)
