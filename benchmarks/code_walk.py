"""The walk of one sweep through posbias's code, counted: from the CLI's options to the rows on disk, which functions
of posbias run (places), over how many files, and how often a call goes back to a file the walk had already left
(turns back). Issue 48 asked for fewer of both; this is how they are counted here (a dynamic count: each distinct
function and each distinct file-to-file call edge once, however often a loop repeats it; module bodies, imports and
the registries' registrations left out).

    .venv/bin/python benchmarks/code_walk.py                      # the default sweep's path, one row
    .venv/bin/python benchmarks/code_walk.py --list               # and every place, in first-call order

Issue 48's "stays in 67 places over 20 files and turns back 47 times" fits one reading exactly (67 = 20 + 47, and its
earlier 51 / 17 / 34 too): read the walk in first-call order, a place is a stay in one file (consecutive new functions
of the same file are one stay), and a stay in a file the walk had already left is a turn back (places - files). This
script prints that count too; its granularity (every posbias function, 33 files) is finer than the issue's (20 files),
whose filter is not written down, so compare its figures across commits, not with the issue's.

A call turns back against the imports when the callee's module imports the caller's, directly or through
others (a callback, a hook, a base class calling its subclass); calls between modules that do not import each other
either way are counted apart.

It runs `posbias sweep --n 1 --positions 0 --facts 3` on the default model in a temporary folder (the numbers do not
depend on the machine; about 30 s with the model cached).
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src" / "posbias")


def walk(argv: list[str]) -> tuple[list[tuple[str, str]], set[tuple[str, str]]]:
    """(places in first-call order as (file, function), the distinct call edges between files)."""
    from posbias.cli import main

    places: dict[tuple[str, str], None] = {}
    edges: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(SRC) or code.co_name in ("<module>", "<lambda>", "<genexpr>", "<listcomp>",
                                                                      "<dictcomp>", "<setcomp>"):
            return
        here = code.co_filename[len(SRC) + 1:]
        places.setdefault((here, code.co_qualname), None)
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(SRC):
            caller = caller.f_back
        if caller is not None:
            there = caller.f_code.co_filename[len(SRC) + 1:]
            if there != here:
                edges.add((there, here))

    sys.argv = ["posbias", *argv]
    sys.setprofile(profile)
    try:
        main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return list(places), edges


def imports() -> dict[str, set[str]]:
    """{file: the posbias files it imports (module level and inside functions)}, paths relative to SRC."""
    root, out = Path(SRC), {}
    for f in root.rglob("*.py"):
        rel, pkg = str(f.relative_to(root)), f.relative_to(root).parent.parts
        got = out.setdefault(rel, set())
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(pkg[: len(pkg) - node.level + 1])
                names = [*base, *(node.module or "").split(".")] if node.module else base
                for alias in node.names if not node.module else [None]:
                    parts = [p for p in ([*names, alias.name] if alias else names) if p]
                    for cand in (Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"):
                        if (root / cand).is_file():
                            got.add(str(cand))
                            break
    return out


def reaches(graph: dict[str, set[str]], a: str, b: str) -> bool:
    """Whether a imports b, directly or through other modules."""
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        for y in graph.get(x, ()):
            if y == b:
                return True
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print every place in first-call order")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        places, edges = walk(["sweep", "--n", "1", "--positions", "0", "--facts", "3", "--quiet", "--out", f"{d}/run"])
    files = {f for f, _ in places}
    stays = [f for i, (f, _) in enumerate(places) if i == 0 or places[i - 1][0] != f]
    graph = imports()
    back = sorted((x, y) for x, y in edges if reaches(graph, y, x))
    loose = sorted((x, y) for x, y in edges if not reaches(graph, x, y) and not reaches(graph, y, x))
    print(f"places {len(places)} (functions) in {len(files)} files; call edges between files {len(edges)}, "
          f"{len(back)} turning back (the callee's module imports the caller's), {len(loose)} between modules that "
          "do not import each other")
    print(f"the walk read in first-call order: {len(stays)} stays in a file, {len(stays) - len(files)} of them a return "
          "to a file it had left (issue 48's places / turns back)")
    if a.list:
        for f, fn in places:
            print(f"  {f}: {fn}")
        print("turning back:")
        for x, y in back:
            print(f"  {x} -> {y}")
        print("between modules that do not import each other:")
        for x, y in loose:
            print(f"  {x} -> {y}")


if __name__ == "__main__":
    main()
