"""Ms-PoE (Zhang et al. 2024): per-head position scaling from min to max ratio, heads ordered by
how position-aware their attention is on the current input. The model-side work is in
models/mspoe.py; this is the Method wrapper."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method
from .registry import register_method


@register_method
class MsPoE(Method):
    name = "mspoe"
    usage = "mspoe[:MIN-MAX]"

    def __init__(self, min_ratio: float = 1.2, max_ratio: float = 1.8, layers: list[int] | None = None):
        if not 0 < min_ratio <= max_ratio:
            raise PosbiasError(f"Ms-PoE ratios must satisfy 0 < min <= max, got {min_ratio}-{max_ratio}",
                               "write it as mspoe:1.2-1.8")
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self.layers = layers  # None: every layer but the first two (the public scripts' choice)

    @classmethod
    def from_spec(cls, arg: str) -> "MsPoE":
        if not arg:
            return cls()
        try:
            lo, hi = (float(x) for x in arg.split("-"))
        except ValueError:
            raise PosbiasError(f"bad Ms-PoE ratios {arg!r}", "write them as mspoe:MIN-MAX, e.g. mspoe:1.2-1.8") from None
        return cls(lo, hi)

    @property
    def label(self) -> str:
        return f"mspoe:{self.min_ratio:g}-{self.max_ratio:g}"

    def config(self) -> dict:
        return {"name": "mspoe", "min_ratio": self.min_ratio, "max_ratio": self.max_ratio, "layers": self.layers}

    def check(self, loaded: Loaded) -> None:
        from ..models.mspoe import check_model

        check_model(loaded.model, self.layers)

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.mspoe import mspoe

        with mspoe(loaded.model, min_ratio=self.min_ratio, max_ratio=self.max_ratio, layers=self.layers) as ms:
            yield _MsPoEActive(ms)


class _MsPoEActive(Active):
    """Teacher forcing scores prompt + answer in one forward; Ms-PoE must rank its heads at the
    last prompt token (as generation does), not at the last answer token."""

    def __init__(self, ms):
        self.ms = ms

    def set_prompt_end(self, cols) -> None:
        self.ms.order_query = cols
