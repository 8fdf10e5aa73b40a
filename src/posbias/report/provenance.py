"""A finished run folder as the report reads it (`Run`), and the provenance block that follows every run's section:
the command that made the run, its folder, kind and result file, model, library versions, configuration and
fingerprint (html.py draws it under the body that sections.py's renderer of the run's kind draws).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .blocks import Raw, details, esc, fmt, key_values, scalars, table


@dataclass
class Run:
    """One finished run folder: its marker (run.json), its result and where it lies."""

    path: Path
    kind: str
    marker: dict  # run.json: kind, fingerprint, command (newer runs)
    result: dict  # the result file's content
    result_name: str  # e.g. sweep.json


def _entry_versions(run: Run) -> dict:
    """A comparison records no versions itself: those its first sweep folder recorded."""
    entries = run.result.get("methods") if run.kind == "comparison" else None
    sub = run.path / str(entries[0].get("dir", "")) / "sweep.json" if entries else None
    if sub is None or not sub.is_file():
        return {}
    return json.loads(sub.read_text(encoding="utf-8")).get("versions") or {}


def provenance(run: Run) -> str:
    """The command that made the run, its configuration, model and library versions."""
    r, fp = run.result, run.marker.get("fingerprint") or {}
    config = r.get("config") if isinstance(r.get("config"), dict) else fp.get("config")
    model = next((m for m in (r.get("model_info"), r.get("base_model"), r.get("model"), fp.get("model")) if isinstance(m, dict)), None)
    vers = r.get("versions") or _entry_versions(run)
    rows = [["command", Raw(f"<code>{esc(run.marker.get('command') or '-')}</code>")],
            ["folder", Raw(f"<code>{esc(run.path)}</code>")], ["kind / result file", f"{run.kind} / {run.result_name}"],
            ["model", ", ".join(f"{k} {fmt(v)}" for k, v in scalars(model).items()) if model else "-"],
            ["versions", ", ".join(f"{k} {v}" for k, v in vers.items()) if vers else "-"]]
    return "".join([Raw('<div class="prov">'), table(["provenance", ""], rows), Raw("</div>"), details("configuration", key_values(config) if config else ""),
                    details("fingerprint (run.json)", Raw(f"<pre>{esc(json.dumps(fp, indent=1, default=str))}</pre>"))])

