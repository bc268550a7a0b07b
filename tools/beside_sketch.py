"""A sketch of the user's own that uses exactly the flash and SRAM reserved for it, with and without a model.

compile --reserve-sram S --reserve-flash F promises that the model fits beside a sketch using S bytes of SRAM and
F bytes of flash. This module builds such a sketch with the Arduino IDE's builder (beside/Beside.ino.tmpl:
ballast arrays sized to the reserve, the model called when WITH_MODEL is defined), runs it on the simulated Uno
over lines of raw features and reads each answer's scores and the free SRAM its stack never reached. Used by
tests/test_reserve.py and tools/bench_reserve.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from arduino_builder import arduino_build

SKETCH = (Path(__file__).resolve().parent / "beside" / "Beside.ino.tmpl").read_text()


def render_sketch(sram: int, flash: int) -> str:
    filler = ", ".join(str((i * 37 + 11) % 251) for i in range(flash))
    return SKETCH.replace("@SRAM@", str(sram)).replace("@FLASH@", str(flash)).replace("@FLASH_BYTES@", filler)


def build(tmp: Path, name: str, libraries: Path, sram: int, flash: int, with_model: bool):
    from tinyproto.device.build import firmware_sizes

    sketch = tmp / name / f"{name}.ino"
    sketch.parent.mkdir(parents=True, exist_ok=True)
    sketch.write_text(render_sketch(sram, flash))
    result = arduino_build(libraries, sketch, tmp / f"build-{name}", tmp / "tools",
                           defines="-DWITH_MODEL" if with_model else "")
    if result.returncode != 0:
        raise RuntimeError(f"the Arduino builder failed on {name}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    elf = tmp / f"build-{name}" / f"{name}.ino.elf"
    return elf, firmware_sizes(elf)


def run_lines(elf: Path, lines: list[str]) -> list[str]:
    """Each line sent to the sketch and its answer."""
    import serial

    from tinyproto.device.sim import SimulatedUno

    answers = []
    with SimulatedUno(elf, markers=False) as uno:
        port = serial.Serial(uno.port, 115200, timeout=2)
        port.readline()  # "ready" (or what is left of it): the sketch listens from now on; input before is lost
        port.timeout = 30
        for line in lines:
            port.write((line + "\n").encode())
            reply = port.readline().decode("ascii", "replace").strip()
            while reply and not ANSWER.match(reply):  # (a line caught halfway when the port opened)
                reply = port.readline().decode("ascii", "replace").strip()
            if not ANSWER.match(reply):
                raise RuntimeError(f"no answer to {line!r}: {reply!r} {uno.stderr_text()}")
            answers.append(reply)
    return answers


ANSWER = re.compile(r"^(-?\d+(?: -?\d+)*) free (\d+) check \d+$")


def sram_used(answer: str) -> int:
    """The SRAM the sketch used: all of it but the free bytes its stack never reached."""
    return 2048 - int(ANSWER.match(answer).group(2))


def size_own_sketch(tmp: Path, libraries: Path, lines: list[str], sram_reserve: int, flash_reserve: int):
    """(sram, flash, own size, SRAM used alone): the ballast that makes the sketch alone use what was reserved.
    Build it without the model, measure, correct (its loops' code depends a little on the sizes).

    Its SRAM is its globals (.data + .bss, exact) and its stack's high-water mark, which is not: the deepest bytes
    are the frame of the serial transmit interrupt (USART_UDRE_vect: 15 registers, the interrupted address and its
    call of HardwareSerial::_tx_udr_empty_irq, 19 B), which fires whenever a character has left, so how deep it
    lands depends on the printed figures, the ballast's own set-up time and the host's timing: 206, 202, 200 and
    206 B for four ballast sizes in a row, each the same in five runs but for one line of one run. Correcting each
    build by its own figure once left a sketch 4 B over the reserve. So the stack counts as the deepest measured
    in any build so far, each run over every line, and a build is kept when that makes it use exactly the reserve
    (its own run went no deeper)."""
    sram, flash, deepest = 256, 1024, 0
    for attempt in range(6):
        elf, own = build(tmp, f"Own{attempt}", libraries, sram, flash, with_model=False)
        used_alone = max(sram_used(answer) for answer in run_lines(elf, lines))
        deepest = max(deepest, used_alone - own.sram_static_bytes)
        if own.flash_bytes == flash_reserve and own.sram_static_bytes + deepest == sram_reserve:
            return sram, flash, own, used_alone
        sram += sram_reserve - own.sram_static_bytes - deepest
        flash += flash_reserve - own.flash_bytes
    raise RuntimeError(f"the sketch's own size did not settle: {own}, {used_alone} B of SRAM used")
