"""The shape of the code (docs/architecture.md), checked on every module of src/posbias:

- layers import one way: a module imports its own package and packages of lower layers, never a
  higher layer nor a sibling package of its own layer (function-level imports count too);
- the CLI imports only the public API (`posbias/__init__.py` and its sub-namespaces) and itself;
- no import cycles between modules (a module never imports itself round a loop);
- transformers internals only in models/ (elsewhere only `from transformers import Name`);
- nothing from torch or transformers in the modules that need neither;
- no module over 370 lines, no function over 60 lines, and in eval/ and scoring/ none over 8 parameters.

Each rule is a function over {module name: source}, so a test can show that it catches a breach.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "posbias"

LAYERS = [  # lowest first; units in one layer may not import each other
    ("version", "errors"),
    ("outdir",),  # may this process write into a folder (runs.RunFolder checks through it)
    ("runs", "specs", "registry"),
    ("data",),  # the benchmark data sets: registry, lookup order, fetch (no torch)
    ("core",),
    ("policy_schema",),  # what a policy file must hold (reads core/stats.py ALPHA)
    ("policy",),  # reads the position test's level (core/metrics.py ALPHA)
    ("report",),
    ("models", "tasks", "integrations"),
    ("methods",),
    ("backends",),
    ("scoring",),
    ("eval",),
    ("mitigate", "analysis", "synth"),
    ("lpes", "hidden", "moice", "distill", "explain", "measure", "plugins"),  # the public sub-namespaces (facade modules)
    ("__init__",),  # the public API
    ("cli",),
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# what the CLI may import: the public API and its sub-namespaces (synth's and data's packages themselves, not their
# modules)
PUBLIC = {"posbias", *(f"posbias.{u}" for u in LAYERS[-3]), "posbias.synth", "posbias.data"}
PURE = ("posbias.version", "posbias.errors", "posbias.outdir", "posbias.runs", "posbias.specs", "posbias.data",
        "posbias.core.metrics", "posbias.core.bezier", "posbias.core.ga", "posbias.core.ga_space", "posbias.tasks",
        "posbias.report")  # (prefixes) no torch, no transformers
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 370, 60
MAX_PARAMETERS, PARAMETER_PACKAGES = 8, ("posbias.eval.", "posbias.scoring.")  # self and cls not counted
WIDE_SIGNATURES = {  # public signatures over the parameter limit, each with why it stays
    "posbias.eval.compare.run_compare": "run_sweep's cfg, out, loaded, resume, overwrite, progress and compare's own "
                                        "methods, models, collapse_margin: every one documented public API",
}


def load_sources(root: Path = SRC) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p.read_text()
    return out


@functools.lru_cache(maxsize=None)
def _parse(source: str) -> ast.Module:
    """A module's tree, parsed once per text (every rule and every breach test walks the same ~170 modules)."""
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def _import_nodes(source: str) -> tuple:
    """The import statements of a module's text, found once: (node, ...) in walk order."""
    return tuple(n for n in ast.walk(_parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom)))


def is_package(name: str, sources: dict[str, str]) -> bool:
    return any(other.startswith(name + ".") for other in sources) or name == "posbias"


def imports(name: str, source: str, sources: dict[str, str]) -> list[tuple[str, int, list[str]]]:
    """(imported module, line, imported names) for every import statement, relative ones resolved."""
    out = []
    for node in _import_nodes(source):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package(name, sources) else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [a.name for a in node.names]
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in sources]
            out += [(s, node.lineno, []) for s in subs] or [(mod, node.lineno, names)]
    return out


