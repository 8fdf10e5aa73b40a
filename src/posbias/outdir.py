"""Whether this process may write into an output folder: the folder is a directory, or can be created, where files can
be written (tried, not read off the permission bits), and no other live process holds its lock (runs.py's
`RunFolder` writes the lock file, "pid host", while it writes the folder). Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from .errors import PosbiasError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refuse_live_writer(lock: Path, folder: Path) -> None:
    """Raise if another live process (or one on another host) holds the folder's lock."""
    try:
        pid_text, host = lock.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return  # no lock, or a half-written one
    if host != socket.gethostname():
        raise PosbiasError(f"{folder} is locked by a process on {host}",
                           f"if none runs there, delete {lock}; else pass another `out`")
    if pid != os.getpid() and _alive(pid):
        raise PosbiasError(f"{folder} is being written by another posbias process (pid {pid})",
                           "wait for it to finish, or pass another `out`")


def check_out_dir(path: Path) -> None:
    """An output folder must be a directory, or creatable: the nearest existing folder above it writable."""
    if path.exists() and not path.is_dir():
        raise PosbiasError(f"`out` {path} is a file", "pass a directory path")
    _check_writable(path)


def _check_writable(path: Path) -> None:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise PosbiasError(f"`out` {path} cannot be created: {probe} is a file", "pass a directory path")
    if not can_write_in(probe):
        raise PosbiasError(f"`out` {path} cannot be written ({probe} takes no new files)",
                           "pass a folder you can write to, e.g. `out=runs/NAME`")


def can_write_in(folder: Path) -> bool:
    """Whether a file can be created in `folder`: tried (permission bits do not tell for root, /proc, read-only mounts)."""
    try:
        with tempfile.TemporaryFile(prefix=".posbias-probe-", dir=folder):
            return True
    except OSError:
        return False
