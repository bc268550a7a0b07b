"""`python -m tinyproto` and the `tinyproto` console script.

The CLI is imported inside `run()` so that Ctrl-C during the (seconds-long) import of numpy, sklearn and click
ends in one line and exit 130, like Ctrl-C anywhere else, instead of a traceback; so do SIGTERM and SIGHUP, which
otherwise killed the process silently until the CLI installed its own handlers.
"""

import signal
import sys


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):  # from the start: a SIGTERM during the imports is Ctrl-C too
        signal.signal(signum, _interrupt)
    try:
        from tinyproto.core.terminal import ascii_safe_stdio

        ascii_safe_stdio()  # output degrades to ASCII under a locale that is not UTF-8 (core/terminal.py)
        from tinyproto.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        _forget_embedded_interrupts()
        sys.exit(130)
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C in click's own start, before it parses the command line (its shell
        # completion check), where neither click nor the group's handlers catch it
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except OSError as exc:  # click printing --help or a usage error, outside the commands' own handling
        from tinyproto.core.errors import os_error_line

        try:
            sys.stderr.write(f"error: {os_error_line(exc)}\n")
        except (OSError, ValueError):
            pass
        sys.exit(1)
    finally:
        _finished()


def _finished() -> None:
    """The verb has ended (its files written, or its refusal printed) and its exit status is decided: a signal from
    now on changes nothing. The interpreter's teardown takes a moment, and a SIGTERM in it killed the process with
    exit 143 and no line after the verb had done its work (Python resets its own handlers to the default there,
    but leaves an ignored signal ignored)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # (None: a descriptor closed before Python started and not reopened)
                stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream: nothing more to say
            pass
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _forget_embedded_interrupts()


def _forget_embedded_interrupts() -> None:
    """CPython records a KeyboardInterrupt that left code run through PyRun_String (compiled libraries run Python
    that way) and, under `python -m tinyproto`, kills the process with SIGINT at its exit whatever status was
    decided: a SIGTERM taken as Ctrl-C, its line printed and exit 130 decided, ended as "killed by SIGINT" (-2).
    Running empty code the same way clears that record; the exit status decided stands."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")
    except Exception:  # (an interpreter without ctypes: the record, if any, stays)
        pass


if __name__ == "__main__":
    run()
