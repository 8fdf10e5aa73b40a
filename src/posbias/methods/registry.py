"""The method registry: `get_method("pi:1.2")`, `get_method("pi:factor=1.2")`, `register_method(MyMethod)`,
`split_specs("none,buckets:1e4,2e4,mspoe:min_ratio=1.2,max_ratio=1.8")`.

A spec is `name`, `name:ARG` in the method's own short form (its `usage`; its `from_spec` reads ARG), or the generic
`name:key=value,...` that every method takes (posbias/specs.py): its keys are `Method.spec_params()`, the constructor's
parameters unless the class declares its own `from_params`.
"""

from __future__ import annotations

from ..errors import PosbiasError
from ..registry import Registry
from ..specs import bind, is_pairs, split_pairs
from .base import Baseline, Method

METHODS = Registry("method")  # name -> Method class
ALIASES = {"baseline": "none", "": "none"}


def register_method(cls: type[Method]) -> type[Method]:
    """Register a Method subclass under its `name` (usable as a class decorator); a taken name is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Method)) or not getattr(cls, "name", ""):
        raise PosbiasError(f"{cls!r} is not a Method subclass with a name", "subclass posbias.Method and set `name`")
    return METHODS.add(cls.name, cls)


def get_method(spec: str | Method) -> Method:
    """A Method from a spec string `name[:arg]` or `name:key=value,...` (see METHODS and `usage`); objects pass through."""
    if isinstance(spec, Method):
        return spec
    text = str(spec).strip()
    name, _, arg = text.partition(":")
    cls = METHODS.get(ALIASES.get(name, name))
    if cls is None:
        known = ", ".join(c.usage or n for n, c in METHODS.items())
        raise PosbiasError(f"unknown method {text!r}", f"use one of: {known} (each also as NAME:key=value,...)")
    arg = arg.strip()
    method = from_pairs(cls, arg, text) if is_pairs(arg) else cls.from_spec(arg)
    method.spec = text or "none"
    return method


def from_pairs(cls: type[Method], arg: str, text: str) -> Method:
    """The method for `name:key=value,...`: the pairs bound to `cls.spec_params()`, then `cls.from_params`."""
    what, forms = f"method spec '{text}'", cls.pairs_form()
    _, pairs = split_pairs(arg, what, f"write it as {forms}")
    return cls.from_params(**bind(pairs, cls.spec_params(), what, forms))


def split_specs(text: str) -> list[str]:
    """Split a comma list of method specs. A comma continues the spec before it when what follows is not a method
    name and the spec has an argument, and it is a number (`buckets:10000,20000`, `layers:1,1.1`) or a key=value
    pair (`mspoe:min_ratio=1.2,max_ratio=1.8`); so `none,buckets:10000,20000,pi:factor=1.5` is three specs and
    `none,bogus` two (the second unknown)."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if specs and part and _continues(specs[-1], part):
            specs[-1] += "," + part
        elif part:
            specs.append(part)
    return specs


def _continues(spec: str, part: str) -> bool:
    """Whether `part` (after a comma) belongs to `spec`: a number, or a pair after pairs, not a method's name."""
    _, colon, arg = spec.partition(":")
    head = part.partition(":")[0]
    if not colon or head in METHODS or head in ALIASES:
        return False
    return part[:1] in tuple("0123456789.+-") or (is_pairs(part) and is_pairs(arg))


register_method(Baseline)
