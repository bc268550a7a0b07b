"""One exception type for user errors: the CLI prints its message on one line and exits 1. Layer: core."""


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
