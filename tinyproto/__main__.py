"""`python -m tinyproto` and the `tinyproto` console script.

The CLI is imported inside `run()` so that Ctrl-C during the (seconds-long) import of numpy, sklearn and click
ends in one line and exit 130, like Ctrl-C anywhere else, instead of a traceback.
"""

import sys


def run() -> None:
    try:
        from tinyproto.core.terminal import ascii_safe_stdio

        ascii_safe_stdio()  # output degrades to ASCII under a locale that is not UTF-8 (core/terminal.py)
        from tinyproto.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
