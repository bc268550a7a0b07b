#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian/Ubuntu machine for tinyproto.
#
#   bash tools/setup.sh          what a user needs: apt: avr-gcc toolchain, avr-libc, simavr + headers (the
#                                simulated Uno), avrdude (uploads to real and simulated boards), arduino-core-avr
#                                (Optiboot's source, the Mega's stk500v2 bootloader), arduino-builder;
#                                .venv: tinyproto with PlatformIO, SCons, dask and river (extras device, federated,
#                                datasets)
#   bash tools/setup.sh --test   the same, and what the test suite needs on top: clang + libFuzzer (fuzzing),
#                                chromium (the report's browser test); .venv: the test extras (pytest, xdist,
#                                hypothesis, ruff, mkdocs, build)
#
# Both end with the simulated Uno host program compiled against libsimavr, Optiboot built from Debian's source and
# the offline PlatformIO home (all in tinyproto's per-user cache; tinyproto would also make them on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '4,11p' "$0" | sed 's/^# \{0,1\}//'; }
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TESTS=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup: unknown option '$arg' (use --test for the test suite's tools, or --help)" >&2; exit 2 ;;
  esac
done

APT_PACKAGES=(gcc-avr binutils-avr avr-libc simavr libsimavr-dev libsimavrparts1 avrdude arduino-core-avr arduino-builder gcc make)
EXTRAS="device,federated,datasets"
if [ "$WITH_TESTS" -eq 1 ]; then
  APT_PACKAGES+=(clang libclang-rt-14-dev chromium)
  EXTRAS="test"
fi
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
echo "setup: installing tinyproto [$EXTRAS] into .venv" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
.venv/bin/python -c "from tinyproto.device.sim import ensure_simulator; ensure_simulator()"
.venv/bin/python -c "from tinyproto.device.board_sim import ensure_bootloader; ensure_bootloader('atmega328p')"
.venv/bin/python -m tinyproto.device.piohome >/dev/null
echo "setup: ready (.venv/bin/tinyproto)" >&2
