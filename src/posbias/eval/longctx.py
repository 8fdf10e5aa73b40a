"""Long-context figures that relate a depth x length grid to the model itself (task niah, tasks/haystack.py).

references  per example, the closed-book score (no context: what the model knows without reading) and the
            short-context score (the needles alone, no haystack): Lost in the Middle's closed-book baseline and
            NoLiMa's base score, each a one-position sweep on the grid's own examples and engine (the cells' resolved
            one, recorded as `engine`; OUT/ref-closed, OUT/ref-needle)
effective   NoLiMa's effective length relative to the model's own short-context score: the longest length L such
            that every length up to L scores at least `threshold` (0.85) x the short-context accuracy (RULER's
            "effective length" uses a fixed score instead); its 95% interval from a paired bootstrap over examples
            (each resample recomputes the short-context score and every length's accuracy on the same examples)
needles     with several needles, each needle's own hit rate (its value in the generated answer) by its true depth
"""

from __future__ import annotations

import numpy as np

from ..core.metrics import normalize_answer, wilson_ci
from ..errors import PosbiasError

REFERENCES = {"closed": "none", "needle": "needle"}  # folder suffix -> the task's `context`
THRESHOLD = 0.85  # NoLiMa: the effective length keeps >= 85% of the base (short-context) score


def parse_size(text: str) -> int:
    """A size: a whole number, or tokens with a k suffix (1k = 1024, 1.5k = 1536)."""
    if text.lower().endswith("k"):
        v = float(text[:-1]) * 1024
        if v != int(v):
            raise ValueError(text)
        return int(v)
    return int(text)


def fill_list(fill: str) -> list[float]:
    """`fill` ("25%,50%,100%") as shares of the window in (0, 1], each once."""
    try:
        out = [float(p.strip().removesuffix("%")) / 100 for p in fill.split(",") if p.strip()]
    except ValueError:
        out = []
    if not out or not all(0 < f <= 1 for f in out) or len(set(out)) != len(out):
        raise PosbiasError(f"bad `fill` {fill!r}", "write distinct percents of the context window in (0%, 100%], "
                           "e.g. `fill=25%,50%,100%`")
    return out


def depth_spacing(depths: str) -> list[str] | None:
    """linear:N / sigmoid:N -> N depth percents from 0 to 100 (0.1% steps); None for an explicit list."""
    kind, colon, n = depths.strip().partition(":")
    if not colon or kind not in ("linear", "sigmoid"):
        return None
    if not n.isdigit() or not 3 <= int(n) <= 101:
        raise PosbiasError(f"bad `depths` {depths!r}", "use linear:N or sigmoid:N with N from 3 to 101, e.g. sigmoid:11")
    from ..tasks import sigmoid_depths

    pts = sigmoid_depths(int(n)) if kind == "sigmoid" else [round(100 * i / (int(n) - 1), 1) for i in range(int(n))]
    return [f"{p:g}" for p in pts]


def fill_sizes(fill: str, window: int, answer: int) -> list[int]:
    """The token length of each share of the window; a full window keeps room for the answer."""
    return [min(int(f * window), window - answer) for f in fill_list(fill)]


def per_example(rows: list[dict], ids: list[str]) -> np.ndarray:
    """Each example's mean score over its rows (the depths of one length), in `ids` order."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["example_id"], []).append(float(bool(r["correct"])))
    return np.array([np.mean(by[i]) for i in ids])


def reference_record(rows: list[dict], ids: list[str]) -> dict:
    """A reference's accuracy over the examples with its Wilson interval."""
    k, n = int(sum(bool(r["correct"]) for r in rows)), len(ids)
    lo, hi = wilson_ci(k, n)
    return {"n": n, "correct": k, "accuracy": k / n, "ci_low": lo, "ci_high": hi}


