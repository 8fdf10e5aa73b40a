"""`posbias data fetch / verify / list`: download the pinned originals, rebuild our copies from them, check hashes.

The download, its cache layout, retries and hash checks are pooch's (a file lands under its registry name only once
its SHA-256 matches; a failed or mismatched download leaves nothing behind); the folder comes from the lookup order
(data/lookup.py). A verbatim file is downloaded to its own name; a built one's sources go to `.sources/REPO/COMMIT/
PATH` in the same folder (kept, so a damaged built file is rebuilt without the network) and the file is written,
atomically, only when its bytes hash to the pinned SHA-256. A second fetch hashes what is there and downloads nothing.

The base URL is GitHub's raw file server; $POSBIAS_DATA_URL (or `base_url=`) names a mirror of the same layout
(`{base}/{owner}/{repo}/{commit}/{path}`).
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import PosbiasError
from ..runs import progress
from .build import content_sha256
from .lookup import get_dataset, locate, roots, sha256, target
from .registry import DATASETS, GITHUB, DataFile, DataSet, Source

URL_ENV = "POSBIAS_DATA_URL"
TIMEOUT = 30  # seconds without an answer before a download is given up
_TMP = re.compile(r"tmp[a-z0-9_]{8}")  # tempfile's names: what a download killed mid-way left (pooch's temporary)


@dataclass(frozen=True)
class FileState:
    """One data file in one folder: `status` is ok | rebuilt-alike (the same records, compressed otherwise by this
    zlib) | mismatch | missing, or for a fetch downloaded | built."""

    dataset: str
    file: str
    path: Path
    status: str

    def line(self) -> str:
        return f"{self.dataset:8s} {self.file:42s} {self.status:14s} {self.path}"


def base_url(base: str | None = None) -> str:
    return base or os.environ.get(URL_ENV) or GITHUB


def names_of(names) -> list[str]:
    """The data sets a command names: a list of names, or ["all"] for every one; an unknown name refused."""
    names = list(names or [])
    if not names:
        raise PosbiasError("no data set named", f"name one or more ({', '.join(DATASETS)}) or `all`")
    if "all" in names:
        return list(DATASETS)
    return [get_dataset(n).name for n in names]


def check(path: Path, f: DataFile) -> str:
    """ok | rebuilt-alike | mismatch | missing: `path` against the pinned file `f`."""
    if not path.is_file():
        return "missing"
    if sha256(path) == f.sha256:
        return "ok"
    if f.content_sha256 and path.suffix == ".gz":
        try:
            if content_sha256(path.read_bytes()) == f.content_sha256:
                return "rebuilt-alike"
        except (OSError, EOFError, zlib.error):  # not a whole gzip file: not the pinned one either
            pass
    return "mismatch"


def fetch(names, data_dir: str | Path | None = None, *, base: str | None = None, retries: int = 2,
          show_progress: bool = True) -> list[FileState]:
    """Download, build and verify every file of the named data sets (["all"]: every one) into the folder a fetch writes
    (data/lookup.py `target`); what is there and matches is kept, downloading nothing. Any failure is one
    PosbiasError naming the URL and the fix; nothing half-written is left under a data file's name."""
    root = target(data_dir)
    _writable(root)
    states = []
    for name in names_of(names):
        ds = get_dataset(name)
        for f in ds.files:
            dest = root / f.name
            if check(dest, f) in ("ok", "rebuilt-alike"):
                states.append(FileState(name, f.name, dest, "present"))
                continue
            states.append(FileState(name, f.name, dest, _get(root, ds, f, base_url(base), retries, show_progress)))
    return states


