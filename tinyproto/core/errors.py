"""One exception type for user errors: the CLI prints its message on one line and exits 1; and a system error
(OSError: a full disk, a permission) as one line, for the CLI and for what a sweep point records. Layer: core."""


class TinyprotoError(Exception):
    """A problem the user can fix (bad input, too-small budget, missing toolchain, silent device)."""


class BudgetTooSmall(TinyprotoError):
    """A budget below the smallest model a family can make: says what that model is and the bytes it needs."""

    def __init__(self, budget: int, needed: int, model: str, smallest: str, beside: str = "") -> None:
        self.budget, self.needed, self.model, self.smallest, self.beside = budget, needed, model, smallest, beside
        super().__init__(f"budget {budget} B is too small for {model}: the smallest model ({smallest}) needs "
                         f"{needed} B{beside}")

    def plus(self, nbytes: int, what: str) -> "BudgetTooSmall":
        """The same refusal for a caller that kept `nbytes` of the budget for `what` before asking the solver."""
        return BudgetTooSmall(self.budget + nbytes, self.needed + nbytes, self.model, self.smallest,
                              f"{self.beside} with its {nbytes} B {what}")


def os_error_line(exc: OSError) -> str:
    """A system error as one line: what failed and on which file. A copy names both files (the system names the
    source first: 'No space left on device: firmware/tp_avr.h' blamed a file that was only read); a full disk
    says what to do."""
    import errno

    if exc.errno == errno.ENOENT and exc.filename is None and not cwd_exists():
        # os.getcwd() under a relative path: "No such file or directory" named no file and said nothing to do
        return ("the current directory no longer exists (it was deleted or moved); cd into an existing directory "
                "and run the command again")
    first, second = _shown(exc.filename), _shown(exc.filename2)
    where = f": {first}" if first else ""
    if first and second:
        where = f": {first} -> {second}"
    if first in ("standard output", "standard error"):  # (core.terminal names them) the disk is not the problem
        hint = "; what the command printed there was lost"
    elif exc.errno == errno.EROFS:
        hint = "; it is on a read-only file system: work on a copy in a directory you can write"
    elif exc.errno == errno.EISDIR and first:  # "Is a directory: DIR/learning/build.json" said nothing to do
        hint = "; tinyproto reads or writes a file there: move the directory away"
    elif exc.errno in (errno.EACCES, errno.EPERM) and first:
        # an immutable or read-only directory said only "Operation not permitted: DIR/..tinyproto.t4imcu5k.tmp"
        hint = f"; check the permissions of {first} and of its directory, or work on a copy in one you can write"
    else:
        hint = no_space_hint(exc)
    return f"{exc.strerror or exc}{where}{hint}"


def cwd_exists() -> bool:
    """False when the working directory was deleted under us (os.getcwd() then fails, and so does a tool's)."""
    import os

    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


def no_space_hint(exc: OSError) -> str:
    """What to do about a full disk or quota, as a clause to end an error line with; "" for any other error."""
    import errno

    return "; free some space and run the command again" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""


def _shown(filename) -> str | None:
    """A file name as the user knows it: a temporary file tinyproto writes a JSON file through
    (DIR/.validation.json.XXXXXXXX.tmp) is named as the file it becomes (DIR/validation.json)."""
    import os
    import re

    if filename is None:
        return None
    text = os.fsdecode(filename) if isinstance(filename, bytes) else str(filename)
    head, name = os.path.split(text)
    temp = re.fullmatch(r"\.(.+)\.[A-Za-z0-9_]{8}\.tmp", name)
    return os.path.join(head, temp.group(1)) if temp else text
