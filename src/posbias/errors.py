"""One exception type for bad input: the message says what is wrong and how to fix it."""


class PosbiasError(Exception):
    """User-facing error. The CLI prints it on one line and exits with status 2."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} -- {fix}" if fix else problem)
