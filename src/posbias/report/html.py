"""`build_report`: one static, self-contained HTML page from any mix of finished run folders.

The page reads only what the runs wrote (run.json, the result file, the PNGs and logs beside it)
and recomputes nothing. Each run becomes one section drawn by the renderer of its kind
(sections.py; unknown kinds get the generic one), followed by its provenance. Figures are embedded
as base64 data URIs and the stylesheet is inline: no external URL, no script.

Bad input is a PosbiasError before anything is written: a path that is not a folder, a folder
that holds no run (no run.json, and no run folder directly inside), an unfinished run, an `out`
that is a directory or cannot be written. The page is written atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import PosbiasError
from ..outdir import can_write_in
from ..runs import MARKER, read_json
from ..version import __version__
from .blocks import PNG_URI, esc
from .provenance import Run, provenance
from .sections import renderer_for

# A run's result file is named in its run.json ("result", written by runs.RunFolder). Folders from before that was
# recorded: by kind, else the first word of the kind + ".json" (grid -> grid.json)
RESULT_FILES = {"comparison": "compare.json", "search": "factors.json", "distillation": "distill.json", "length-gain": "gain.json",
                "hidden-search": "hidden.json"}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d232b;background:#f5f6f8}
main{max-width:1160px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:0 0 2px}
.sub{color:#5b6470;margin:0 0 12px}
nav ol{margin:4px 0 16px;padding-left:22px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:16px 20px;margin:0 0 20px}
.kind{display:inline-block;font-size:11px;background:#e7eef9;color:#25497a;border-radius:3px;padding:1px 6px;margin-left:6px;vertical-align:middle}
table{border-collapse:collapse;margin:8px 0 12px;font-size:13px}
caption{text-align:left;font-weight:600;padding:2px 0 4px;color:#3a424c}
th,td{border-bottom:1px solid #e3e6ea;padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f0f2f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
td small{color:#6b7480}
.scroll{overflow-x:auto}.prov table{width:100%}.kv{display:inline-block;vertical-align:top;margin-right:28px;max-width:100%}.prov td:first-child{width:150px;white-space:nowrap}
.summary{background:#f7f9fb;border-left:3px solid #4a78b5;padding:6px 10px}
.figs{display:flex;flex-wrap:wrap;gap:14px;margin:8px 0}
figure{margin:0;max-width:100%}figure img{max-width:100%;height:auto;border:1px solid #e3e6ea;display:block}
figcaption{font-size:12px;color:#5b6470}
details{margin:6px 0}summary{cursor:pointer;color:#25497a}
pre{background:#f7f9fb;padding:8px;overflow-x:auto;font-size:12px}
code{font-size:12px;word-break:break-all}
footer{color:#5b6470;font-size:12px;margin-top:8px}
"""


@dataclass
class ReportResult:
    """A report: the result file is the HTML page `out`, so `record` is what the page holds (title, figures, one entry
    per section); `rows` has one flat dict per section, in page order: section, kind, run (its folder); `format()` is
    what `posbias report` prints."""

    out: Path  # the HTML file written
    sections: int  # one per run
    images: int  # PNGs embedded (data URIs)
    kinds: list[str] = field(default_factory=list)  # the kind of each section, in page order
    runs: list[str] = field(default_factory=list)  # the folder of each section
    title: str = "posbias report"

    @property
    def rows(self) -> list[dict]:
        return [{"section": i + 1, "kind": k, "run": r} for i, (k, r) in enumerate(zip(self.kinds, self.runs))]

    @property
    def record(self) -> dict:
        return {"out": str(self.out), "title": self.title, "images": self.images, "sections": self.rows}

    def format(self) -> str:
        """The page written, its sections and figures, then one line per section: its kind and run folder."""
        return "\n".join([f"wrote {self.out} ({self.sections} sections, {self.images} figures)",
                          *(f"{r['section']:>3}. {r['kind']:<20} {r['run']}" for r in self.rows)])


