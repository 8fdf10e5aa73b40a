"""The method registry: `get_method("pi:1.2")`, `register_method(MyMethod)`, `split_specs("none,buckets:1e4,2e4")`."""

from __future__ import annotations

from ..errors import PosbiasError
from .base import Baseline, Method

METHODS: dict[str, type[Method]] = {}
ALIASES = {"baseline": "none", "": "none"}


def register_method(cls: type[Method]) -> type[Method]:
    """Register a Method subclass under its `name` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Method)) or not getattr(cls, "name", ""):
        raise PosbiasError(f"{cls!r} is not a Method subclass with a name", "subclass posbias.Method and set `name`")
    METHODS[cls.name] = cls
    return cls


def get_method(spec: str | Method) -> Method:
    """A Method from a spec string `name[:arg]` (see METHODS and each class's usage); objects pass through."""
    if isinstance(spec, Method):
        return spec
    text = str(spec).strip()
    name, _, arg = text.partition(":")
    cls = METHODS.get(ALIASES.get(name, name))
    if cls is None:
        raise PosbiasError(f"unknown method {text!r}", f"use one of: {', '.join(c.usage or n for n, c in METHODS.items())}")
    method = cls.from_spec(arg.strip())
    method.spec = text or "none"
    return method


def split_specs(text: str) -> list[str]:
    """Split a comma list of method specs; a comma continues a spec's argument list only before a number, so
    `none,buckets:10000,20000,layers:1,1.1` is three specs and `none,bogus` two (the second unknown)."""
    specs: list[str] = []
    for part in text.split(","):
        name = part.strip().partition(":")[0]
        numeric = part.strip()[:1] in tuple("0123456789.+-")
        if specs and name not in METHODS and name not in ALIASES and ":" in specs[-1] and numeric:
            specs[-1] += "," + part.strip()
        elif part.strip():
            specs.append(part.strip())
    return specs


register_method(Baseline)