def unit(module: str) -> str:
    """The layer unit of a posbias module: its first-level package (or __init__ for the package root)."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def layer_violations(sources: dict[str, str]) -> list[str]:
    bad = []
    for name, src in sources.items():
        me = unit(name)
        for target, line, _ in imports(name, src, sources):
            if target.split(".")[0] != "posbias":
                continue
            them = unit(target)
            if me == "cli" and them != "cli" and target not in PUBLIC:
                bad.append(f"{name}:{line} (cli) imports {target}: the CLI uses only the public API")
            elif them != me and LAYER[them] >= LAYER[me]:
                bad.append(f"{name}:{line} ({me}, layer {LAYER[me]}) imports {target} ({them}, layer {LAYER[them]})")
    return bad


def dependency_violations(sources: dict[str, str]) -> list[str]:
    bad = []
    for name, src in sources.items():
        for target, line, names in imports(name, src, sources):
            top = target.split(".")[0]
            if top == "transformers" and not name.startswith("posbias.models") and (target != "transformers" or not names):
                bad.append(f"{name}:{line} uses transformers internals ({target}): only models/ may")
            if top in ("torch", "transformers") and name.startswith(PURE):
                bad.append(f"{name}:{line} imports {top}, which this module must not need")
    return bad


def cycle_violations(sources: dict[str, str]) -> list[str]:
    """Modules that import each other, directly or round a longer loop (function-level imports count too)."""
    graph = {n: {t for t, _, _ in imports(n, src, sources) if t in sources and t != n} for n, src in sources.items()}
    bad = []
    for start in sorted(graph):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m == start:
                bad.append(f"{start} imports itself round a loop of modules")
                break
            if m not in seen:
                seen.add(m)
                todo += graph[m]
    return bad


def size_violations(sources: dict[str, str]) -> list[str]:
    bad = []
    for name, src in sources.items():
        n = len(src.splitlines())
        if n > MAX_MODULE_LINES:
            bad.append(f"{name}: {n} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(_parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{name}.{node.name}: {length} lines > {MAX_FUNCTION_LINES}")
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None]
                wide = len([x for x in names if x not in ("self", "cls")])
                if (name.startswith(PARAMETER_PACKAGES) and wide > MAX_PARAMETERS
                        and f"{name}.{node.name}" not in WIDE_SIGNATURES):
                    bad.append(f"{name}.{node.name}: {wide} parameters > {MAX_PARAMETERS}")
    return bad


def test_every_unit_has_a_layer():
    assert {unit(n) for n in load_sources()} <= set(LAYER), "add the new package to LAYERS and docs/architecture.md"


@pytest.mark.parametrize("rule", [layer_violations, dependency_violations, cycle_violations, size_violations],
                         ids=lambda f: f.__name__)
def test_the_tree_follows_the_rule(rule):
    assert rule(load_sources()) == []


@pytest.mark.parametrize("module, source, rule, expect", [
    ("posbias.core.bad", "def f():\n    from ..eval import sweep\n", layer_violations, "imports posbias.eval.sweep"),
    ("posbias.models.bad", "from ..tasks import get_task\n", layer_violations, "imports posbias.tasks"),
    ("posbias.mitigate.bad", "from ..analysis.theory import run_theory\n", layer_violations, "imports posbias.analysis"),
    ("posbias.cli.bad", "from ..eval.sweep import run_sweep\n", layer_violations, "the CLI uses only the public API"),
    ("posbias.cli.bad", "from ..synth.experiments import run_grid\n", layer_violations, "the CLI uses only the public API"),
    ("posbias.lpes", "from .explain import run_theory\n", layer_violations, "imports posbias.explain"),
    ("posbias.mitigate.bad", "from ..lpes import run_search\n", layer_violations, "imports posbias.lpes"),
    ("posbias.eval.bad", "from transformers.masking_utils import x\n", dependency_violations, "transformers internals"),
    ("posbias.eval.bad", "import transformers\n", dependency_violations, "transformers internals"),
    ("posbias.core.metrics", "import torch\n", dependency_violations, "must not need"),
    ("posbias.tasks.bad", "from torch import nn\n", dependency_violations, "must not need"),
    ("posbias.eval.sweep", "from .compare import run_compare\n", cycle_violations, "round a loop"),  # compare imports it
    ("posbias.scoring.scorer", "from ..eval.sweep import run_sweep\n", layer_violations, "imports posbias.eval.sweep"),
    ("posbias.core.bad", "x = 1\n" * 371, size_violations, "371 lines"),
    ("posbias.eval.bad", "def f(a, b, c, d, e, f, g, *, h, i=1):\n    pass\n", size_violations, "f: 9 parameters"),
    ("posbias.core.bad", "def f():\n" + "    x = 1\n" * 60, size_violations, "f: 61 lines"),
])
def test_each_rule_catches_a_breach(module, source, rule, expect):
    sources = {**load_sources(), module: source}
    found = [v for v in rule(sources) if v.startswith(module)]
    assert found and expect in found[0], found


def test_allowed_imports_pass():
    ok = {"posbias.eval.fine": "from ..methods import get_method\nfrom transformers import GenerationConfig\n",
          "posbias.cli.fine": "from .. import run_sweep\nfrom .options import uses\nfrom ..lpes import run_search\n"
                              "from ..synth import run_grid\nfrom .. import explain\n"}
    sources = {**load_sources(), **ok}
    for rule in (layer_violations, dependency_violations):
        assert not [v for v in rule(sources) if v.startswith(tuple(ok))]
