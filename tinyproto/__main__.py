"""`python -m tinyproto` and the `tinyproto` console script.

The CLI is imported inside `run()` so that Ctrl-C during the (seconds-long) import of numpy, sklearn and click
ends in one line and exit 130, like Ctrl-C anywhere else, instead of a traceback; so do SIGTERM and SIGHUP, which
otherwise killed the process silently until the CLI installed its own handlers.
"""

import sys


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run() -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGHUP):  # from the start: a SIGTERM during the imports is Ctrl-C too
        signal.signal(signum, _interrupt)
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
