"""HTML building blocks for the report: escaping, number formatting, tables, embedded figures.

Every string that came from a JSON file goes through `esc` (html.escape); markup built here is
wrapped in `Raw` so a table knows not to escape it twice. Figures are PNG bytes embedded as base64
data URIs: the page needs no other file and no network.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

PNG_URI = "data:image/png;base64,"


class Raw(str):
    """Markup that is already safe (built here from escaped pieces)."""


def esc(value: Any) -> str:
    """`value` as escaped text (quotes too: safe inside attributes)."""
    return value if isinstance(value, Raw) else html.escape(str(value), quote=True)


def fmt(v: Any) -> str:
    """A cell's text: 3 decimals for rates, 3 significant digits for large or tiny floats, "-" for None."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.3f}"
    if _mean_std(v):
        return f"{fmt(v['mean'])} ± {fmt(v['std'])}" + (f" (n={v['n']})" if "n" in v else "")
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, float, str)) for x in v):
            text = ", ".join(fmt(x) for x in v)
            return text if len(text) <= 120 else text[:117] + "..."
    if isinstance(v, (dict, list, tuple)):
        text = json.dumps(v, ensure_ascii=False)
        return text if len(text) <= 120 else text[:117] + "..."
    return str(v)


def _mean_std(v: Any) -> bool:
    """A {mean, std[, n]} summary over seeds, shown in one cell."""
    return isinstance(v, dict) and {"mean", "std"} <= set(v) <= {"mean", "std", "n"}


def pos_label(p: Any) -> str:
    """A gold position (5) or a two-hop placement ([2, 7] -> "2:7")."""
    return ":".join(map(str, p)) if isinstance(p, (list, tuple)) else str(p)


def cell(v: Any) -> str:
    """A table cell's content: markup as is, anything else formatted and escaped."""
    return v if isinstance(v, Raw) else esc(fmt(v))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> Raw:
    """A plain table; numeric cells are right-aligned by the stylesheet (class num)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        tds = "".join(f'<td class="{_cls(v)}">{cell(v)}</td>' for v in row)
        body.append(f"<tr>{tds}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return Raw(f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _cls(v: Any) -> str:
    return "num" if isinstance(v, (int, float)) and not isinstance(v, bool) else ""


def scalars(d: dict, prefix: str = "") -> dict:
    """The scalar entries of `d` (one level of nested dicts flattened as `key.sub`, mean ± std kept whole)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, (int, float, str, bool)) or v is None or _mean_std(v):
            out[f"{prefix}{k}"] = v
        elif isinstance(v, dict) and not prefix:
            out.update({kk: vv for kk, vv in scalars(v, f"{k}.").items()})
        elif isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (int, float, str)) for x in v):
            out[f"{prefix}{k}"] = v
    return out


def key_values(d: dict, caption: str | None = None) -> Raw:
    """A two-column table of a dict's scalar entries (empty markup if there are none)."""
    items = scalars(d)
    if not items:
        return Raw("")
    t = table(["", "value"], [[Raw(f"<code>{esc(k)}</code>"), v] for k, v in items.items()], caption)
    return Raw(f'<div class="kv">{t}</div>')


def rows_table(rows: list[dict], caption: str | None = None, limit: int = 200) -> Raw:
    """A table of tidy rows (list of dicts): one column per scalar key, in first-seen order."""
    flat = [scalars(r) for r in rows[:limit] if isinstance(r, dict)]
    cols: list[str] = []
    for r in flat:
        cols += [k for k in r if k not in cols]
    if not cols:
        return Raw("")
    more = f" (first {limit} of {len(rows)})" if len(rows) > limit else ""
    return table(cols, [[r.get(c) for c in cols] for r in flat], (caption or "") + more or None)


def figure(png: bytes, caption: str) -> Raw:
    """A PNG embedded as a data URI, with its caption."""
    data = base64.b64encode(png).decode("ascii")
    return Raw(f'<figure><img src="{PNG_URI}{data}" alt="{esc(caption)}"><figcaption>{esc(caption)}</figcaption></figure>')


def png_files(folder: Path, first: Sequence[str] = ()) -> list[Path]:
    """Every PNG directly in `folder`: the names in `first` (in that order), then the rest sorted."""
    found = sorted(p for p in folder.glob("*.png") if p.is_file() and not p.name.endswith(".tmp.png"))
    order = {name: i for i, name in enumerate(first)}
    return sorted(found, key=lambda p: (order.get(p.name, len(order)), p.name))


def figures(folder: Path, first: Sequence[str] = ()) -> Raw:
    """Every PNG in `folder` as embedded figures, in a grid."""
    items = [figure(p.read_bytes(), p.name) for p in png_files(folder, first)]
    return Raw(f'<div class="figs">{"".join(items)}</div>' if items else "")


def details(summary: str, body: str) -> Raw:
    return Raw(f"<details><summary>{esc(summary)}</summary>{body}</details>") if body else Raw("")


def pre_json(obj: Any) -> Raw:
    return Raw(f"<pre>{esc(json.dumps(obj, indent=2, ensure_ascii=False, default=str))}</pre>")


def para(text: str) -> Raw:
    return Raw(f"<p>{esc(text)}</p>")