def result_file(kind: str) -> str:
    """The file a run of `kind` writes last (`synth A grid` -> A.json)."""
    if kind.startswith("synth ") and kind.endswith(" grid"):
        return f"{kind.split()[1]}.json"
    return RESULT_FILES.get(kind, f"{kind.split()[0]}.json" if kind.strip() else "result.json")


DAMAGED = "leave that folder out of the report, or rerun the command that wrote it into a new folder"


def check_out(out: Path) -> None:
    """`out` must be a file path whose folder exists or can be created, and is writable."""
    if out.is_dir():
        raise PosbiasError(f"`out` {out} is a directory", "pass a file path such as report.html")
    probe = out.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not can_write_in(probe) or (out.exists() and not os.access(out, os.W_OK)):
        raise PosbiasError(f"`out` {out} cannot be written", "pass a path in a folder you can write to, e.g. "
                                                              "`out=report.html`")


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """The run folders: each path itself, or (a parent folder) the run folders directly inside it;
    sub-sweeps of a comparison also listed are dropped (the comparison shows them)."""
    if not paths:
        raise PosbiasError("no run folders given", "pass one or more folders a posbias command wrote")
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise PosbiasError(f"{p} is not a folder", "pass the folder a posbias command wrote (its --out)")
        if (p / MARKER).is_file():
            found.append(p)
            continue
        inside = sorted(c for c in p.iterdir() if c.is_dir() and (c / MARKER).is_file())
        if not inside:
            raise PosbiasError(f"{p} is not a run folder (no {MARKER}, nor a run folder directly inside it)",
                               "pass the folder a posbias command wrote (its --out)")
        found += inside
    unique = list(dict.fromkeys(p.resolve() for p in found))
    compares = [p for p in unique if (p / "compare.json").is_file()]
    return [p for p in unique if p.parent not in compares or not (p / "sweep.json").is_file()]


def load_run(path: Path) -> Run:
    """run.json and the finished result of one run folder (an unfinished run is an error)."""
    marker = read_json(path / MARKER, "run marker", DAMAGED)
    kind = str(marker.get("kind") or "")
    if not kind:
        raise PosbiasError(f"{path / MARKER} names no kind of run", "pass a folder a posbias command wrote")
    name = str(marker.get("result") or result_file(kind))
    if not (path / name).is_file():
        raise PosbiasError(f"the {kind} in {path} is not finished (no {name})",
                           "finish it first (resume the command recorded in its run.json), or pass only finished runs")
    return Run(path, kind, marker, read_json(path / name, f"{kind} result", DAMAGED), name)


def section(i: int, run: Run) -> str:
    """One run: heading, the body its kind's renderer draws, its provenance."""
    body = renderer_for(run.kind)(run)
    return (f'<section id="run{i}"><h2>{i}. {esc(run.path.name)}<span class="kind">{esc(run.kind)}</span></h2>'
            f'<p class="sub"><code>{esc(run.path)}</code></p>{body}{provenance(run)}</section>')


def page(title: str, runs: list[Run]) -> str:
    toc = "".join(f'<li><a href="#run{i}">{esc(r.path.name)}</a> <span class="kind">{esc(r.kind)}</span></li>'
                  for i, r in enumerate(runs, 1))
    sections = "".join(section(i, r) for i, r in enumerate(runs, 1))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body><main><h1>{esc(title)}</h1>"
            f'<p class="sub">{len(runs)} run(s); every number is read from the files the runs wrote.</p>'
            f"<nav><ol>{toc}</ol></nav>{sections}"
            f"<footer>posbias {esc(__version__)} report</footer></main></body></html>\n")


def build_report(paths: Sequence[str | Path], out: str | Path, title: str | None = None) -> ReportResult:
    """Write one self-contained HTML page for the finished run folders `paths` (or parent folders of runs)."""
    out = Path(out)
    check_out(out)
    runs = [load_run(p) for p in find_runs(paths)]  # every check before anything is written
    title = title or "posbias report"
    text = page(title, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return ReportResult(out, len(runs), text.count(PNG_URI), [r.kind for r in runs], [str(r.path) for r in runs], title)
