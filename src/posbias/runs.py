"""The run-folder protocol every pipeline shares, and the small utilities around it.

A pipeline (sweep, compare, LPES search, distillation, synthetic grid, theory) writes into one output folder through a
`RunFolder`:

  check(resume, overwrite)   before any expensive work (loading a model): contradictory flags, `out` a file or not
                             writable, a started folder without resume or overwrite, resume with nothing there
  open(fingerprint, ...)     takes the folder's lock (one writer at a time), then either compares the stored
                             fingerprint (resume) or clears what the pipeline owns (new run, overwrite), and
                             records the fingerprint in run.json
  finish(record)             writes the result file atomically, last: its presence means complete

Besides: atomic JSON writes, a JSONL log that survives a kill mid-line, one progress bar helper, the main-process
check under `accelerate launch`, the library versions record. The checks on the folder itself (writable, no other
live writer) are in outdir.py. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import socket
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from .errors import PosbiasError
from .outdir import check_out_dir, refuse_live_writer
from .version import __version__

MARKER = "run.json"  # kind + fingerprint of the run a folder holds
LOCK = ".lock"  # "pid host" of the process writing the folder


# ----------------------------------------------------------------------------- files


def write_json_atomic(path: str | Path, obj, indent: int | None = None, allow_nan: bool = True) -> None:
    """Write JSON to a temporary file beside `path`, then os.replace it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=allow_nan) + "\n")
    os.replace(tmp, path)


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> None:
    """One JSON object per line, written to a temporary file and renamed into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: str | Path, what: str, fix: str = "pass `overwrite=True` to start again") -> dict:
    """A JSON object from a file this package wrote; a clear error (ending in `fix`) if it is unreadable."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PosbiasError(f"{path} is not a readable {what} ({e})", fix) from None
    if not isinstance(obj, dict):
        raise PosbiasError(f"{path} is not a {what}", fix)
    return obj


class JsonlLog:
    """An append-only JSONL file of rows; a kill can tear only its last line, which `read` drops."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self, required: Sequence[str] = ()) -> list[dict]:
        """Every complete row (a torn last line is cut from the file); rows lacking `required` keys are an error."""
        if not self.path.exists():
            return []
        rows, keep = [], 0
        with self.path.open("rb") as f:
            lines = f.readlines()
        for i, line in enumerate(lines):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if i == len(lines) - 1 and not line.endswith(b"\n"):
                    break  # torn by a kill while writing
                raise PosbiasError(f"{self.path}:{i + 1} is not a JSON row", "pass `overwrite=True` to start again") from None
            if not isinstance(row, dict) or any(k not in row for k in required):
                raise PosbiasError(f"{self.path}:{i + 1} is not a row this pipeline wrote (needs {', '.join(required)})",
                                   "pass `overwrite=True` to start again")
            rows.append(row)
            keep += len(line)
        if keep != sum(map(len, lines)):
            with self.path.open("r+b") as f:
                f.truncate(keep)
        return rows

    def append(self, rows: Iterable[dict]) -> None:
        """Append rows; a torn last line (a kill mid-write) is cut first, so a row never continues it."""
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        if not text:
            return
        self._repair()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()

    def _repair(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("r+b") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)


def cached_record(path: str | Path, config: dict) -> dict | None:
    """The finished record at `path` if it was made with `config` (its "config" key), None if absent."""
    path = Path(path)
    if not path.exists():
        return None
    old = read_json(path, "result")
    if old.get("config") != json.loads(json.dumps(config)):
        raise PosbiasError(f"{path} holds another configuration", "pass another `out`, or `overwrite=True`")
    return old


# ----------------------------------------------------------------------------- processes, versions, progress


def process_index() -> int:
    """This process's rank under `accelerate launch` / torchrun (RANK), 0 otherwise."""
    return int(os.environ.get("RANK", "0"))


def num_processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return process_index() == 0


