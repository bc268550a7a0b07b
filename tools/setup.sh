#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian/Ubuntu machine for tinyproto:
#   apt: avr-gcc toolchain, avr-libc, simavr + headers (the simulated Uno), avrdude (uploads to real and simulated
#        boards), arduino-core-avr (Optiboot's source, the Mega's stk500v2 bootloader), clang (fuzzing),
#        chromium (the report's browser test)
#   .venv: tinyproto with its test extras (PlatformIO, SCons, pytest, pytest-randomly, hypothesis)
#   the simulated Uno host program, compiled against libsimavr, Optiboot built from Debian's source, and the
#   offline PlatformIO home (all in tinyproto's per-user cache; tinyproto would also make them on first use)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(gcc-avr binutils-avr avr-libc simavr libsimavr-dev libsimavrparts1 avrdude arduino-core-avr arduino-builder clang libclang-rt-14-dev gcc make chromium)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Always (it takes seconds when nothing changed): a dependency added to pyproject.toml reaches old venvs too.
echo "setup: installing tinyproto and its test extras into .venv" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/python -c "from tinyproto.device.sim import ensure_simulator; ensure_simulator()"
.venv/bin/python -c "from tinyproto.device.board_sim import ensure_bootloader; ensure_bootloader('atmega328p')"
# tinyproto's per-user PlatformIO home (the offline platform, toolchain, SCons, Debian's Arduino core): what the
# generated platformio.ini files name (core_dir = ~/.cache/tinyproto/pio-core); tinyproto build also refreshes it.
.venv/bin/python -m tinyproto.device.piohome >/dev/null
echo "setup: ready (.venv/bin/tinyproto)" >&2
