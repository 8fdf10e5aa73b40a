"""No option help is written twice. A config field's meaning is written once, as a `name: text` entry of its config's
docstring (a mixin's field on the mixin), and `posbias.measure.field_docs` reads it; the CLI option that sets the field shows
exactly that text as its help (--task, --method and --engine add the registry's values after it). So:

- every option of every command that maps to a config field (by name, or by the flag `cli._FLAGS` gives it) has
  that field's doc as its help;
- every field of every public config has a doc entry, and every entry names a field;
- no help string written in src/posbias/cli restates a field doc, and none is written twice.

The last two are functions over sources / classes, so a test shows that each catches a breach.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from types import ModuleType

import pytest

import posbias
from posbias.cli import _FLAGS
from posbias.eval.config import doc_entries
from test_cli_defaults import commands

CLI = Path(__file__).resolve().parents[1] / "src" / "posbias" / "cli"
SYNTH = posbias.synth.RunConfig()
SYNTH_PARTS = [type(SYNTH.data), type(SYNTH.model), type(SYNTH.train), type(SYNTH.eval)]
SYNTH_GRID = [type(SYNTH.train), type(SYNTH.eval), type(SYNTH.data)]  # the grids' --residual is a list, not the field

# command -> the configs its options set, searched in order for a field named like the option
CONFIGS = {
    "sweep": [posbias.SweepConfig], "compare": [posbias.SweepConfig], "grid": [posbias.GridConfig],
    "export": [posbias.SweepConfig], "show": [posbias.SweepConfig],
    "lpes search": [posbias.lpes.SearchConfig, posbias.lpes.GAConfig], "hidden search": [posbias.hidden.SearchConfig],
    "distill r1": [posbias.distill.DistillConfig], "distill r2": [posbias.distill.DistillConfig],
    "moice train": [posbias.moice.TrainConfig],
    "analyze attention": [posbias.explain.AttentionConfig], "analyze shifting": [posbias.explain.ShiftingConfig],
    "analyze prior": [posbias.explain.PriorConfig], "theory": [posbias.explain.TheoryConfig, posbias.explain.RealRollout],
    "synth train": [posbias.synth.RunConfig, *SYNTH_PARTS],
    "synth depth": SYNTH_GRID, "synth bias": SYNTH_GRID, "synth sinks": SYNTH_GRID,
}
# option name -> field name, where they differ: the flags the CLI maps library parameters to, and --eval-seqs
RENAMED = {flag.removeprefix("--").replace("-", "_"): name for name, flag in _FLAGS.items()} | {"eval_seqs": "n_seqs"}
# options named like a field that set something else, and why
NOT_THE_FIELD = {
    ("theory", "tokens"): "sets n_tokens and check_tokens",
    ("theory", "depth"): "sets depth and check_depth",
    ("export", "model"): "an argument: a model posbias loads, never a served spec",
}
FROM_REGISTRY = ("task", "method", "engine")  # the field's doc, then the registry's values


def field_doc(configs: list[type], option: str) -> str | None:
    name = RENAMED.get(option, option)
    return next((posbias.measure.field_docs(c)[name] for c in configs if name in posbias.measure.field_docs(c)), None)


def public_configs() -> list[type]:
    """Every config the public API and its sub-namespaces name (a dataclass with `validate`), its dataclass bases and
    nested configs."""
    spaces = [posbias, *(getattr(posbias, n) for n in posbias.__all__ if isinstance(getattr(posbias, n), ModuleType))]
    todo = [o for ns in spaces for o in (getattr(ns, n) for n in ns.__all__)
            if isinstance(o, type) and dataclasses.is_dataclass(o) and hasattr(o, "validate")]
    seen: list[type] = []
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.append(c)
        todo += [b for b in c.__mro__[1:] if dataclasses.is_dataclass(b)]
        for f in dataclasses.fields(c):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            todo += [type(value)] if dataclasses.is_dataclass(value) else []
    return sorted(seen, key=lambda c: c.__name__)


def test_every_command_with_config_options_is_checked():
    names = {name for name, _ in commands()}
    assert set(CONFIGS) <= names
    unchecked = names - set(CONFIGS) - {"tasks", "methods", "models", "backends", "report", "lpes gain", "policy export",
                                         "data list", "data fetch", "data path", "data verify"}  # no config field
    assert not unchecked, f"add {unchecked} to CONFIGS"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_option_that_sets_a_field_shows_the_fields_doc(name):
    cmd = dict(commands())[name]
    shown = 0
    for p in cmd.params:
        doc = field_doc(CONFIGS[name], p.name)
        if doc is None or (name, p.name) in NOT_THE_FIELD:
            continue
        if p.name in FROM_REGISTRY and p.help != doc:
            assert p.help.startswith(doc + " "), f"{name} --{p.name}: {p.help!r} does not start with {doc!r}"
        else:
            assert p.help == doc, f"{name} --{p.name}: help {p.help!r} is not the field's doc {doc!r}"
        shown += 1
    assert shown, f"{name} has no option that sets a field of {CONFIGS[name]}"


def undocumented(cls: type) -> list[str]:
    """Fields of `cls` without a doc entry, and entries of its docstring that name no field (a reference entry,
    "see `Base`", must name a base that documents those fields)."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs = posbias.measure.field_docs(cls)
    bad = [f"{cls.__name__}.{n}: no `{n}: ...` entry in its docstring (or its mixin's)" for n in names - set(docs)]
    bases = {b.__name__: b for b in cls.__mro__[1:]}
    for entry, text in doc_entries(cls):
        bad += [f"{cls.__name__}: the entry `{n}:` names no field" for n in entry if n not in names]
        ref = re.fullmatch(r"see `(\w+)`\.?", text)
        if ref and (ref[1] not in bases or not set(entry) <= set(posbias.measure.field_docs(bases[ref[1]]))):
            bad.append(f"{cls.__name__}: `{', '.join(entry)}: {text}` refers to no base that documents them")
    return bad


