"""SCons script of `framework = arduino` on tinyproto's offline AVR dev-platform.

The official `atmelavr` platform downloads `framework-arduino-avr`; offline, the same core comes from Debian
(arduino-core-avr: /usr/share/arduino/hardware/arduino/avr), which tinyproto installs into its PlatformIO home
as the package framework-arduino-avr (links to its cores/, variants/, libraries/). This builds the core
(cores/<build.core>, variants/<build.variant> of the board manifest, as Debian's boards.txt gives them) into a
library with the Arduino IDE's defines and C++ flags; PlatformIO itself turns the .ino into .cpp. The
`<board>_offline` environment of `tinyproto export --arduino`'s platformio.ini uses it.
"""

import os

from SCons.Script import DefaultEnvironment

env = DefaultEnvironment()
platform = env.PioPlatform()
board = env.BoardConfig()

FRAMEWORK_DIR = platform.get_package_dir("framework-arduino-avr")
CORE = board.get("build.core", "arduino")
VARIANT = board.get("build.variant", "standard")

env.Append(
    CPPDEFINES=[
        ("ARDUINO", 10819),
        ("ARDUINO_%s" % board.get("build.board", "AVR_UNO"), None),
        ("ARDUINO_ARCH_AVR", None),
        ("DECIMAL_DIG", "__DECIMAL_DIG__"),  # gcc-5's float.h hides DECIMAL_DIG outside C99; the core needs it
    ],
    CXXFLAGS=["-std=gnu++11", "-fpermissive", "-fno-exceptions", "-fno-threadsafe-statics"],
    CPPPATH=[os.path.join(FRAMEWORK_DIR, "cores", CORE), os.path.join(FRAMEWORK_DIR, "variants", VARIANT)],
    LIBSOURCE_DIRS=[os.path.join(FRAMEWORK_DIR, "libraries")],
)
if board.get("build.vid", ""):
    # Boards with native USB (the Leonardo): the core's CDC/HID code needs the ids (boards.txt's usb_flags).
    env.Append(CPPDEFINES=[
        ("USB_VID", board.get("build.vid")),
        ("USB_PID", board.get("build.pid")),
        ("USB_MANUFACTURER", '\\"Arduino LLC\\"'),
        ("USB_PRODUCT", '\\"%s\\"' % board.get("build.usb_product", "Arduino")),
    ])

core_library = env.BuildLibrary(os.path.join("$BUILD_DIR", "FrameworkArduino"),
                                os.path.join(FRAMEWORK_DIR, "cores", CORE))
env.Prepend(LIBS=[core_library])