def effective_length(per_size: dict[int, np.ndarray], short: np.ndarray, threshold: float = THRESHOLD,
                     n_boot: int = 2000, seed: int = 0) -> dict:
    """NoLiMa's effective length (module docstring): per_size[L] = each example's accuracy at length L (mean over
    depths), short = each example's short-context score, all on the same examples in the same order. 0 means no
    length keeps the threshold; None (with a note) when the model fails the needle alone (no base to relate to)."""
    sizes = sorted(per_size)
    mat = np.stack([per_size[s] for s in sizes], axis=1)  # [examples, lengths]

    def longest(idx: np.ndarray) -> tuple[int, np.ndarray]:
        base, acc = short[idx].mean(), mat[idx].mean(axis=0)
        ratio = acc / base if base > 0 else np.full(len(sizes), np.nan)
        ok = ratio >= threshold
        k = int(np.argmin(ok)) if not ok.all() else len(sizes)  # the first length that falls below
        return (sizes[k - 1] if k else 0), ratio

    everyone = np.arange(len(short))
    point, ratio = longest(everyone)
    out = {"threshold": threshold, "short_context": float(short.mean()), "lengths": sizes}
    if short.mean() == 0:
        return {**out, "effective_length": None, "ci": None, "ratios": [],
                "note": "the model fails the needle alone: no short-context score to relate the lengths to"}
    idx = np.random.default_rng(seed).integers(0, len(short), size=(n_boot, len(short)))
    boots = [longest(i) for i in idx]
    lengths = np.array([b[0] for b in boots])
    ratios = np.array([b[1] for b in boots])  # [n_boot, lengths]; nan where a resample's base is 0
    rows = []
    for j, s in enumerate(sizes):
        lo, hi = np.nanquantile(ratios[:, j], [0.025, 0.975])
        rows.append({"length": s, "accuracy": float(mat[:, j].mean()), "ratio": float(ratio[j]),
                     "ci": [float(lo), float(hi)], "keeps": bool(ratio[j] >= threshold)})
    lo, hi = np.quantile(lengths, [0.025, 0.975], method="inverted_cdf")
    return {**out, "effective_length": point, "ci": [int(lo), int(hi)], "ratios": rows}


def needle_hits(rows: list[dict], bins: int = 5) -> list[dict]:
    """With several needles (rows that carry `needle_answers` and a generated `prediction`): how often each role's
    value is in the answer, per true-depth bin of width 100/bins. [] when the rows carry none."""
    acc: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        if "needle_answers" not in r or "prediction" not in r:
            continue
        pred = normalize_answer(r["prediction"])
        for role, depth, ans in zip(r["needle_roles"], r["needle_depths"], r["needle_answers"]):
            b = min(int(depth // (100 / bins)), bins - 1)
            acc.setdefault((role, b), []).append(int(normalize_answer(ans) in pred))
    return [{"role": role, "depths": [b * 100 / bins, (b + 1) * 100 / bins], "n": len(v), "found": sum(v) / len(v)}
            for (role, b), v in sorted(acc.items())]


def format_long(rec: dict) -> list[str]:
    """The references, the effective length and each length's fill and shape, as lines under the grid's table."""
    lines = []
    refs = rec.get("references") or {}
    if refs:
        engine = refs["needle"].get("engine")  # the cells' own engine (grids before it was recorded: none said)
        lines.append(f"references{f' ({engine})' if engine else ''}: " + "; ".join(
            f"{name} {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" for name, r in
            (("closed-book", refs["closed"]), ("needle alone", refs["needle"]))))
    eff = rec.get("effective")
    if eff:
        if eff["effective_length"] is None:
            lines.append(f"effective length: none ({eff['note']})")
        else:
            e = eff["effective_length"]
            lines.append(f"effective length (>= {eff['threshold']:.0%} of the needle-alone score): "
                         f"{f'{e} tokens' if e else 'below the shortest length'}, 95% CI [{eff['ci'][0]}, {eff['ci'][1]}]"
                         " (0 = below the shortest)")
            lines.append("ratio to needle alone: " + "; ".join(
                f"{r['length']}: {r['ratio']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" for r in eff["ratios"]))
    for s in rec["sizes"]:
        sh = s["summary"].get("shape")
        fill = f", {s['fill']:.0%} of the window" if "fill" in s else ""
        if sh:
            lines.append(f"{s['size']} tokens{fill}: shape {sh['shape']} (first - interior "
                         f"{sh['first']['difference']:+.2f} [{sh['first']['ci'][0]:+.2f}, {sh['first']['ci'][1]:+.2f}]; "
                         f"last - interior {sh['last']['difference']:+.2f} "
                         f"[{sh['last']['ci'][0]:+.2f}, {sh['last']['ci'][1]:+.2f}])")
    return lines
