"""The Arduino IDE's own build of a sketch, offline: Debian's arduino-builder with arduino-core-avr.

Shared by the tests that build exported libraries as a user's IDE would and by the benchmarks that measure a
sketch beside a model (tools/bench_reserve.py, tools/bench_two_models.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ARDUINO_HARDWARE = Path("/usr/share/arduino/hardware")  # Debian's arduino-core-avr


def arduino_build(libraries: Path | list[Path], sketch: Path, build: Path, tools: Path,
                  defines: str = "") -> subprocess.CompletedProcess:
    """The Arduino IDE's build, offline (see docs: Debian's arduino-builder needs these prefs with gcc 5.4);
    `libraries`: one folder of libraries or several; `defines`: more -D flags for the sketch's C++."""
    build.mkdir(parents=True, exist_ok=True)
    tools.mkdir(parents=True, exist_ok=True)
    folders = [libraries] if isinstance(libraries, Path) else libraries
    command = [
        "arduino-builder", "-hardware", str(ARDUINO_HARDWARE), "-tools", str(tools),
        *[arg for folder in folders for arg in ("-libraries", str(folder))],
        "-fqbn", "arduino:avr:uno", "-build-path", str(build),
        "-prefs=tools.ctags.path=/usr/bin", "-prefs=tools.ctags.cmd.path=/usr/bin/arduino-ctags",
        '-prefs=tools.ctags.pattern="{cmd.path}" -u --language-force=c++ -f - --c++-kinds=svpf --fields=KSTtzns '
        '--line-directives "{source_file}"',
        "-prefs=runtime.ide.version=10819",
        f"-prefs=compiler.cpp.extra_flags=-DDECIMAL_DIG=__DECIMAL_DIG__ {defines}".rstrip(),
        str(sketch),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)
