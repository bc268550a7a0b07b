"""One exception type for user errors: the CLI prints its message on one line and exits 1. Layer: core."""


class TinyprotoError(Exception):
    """A problem the user can fix (bad input, too-small budget, missing toolchain, silent device)."""