@pytest.mark.parametrize("cls", public_configs(), ids=lambda c: c.__name__)
def test_every_field_of_every_public_config_has_a_doc(cls):
    assert not undocumented(cls)


def test_a_field_without_a_doc_or_a_stale_entry_is_caught():
    @dataclasses.dataclass
    class Example(posbias.SweepConfig):
        """An example.

        width: how wide.
        gone: a field that was removed.
        model: see `Scoring`.
        """

        width: int = 1
        height: int = 2

    found = "\n".join(undocumented(Example))
    assert "Example.height: no `height: ...` entry" in found
    assert "the entry `gone:` names no field" in found and "refers to no base" in found
    assert posbias.measure.field_docs(Example)["width"] == "how wide." and "model" in posbias.measure.field_docs(Example)


def help_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every help written as a literal: help="..." of any call, Opt(default, "..."), CLI_HELP values."""
    def text(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return left + right if left is not None and right is not None else None
        return None

    out = []
    for node in ast.walk(ast.parse(source)):
        values = []
        if isinstance(node, ast.Call):
            values = [k.value for k in node.keywords if k.arg == "help"]
            if getattr(node.func, "id", None) == "Opt" and len(node.args) >= 2:
                values.append(node.args[1])
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CLI_HELP" for t in node.targets):
            values = list(getattr(node.value, "values", []))
        out += [(v.lineno, t) for v in values if (t := text(v)) is not None]
    return out


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().rstrip(".").lower()


def restated(sources: dict[str, str], docs: list[str]) -> list[str]:
    """Help literals that restate a field doc (equal, or one holding the other), or that are written twice."""
    docs_n = {_norm(d) for d in docs}
    bad, seen = [], {}
    for name, src in sources.items():
        for line, t in help_strings(src):
            h = _norm(t)
            if any(h == d or (min(len(h), len(d)) >= 12 and (h in d or d in h)) for d in docs_n):
                bad.append(f"{name}:{line} help {t!r} restates a config field's doc: use field_option / Opt()")
            if h in seen:
                bad.append(f"{name}:{line} help {t!r} is written twice (also {seen[h]}): write it once in CLI_HELP")
            seen.setdefault(h, f"{name}:{line}")
    return bad


def all_field_docs() -> list[str]:
    return [d for c in public_configs() for d in posbias.measure.field_docs(c).values()]


def test_no_help_string_in_the_cli_restates_a_field_doc_or_repeats():
    sources = {p.name: p.read_text() for p in sorted(CLI.glob("*.py"))}
    assert len([h for s in sources.values() for h in help_strings(s)]) > 20  # the scan sees the literals
    assert not restated(sources, all_field_docs())


def test_a_restated_or_repeated_help_is_caught():
    src = ('n = typer.Option(100, help="examples per position")\n'
           'q = typer.Option(False, help="no progress " + "bars")\n'
           'r = typer.Option(False, help="no progress bars")\n'
           'G = Group("g", "G", x=Opt(1, "padded tokens per batch", int))\n')
    found = "\n".join(restated({"new.py": src}, all_field_docs()))
    assert "new.py:1 help 'examples per position' restates" in found
    assert "new.py:4 help 'padded tokens per batch' restates" in found
    assert "new.py:3 help 'no progress bars' is written twice (also new.py:2)" in found
