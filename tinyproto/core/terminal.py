"""Output that never depends on the terminal's encoding: under a locale whose encoding is not a UTF (LC_ALL=C,
POSIX, ISO-8859-x with Python's UTF-8 mode off) stdout and stderr degrade to ASCII instead of raising
UnicodeEncodeError in the middle of a run.

`ascii_safe_stdio()` (called once by the `tinyproto` entry point and by worker processes that print) wraps each
stream whose encoding is not a UTF in `AsciiStream`: the symbols tinyproto prints get an ASCII spelling (· -> '.',
— -> '-', ± -> '+/-', box drawing -> + - |), and any other character (a class or file name in another script)
is written as a backslash escape (\\u00e9), so nothing is lost and nothing raises. The wrapper reports its
encoding as 'ascii', so rich draws ASCII tables, and it has no `buffer`, so click writes through it instead of
re-encoding to UTF-8 behind its back. Under a UTF-8 locale the text is unchanged. Either way a stream whose reader
went away (a broken pipe) writes to /dev/null from then on (ReaderSafeStream): the run is not cut short by it.
Layer: core.
"""

from __future__ import annotations

import codecs
import io
import os
import sys

# the symbols tinyproto's own messages and tables use, spelled in ASCII
_SPELLING = {
    "·": ".", "—": "-", "–": "-", "−": "-", "±": "+/-", "×": "x", "²": "^2", "³": "^3", "≈": "~", "…": "...",
    "→": "->", "←": "<-", "≥": ">=", "≤": "<=", "≠": "!=", "µ": "u", "μ": "u", "°": " deg", "•": "*", "✓": "ok",
    "✗": "x", "‘": "'", "’": "'", "“": '"', "”": '"', "\u00a0": " ", "Σ": "sum", "∝": "~", "₀": "0", "ε": "eps",
    "ρ": "rho", "φ": "phi", "τ": "tau", "α": "alpha", "Γ": "Gamma", "█": "#", "▏": "|", "▌": "|", "━": "-",
    "┃": "|",
}


def _box_drawing() -> dict[int, str]:
    """U+2500..U+257F (what rich draws tables with) and the braille spinner frames, in ASCII."""
    table = {}
    for code in range(0x2500, 0x2580):
        name = _unicode_name(code)
        if "HORIZONTAL" in name and "VERTICAL" not in name and "AND" not in name:
            table[code] = "-"
        elif "VERTICAL" in name and "HORIZONTAL" not in name and "AND" not in name:
            table[code] = "|"
        else:
            table[code] = "+"
    for code in range(0x2800, 0x2900):  # rich's "dots" spinner
        table[code] = "*"
    return table


def _unicode_name(code: int) -> str:
    import unicodedata

    return unicodedata.name(chr(code), "")


# A byte of a name that did not decode (a UTF-8 file name under LC_ALL=C: os.fsdecode's surrogate escapes
# U+DC80..U+DCFF) is written as that byte, \xc3\xa9, not as the surrogate's \udcc3\udca9.
_RAW_BYTES = {0xDC00 + byte: f"\\x{byte:02x}" for byte in range(0x80, 0x100)}
_TABLE = {**_box_drawing(), **{ord(k): v for k, v in _SPELLING.items()}, **_RAW_BYTES}


def to_ascii(text: str) -> str:
    """`text` in ASCII: tinyproto's symbols spelled out, every other non-ASCII character backslash-escaped."""
    if text.isascii():
        return text
    return text.translate(_TABLE).encode("ascii", "backslashreplace").decode("ascii")


def is_utf(encoding: str | None) -> bool:
    try:
        return codecs.lookup(encoding or "ascii").name.startswith("utf")
    except LookupError:
        return False


class ReaderSafeStream(io.TextIOBase):
    """A text stream that writes to another one and outlives its reader: when the reader goes away (`tinyproto ...
    | head -1`: a broken pipe) the stream's descriptor is pointed at /dev/null, so the run finishes its work and
    exits with its own status (validate's verdict) instead of stopping at the next line it prints; what follows
    is dropped, as the reader asked. Its text is unchanged (see AsciiStream)."""

    def __init__(self, inner):
        super().__init__()
        self._inner = inner

    @property
    def encoding(self) -> str:
        return getattr(self._inner, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self._inner, "errors", None) or "strict"

    def _text(self, text: str) -> str:
        return text

    def write(self, text: str) -> int:
        try:
            self._inner.write(self._text(text))
        except BrokenPipeError:
            self._reader_gone()
        except OSError as exc:
            raise self._named(exc) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except BrokenPipeError:
            self._reader_gone()
        except OSError as exc:
            raise self._named(exc) from None

    def _named(self, exc: OSError) -> OSError:
        """A write error that names the stream (`> /dev/full` said "No space left on device" and no file)."""
        if exc.filename is not None or exc.errno is None:
            return exc
        name = {1: "standard output", 2: "standard error"}.get(self._fd(), "an output stream")
        return type(exc)(exc.errno, exc.strerror, name)

    def _fd(self) -> int | None:
        try:
            return self._inner.fileno()
        except (OSError, ValueError, AttributeError):
            return None

    def _reader_gone(self) -> None:
        """From now on the descriptor writes to /dev/null (for this stream, a child process that inherited it and
        the buffered text a flush at exit would write again)."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._inner.fileno())
            finally:
                os.close(devnull)
            self._inner.flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        return self._inner.fileno()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        super().close()
        self._inner.close()

    @property
    def line_buffering(self) -> bool:
        return getattr(self._inner, "line_buffering", False)


class AsciiStream(ReaderSafeStream):
    """A text stream that writes `to_ascii(text)` to another text stream (see the module doc)."""

    encoding = "ascii"
    errors = "strict"

    def _text(self, text: str) -> str:
        return to_ascii(text)


def reopen_closed_stdio() -> None:
    """A standard descriptor the caller closed (`tinyproto ... >&-`, `2>&-`) is opened on /dev/null, and its
    sys stream with it: Python left sys.stdout None (a traceback at the first print or flush: `boards >&-` exited
    1 after its work), and the next file tinyproto opened would have become descriptor 1, where a tool started
    with an inherited stdout writes. What would have been printed there is dropped, as the caller asked."""
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, mode)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", errors="backslashreplace",
                                        closefd=False, buffering=-1 if fd == 0 else 1))


def ascii_safe_stdio() -> None:
    """Wrap sys.stdout and sys.stderr in AsciiStream when their encoding is not a UTF, else in ReaderSafeStream
    (idempotent): either outlives a reader that went away. The inner streams of AsciiStream also get
    errors='backslashreplace', so a write that bypasses the wrapper cannot raise either. A closed standard
    descriptor is opened on /dev/null first (reopen_closed_stdio)."""
    reopen_closed_stdio()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, ReaderSafeStream):
            continue
        if is_utf(getattr(stream, "encoding", None)):
            setattr(sys, name, ReaderSafeStream(stream))
            continue
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, io.UnsupportedOperation):
            pass
        setattr(sys, name, AsciiStream(stream))
