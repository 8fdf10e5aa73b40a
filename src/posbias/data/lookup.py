"""Where a data set is read from: one lookup order for every task and command.

  1. `data_dir` (the CLI's --data-dir): a folder you name is the only place looked in;
  2. else $POSBIAS_DATA, likewise;
  3. else the user cache (`cache_dir()`: $POSBIAS_CACHE_DIR/data, else platformdirs' user cache, ~/.cache/posbias/data
     on Linux), where `posbias data fetch` puts what it downloads,
  4. then a development checkout's ../shared/data (the folder beside a clone that runs from source, on the project's
     own machines and CI).

A folder named by 1 or 2 is where a fetch writes too. In every folder a data set's files keep their relative names
(`nq/nq-open-oracle.jsonl.gz`), so a copy of the original layout works as it is.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import PosbiasError
from .registry import DATASETS, DataSet

ENV = "POSBIAS_DATA"


class DataMissing(PosbiasError):
    """A data set a task needs is in none of the folders looked in (the message names the fetch command)."""

    def __init__(self, name: str, data_dir: str | Path | None = None):
        self.dataset = name
        where = "; ".join(f"{label} {p}" for label, p in roots(data_dir))
        super().__init__(f"data set {name} is not here (looked in {where})",
                         f"get it with `posbias data fetch {name}`, or pass `data_dir=DIR` for a copy you have "
                         f"(DIR/{get_dataset(name).files[0].name})")


def get_dataset(name: str) -> DataSet:
    ds = DATASETS.get(name)
    if ds is None:
        raise PosbiasError(f"unknown data set '{name}'", f"use one of: {', '.join(DATASETS)} (`posbias data list`)")
    return ds


def cache_dir() -> Path:
    """The user cache's data folder: $POSBIAS_CACHE_DIR/data (the model cache's root, when set), else
    platformdirs' user cache for posbias, /data."""
    if os.environ.get("POSBIAS_CACHE_DIR"):
        return Path(os.environ["POSBIAS_CACHE_DIR"]).expanduser() / "data"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("posbias", appauthor=False)) / "data"


def checkout_dir() -> Path | None:
    """../shared/data beside the checkout this module runs from (src/posbias/data/ in a clone), if there is one."""
    repo = Path(__file__).resolve().parents[3]
    shared = repo.parent / "shared" / "data"
    return shared if (repo / "pyproject.toml").is_file() and shared.is_dir() else None


def roots(data_dir: str | Path | None = None) -> list[tuple[str, Path]]:
    """(label, folder) in lookup order (module docstring)."""
    if data_dir:
        return [("`data_dir`", Path(data_dir).expanduser())]
    if os.environ.get(ENV):
        return [(ENV, Path(os.environ[ENV]).expanduser())]
    dev = checkout_dir()
    return [("the user cache", cache_dir()), *([("the checkout's", dev)] if dev else [])]  # labels for messages


def target(data_dir: str | Path | None = None) -> Path:
    """Where a fetch writes: `data_dir`, else $POSBIAS_DATA, else the user cache."""
    return roots(data_dir)[0][1]


def has(folder: Path, ds: DataSet) -> bool:
    return all((folder / f.name).is_file() for f in ds.files)


def locate(name: str, data_dir: str | Path | None = None) -> Path | None:
    """The first folder in lookup order that holds every file of data set `name`; None if none does."""
    ds = get_dataset(name)
    return next((folder for _, folder in roots(data_dir) if has(folder, ds)), None)


def require(name: str, data_dir: str | Path | None = None) -> Path:
    """The folder data set `name` is read from; DataMissing (one line naming the fetch command) if it is nowhere."""
    folder = locate(name, data_dir)
    if folder is None:
        raise DataMissing(name, data_dir)
    return folder


def data_file(name: str, file: str, data_dir: str | Path | None = None) -> Path:
    """The path of `file` (its name relative to a data folder, one of data set `name`'s files) from the lookup order."""
    if file not in {f.name for f in get_dataset(name).files}:
        raise ValueError(f"{file} is not a file of data set {name}")  # a task naming a file its data set lacks: a bug
    return require(name, data_dir) / file


def sha256(path: Path) -> str:
    """A file's SHA-256; a folder's: of the lines "HASH  NAME" of its files in name order (what sha256sum prints)."""
    if path.is_dir():
        lines = "".join(f"{sha256(f)}  {f.relative_to(path)}\n" for f in sorted(path.rglob("*")) if f.is_file())
        return hashlib.sha256(lines.encode()).hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance(paths) -> list[dict]:
    """What a run records of the files it read: each path and its SHA-256, and the data set and file name where it is
    a registered data file (known by its last two path parts, `nq/nq-open-oracle.jsonl.gz`)."""
    known = {f.name: ds.name for ds in DATASETS.values() for f in ds.files}
    out = []
    for p in (p for p in map(Path, paths) if p.exists()):
        rel = f"{p.parent.name}/{p.name}"
        out.append({**({"data_set": known[rel], "file": rel} if rel in known else {}), "path": str(p.resolve()),
                    "sha256": sha256(p)})
    return out
