"""Natural text for haystacks (tasks/haystack.py): sentences of real, hard-wrapped text, NoLiMa's content words, and
the haystacks' sources (the nq data set's passages; a user's text file or folder, as sentences).

sentences  paragraphs split on blank lines (a line of only white space is blank); inside one, a single newline is
           a space (hard-wrapped text: NIAH's Paul Graham essays, Gutenberg books, RFCs, mail); a sentence ends at
           . ! or ? (closing quotes and brackets kept with it) before white space and a capital, a digit or an
           opening quote, except after an abbreviation (ABBREVIATIONS) or a single capital initial ("J. R. R.
           Tolkien") or inside an open quotation ("You do not read a novel. You live next to it." is one); a
           decimal ("3.14", "v1.2") has no white space after its point, so it never ends one. A quotation longer
           than QUOTE_SPLIT characters (a quoted letter, or one left open to its paragraph's end) is split at its
           own sentence ends, so a needle's depth is never held off by one sentence hundreds of tokens long
files      text_files: a text file's or a folder's sentences, file by file (a haystack marks where a file starts)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Iterator

from ..core.metrics import normalize_answer
from ..errors import PosbiasError
from .base import read_jsonl

# lower-cased, without their last period: "e.g." -> "e.g", "U.S." -> "u.s"
ABBREVIATIONS = frozenset("mr mrs ms dr prof st jr sr vs etc e.g i.e u.s u.k a.m p.m no fig".split())
QUOTE_SPLIT = 200  # characters: a longer quotation is split at its own sentence ends (~2 sentences of prose)
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


def _quotations(text: str) -> list[tuple[int, int]]:
    """The spans [opening quote, after its closing quote) of a paragraph's outermost double quotations, the last one
    running to the paragraph's end if it is left open: a quote that follows white space or an opening bracket opens
    one, any other closes one (a passage that starts mid-quote opens none)."""
    spans, depth, opened = [], 0, 0
    for i, c in enumerate(text):
        if c in "\"\u201c\u201d":
            if c == "\u201c" or (c == '"' and (i == 0 or text[i - 1].isspace() or text[i - 1] in "([")):
                opened, depth = (i if depth == 0 else opened), depth + 1
            elif depth:
                depth -= 1
                if depth == 0:
                    spans.append((opened, i + 1))
    return spans + [(opened, len(text))] if depth else spans


def _held(spans: list[tuple[int, int]], end: int) -> bool:
    """Whether a sentence end whose match ends at `end` lies inside a quotation short enough to keep whole."""
    return any(a < end < b and b - a <= QUOTE_SPLIT for a, b in spans)


def sentences(text: str) -> list[str]:
    """The sentences of running text (module docstring), white space collapsed, in order."""
    out = []
    for para in _PARAGRAPH.split(text):
        para, start = " ".join(para.split()), 0
        spans = _quotations(para)
        for m in _END.finditer(para):
            if (para[m.start()] == "." and _abbreviation(para, m.start())) or _held(spans, m.end()):
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


def haystack_stream(units: tuple, passages: bool, rng, avoid: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    """A haystack's sentences in order, each with whether a document starts there: nq passages (passages=True) in
    the seeded order, split into sentences; or a file's or folder's sentences (units: file by file) from a seeded
    sentence, wrapping round to the first file's start. Sentences holding a normalised string of `avoid` are left
    out (a document's start then moves to its next sentence kept)."""
    if passages:
        order = list(range(len(units)))
        rng.shuffle(order)
        seq = ((s, k == 0) for i in order for k, s in enumerate(sentences(units[i])))
    else:
        flat = [(s, k == 0) for f in units for k, s in enumerate(f)]
        start = rng.randrange(len(flat))
        seq = (flat[(start + i) % len(flat)] for i in range(len(flat)))
    starts = False
    for s, first in seq:
        starts = starts or first
        if not any(a in normalize_answer(s) for a in avoid):
            yield s, starts
            starts = False


@functools.lru_cache(maxsize=4)
def nq_passages(paths: tuple[str, ...], stamps: tuple) -> tuple[str, ...]:
    """Every distinct passage "Title. text" of the NQ files at `paths` (stamps: their versions)."""
    seen: dict[str, None] = {}
    for path in paths:
        for _, rec in read_jsonl(path):
            for c in rec.get("ctxs", []):
                seen.setdefault(f"{c['title']}. {c['text']}", None)
    return tuple(seen)


def text_units(path: str, stamps: tuple) -> tuple[str, ...]:
    """The sentences of a text file, or of a folder's .txt / .md files in path order (stamps: their versions)."""
    return tuple(s for f in text_files(path, stamps) for s in f)


@functools.lru_cache(maxsize=4)
def text_files(path: str, stamps: tuple) -> tuple[tuple[str, ...], ...]:
    """The sentences of a text file, or of each of a folder's .txt / .md files in path order (stamps: their
    versions), file by file (a file without a sentence is left out)."""
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".md") and f.is_file()) if p.is_dir() else [p]
    if not files:
        raise PosbiasError(f"haystack folder '{p}' holds no .txt or .md file", "pass a text file or a folder of them")
    out = []
    for f in files:
        if not f.is_file():
            raise PosbiasError(f"haystack file '{f}' does not exist", "pass `haystack=nq` or a text file / folder")
        try:
            out.append(tuple(sentences(f.read_text(encoding="utf-8"))))
        except UnicodeDecodeError:
            raise PosbiasError(f"haystack file '{f}' is not UTF-8 text", "save it as UTF-8") from None
    if sum(map(len, out)) < 2:
        raise PosbiasError(f"haystack '{p}' holds fewer than 2 sentences", "give it more natural text")
    return tuple(f for f in out if f)
