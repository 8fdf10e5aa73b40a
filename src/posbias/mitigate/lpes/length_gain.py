"""Method gain against context length (LPES Table 17's question on one model): read several `compare`
folders (the same methods on the same model at different context lengths), and for every method the
paired difference to the first entry (its average minus the unmodified model's, Agresti-Min 95% CI over
the same examples, as `compare` computed it) against the mean prompt length in model tokens.

Files in OUT: gain.json (atomic, last) and gain.png (one line per method with CI bars).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ...errors import PosbiasError
from ...runs import RunFolder, folder_kind, kind_name, read_json


@dataclass
class GainResult:
    """Gain against length: `record` is gain.json; `rows` has one flat dict per comparison x entry (model, method,
    label, mean prompt tokens, n, average, difference from the comparison's first entry and its paired 95% CI; the
    task options as task_options.NAME); `format()` is what `posbias lpes gain` prints."""

    record: dict = field(repr=False)  # the content of gain.json
    out: Path | None = None

    @property
    def rows(self) -> list[dict]:
        return [{**{k: v for k, v in p.items() if not isinstance(v, dict)},
                 **{f"{k}.{o}": x for k, v in p.items() if isinstance(v, dict) for o, x in v.items()}}
                for p in self.record["points"]]

    def format(self) -> str:
        """One line per point: method, model, tokens, n, average, difference to the first entry (paired 95% CI)."""
        return format_length_gain(self.record)


def _read_compare(path: Path) -> dict:
    kind = folder_kind(path) if path.is_dir() else "missing"
    if kind != "comparison":
        what = "is not a folder" if kind == "missing" else f"holds {kind_name(kind)}, not a comparison"
        raise PosbiasError(f"{path} {what}", "pass folders written by `posbias compare`")
    f = path / "compare.json"
    if not f.exists():
        raise PosbiasError(f"{path} holds an unfinished comparison (no compare.json)",
                           f"finish it first: posbias compare ... --out {path} --resume")
    return read_json(f, "comparison result", "pass a finished comparison, or rerun that comparison")


def _mean_tokens(path: Path, entry: dict) -> float:
    """Mean prompt length (model tokens) over the entry's rows."""
    lens = [json.loads(line).get("prompt_tokens") for line in (path / entry["dir"] / "examples.jsonl").open()]
    lens = [n for n in lens if n is not None]
    if not lens:
        raise PosbiasError(f"{path / entry['dir']} rows carry no prompt_tokens", "re-run that comparison with this version")
    return sum(lens) / len(lens)


def short_spec(spec: str) -> str:
    """A method spec with any file path cut to its folder name: lpes:/x/runs/lpes-kv30/factors.json -> lpes:lpes-kv30."""
    name, sep, arg = spec.partition(":")
    if "/" not in arg:
        return spec
    p = Path(arg)
    return f"{name}{sep}{(p.parent if p.suffix == '.json' else p).name}"


def length_points(dirs: Sequence[str | Path]) -> list[dict]:
    """One point per (comparison, method): model, task, task options, mean tokens, n, average, difference, CI."""
    points = []
    for d in map(Path, dirs):
        rec = _read_compare(d)
        cfg = rec["config"]
        tokens = _mean_tokens(d, rec["methods"][0])
        for i, e in enumerate(rec["methods"]):
            v = e.get("vs_first") or {"difference": 0.0, "ci": [0.0, 0.0]}
            points.append({"compare": str(d), "model": cfg.get("model") or e["model"], "task": cfg["task"],
                           "task_options": cfg.get("task_options", {}), "tokens": round(tokens, 1),
                           "n": cfg["n"], "positions": cfg.get("positions_resolved"), "method": e["method"],
                           "label": short_spec(e["method"]) if cfg.get("model") else e["label"], "reference": i == 0, "average": e["summary"]["average"],
                           "difference": v["difference"], "ci": v["ci"]})
    return points


def run_length_gain(dirs: Sequence[str | Path], out: str | Path, *, overwrite: bool = False) -> GainResult:
    """gain.json + gain.png in `out` from the comparisons in `dirs` (at least one)."""
    if not dirs:
        raise PosbiasError("no comparison folders given", "pass two or more `posbias compare` output folders")
    seen = [Path(d).resolve() for d in dirs]
    twice = next((d for i, d in enumerate(dirs) if seen[i] in seen[:i]), None)
    if twice is not None:
        raise PosbiasError(f"{twice} is listed twice (its rows would count twice)", "list each comparison folder once")
    points = length_points(dirs)  # reads everything before the folder is touched
    folder = RunFolder(out, "length-gain", "gain.json", ("gain.png",), resumable=False)
    folder.check(False, overwrite)
    with folder.open({"compares": [str(Path(d)) for d in dirs]}, False, overwrite):
        from ...report.lpes_plots import plot_gain_vs_length

        plot_gain_vs_length(points, folder.file("gain.png"))
        record = {"points": points}
        folder.finish(record)
    return GainResult(record, folder.path)


def format_length_gain(record: dict) -> str:
    """A table: method, tokens, average, difference to the first entry (paired 95% CI)."""
    lines = [f"{'method':<28} {'model':<14} {'tokens':>7} {'n':>4} {'average':>8}  difference (paired 95% CI)"]
    for p in sorted(record["points"], key=lambda p: (p["label"], p["model"], p["tokens"])):
        lines.append(f"{p['label'][:28]:<28} {str(p['model'])[:14]:<14} {p['tokens']:>7.0f} {p['n']:>4} {p['average']:>8.3f}"
                     f"  {p['difference']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]")
    return "\n".join(lines)
