"""MoICE (Lin et al. 2024): per-head routers mix attention computed with several RoPE bases. The routers are
trained (`posbias moice train`, mitigate/moice/); the model is not, so applying them is a reversible context
like the training-free methods. The model-side work is in models/moice.py; this is the Method wrapper.

`moice:DIR` reads DIR/routers.safetensors (bases and top_k travel in its metadata) and, when DIR is a training
run, DIR/moice.json: the routers' sha256 must match it, and its `fitted_on` (the training examples) makes compare
refuse to report MoICE on them.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import PosbiasError
from ..models.load import Loaded
from ..runs import folder_kind, kind_name
from .base import Active, Method, active_while
from .registry import register_method

ROUTERS = "routers.safetensors"
RESULT = "moice.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_moice_dir(path: str | Path) -> tuple[Path, dict | None]:
    """(routers file, the training record or None) of a MoICE folder (or a routers file), checked."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    routers = p / ROUTERS if p.is_dir() else p
    result = folder / RESULT
    kind = folder_kind(folder)
    if kind not in (None, "moice"):
        raise PosbiasError(f"{folder} holds {kind_name(kind)}, not a MoICE training",
                           "pass the folder `posbias moice train --out DIR` wrote")
    if not result.is_file() and kind == "moice":
        raise PosbiasError(f"{folder} holds an unfinished MoICE training (no {RESULT})",
                           f"finish it with `posbias moice train ... --out {folder} --resume`")
    if not routers.is_file():
        raise PosbiasError(f"no MoICE routers at {routers}", "pass the folder `posbias moice train --out DIR` wrote")
    if not result.is_file():
        return routers, None
    try:
        record = json.loads(result.read_text())
        want = record["routers"]["sha256"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise PosbiasError(f"{result} is not a MoICE result ({type(e).__name__})", "retrain into a fresh folder") from None
    if sha256(routers) != want:
        raise PosbiasError(f"{routers} does not match the sha256 recorded in {result}", "retrain, or restore the file")
    return routers, record


@register_method
class MoICE(Method):
    """Trained MoICE routers (a `posbias moice train` folder)."""

    name = "moice"
    usage = "moice:DIR"
    prefix_note = "MoICE's routers mix attention over several RoPE bases in its own attention path, not checked with a cache"

    def __init__(self, path: str | Path):
        from ..models.moice import Routers

        self.routers_file, self.record = read_moice_dir(path)
        self.path = str(path)
        self.routers = Routers.load(self.routers_file)
        self.digest = sha256(self.routers_file)
        self.fitted_on = (self.record or {}).get("fitted_on")

    @classmethod
    def from_spec(cls, arg: str) -> "MoICE":
        if not arg:
            raise PosbiasError("moice needs trained routers", f"write it as {cls.spec_forms()} (a `posbias moice train` folder)")
        return cls(arg)

    @property
    def label(self) -> str:
        return f"moice:{Path(self.path).name}" if self.path else "moice"

    def config(self) -> dict:
        return {"name": "moice", "path": self.path, "sha256": self.digest, "bases": list(self.routers.bases),
                "top_k": self.routers.top_k}

    def check(self, loaded: Loaded) -> None:
        from ..models.moice import check_routers

        check_routers(loaded.model, self.routers)

    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        from ..models.moice import moice

        device = next(loaded.model.parameters()).device
        return active_while(moice(loaded.model, self.routers.to(device)))