def _get(root: Path, ds: DataSet, f: DataFile, base: str, retries: int, show: bool) -> str:
    if f.build is None:  # verbatim: downloaded straight to its name
        _download(root, f.name, f.sources[0], ds.name, base, retries, show)
        return "downloaded"
    paths = [_download(root, s.key, s, ds.name, base, retries, show) for s in f.sources]
    data = f.build(paths)
    dest = root / f.name
    got = _digest(data)
    if got != f.sha256 and not (f.content_sha256 and content_sha256(data) == f.content_sha256):
        raise PosbiasError(f"{f.name} built from its verified sources hashes to {got[:12]}..., not the pinned "
                           f"{f.sha256[:12]}... (the builder or this Python's json differs from the copy's)",
                           "report it with `posbias data list` and your Python version; nothing was written")
    tmp = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return "built" if got == f.sha256 else "rebuilt-alike"


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _download(root: Path, key: str, src: Source, name: str, base: str, retries: int, show: bool) -> Path:
    """`src` into root/key through pooch (kept if it is there and matches); failures as one line each."""
    import pooch
    import requests

    _sweep((root / key).parent)
    url = src.url(base)
    store = pooch.create(path=root, base_url=base, registry={key: f"sha256:{src.sha256}"}, urls={key: url},
                         retry_if_failed=retries)
    pooch.get_logger().setLevel("WARNING")  # its "Downloading file ..." lines: the bar and fetch's own lines say it
    bar = progress(0, Path(src.path).name, "B", enabled=show, unit_scale=True, leave=False)
    again = f"run `posbias data fetch {name}` again"
    try:
        got = Path(store.fetch(key, downloader=pooch.HTTPDownloader(progressbar=bar if show else False,
                                                                    timeout=TIMEOUT)))
        _readable(got)
        return got
    except requests.exceptions.HTTPError as e:
        code = e.response.status_code if e.response is not None else "?"
        reason = e.response.reason if e.response is not None else ""
        raise PosbiasError(f"{url} answered HTTP {code} {reason}".rstrip(),
                           f"the file moved or the mirror lacks it: check `base` / {URL_ENV} (a mirror of GitHub's raw "
                           "layout, BASE/OWNER/REPO/COMMIT/PATH)") from None
    except requests.exceptions.ProxyError as e:
        raise PosbiasError(f"the proxy refused {url} ({_why(e)})",
                           f"check HTTPS_PROXY / HTTP_PROXY / NO_PROXY, then {again}") from None
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as e:
        raise PosbiasError(f"the download of {url} was cut short ({_why(e)}); nothing partial was kept", again) from None
    except requests.exceptions.Timeout:
        raise PosbiasError(f"no answer from {url} within {TIMEOUT} s", f"check the network, then {again}") from None
    except requests.exceptions.RequestException as e:  # no network, refused, a name that does not resolve
        raise PosbiasError(f"cannot reach {url} ({_why(e)})",
                           f"connect to the network (or set {URL_ENV} to a mirror), then {again}") from None
    except ValueError as e:  # pooch: the downloaded file's hash is not the pinned one (the download was deleted)
        got = re.search(r"got ([0-9a-f]{64})", str(e))
        raise PosbiasError(f"{url} sent a file whose SHA-256 is {got[1][:12] if got else '?'}..., not the pinned "
                           f"{src.sha256[:12]}... (corrupted on the way, or changed at the source); nothing was kept",
                           f"{again}; if it fails the same way, the source changed: fetch from a mirror ({URL_ENV})") from None
    finally:
        bar.close()


def _why(e: BaseException) -> str:
    """The innermost reason of a requests error (`[Errno 111] Connection refused`, `IncompleteRead(...)`), one line."""
    depth, deepest, todo, seen = -1, e, [(e, 0)], set()
    while todo:
        x, d = todo.pop()
        if d > depth:
            depth, deepest = d, x
        for inner in (*x.args, getattr(x, "reason", None), x.__cause__, x.__context__):
            if isinstance(inner, BaseException) and id(inner) not in seen:
                seen.add(id(inner))
                todo.append((inner, d + 1))
    text = re.sub(r"<[^>]*>: ", "", str(deepest))  # urllib3's "<HTTPConnection object at 0x..>: "
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    return " ".join((errno[0] if errno else text or type(deepest).__name__).split())[:160]


def _sweep(folder: Path) -> None:
    """Remove what a download killed mid-way left in `folder` (tempfile names only), so nothing stale piles up."""
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_file() and (_TMP.fullmatch(p.name) or p.name.endswith(".part")):
                p.unlink(missing_ok=True)


def _readable(path: Path) -> None:
    """A downloaded file as a file the user wrote would be (pooch's temporary files are created 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def _writable(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PosbiasError(f"cannot create the data folder {root} ({e.strerror})",
                           "pass `data_dir=DIR` (or set POSBIAS_DATA) to a folder you can write") from None
    if not os.access(root, os.W_OK):
        raise PosbiasError(f"the data folder {root} is not writable",
                           "pass `data_dir=DIR` (or set POSBIAS_DATA) to a folder you can write")


def verify(names=("all",), data_dir: str | Path | None = None) -> list[FileState]:
    """Each file of the named data sets where a task would read it (the lookup order), checked against its pinned
    SHA-256. A data set found nowhere gives one `missing` state per file in the first folder looked in."""
    out = []
    for name in names_of(names):
        ds = get_dataset(name)
        folder = locate(name, data_dir) or roots(data_dir)[0][1]
        out += [FileState(name, f.name, folder / f.name, check(folder / f.name, f)) for f in ds.files]
    return out


def listing(data_dir: str | Path | None = None) -> list[dict]:
    """One dict per data set: name, description, licence, sources (repo@commit), size and download size (bytes),
    the tasks that read it, and where it is read from (None: not here)."""
    rows = []
    for name, ds in DATASETS.items():
        sources = sorted({f"{s.repo}@{s.commit[:7]}" for f in ds.files for s in f.sources})
        here = locate(name, data_dir)
        rows.append({"name": name, "description": ds.description, "licence": ds.licence, "sources": sources,
                     "size": ds.size, "download": ds.download_size, "tasks": ds.tasks,
                     "here": str(here) if here else None})
    return rows
