"""Every fix an error suggests must be a command that works (tests/test_bad_input.py runs it on every case).

A fix is read as alternatives ("pass --resume to continue it or --overwrite to start again": two), each a set
of `--flag [VALUE]` changes to the command that failed ("drop --flag" removes one), or a whole command it spells
out (`posbias distill r1 ...`). A hint fails when
  - it names a flag the command does not have, or a value the command's own parser refuses;
  - it gives a bare value after "e.g." without saying which flag takes it;
  - the command, rerun with the hint applied (on a copy of its output folder, the model load stubbed out), is
    refused again before it reaches the model.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
from pathlib import Path

import pytest
import typer.main

from posbias.cli import app, main

ROOT = typer.main.get_command(app)
STOP = {"or", "and", "to", "with", "between", "below", "above", "first", "instead", "that", "which", "in", "as", "more",
        "fewer", "less", "one", "of", "the", "a", "an", "it", "them", "is", "for", "like", "another", "here", "again",
        "inside", "outside"}
EXCLUSIVE = {"--resume", "--overwrite"}  # passing one replaces the other
SENTINEL = "posbias-test: the model load was reached"


def command_of(argv: list[str]) -> tuple[object, list[str], list[str]]:
    """(the click command argv runs, its path, its own arguments)."""
    cmd, n = ROOT, 0
    while hasattr(cmd, "commands") and n < len(argv) and argv[n] in cmd.commands:
        cmd, n = cmd.commands[argv[n]], n + 1
    return cmd, argv[:n], argv[n:]


def _param(cmd, flag: str):
    return next((p for p in cmd.params if flag in p.opts or flag in getattr(p, "secondary_opts", ())), None)


def _clean(token: str) -> str:
    """A token without the quotes, brackets and punctuation around it ("...", the user's other options, kept)."""
    token = re.sub(r"^[`'\"(\[]+", "", token)
    return token if token.endswith("...") else re.sub(r"[`'\"()\],;:.]+$", "", token)


def _placeholder(value: str) -> bool:
    return bool(re.search(r"\b[A-Z]{2,}\b", value)) or "..." in value or "<" in value


def _flag_at(tokens: list[str], i: int, cmd) -> tuple[str, str | None, int]:
    """(flag, its value or None, tokens used) for the flag at tokens[i] of `cmd`."""
    flag = _clean(tokens[i])
    value = _clean(tokens[i + 1]) if _takes_value(_param(cmd, flag)) and i + 1 < len(tokens) else None
    if value is not None and (value in STOP or value.startswith("--")):
        value = None
    return flag, value, 1 if value is None else 2


def _spelled_command(tokens: list[str], i: int) -> tuple[list[str], list, int]:
    """The `posbias CMD --flag VALUE ...` at tokens[i]: (its command path, its flags, the index after it)."""
    j, sub = i + 1, ROOT
    while j < len(tokens) and hasattr(sub, "commands") and _clean(tokens[j]) in sub.commands:
        sub, j = sub.commands[_clean(tokens[j])], j + 1
    path, changes = [_clean(t) for t in tokens[i + 1 : j]], []
    while j < len(tokens) and (_clean(tokens[j]).startswith("--") or _clean(tokens[j]) == "..."):
        if _clean(tokens[j]) == "...":  # the user's other options
            j += 1
            continue
        flag, value, used = _flag_at(tokens, j, sub)
        changes.append(("set", flag, value))
        j += used
    return path, changes, j


def alternatives(fix: str, cmd) -> tuple[list[tuple[list[str], list]], list[str]]:
    """([(command path, or [] for the failing command `cmd`, [(op, flag, value)]), ...], problems found reading)."""
    tokens, out, problems, current, i = fix.split(), [], [], [], 0
    while i < len(tokens):
        raw, tok = tokens[i], _clean(tokens[i])
        if tok == "posbias":
            path, changes, i = _spelled_command(tokens, i)
            out.append((path, changes))
            continue
        if raw.strip("`(") == "e.g." and i + 1 < len(tokens) and re.fullmatch(r"[\d.,:%+-]+", _clean(tokens[i + 1])):
            problems.append(f"the value {_clean(tokens[i + 1])} after 'e.g.' names no flag")  # which option takes it?
        if tok.startswith("--") and tok != "--help":
            flag, value, used = _flag_at(tokens, i, cmd)
            current.append(("drop" if i and _clean(tokens[i - 1]) == "drop" else "set", flag, value))
            i += used - 1
            raw = tokens[i]
        if tok == "or" or raw.endswith((",", ";")):
            out, current = out + [([], current)] if current else out, []
        i += 1
    return out + ([([], current)] if current else []), problems


def _takes_value(p) -> bool:
    return p is not None and not getattr(p, "is_flag", False)


def _apply(argv: list[str], cmd, changes: list) -> list[str]:
    """argv with the hint's changes: a flag set replaces its earlier value (and --resume / --overwrite each other)."""
    new = list(argv)
    for op, flag, value in changes:
        gone = {flag} | (EXCLUSIVE - {flag} if flag in EXCLUSIVE else set())
        kept, k = [], 0
        while k < len(new):
            if new[k] in gone:
                k += 2 if _takes_value(_param(cmd, new[k])) else 1
                continue
            kept.append(new[k])
            k += 1
        new = kept + ([flag, *([value] if value is not None else [])] if op == "set" else [])
    return new


def check(argv: list[str], line: str, out: Path | None, scratch: Path, rerun: bool) -> None:
    """Raise AssertionError when a hint in the error `line` that `argv` gave is not a command that works."""
    fix = line.split(" -- ", 1)[1] if " -- " in line else ""
    cmd, path, _ = command_of(argv)
    alts, problems = alternatives(fix, cmd)
    assert not problems, f"{problems[0]}: {line}"
    for target, changes in alts:
        sub = command_of(target)[0] if target else cmd
        name = "posbias " + " ".join(target or path)
        for _, flag, value in changes:
            if flag == "--help":
                continue
            p = _param(sub, flag)
            assert p is not None, f"the hint names {flag}, which `{name}` does not have: {line}"
            if value is not None and not _placeholder(value) and not getattr(p, "is_flag", False):
                try:
                    p.process_value(sub.make_context(name, [], resilient_parsing=True), value)
                except Exception as e:  # click's BadParameter, whichever click typer carries
                    raise AssertionError(f"the hint's {flag} {value} is refused by `{name}` ({e}): {line}") from None
        concrete = all(op == "drop" or (v is not None and not _placeholder(v)) or not _takes_value(_param(cmd, f))
                       for op, f, v in changes)
        if rerun and not target and changes and concrete:
            _rerun(_apply(argv, cmd, changes), line, out, scratch)


def _rerun(argv: list[str], line: str, out: Path | None, scratch: Path) -> None:
    """The command with the hint applied must get past every check before the model loads."""
    if out is not None and out.is_dir():  # a copy: the rerun must not touch the shared folders
        copy = scratch / f"copy-{len(list(scratch.glob('copy-*')))}"
        shutil.copytree(out, copy)
        argv = [str(copy) if a == str(out) else a for a in argv]
    from transformers import AutoModelForCausalLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AutoModelForCausalLM, "from_pretrained", _stop)
        mp.setattr(sys, "argv", ["posbias", *argv])
        err = _run_main()
    assert not err or SENTINEL in err, f"the hint does not work: `posbias {' '.join(argv)}` fails with {err!r} (was: {line})"


def _stop(*a, **k):
    raise RuntimeError(SENTINEL)


def _run_main() -> str | None:
    """The error line of an in-process CLI run (None when it finished)."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as e:
            if e.code in (0, None):
                return None
    lines = [x for x in buf.getvalue().splitlines() if x.startswith("posbias: error")]
    return lines[-1] if lines else buf.getvalue()[-300:]
