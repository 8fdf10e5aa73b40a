"""Positional hidden-channel scaling (Yu et al. 2025): one hidden channel that varies monotonically with
position is scaled by s when the last token's query and the keys are computed, in the middle layers.

Spec forms:
  hidden:DIR                         a `posbias hidden search` folder (its hidden.json: channel, scale, layers,
                                     the model it was found on, and the calibration split compare must avoid)
  hidden:CHANNEL:SCALE[:A-B]         explicit; layers A..B inclusive, default the paper's middle layers
                                     (models/hidden.middle_layers: 9..23 of SmolLM2's 30)
  hidden:channel=C,scale=S,layers=A-B | hidden:source=DIR     the same as key=value pairs (posbias/specs.py)

The model-side work is in models/hidden.py; this is the Method wrapper.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method
from .registry import register_method

RESULT = "hidden.json"
_USAGE_FIX = ("write it as hidden:DIR (a `posbias hidden search` folder) or hidden:CHANNEL:SCALE[:A-B], e.g. hidden:123:0:9-23 "
              "(or hidden:channel=123,scale=0,layers=9-23)")


def parse_layers(text: str) -> list[int]:
    """`a-b` (inclusive) or `a,b,c` -> layer indices."""
    try:
        if "-" in text:
            a, b = (int(x) for x in text.split("-"))
            out = list(range(a, b + 1))
        else:
            out = [int(x) for x in text.split(",")]
    except ValueError:
        raise PosbiasError(f"bad hidden-scaling layers {text!r}", _USAGE_FIX) from None
    if not out or min(out) < 0:
        raise PosbiasError(f"hidden-scaling layers {text!r} name no layer", _USAGE_FIX)
    return out


def layers_text(layers: list[int]) -> str:
    contiguous = layers == list(range(layers[0], layers[-1] + 1))
    return f"{layers[0]}-{layers[-1]}" if contiguous else ",".join(map(str, layers))


def read_search(path: str | Path) -> dict:
    """The record a hidden-channel search wrote (DIR/hidden.json), checked."""
    from ..runs import read_json

    p = Path(path)
    p = p / RESULT if p.is_dir() else p
    if not p.is_file():
        if (p.parent / "run.json").is_file():
            kind = read_json(p.parent / "run.json", "run marker").get("kind")
            if kind != "hidden-search":
                raise PosbiasError(f"{p.parent} holds a {kind}, not a hidden-channel search", _USAGE_FIX)
            raise PosbiasError(f"{p.parent} holds an unfinished hidden-channel search (no {RESULT})",
                               f"finish it with `posbias hidden search ... --out {p.parent} --resume`")
        raise PosbiasError(f"no hidden-channel search at {p}", _USAGE_FIX)
    rec = read_json(p, "hidden-channel search")
    try:
        int(rec["channel"]), float(rec["scale"]), list(rec["layers"]), rec["model_info"]["name"]
    except (KeyError, TypeError, ValueError):
        raise PosbiasError(f"{p} is not a hidden-channel search result", "rerun the search into a fresh folder") from None
    return {**rec, "path": str(p)}


@register_method
class HiddenScale(Method):
    """Scale hidden channel `channel` by `scale` for the last token's query and the keys, in `layers`."""

    name = "hidden"
    usage = "hidden:DIR|hidden:CHANNEL:SCALE[:A-B]"
    prefix_note = "the query rows from the prompt's end onwards are recomputed from a scaled hidden channel"

    def __init__(self, channel: int, scale: float, layers: list[int] | None = None, source: str | None = None,
                 model: dict | None = None):
        if channel < 0 or not math.isfinite(scale):
            raise PosbiasError(f"hidden scaling needs a channel >= 0 and a finite scale, got {channel}, {scale}", _USAGE_FIX)
        self.channel, self.scale = int(channel), float(scale)
        self.layers = sorted(set(layers)) if layers else None  # None: models/hidden.middle_layers of the model
        self.source, self.model = source, model  # the search folder, and the model it was found on

    @classmethod
    def from_spec(cls, arg: str) -> "HiddenScale":
        parts = arg.split(":") if arg else []
        if not parts:
            raise PosbiasError("hidden needs a search folder or a channel and a scale", _USAGE_FIX)
        if len(parts) == 1 or not parts[0].strip().lstrip("-").isdigit():
            return cls.from_params(source=arg)
        if len(parts) > 3:
            raise PosbiasError(f"bad hidden spec {arg!r}", _USAGE_FIX)
        try:
            channel, scale = int(parts[0]), float(parts[1])
        except ValueError:
            raise PosbiasError(f"bad hidden spec {arg!r}", _USAGE_FIX) from None
        return cls(channel, scale, parse_layers(parts[2]) if len(parts) == 3 else None)

    @classmethod
    def from_params(cls, channel: int | None = None, scale: float | None = None, layers: list[int] | None = None,
                    source: str | None = None) -> "HiddenScale":
        """`hidden:channel=C,scale=S[,layers=A-B]`, or `hidden:source=DIR` (a search folder: all of them from it)."""
        if source is None:
            if channel is None or scale is None:
                raise PosbiasError("hidden needs a channel and a scale, or a search folder", _USAGE_FIX)
            return cls(channel, scale, layers)
        if (channel, scale, layers) != (None, None, None):
            raise PosbiasError("hidden takes a search folder or a channel and a scale, not both", _USAGE_FIX)
        rec = read_search(source)
        info = rec["model_info"]
        method = cls(rec["channel"], rec["scale"], rec["layers"], source=rec["path"],
                     model={k: info.get(k) for k in ("name", "hidden_size", "n_layers")})
        method.fitted_on = rec.get("fitted_on")
        return method

    @property
    def label(self) -> str:
        if self.source:
            return f"hidden:{Path(self.source).parent.name}"
        where = f":{layers_text(self.layers)}" if self.layers else ""
        return f"hidden:{self.channel}:{self.scale:g}{where}"

    def config(self) -> dict:
        return {"name": self.name, "channel": self.channel, "scale": self.scale, "layers": self.layers,
                "source": self.source, "model": self.model}

    def resolved_layers(self, model) -> list[int]:
        from ..models.hidden import decoder_layers, middle_layers

        return self.layers or middle_layers(len(decoder_layers(model)))

    def check(self, loaded: Loaded) -> None:
        from ..models.hidden import check_model

        if self.model is not None:
            cfg = loaded.model.config
            have = {"hidden_size": int(cfg.hidden_size), "n_layers": int(cfg.num_hidden_layers)}
            diff = [f"{k} {self.model.get(k)} vs {v}" for k, v in have.items() if self.model.get(k) not in (None, v)]
            if self.model.get("name") != loaded.info.get("name") or diff:
                raise PosbiasError(f"the hidden channel in {self.source} was found on {self.model.get('name')}, not on "
                                   f"{loaded.info.get('name')}{' (' + ', '.join(diff) + ')' if diff else ''}",
                                   "run `posbias hidden search` on this model, or pass hidden:CHANNEL:SCALE")
        check_model(loaded.model, self.channel, self.resolved_layers(loaded.model))

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.hidden import hidden_scaling

        with hidden_scaling(loaded.model, self.channel, self.scale, self.resolved_layers(loaded.model)) as st:
            yield _HiddenActive(st)


class _HiddenActive(Active):
    """Teacher forcing scores prompt + answer in one forward: the rows from the last prompt token on are the
    ones generation computes with the scaled query (the public code's last_recompute_tokens = answer + 1)."""

    def __init__(self, st):
        self.st = st

    def set_prompt_end(self, cols) -> None:
        self.st.set_prompt_end(cols)
