"""What a model's code costs inside a sketch, measured by building it: flash, static SRAM and a stack bound.

A probe program calls the model's tp_input_quantize and tp_predict on buffers of its own; it is built twice with
avr-gcc (the model called, and not), with the flags of every tinyproto build (-Os, sections, --gc-sections), so
the difference is what the model's runtime and data add to any program: its flash and its static SRAM. The stack
the calls need is bounded from avr-gcc's own frame sizes (-fstack-usage) of every function of the runtime: no
call chain holds more frames than all of them (the runtime has no recursion), plus a return address per function
and the soft-float routines' saved registers. The caller's buffers (raw floats, int8 input, int32 scores) are
counted apart: the sketch declares them.
Layer: device.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.outdir import private_scratch
from tinyproto.core.render import model_sources, write_sources
from tinyproto.device.build import firmware_sizes
from tinyproto.device.piohome import require_tool
from tinyproto.device.project import C_FLAGS, LINK_FLAGS, LINK_LIBS, _run, no_space_line

RETURN_ADDRESS_BYTES = 2  # per call level on a 16-bit program counter (ATmega328P)
# avr-libc's soft-float routines (the input stage's float arithmetic, ldexp) save at most the 18 call-saved
# registers and the frame pointer: the deepest of them, with its return address.
SOFT_FLOAT_STACK_BYTES = 18 + 2 + RETURN_ADDRESS_BYTES

PROBE = """#include <stdint.h>
#include "tinyproto.h"
#include "tinyproto_model.h"
float probe_raw[TP_N_FEATURES];
int8_t probe_x[TP_N_FEATURES];
int32_t probe_scores[TP_N_CLASSES];
void *volatile probe_keep[3];
volatile uint8_t probe_label;
int main(void)
{
    probe_keep[0] = probe_raw; probe_keep[1] = probe_x; probe_keep[2] = probe_scores;
#ifdef PROBE_MODEL
    tp_input_quantize(probe_raw, probe_x);
    probe_label = tp_predict(probe_x, probe_scores);
#endif
    return 0;
}
"""


@dataclass(frozen=True)
class LibraryCost:
    """The model's code and data in any program (bytes)."""

    flash_bytes: int  # runtime code + model arrays + what they pull from avr-libc (soft float)
    static_sram_bytes: int  # .data + .bss of the runtime (its static state)
    stack_bound_bytes: int  # the calls' stack at most (frames of every runtime function + returns + soft float)
    caller_bytes: int  # the sketch's raw[d] floats, x[d] int8, scores[L] int32

    @property
    def sram_bytes(self) -> int:
        return self.static_sram_bytes + self.stack_bound_bytes + self.caller_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "sram_bytes": self.sram_bytes,
                "how": "built with avr-gcc (-Os, --gc-sections): a probe calling tp_input_quantize and tp_predict "
                       "minus the same probe without the calls; stack: -fstack-usage frames of every runtime "
                       "function + return addresses + soft-float registers"}


def caller_buffer_bytes(model) -> int:
    return 4 * model.n_features + model.n_features + 4 * model.n_classes


def _frames(folder: Path) -> tuple[int, int]:
    """(sum of every function's frame, number of functions) from avr-gcc's .su files in `folder`."""
    total = functions = 0
    for su in folder.glob("*.su"):
        for line in su.read_text(encoding="utf-8").splitlines():
            match = re.match(r"^\S+\t(\d+)\t(\w+(?:,\w+)*)$", line)
            if not match:
                continue
            if "dynamic" in match.group(2) and "bounded" not in match.group(2):
                raise TinyprotoError(f"the runtime has a stack frame of unbounded size ({line.split()[0]})")
            total += int(match.group(1))
            functions += 1
    return total, functions


def measure_library(model, board) -> LibraryCost:
    """Build the probe for `board` and measure the model's cost (needs avr-gcc and avr-size)."""
    gcc = require_tool("avr-gcc")
    with private_scratch("tinyproto-library-") as tmp:  # a killed run's is removed by the next one
        project = Path(tmp)
        write_sources(model, project, "probe", 0, 1 << 20, prefix="probe")
        lib = project / "lib" / "tinyproto"
        (project / "probe.c").write_text(PROBE, encoding="utf-8")
        flags = [f"-mmcu={board.mcu}", f"-DF_CPU={board.f_cpu_hz}UL", *C_FLAGS, f"-I{project / 'include'}",
                 f"-I{lib}"]
        runtime = [lib / name for name in model_sources(model.family)]
        sizes = {}
        for name, extra in (("with", ["-DPROBE_MODEL"]), ("without", [])):
            elf = project / f"{name}.elf"
            result = _run([gcc, *flags, *extra, str(project / "probe.c"), *map(str, runtime), *LINK_FLAGS,
                           "-o", str(elf), *LINK_LIBS], cwd=project)
            if result.returncode != 0:
                raise TinyprotoError(_failure(result.stderr, project))
            sizes[name] = firmware_sizes(elf)
        objects = project / "su"
        objects.mkdir()
        for source in runtime:
            result = _run([gcc, *flags, "-fstack-usage", "-c", str(source), "-o", str(objects / f"{source.stem}.o")],
                          cwd=project)
            if result.returncode != 0:
                raise TinyprotoError(_failure(result.stderr, project))
        frames, functions = _frames(objects)
    with_model, without = sizes["with"], sizes["without"]
    return LibraryCost(
        flash_bytes=with_model.flash_bytes - without.flash_bytes,
        static_sram_bytes=(with_model.data_bytes + with_model.bss_bytes) - (without.data_bytes + without.bss_bytes),
        stack_bound_bytes=frames + RETURN_ADDRESS_BYTES * functions + SOFT_FLOAT_STACK_BYTES,
        caller_bytes=caller_buffer_bytes(model),
    )


def _failure(log: str, where: Path) -> str:
    """The one line of a failed measurement: a full disk said so (no_space_line), else avr-gcc's first words."""
    return f"measuring the model's library failed (avr-gcc): {no_space_line(log, where) or log.strip()[:300]}"
