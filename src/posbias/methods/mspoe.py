"""Ms-PoE (Zhang et al. 2024): per-head position scaling from min to max ratio, heads ordered by
how position-aware their attention is on the current input. Under grouped-query attention one ratio
per KV group (`mspoe`, mode "group") or one per query head (`mspoe:query`, the paper's rule). The
model-side work is in models/mspoe.py; this is the Method wrapper."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method
from .registry import register_method


@register_method
class MsPoE(Method):
    """Ms-PoE (Zhang et al. 2024): positions rescaled per head, ratios assigned by each head's position-awareness."""

    name = "mspoe"
    usage = "mspoe[:MIN-MAX][:query]"
    prefix_note = "Ms-PoE ranks its heads at each prompt's end and re-rotates the whole prompt per head"
    modes = ("group", "query")  # one ratio per KV group (default) | per query head (the paper's rule)

    def __init__(self, min_ratio: float = 1.2, max_ratio: float = 1.8, layers: list[int] | None = None,
                 mode: str = "group"):
        if not 0 < min_ratio <= max_ratio:
            raise PosbiasError(f"Ms-PoE ratios must satisfy 0 < min <= max, got {min_ratio}-{max_ratio}",
                               "write it as mspoe:1.2-1.8")
        if mode not in self.modes:
            raise PosbiasError(f"unknown Ms-PoE mode {mode!r}", "write mspoe (per KV group) or mspoe:query (per query head)")
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self.layers = layers  # None: every layer but the first two (the public scripts' choice)
        self.mode = mode

    @classmethod
    def from_spec(cls, arg: str) -> "MsPoE":
        """`` (defaults), `MIN-MAX`, `query` / `group`, or `MIN-MAX:query` / `MIN-MAX:group`."""
        parts = arg.split(":") if arg else []
        mode = parts.pop() if parts and parts[-1] in cls.modes else "group"
        if not parts:
            return cls(mode=mode)
        try:
            (ratios,) = parts
            lo, hi = (float(x) for x in ratios.split("-"))
        except ValueError:
            raise PosbiasError(f"bad Ms-PoE spec {arg!r}",
                               "write it as mspoe[:MIN-MAX][:query], e.g. mspoe:1.2-1.8 or mspoe:1.2-1.8:query") from None
        return cls(lo, hi, mode=mode)

    @property
    def label(self) -> str:
        return f"mspoe:{self.min_ratio:g}-{self.max_ratio:g}:{self.mode}"

    def config(self) -> dict:
        return {"name": "mspoe", "min_ratio": self.min_ratio, "max_ratio": self.max_ratio, "layers": self.layers,
                "mode": self.mode}

    def check(self, loaded: Loaded) -> None:
        from ..models.mspoe import check_model

        check_model(loaded.model, self.layers)

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.mspoe import mspoe

        with mspoe(loaded.model, self.min_ratio, self.max_ratio, self.layers, self.mode) as ms:
            yield _MsPoEActive(ms)


class _MsPoEActive(Active):
    """Teacher forcing scores prompt + answer in one forward; Ms-PoE must rank its heads at the
    last prompt token (as generation does), not at the last answer token."""

    def __init__(self, ms):
        self.ms = ms

    def set_prompt_end(self, cols) -> None:
        self.ms.order_query = cols
