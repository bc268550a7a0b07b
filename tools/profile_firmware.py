#!/usr/bin/env python3
"""Where the simulated chip's instructions go during validation: per firmware function, the instructions and
cycles the simulated Uno executed while it answered the int8 and raw passes of the first N test vectors.

    python tools/profile_firmware.py MODEL_DIR [--vectors 100] [--top 20]

MODEL_DIR is a built model directory (`tinyproto compile`, `tinyproto build`). The script builds a profiling
simuno (tools/simuno/simuno.c compiled with -DSIMUNO_PROFILE: it counts the instructions and cycles of every
program counter and writes them when it stops), sends the vectors as `tinyproto validate --sim` does (the int8
pass, then the raw pass as one window), checks every answer against the host reference, and maps the program
counters to the functions of the firmware's ELF (avr-nm). Simulator CPU grows with the instructions executed, so
this says what a change of the firmware saves the simulator. "asleep" is the simulated time the chip slept
(each sleep is one simulator step however long it lasts).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto, not another one installed in the environment

from tinyproto import families  # noqa: E402
from tinyproto.core.modeldir import load_model_dir  # noqa: E402
from tinyproto.device import sim  # noqa: E402
from tinyproto.device.protocol import open_device  # noqa: E402
from tinyproto.pipeline.validate import checked_vectors, load_build_info  # noqa: E402

ASLEEP = 0x1FFFE  # the profile's line for sleep steps (simuno.c, SIMUNO_PROFILE)


def build_profiling_simulator(where: Path) -> Path:
    binary = where / "simuno-profile"
    for link in sim._LINK_CHOICES:
        command = sim._compile_command(sim.simulator_source(), binary, link)
        if subprocess.run([*command[:1], "-DSIMUNO_PROFILE", *command[1:]], capture_output=True).returncode == 0:
            return binary
    sys.exit("could not compile the profiling simuno (gcc, libsimavr-dev)")


@contextmanager
def profiling(binary: Path, profile: Path) -> Iterator[None]:
    """SimulatedUno starts the profiling simulator `binary`, which writes its profile to `profile`, inside the
    block only: the module's ensure_simulator and the environment are given back afterwards (the tests call these
    tools, and a simulator left patched in would change what later tests in the process run)."""
    original, before = sim.ensure_simulator, os.environ.get("SIMUNO_PROFILE")
    sim.ensure_simulator = lambda: binary
    os.environ["SIMUNO_PROFILE"] = str(profile)
    try:
        yield
    finally:
        sim.ensure_simulator = original
        if before is None:
            os.environ.pop("SIMUNO_PROFILE", None)
        else:
            os.environ["SIMUNO_PROFILE"] = before


def run_vectors(model_dir: Path, n: int, binary: Path, profile: Path) -> None:
    """Both passes of the first n test vectors on the profiling simulator; exits if an answer differs."""
    model_dir_obj = load_model_dir(model_dir)
    model = families.load_int_model(model_dir_obj)
    vectors = checked_vectors(model_dir_obj, model)
    build = load_build_info(model_dir_obj)
    n = min(n, len(vectors.labels))
    with profiling(binary, profile), sim.SimulatedUno(model_dir / build.elf) as uno:
        client = open_device(uno.port, baud=build.serial_baud, boot_quiet_s=0.0, rx_ring=build.rx_ring)
        client.hello()
        for i in range(n):
            answer = client.predict(vectors.xq[i])
            if answer.label != vectors.labels[i] or not np.array_equal(answer.scores, vectors.scores[i]):
                sys.exit(f"vector {i}: the device's int8 answer differs from the host reference")
        for i, answer in enumerate(client.predict_raw_many(vectors.X_raw[:n])):
            if not np.array_equal(answer.x, vectors.xq[i]) or not np.array_equal(answer.scores, vectors.scores[i]):
                sys.exit(f"vector {i}: the device's raw answer differs from the host reference")
        client.close()


def functions_of(elf: Path) -> tuple[list[int], list[str]]:
    """The code symbols of `elf` by address. Only symbols of the .text section count: avr-nm also lists absolute
    ones such as __stack (an SRAM address), which would cut a function in two."""
    out = subprocess.run(["avr-objdump", "-t", str(elf)], capture_output=True, text=True, check=True).stdout
    symbols = sorted((int(fields[0], 16), fields[-1]) for fields in (line.split() for line in out.splitlines())
                     if len(fields) >= 4 and ".text" in fields[:-2] and fields[0].isalnum())
    return [address for address, _ in symbols], [name for _, name in symbols]


def table(profile: Path, elf: Path, n: int, top: int) -> None:
    addresses, names = functions_of(elf)
    instructions, cycles = collections.Counter(), collections.Counter()
    asleep = (0, 0)
    for line in profile.read_text().splitlines():
        pc, count, spent = (int(field, 16) if k == 0 else int(field) for k, field in enumerate(line.split()))
        if pc == ASLEEP:
            asleep = (count, spent)
            continue
        k = bisect.bisect_right(addresses, pc) - 1
        name = names[k] if k >= 0 else "?"
        instructions[name] += count
        cycles[name] += spent
    total = sum(instructions.values())
    print(f"{n} vectors, int8 and raw passes: {total:,} instructions, {sum(cycles.values()):,} cycles awake "
          f"({total / n:,.0f} instructions a vector); asleep {asleep[1]:,} cycles in {asleep[0]:,} steps")
    print(f"{'function':<34} {'instructions':>14} {'share':>6} {'cycles':>14}")
    for name, count in instructions.most_common(top):
        print(f"{name:<34} {count:>14,} {100 * count / total:>5.1f}% {cycles[name]:>14,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--vectors", type=int, default=100)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="profile_firmware.") as tmp:
        binary = build_profiling_simulator(Path(tmp))
        profile = Path(tmp) / "profile.txt"
        run_vectors(args.model_dir, args.vectors, binary, profile)
        elf = args.model_dir / load_build_info(load_model_dir(args.model_dir)).elf
        table(profile, elf, args.vectors, args.top)


if __name__ == "__main__":
    main()