def versions(*extra: str) -> dict:
    """posbias, Python and the installed versions of torch, transformers, numpy (and `extra` packages)."""
    out = {"posbias": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "numpy", *extra):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def progress(total: int | None, desc: str, unit: str, initial: int = 0, enabled: bool = True, **kw) -> Any:
    """A tqdm bar on the main process when enabled, else a disabled one (tqdm's own no-op)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                disable=not enabled or not is_main_process(), **kw)


# ----------------------------------------------------------------------------- run folders


def command_line() -> str:
    """The command that started this process (`posbias sweep --n 5 ...`), for the run's provenance."""
    argv = list(sys.argv) or [""]
    exe = Path(argv[0])
    head = shlex.quote(argv[0])
    if exe.name == "posbias" or (exe.name == "__main__.py" and exe.parent.name == "cli" and exe.parent.parent.name == "posbias"):
        head = "posbias"
    elif exe.name == "__main__.py":  # python -m pytest ...
        head = f"python -m {shlex.quote(exe.parent.name)}"
    return " ".join([head, *map(shlex.quote, argv[1:])])


def _diff(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths at which two JSON values differ, with both values (for the error message), depth-first. Two strings of
    key=value items (model specs) show only the items that differ; over 120 characters, a value is cut in the middle."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{where}.{k}".lstrip("."))]
    if a == b:
        return []
    x, y = json.dumps(a, ensure_ascii=False), json.dumps(b, ensure_ascii=False)
    if isinstance(a, str) and isinstance(b, str) and "=" in a + b:
        dx, dy = (",".join(i for i in mine.split(",") if i not in theirs.split(",")) for mine, theirs in ((a, b), (b, a)))
        x, y = (dx or "(nothing)", dy or "(nothing)") if dx or dy else (x, y)  # the same items in another order: all
    return [f"{where or 'value'}: {_cut(x)} -> {_cut(y)}"]


def _cut(text: str, most: int = 120) -> str:
    return text if len(text) <= most else f"{text[:most // 2 - 2]} ... {text[-(most // 2 - 3):]}"


# what a folder's kind is called in messages, where "a <kind>" does not read right
_KIND_NAMES = {"search": "an LPES search", "moice": "a MoICE training", "attention analysis": "an attention analysis"}


def kind_name(kind: str | None) -> str:
    """'a sweep', 'an LPES search', 'a MoICE training' ...; None: 'no posbias run'."""
    return "no posbias run" if kind is None else _KIND_NAMES.get(kind, f"a {kind}")


