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
    """User-facing error. The CLI prints it on one line and exits with status 2.

    What a run folder's resume hint reads (eval/sweep.py, `with_resume_hint`): fix_before_resume, the fix without a
    hint a run added (None: `fix`); fix_resumes, whether the fix leaves the kept rows as they are (rerun with
    `resume`) or changes them (rerun with `overwrite`); in_folder, raised inside a run that opened its folder."""

    fix_before_resume: str | None = None
    fix_resumes: bool = True
    in_folder: bool = False

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} -- {fix}" if fix else problem)

    def render(self, flag: Callable[[str, str | None], str]) -> str:
        """The message with every `param` / `param=value` mark replaced by flag(param, value or None)."""
        return _PARAM.sub(lambda m: flag(m["name"], m["value"]), str(self))


def shown(value, width: int = 40) -> str:
    """`value` as a message quotes it: repr, with every string longer than `width` cut at a word's end and marked
    "..." (the message's fix is never cut off by a long value, and no word is cut in half)."""
    if isinstance(value, str):
        if len(value) <= width:
            return repr(value)
        cut = value[:width].rsplit(" ", 1)[0] if " " in value[:width] else value[:width]
        return repr(cut.rstrip() + " ...")
    if isinstance(value, (list, tuple)):
        inner = ", ".join(shown(v, width) for v in value[:6]) + (", ..." if len(value) > 6 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    text = repr(value)
    return text if len(text) <= 2 * width else text[: 2 * width].rsplit(" ", 1)[0] + " ..."
