"""Plugins: tasks, methods, backends, model names, scoring engines and server dialects from other packages, found
through the entry-point group "posbias".

A plugin package declares, in its pyproject.toml,

    [project.entry-points.posbias]
    my_plugin = "my_package.plugin"            # a module: importing it registers (register_task, @register_method,
                                               # @register_backend, @register_engine at its classes, register_model,
                                               # register_dialect)
    # or "my_package.plugin:register"          # a function called with no arguments

and once it is installed in the same environment (`pip install my-package`), `import posbias` loads it: its
registrations join `TASKS`, `METHODS`, `BACKENDS`, `MODELS`, `ENGINES` and `DIALECTS`, tagged `plugin NAME (DIST
VERSION)`, which `posbias tasks`, `posbias methods`, `posbias backends` (dialects too) and `posbias models` print (and
--engine's help lists the engines). A plugin that fails to load is named in one warning and left out (the
built-ins still work); a name it registers that is already taken is refused the same way. POSBIAS_DISABLE_PLUGINS=1
loads none (as PYTEST_DISABLE_PLUGIN_AUTOLOAD does for pytest).
"""

from __future__ import annotations

import os
import warnings
from importlib.metadata import entry_points

from .registry import loading

GROUP = "posbias"
LOADED: dict[str, str] = {}  # entry-point name -> its origin tag, for the plugins that loaded (posbias.PLUGINS)
FAILED: dict[str, str] = {}  # entry-point name -> why it did not


def load_plugins() -> dict[str, str]:
    """Load every installed plugin once (import posbias calls this); -> LOADED."""
    if os.environ.get("POSBIAS_DISABLE_PLUGINS", "") not in ("", "0"):
        return LOADED
    for ep in entry_points(group=GROUP):
        if ep.name in LOADED or ep.name in FAILED:
            continue
        dist = f" ({ep.dist.name} {ep.dist.version})" if ep.dist is not None else ""
        tag = f"plugin {ep.name}{dist}"
        try:
            with loading(tag):
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type):
                    obj()
        except Exception as e:  # noqa: BLE001 - a broken plugin is named and left out; posbias still works
            FAILED[ep.name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"posbias plugin '{ep.name}'{dist} failed to load and is left out ({FAILED[ep.name]}); fix or "
                          f"uninstall it, or set POSBIAS_DISABLE_PLUGINS=1", stacklevel=2)
            continue
        LOADED[ep.name] = tag
    return LOADED


PLUGINS = load_plugins()  # at import: posbias/__init__.py imports this module after every name a plugin imports
