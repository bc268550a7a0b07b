"""SCons build script of tinyproto's offline AVR dev-platform.

Bare avr-libc C (no Arduino framework) with the avr-gcc/binutils found on PATH, for the boards in boards/
(ATmega328P, ATmega2560, ATmega32U4; the board manifest gives mcu and f_cpu). PlatformIO puts the
`toolchain-atmelavr` package's bin/ first on PATH; tinyproto's package is a folder of symlinks to the
system tools (Debian gcc-avr, binutils-avr), so nothing is downloaded.

Targets: the default build (firmware.elf + firmware.hex + size check), `size`, and `upload`:
  upload_protocol = arduino (or any avrdude programmer) -> avrdude from PATH, like the official platform
  upload_protocol = simavr                              -> nothing to flash: the simulated Uno loads the ELF;
      with an upload port (--upload-port / upload_port) it flashes that port like a real board, with the
      protocol of the board manifest (upload.protocol: the bootloader's), e.g. a simulated board from
      `python -m tinyproto.device.board_sim` or a physical one
"""

import os

from SCons.Script import AlwaysBuild, Builder, Default, DefaultEnvironment

env = DefaultEnvironment()

env.Replace(
    AR="avr-ar",
    AS="avr-as",
    CC="avr-gcc",
    CXX="avr-g++",
    GDB="avr-gdb",
    OBJCOPY="avr-objcopy",
    RANLIB="avr-ranlib",
    SIZETOOL="avr-size",
    ARFLAGS=["rc"],
    # Used by PlatformIO's `checkprogsize` against the board's maximum_size / maximum_ram_size.
    SIZEPROGREGEXP=r"^(?:\.text|\.data|\.bootloader)\s+(\d+).*",
    SIZEDATAREGEXP=r"^(?:\.data|\.bss|\.noinit)\s+(\d+).*",
    SIZECHECKCMD="$SIZETOOL -A -d $SOURCES",
    SIZEPRINTCMD="$SIZETOOL -A -d $SOURCES",
    PROGSUFFIX=".elf",
)

# Same flags as the official atmelavr platform's bare build, minus LTO (the generated platformio.ini
# removes LTO there too, so both environments compile the same way). The project's build_flags add
# -std=gnu99 -Wall -Wextra -Werror and the include directories.
env.Append(
    ASFLAGS=["-x", "assembler-with-cpp"],
    CCFLAGS=["-Os", "-mmcu=$BOARD_MCU", "-ffunction-sections", "-fdata-sections"],
    CFLAGS=["-std=gnu99"],
    CPPDEFINES=[("F_CPU", "$BOARD_F_CPU")],
    LINKFLAGS=["-Os", "-mmcu=$BOARD_MCU", "-Wl,--gc-sections"],
    LIBS=["m"],
)
env.Append(ASFLAGS=env.get("CCFLAGS", [])[:])

env.Append(
    BUILDERS={
        "ElfToHex": Builder(
            action=env.VerboseAction("$OBJCOPY -O ihex -R .eeprom $SOURCES $TARGET", "Building $TARGET"),
            suffix=".hex",
        )
    }
)

if env.get("PROGNAME", "program") == "program":
    env.Replace(PROGNAME="firmware")

# --- build -------------------------------------------------------------------------------------------

target_elf = env.BuildProgram()
target_hex = env.ElfToHex(os.path.join("$BUILD_DIR", "${PROGNAME}"), target_elf)
target_buildprog = env.Alias("buildprog", target_hex, target_hex)

target_size = env.Alias("size", target_elf, env.VerboseAction("$SIZEPRINTCMD", "Calculating size $SOURCE"))
AlwaysBuild(target_size)

# --- upload ------------------------------------------------------------------------------------------


def _before_avrdude(target, source, env):  # pylint: disable=unused-argument
    upload = env.BoardConfig().get("upload", {})
    if upload.get("use_1200bps_touch", False):
        # Leonardo (Caterina, avr109 over native USB): opening the port at 1200 baud makes the sketch's USB
        # stack reset into the bootloader, which then appears as a new port (as the official platform does).
        env.AutodetectUploadPort()
        env.TouchSerialPort("$UPLOAD_PORT", 1200)
        if upload.get("wait_for_upload_port", False):
            env.Replace(UPLOAD_PORT=env.WaitForNewSerialPort(env.subst("$UPLOAD_PORT")))
    if env.subst("$UPLOAD_SPEED"):
        env.Append(UPLOADERFLAGS=["-b", "$UPLOAD_SPEED"])
    # the bootloaders (Optiboot, ATmegaBOOT, stk500v2, Caterina) erase pages themselves
    env.Append(UPLOADERFLAGS=["-D"])
    env.AutodetectUploadPort()
    env.Append(UPLOADERFLAGS=["-P", '"$UPLOAD_PORT"'])
    if not upload.get("use_1200bps_touch", False):
        _open_and_close(env.subst("$UPLOAD_PORT"))


PORT_CLOSED_S = 0.25  # longer than a simulated board's polling for opens and closes of its port


def _open_and_close(port):
    """Open the port, close it, wait: what the official platform's FlushSerialBuffer does before avrdude, minus its
    DTR/RTS calls (a pty has no modem lines). On a board with auto-reset it is one reset more; a simulated board
    that notices opens by polling and missed the first one (a pty nobody had opened yet) sees a close now, so
    avrdude's open is a reset there too."""
    import time

    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return  # avrdude's own open reports why
    os.close(fd)
    time.sleep(PORT_CLOSED_S)


def _simulated_upload(target, source, env):  # pylint: disable=unused-argument
    print(f"Simulated Uno: nothing to flash, the simulator loads {target_elf[0].get_abspath()} directly "
          "(give --upload-port to flash a board, e.g. one from python -m tinyproto.device.board_sim)")


_protocol = env.subst("$UPLOAD_PROTOCOL")
if _protocol == "simavr" and env.subst("$UPLOAD_PORT"):
    _protocol = env.BoardConfig().get("upload.protocol", "arduino")  # a port was named: flash it for real

if _protocol == "simavr":
    upload_actions = [env.VerboseAction(_simulated_upload, "Simulated upload")]
else:
    env.Replace(
        UPLOADER="avrdude",
        UPLOADERFLAGS=["-p", "$BOARD_MCU", "-c", _protocol],
        UPLOADCMD="$UPLOADER $UPLOADERFLAGS -U flash:w:$SOURCES:i",
    )
    upload_actions = [
        env.VerboseAction(_before_avrdude, "Looking for upload port..."),
        env.VerboseAction("$UPLOADCMD", "Uploading $SOURCE"),
    ]

AlwaysBuild(env.Alias("upload", target_hex, upload_actions))

Default([target_buildprog, target_size])
