"""A simulated board that stops is reported as stopped, with how (halted, crashed), never as a serial port that
"does not exist: is the Uno plugged in?", and one that runs but never answers as such, not "is the firmware flashed
and the baud rate ...?" (device/sim.py: SimulatedUno.__exit__ explains a failure to talk to a simulated chip)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from helpers import tinyproto

from tinyproto.core.errors import TinyprotoError

pytestmark = [pytest.mark.device,
              pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed")]

PROGRAMS = {
    "halts": "#include <avr/interrupt.h>\n#include <avr/sleep.h>\n"
             "int main(void) { cli(); sleep_enable(); sleep_cpu(); for (;;) {} }\n",
    "crashes": "int main(void) { ((void (*)(void))0x3000)(); for (;;) {} }\n",  # erased flash: invalid opcode
    "never answers": "int main(void) { for (;;) {} }\n",  # runs for ever, never reads the serial line
}
EXPECTED = {"halts": "stopped: the firmware finished: it halted", "crashes": "stopped: the firmware crashed",
            "never answers": "runs never answers.elf but it never answered the serial protocol"}


def _elf(tmp_path, name: str):
    source = tmp_path / f"{name}.c"
    source.write_text(PROGRAMS[name])
    elf = tmp_path / f"{name}.elf"
    subprocess.run(["avr-gcc", "-mmcu=atmega328p", "-Os", "-DF_CPU=16000000UL", str(source), "-o", str(elf)],
                   check=True)
    return elf


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_stopped_chip_is_named_as_stopped(tmp_path, name):
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    with pytest.raises(TinyprotoError) as caught:
        with SimulatedUno(_elf(tmp_path, name)) as uno, open_device(uno.port, handshake_timeout=3.0) as client:
            client.hello()
    message = str(caught.value)
    assert EXPECTED[name] in message and "plugged in" not in message, message
    assert "is the firmware flashed" not in message, message  # the simulator runs the very ELF it was given


@pytest.mark.slow
def test_validate_of_a_firmware_that_halts_at_once(compiled, monkeypatch):
    from rich.console import Console

    import tinyproto.core.modeldir as modeldir
    from tinyproto.pipeline import firmware

    out = compiled("iris", "1kB", "flynn")  # a copy of the run's iris FlyNN
    main_c = out / "src" / "main.c"
    text = main_c.read_text()
    edited = re.sub(r"int main\(void\)\s*\{", "int main(void)\n{\n    cli();\n    SMCR = 1;\n"
                    "    __asm__ volatile(\"sleep\");\n", text, count=1)
    assert edited != text
    main_c.write_text("#include <avr/interrupt.h>\n#include <avr/io.h>\n" + edited)
    monkeypatch.setattr(modeldir, "check_project_files", lambda path: None)
    firmware.build_model_dir(out, None, Console(quiet=True))
    result = tinyproto("validate", str(out), timeout=600)
    assert result.returncode == 1
    assert ("stopped: the firmware finished: it halted" in result.stderr
            and "Traceback" not in result.stderr), result.stderr
    assert "plugged in" not in result.stderr and "closed with it" in result.stderr, result.stderr
    assert not (out / "validation.json").exists() or json.loads((out / "validation.json").read_text())
