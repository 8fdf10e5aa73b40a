"""Natural text for haystacks (tasks/haystack.py): sentences of real, hard-wrapped text, NoLiMa's content words, and
the haystacks' sources (the nq data set's passages; a user's text file or folder, as sentences).

sentences  paragraphs split on blank lines (a line of only white space is blank); inside one, a single newline is
           a space (hard-wrapped text: NIAH's Paul Graham essays, Gutenberg books, RFCs, mail); a sentence ends at
           . ! or ? (closing quotes and brackets kept with it) before white space and a capital, a digit or an
           opening quote, except after an abbreviation (ABBREVIATIONS) or a single capital initial ("J. R. R.
           Tolkien") or inside an open quotation ("You do not read a novel. You live next to it." is one); a
           decimal ("3.14", "v1.2") has no white space after its point, so it never ends one
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ..errors import PosbiasError
from .base import read_jsonl

# lower-cased, without their last period: "e.g." -> "e.g", "U.S." -> "u.s"
ABBREVIATIONS = frozenset("mr mrs ms dr prof st jr sr vs etc e.g i.e u.s u.k a.m p.m no fig".split())
_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")  # a blank line, or one of only white space
_STOP = frozenset((
    "a an and are as at be been being but by can could did do does for from had has have he her his how i if in "
    "into is it its may me might more most my no not of on or our she should so some such than that the their "
    "them then there these they this those to was we were what when where which who whom whose why will with "
    "would you your also after before about over under between during other one two first last many much very "
    "s t").split())


def _abbreviation(text: str, dot: int) -> bool:
    """Whether the period at text[dot] closes an abbreviation or an initial, not a sentence."""
    word = text[:dot].rsplit(None, 1)[-1].lstrip("\"'\u201c\u2018([") if text[:dot].strip() else ""
    return word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper())


def _quoted(text: str, start: int, end: int) -> bool:
    """Whether a double quotation opened in text[start:end] (the sentence so far) is still open: a quote that follows
    white space or an opening bracket opens one, any other closes one (a passage that starts mid-quote opens none)."""
    depth = 0
    for i in range(start, end):
        if text[i] in "\"\u201c\u201d":
            opening = text[i] == "\u201c" or (text[i] == '"' and (i == 0 or text[i - 1].isspace() or text[i - 1] in "(["))
            depth = depth + 1 if opening else max(depth - 1, 0)
    return depth > 0


def sentences(text: str) -> list[str]:
    """The sentences of running text (module docstring), white space collapsed, in order."""
    out = []
    for para in _PARAGRAPH.split(text):
        para, start = " ".join(para.split()), 0
        for m in _END.finditer(para):
            if (para[m.start()] == "." and _abbreviation(para, m.start())) or _quoted(para, start, m.end()):
                continue
            out.append(para[start : m.end()].strip())
            start = m.end()
        if para[start:].strip():
            out.append(para[start:].strip())
    return out


def content_words(text: str) -> set[str]:
    """NoLiMa's overlap check, made concrete: lower-cased alphanumeric words, English stop words dropped, a crude
    stem (a trailing 's', 'es', 'ed' or 'ing' cut from words of 5 letters or more)."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w in _STOP:
            continue
        for suf in ("ing", "es", "ed", "s"):
            if len(w) >= 5 and w.endswith(suf):
                w = w[: -len(suf)]
                break
        out.add(w)
    return out


@functools.lru_cache(maxsize=4)
def nq_passages(paths: tuple[str, ...], stamps: tuple) -> tuple[str, ...]:
    """Every distinct passage "Title. text" of the NQ files at `paths` (stamps: their versions)."""
    seen: dict[str, None] = {}
    for path in paths:
        for _, rec in read_jsonl(path):
            for c in rec.get("ctxs", []):
                seen.setdefault(f"{c['title']}. {c['text']}", None)
    return tuple(seen)


@functools.lru_cache(maxsize=4)
def text_units(path: str, stamps: tuple) -> tuple[str, ...]:
    """The sentences of a text file, or of a folder's .txt / .md files in path order (stamps: their versions)."""
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".md") and f.is_file()) if p.is_dir() else [p]
    if not files:
        raise PosbiasError(f"haystack folder '{p}' holds no .txt or .md file", "pass a text file or a folder of them")
    out = []
    for f in files:
        if not f.is_file():
            raise PosbiasError(f"haystack file '{f}' does not exist", "pass `haystack=nq` or a text file / folder")
        try:
            out += sentences(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise PosbiasError(f"haystack file '{f}' is not UTF-8 text", "save it as UTF-8") from None
    if len(out) < 2:
        raise PosbiasError(f"haystack '{p}' holds fewer than 2 sentences", "give it more natural text")
    return tuple(out)
