"""Entry point PlatformIO runs for its core package `tool-scons`: start the SCons installed from PyPI.

tinyproto places a symlink `SCons` next to this file pointing at the PyPI package, so the import works with
the Python PlatformIO uses even if SCons lives elsewhere.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from SCons.Script.Main import main  # imported after the sys.path line on purpose

if __name__ == "__main__":
    sys.exit(main())
