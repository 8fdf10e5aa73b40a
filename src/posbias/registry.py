"""One registration shape for tasks, methods, backends, model names, scoring engines and server dialects, and where
each entry came from.

`TASKS`, `METHODS`, `BACKENDS`, `MODELS`, `ENGINES` and `DIALECTS` are `Registry` objects (dicts: name -> entry),
filled by register_task, register_method, register_backend, register_model, register_engine and register_dialect
(posbias.measure has the last four). `add` validates nothing about the entry (each register_* function does that
first) and refuses a second entry under a taken name, naming both origins. The origin of an entry is the plugin
being loaded when it registered (`plugin NAME (DIST VERSION)`, set by `loading`), else "posbias" for the built-ins,
else the module that defines it (your own code).

Plugins (posbias/plugins.py) are Python packages that declare an entry point in the group "posbias", as pytest's
"pytest11" and simonw/llm's "llm" groups work; loading one imports it, and its registrations are tagged with it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from .errors import PosbiasError

_LOADING: list[str] = []  # the plugin being loaded (a stack: a plugin may load another)


@contextmanager
def loading(origin: str) -> Iterator[None]:
    """Tag every registration made inside with `origin` (a plugin's name)."""
    _LOADING.append(origin)
    try:
        yield
    finally:
        _LOADING.pop()


def origin_of(obj: Any) -> str:
    """Where a registration comes from: the plugin being loaded, posbias itself, or the defining module (`obj`'s, or
    `obj` itself where it is a module's name: an entry that is an instance, as a dialect, names its caller's)."""
    if _LOADING:
        return _LOADING[-1]
    module = obj if isinstance(obj, str) else getattr(obj, "__module__", None) or "?"
    return "posbias" if module == "posbias" or module.startswith("posbias.") else f"module {module}"


class Registry(dict):
    """name -> entry of one kind ("task", "method", "backend", "model", "engine", "dialect"), with each entry's origin."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.origins: dict[str, str] = {}

    def add(self, name: str, entry: Any, owner: Any = None) -> Any:
        """Register `entry` under `name` (owner: the object, or the name of the module, that says where it came from;
        default the entry). The same entry again is a no-op; another entry under a taken name is refused."""
        origin = origin_of(owner if owner is not None else entry)
        if name in self and self[name] is not entry:
            a = "an" if self.kind[0] in "aeiou" else "a"
            raise PosbiasError(f"{a} {self.kind} named '{name}' is already registered (from {self.origins.get(name, '?')}); "
                               f"{origin} registers another", f"give the new {self.kind} another name")
        self[name] = entry
        self.origins.setdefault(name, origin)
        return entry

    def remove(self, name: str) -> None:
        """Take an entry out (a test that registered one for its own use)."""
        self.pop(name, None)
        self.origins.pop(name, None)
