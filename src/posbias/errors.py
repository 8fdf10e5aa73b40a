"""One exception type for bad input: the message says what is wrong and how to fix it.

Library messages name parameters as Python does, in backticks: "`n` must be at least 1" and
"use `n=10` or fewer". `PosbiasError.render(flag)` rewrites those marks; the CLI passes a
function that turns (parameter, value) into its flag ("--n 10"), so the same error reads right
from Python and from the shell.
"""

from __future__ import annotations

import re
from typing import Callable

# `name` or `name=value`; a mark must be a bare identifier, so `posbias sweep --out DIR` is left alone
_PARAM = re.compile(r"`(?P<name>[a-z_][a-z0-9_]*)(?:=(?P<value>[^`\s][^`]*))?`")


class PosbiasError(Exception):
    """User-facing error. The CLI prints it on one line and exits with status 2."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} -- {fix}" if fix else problem)

    def render(self, flag: Callable[[str, str | None], str]) -> str:
        """The message with every `param` / `param=value` mark replaced by flag(param, value or None)."""
        return _PARAM.sub(lambda m: flag(m["name"], m["value"]), str(self))
