"""The one way a pipeline gets its model: a model it was given is used as it is, and left open; a spec is opened,
and closed when the pipeline is done with it (sweep, grid and compare)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..backends import Backend, ModelSpec, as_backend, open_backend
from ..models.load import Loaded
from ..scoring.scaleout import start_processes
from .config import ModelChoice


@contextmanager
def opened(model: str | ModelSpec | Loaded | Backend, choice: ModelChoice, progress: bool = True) -> Iterator[Backend]:
    """The backend to run on: `model` as it is if the caller holds it (a `Loaded` model, wrapped, or an open
    `Backend`: never closed here), else opened from the spec with `choice`'s dtype, device and device map, and
    closed on leaving (also on an error). Several processes: each joins the launcher's group first, before a model
    loads (scoring/scaleout.py)."""
    start_processes()
    if isinstance(model, (Loaded, Backend)):
        yield as_backend(model)
        return
    backend = open_backend(model, choice.dtype, choice.device, progress, choice.device_map)
    try:
        yield backend
    finally:
        backend.close()