def folder_kind(path: str | Path) -> str | None:
    """The kind of run a folder holds ('sweep', 'comparison', 'search', 'distillation', 'moice', ...), as its
    run.json names it; None for a folder no posbias command wrote."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return None
    kind = read_json(marker, "run marker", "pass a folder a posbias command wrote, or rerun that command").get("kind")
    return str(kind) if kind else None


class RunFolder:
    """One pipeline's output folder (see the module docstring). path None: a run without files (API use).

    kind: what the folder holds ("sweep", "compare", ...); result: the result file written last;
    owned: the other files and folders the pipeline writes there (removed on a new run or overwrite); a name with
        '*' (size-*) owns every match.
    """

    def __init__(self, path: str | Path | None, kind: str, result: str, owned: Sequence[str] = (), resumable: bool = True):
        self.path = Path(path) if path is not None else None
        self.kind, self.result, self.owned, self.resumable = kind, result, tuple(owned), resumable
        self.resuming = False

    def file(self, name: str) -> Path:
        assert self.path is not None, "a RunFolder without a path has no files"
        return self.path / name

    def started(self) -> bool:
        return self.path is not None and self.path.is_dir() and any(p.exists() for p in self._paths())

    def _paths(self) -> list[Path]:  # what the folder's pipeline owns; a name with '*' (size-*): every match
        names = (self.result, MARKER, *self.owned)
        return [q for n in names for q in (sorted(self.path.glob(n)) if "*" in n else [self.path / n])]

    def complete(self) -> bool:
        return self.path is not None and (self.path / self.result).exists()

    def check(self, resume: bool, overwrite: bool) -> None:
        """The checks that need no model: call before loading one."""
        if resume and overwrite:
            raise PosbiasError("`resume` and `overwrite` contradict each other", "pass one of them")
        if self.path is None or not is_main_process():  # under accelerate launch, rank 0 checks and owns the folder
            return
        check_out_dir(self.path)
        other = self._marker_kind(overwrite)
        if other != self.kind:
            raise PosbiasError(f"{self.path} holds {kind_name(other)}, not {kind_name(self.kind)}", "pass another `out`")
        refuse_live_writer(self.file(LOCK), self.path)
        started = self.started()
        if started and not (resume or overwrite):
            fix = ("pass `resume=True` to continue it or `overwrite=True` to start again" if self.resumable
                   else "pass `overwrite=True` to replace it, or another `out`")
            raise PosbiasError(f"{self.path} already holds {kind_name(self.kind)}", fix)
        if resume and not started:
            raise PosbiasError(f"nothing to resume in {self.path}", f"drop `resume` to start a new {self.kind}")

    def _marker_kind(self, overwrite: bool) -> str | None:
        """The kind run.json names (this folder's own kind without one); `overwrite` replaces an unreadable one."""
        try:
            return folder_kind(self.path) if (self.path / MARKER).is_file() else self.kind
        except PosbiasError:
            if overwrite:
                return self.kind
            raise

    @contextmanager
    def open(self, fingerprint: dict, resume: bool, overwrite: bool, inputs: list[dict] | None = None) -> Iterator["RunFolder"]:
        """Lock the folder, then resume (same fingerprint, and the same data: `inputs`, the files the run reads with
        their SHA-256, recorded in run.json) or start afresh; the lock is released on exit."""
        self.check(resume, overwrite)
        if self.path is None or not is_main_process():
            self.resuming = resume and self.path is not None
            yield self
            return
        self.path.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if resume:  # run.json stays as the run's first command wrote it (same fingerprint: checked)
                self._compare(fingerprint, inputs)
            else:
                self._clear()
                write_json_atomic(self.file(MARKER), {"kind": self.kind, "result": self.result, "fingerprint": fingerprint,
                                                      "command": command_line(), **({"inputs": inputs} if inputs else {})},
                                  indent=2)
            self.resuming = resume
            yield self

    def finish(self, record: dict, indent: int | None = 2, allow_nan: bool = True) -> None:
        """Write the result file atomically: the last file a run writes."""
        if self.path is not None and is_main_process():
            write_json_atomic(self.file(self.result), record, indent=indent, allow_nan=allow_nan)

    def read_result(self) -> dict:
        return read_json(self.file(self.result), f"{self.kind} result")

    def _compare(self, fingerprint: dict, inputs: list[dict] | None = None) -> None:
        marker = self.file(MARKER)
        if not marker.exists():
            raise PosbiasError(f"{self.path} has no {MARKER}, so it cannot be resumed (an older posbias wrote it?)",
                               "pass `overwrite=True` to start again")
        old = read_json(marker, "run marker")
        diffs = _diff(old.get("fingerprint"), json.loads(json.dumps(fingerprint)))
        if diffs:
            raise PosbiasError(f"{self.path} holds a {self.kind} with a different configuration ({'; '.join(diffs[:3])})",
                               "rerun it with the same options, or pass `overwrite=True`")
        was = {i.get("file") or i.get("path"): i.get("sha256") for i in old.get("inputs") or ()}
        for now in inputs or ():
            key = now.get("file") or now.get("path")
            if key in was and was[key] != now.get("sha256"):  # the same file name, other bytes: other data
                raise PosbiasError(f"{self.path} holds a {self.kind} of other data: {key} had SHA-256 {was[key][:12]}..., "
                                   f"{now['path']} has {now['sha256'][:12]}...",
                                   "resume it with the data it started on (`posbias data verify`), or pass `overwrite=True`")

    def _clear(self) -> None:
        for p in self._paths():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        path, me = self.file(LOCK), f"{os.getpid()} {socket.gethostname()}"
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # a lock whose process is gone (or a half-written one) is removed; a live one refuses
                refuse_live_writer(path, self.path)
                path.unlink(missing_ok=True)
                continue
            os.write(fd, me.encode())
            os.close(fd)
            break
        else:
            raise PosbiasError(f"could not lock {self.path}", "pass another `out`")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
