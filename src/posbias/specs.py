"""One parser for `key=value,key=value` spec strings (lm-evaluation-harness's `create_from_arg_string` habit): the
generic form of every method spec (`mspoe:min_ratio=1.2,max_ratio=1.8`), task spec (`kv-lookup:facts=30`) and the
keys of a model spec (`vllm:DIR,max_model_len=4096`, backends/spec.py).

Grammar of the part after `NAME:`:

- pairs `key=value` separated by commas; the first `=` of a pair splits it, so a value may hold `=` but not `,`;
- a list value is its items, comma-separated, after the key: `factors=1,1.1,1.2`; an item without `=` belongs to
  the key before it. In a list of whole numbers an item may be a range `A-B` (inclusive): `layers=9-23`;
- values are converted by the annotation of the parameter they fill: int, float, bool (true/false, yes/no,
  on/off, 1/0), str, `none` / `null` where None is allowed, lists and tuples of those; a key without a type
  (a backend's pass-through key) becomes an int, a float, true/false or else the text;
- an unknown key, a key given twice, a missing required key, a value of the wrong type or an item before the first
  key is refused in one line that says which keys there are;
- a method or task argument is read as pairs only when one of its comma items starts with `key=` (a bare
  identifier then `=`); any other argument is the class's own short form (`pi:1.2`, `jsonl:PATH`), as before.

What a key means is written once, as a `name: text` entry of the docstring of what takes it (`doc_entries`): a
config's fields (eval/config.py `field_docs`, the CLI's help) and a task builder's options (tasks/registry.py).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import PosbiasError

_ENTRY = re.compile(r"([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)")
_KEY = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")
_RANGE = re.compile(r"(\d+)-(\d+)")
_TRUE, _FALSE, _NULL = ("true", "yes", "on", "1"), ("false", "no", "off", "0"), ("none", "null")


@dataclass(frozen=True)
class Param:
    """One key of a key=value form: its type (None: untyped, see `guess`) and whether it must be given."""

    annotation: Any = None
    required: bool = False


def is_pairs(text: str) -> bool:
    """Whether an argument is in the key=value form: one of its comma items starts with `key=`."""
    return any(_KEY.match(item) for item in text.split(","))


def split_pairs(text: str, what: str, fix: str, head: bool = False) -> tuple[str | None, dict[str, list[str]]]:
    """(the bare first item, or None; {key: its raw values}) of `text`. head: a first item without `=` is allowed
    (a model spec's model, a task's PATH). `what` names the spec in errors, `fix` says how to write it."""
    first, pairs, last = None, {}, None
    for i, item in enumerate(p.strip() for p in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if eq:
            key = key.strip()
            if not key.isidentifier():
                raise PosbiasError(f"'{item}' in {what} has no key before its '='", fix)
            if key in pairs:
                raise PosbiasError(f"'{key}' is given twice in {what}", f"give each key once ({fix})")
            pairs[key], last = [value.strip()], key
        elif last is not None:
            pairs[last].append(item)  # a list value goes on
        elif head and i == 0:
            first = item
        else:
            raise PosbiasError(f"'{item}' in {what} is not key=value", fix)
    return first, pairs


def guess(raw: str) -> Any:
    """An untyped value: int, float, true/false, else the text."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def parameters(fn: Callable, skip: tuple[str, ...] = ()) -> dict[str, Param]:
    """The keys a function takes by name, with their annotations (resolved) and whether they have no default."""
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # an annotation that does not resolve: untyped
        hints = {}
    return {name: Param(hints.get(name), p.default is inspect.Parameter.empty)
            for name, p in inspect.signature(fn).parameters.items()
            if name not in skip and name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def doc_entries(obj: Any) -> list[tuple[list[str], str]]:
    """The `name: text` entries of the docstring of `obj` (a class's own, not a base's; a function's), in order:
    (names, text), continuation lines joined.

    An entry starts at the docstring's left margin with one field name (or several, comma-separated, for a
    reference such as "model, dtype: see `ModelChoice`") and a colon; more-indented lines continue it; a blank
    line or the next line at the margin ends it."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    entries: list[tuple[list[str], str]] = []
    open_entry = False
    for line in inspect.cleandoc(doc or "").splitlines():
        m = _ENTRY.fullmatch(line)
        if m:
            entries.append((m[1].split(", "), m[2].strip()))
        elif open_entry and line.startswith(" ") and line.strip():
            names, text = entries[-1]
            entries[-1] = (names, f"{text} {line.strip()}")
        open_entry = bool(m) or (open_entry and line.startswith(" ") and bool(line.strip()))
    return entries


def bind(pairs: dict[str, list[str]], params: dict[str, Param], what: str, example: str) -> dict:
    """The pairs as keyword arguments for `params`: unknown and missing keys refused, values converted. `what` names
    the spec in errors, `example` shows its form."""
    keys = ", ".join(params) or "none"
    for key in pairs:
        if key not in params:
            raise PosbiasError(f"{what} has no key '{key}'", f"use its keys: {keys} ({example})")
    for key, p in params.items():
        if p.required and key not in pairs:
            raise PosbiasError(f"{what} needs '{key}'", f"add {key}=VALUE ({example})")
    return {key: convert(raw, params[key].annotation, key, what) for key, raw in pairs.items()}


def convert(raw: list[str], annotation: Any, key: str, what: str) -> Any:
    """The raw values of one key as its annotation asks (see the module docstring)."""
    if annotation is None or annotation is Any:
        return guess(raw[0]) if len(raw) == 1 else [guess(r) for r in raw]
    for choice in _choices(annotation):
        try:
            return _as(choice, raw)
        except (ValueError, TypeError):
            continue
    raise PosbiasError(f"'{key}' in {what} takes {_kind(annotation)}, got '{','.join(raw)}'",
                       f"write {key}={_sample(annotation)}")


def _choices(annotation: Any) -> list:
    """The alternatives of a union (None first, so `none` means None where it is allowed), else [annotation]."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return [a for a in args if a is type(None)] + [a for a in args if a is not type(None)]
    return [annotation]


def _as(kind: Any, raw: list[str]) -> Any:
    """raw as `kind`; ValueError when it is not one."""
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        item = (typing.get_args(kind) or (str,))[0]
        values = [v for r in raw for v in _items(item, r)]
        return values if origin is list else tuple(values)
    if len(raw) != 1:
        raise ValueError("one value expected")
    return _scalar(kind, raw[0])


def _items(kind: Any, raw: str) -> list:
    m = _RANGE.fullmatch(raw)
    if kind is int and m and int(m[1]) <= int(m[2]):
        return list(range(int(m[1]), int(m[2]) + 1))
    return [_scalar(kind, raw)]


def _scalar(kind: Any, raw: str) -> Any:
    low = raw.lower()
    if kind is type(None):
        if low not in _NULL:
            raise ValueError(raw)
        return None
    if kind is bool:
        if low not in _TRUE + _FALSE:
            raise ValueError(raw)
        return low in _TRUE
    if kind in (int, float):
        return kind(raw)
    if kind is Path:
        return Path(raw)
    if kind is str:
        return raw
    raise TypeError(f"no conversion to {kind}")


def _kind(annotation: Any) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "text", Path: "a path",
             type(None): "none"}
    parts = []
    for choice in _choices(annotation):
        origin = typing.get_origin(choice)
        if origin in (list, tuple):
            item = (typing.get_args(choice) or (str,))[0]
            parts.append(f"a list of {'whole numbers' if item is int else 'numbers' if item is float else 'values'}")
        else:
            parts.append(names.get(choice, getattr(choice, "__name__", str(choice))))
    return " or ".join(parts)


def _sample(annotation: Any) -> str:
    """A valid value for the annotation, for a fix."""
    choice = ([c for c in _choices(annotation) if c is not type(None)] or [type(None)])[0]
    if typing.get_origin(choice) in (list, tuple):
        return "1,2,3" if (typing.get_args(choice) or (str,))[0] is int else "1,1.5,2"
    return {int: "2", float: "1.5", bool: "true", type(None): "none"}.get(choice, "VALUE")
