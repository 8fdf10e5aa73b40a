"""Atomic file writes: a result file either exists complete or not at all."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: str | Path, obj, indent: int | None = None, allow_nan: bool = True) -> None:
    """Write JSON to a temporary file beside `path`, then os.replace it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=allow_nan) + "\n")
    os.replace(tmp, path)
