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

    where = f": {exc.filename}" if exc.filename else ""
    if exc.filename and exc.filename2:
        where = f": {exc.filename} -> {exc.filename2}"
    hint = "; free some space and run the command again" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"{exc.strerror or exc}{where}{hint}"
