"""Deterministic builders: a data file made from the public originals it was selected or rebuilt from.

Each builder takes the downloaded source files (in the order its registry entry lists them) and returns the file's
bytes. Same sources, same bytes: the records are selected by a fixed rule, serialised as `json.dumps` writes them
(ASCII, ", " and ": ") one per line, and gzip-compressed exactly as the copy the documented figures came from was
(`gzip_lines`). Nothing here reads the network or the clock.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path
from typing import Iterable

CHUNK = 8192  # io.TextIOWrapper's write chunk: what `gzip.open(path, "wt")` hands zlib at a time


def gzip_lines(lines: Iterable[bytes], name: str, mtime: int) -> bytes:
    """The bytes `gzip.open(path, "wt")` of CPython 3.11 writes for these lines (written one `write` each, then
    closed), made here from zlib directly so that they do not depend on the running Python's gzip and io modules: the
    text layer hands GzipFile its pending lines once they would pass CHUNK bytes (or reach it), GzipFile deflates each
    hand-over at level 9, and closing flushes once with Z_SYNC_FLUSH before finishing the stream. The header holds
    the file `name` and `mtime` (RFC 1952: FNAME set, XFL 2 for level 9, OS 255). zlib's deflate decides the rest:
    another zlib (zlib-ng) may compress differently, which `DataFile.content_sha256` tells apart from other data."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, 0)
    body, pending, count, crc, size = [], [], 0, 0, 0

    def hand_over() -> None:
        nonlocal pending, count, crc, size
        if pending:
            data = b"".join(pending)
            crc, size = zlib.crc32(data, crc), size + len(data)
            body.append(deflate.compress(data))
            pending, count = [], 0

    for line in lines:
        if count + len(line) > CHUNK:
            hand_over()
        pending.append(line)
        count += len(line)
        if count >= CHUNK:
            hand_over()
    hand_over()
    body += [deflate.flush(zlib.Z_SYNC_FLUSH), deflate.flush()]
    header = b"\x1f\x8b\x08\x08" + struct.pack("<I", mtime) + b"\x02\xff" + name.encode("latin-1") + b"\x00"
    return header + b"".join(body) + struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF)


def jsonl(records: Iterable[dict]) -> list[bytes]:
    """One line per record, as `json.dumps(record) + "\\n"` writes it."""
    return [(json.dumps(r) + "\n").encode("ascii") for r in records]


def gz_records(path: Path, complete: bool = False) -> list[dict]:
    """The JSON records of a .jsonl.gz file; `complete`: only the lines that end in a newline (a file whose stream
    ends inside its last record, as the Lost-in-the-Middle fork's committed predictions file does)."""
    raw = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(Path(path).read_bytes())
    lines = raw.split(b"\n")
    return [json.loads(x) for x in (lines[:-1] if complete else lines) if x.strip()]


def json_records(path: Path) -> list[dict]:
    """The records of a JSON file: an array of objects, or one object per line."""
    text = Path(path).read_text(encoding="utf-8").strip()
    return json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]


def gz_jsonl(records: Iterable[dict], name: str, mtime: int) -> bytes:
    return gzip_lines(jsonl(records), name, mtime)


def content_sha256(data: bytes) -> str:
    """The SHA-256 of a .gz file's decompressed bytes (what a task reads, whatever zlib compressed it)."""
    import hashlib

    return hashlib.sha256(gzip.decompress(data)).hexdigest()


# --- the builders the registry names (data/registry.py) ---------------------------------------------------------

NQ_KEYS = ("question", "answers", "ctxs", "nq_annotated_gold")  # the study's input fields; the fork adds its model's
NQ_QUESTIONS = 341  # the 20-document copy holds the first 341 of the fork file's 441 complete records
HELD_BACK = range(341, 441)  # the fork's other 100 questions: left out of the oracle copy (its records 341-440)


def nq_20docs(fork_predictions: Path, *, name: str, mtime: int) -> bytes:
    """The 20-document file with the gold passage first: the fork's gold-at-0 predictions file (whose records hold
    the study's inputs, `ctxs` in the study's order, beside its model's outputs), its first NQ_QUESTIONS complete
    records, the study's input fields only."""
    records = gz_records(fork_predictions, complete=True)[:NQ_QUESTIONS]
    return gz_jsonl(({k: r[k] for k in NQ_KEYS} for r in records), name, mtime)


def nq_oracle(study_oracle: Path, *, name: str, mtime: int) -> bytes:
    """The study's oracle file (2,655 questions, the gold passage alone) less its records HELD_BACK."""
    records = gz_records(study_oracle)
    return gz_jsonl((r for i, r in enumerate(records) if i not in HELD_BACK), name, mtime)


def musique_two_hop(*sources: tuple[str, str, Path], name: str, mtime: int) -> bytes:
    """MuSiQue-Ans answerable 2-hop questions from three public copies, in source order: every record whose id
    starts with `2hop__` and that is answerable, the first of each id kept, with `_source` (REPO:PATH) and `_split`
    (the MuSiQue split that copy holds) added."""
    seen: set[str] = set()
    out = []
    for origin, split, path in sources:
        for r in json_records(path):
            if str(r.get("id", "")).startswith("2hop__") and r.get("answerable") and r["id"] not in seen:
                seen.add(r["id"])
                out.append({**r, "_source": origin, "_split": split})
    return gz_jsonl(out, name, mtime)
