"""Long-context figures that relate a depth x length grid to the model itself (task niah, tasks/haystack.py).

references  per example, the closed-book score (no context: what the model knows without reading) and the
            needle-alone score (the needles, no haystack): Lost in the Middle's closed-book baseline and a
            haystack-free reference, each a one-position sweep on the grid's own examples and engine (the cells'
            resolved one, recorded as `engine`; OUT/ref-closed, OUT/ref-needle: the niah task's `references`)
bases       two references for the effective length, each reported under its own name:
            `nolima_base`  NoLiMa's base score (Modarressi et al. 2025, Sec. 4.3): the task itself, haystack
                           included, at short contexts (250, 500 and 1K tokens): "for each question-needle example,
                           we compute the average scores over 5 haystacks, then take its maximum score across the
                           250, 500, and 1K tests. The final base score is obtained by averaging these maximum scores
                           across all question-needle examples." Here: each example's mean over its depths at each
                           grid length <= 1K tokens (1k = 1024), its best such length, averaged over examples.
                           Unavailable (said, with the fix) when the grid has no length <= 1K.
            `needle_alone` the needles with no haystack at all (posbias's earlier base; not NoLiMa's)
effective   the longest length L such that every length up to L keeps accuracy >= `threshold` (0.85) x the base
            (NoLiMa: "the largest tested length that exceeds this threshold"; the same on a curve that falls with
            length, and here a dip at a shorter length is not skipped over). Compared as acc >= t x base - 1e-9:
            the scores are ratios of small counts, so 17/28 against 20/28 keeps 0.85 exactly.
intervals   per length, the ratio acc / base: Fieller's interval on the paired per-example scores, with z^2/4
            pseudo-examples at (1, 0) and at (0, 1) (Agresti & Min 2005's pseudo-pairs for paired proportions), so no
            interval is zero-width at the ceiling or with few examples. The effective length's interval:
            [longest L whose lengths' 95% lower ends all keep the threshold, longest L whose lengths' upper ends at
            1 - 0.05/K (K lengths, Bonferroni) all keep it]; it holds 95% for any true curve (the lower end fails
            only through the first failing length's lower end, the upper only through some kept length's upper
            end). A base near 0 makes a ratio's upper end unbounded (None in grid.json), so the interval reaches
            the longest length: no resample or base of 0 is ever read as length 0. tests/test_statistics_longctx.py
            checks both intervals' coverage by simulation.
partial     RULER's score for several asked values (`string_match_all`, NVIDIA/RULER
            scripts/eval/synthetic/constants.py): the share of the values found in the answer, beside the
            all-or-nothing `correct`
needles     with several needles, each needle's own hit rate (its value in the generated answer) by its true depth
"""

from __future__ import annotations

import math

import numpy as np

from ..core.stats import ALPHA, exact_ci, mean_ci, z_of
from ..errors import PosbiasError
from ..report.longctx_blocks import BASE_NAMES, effective_bases

THRESHOLD = 0.85  # NoLiMa: the effective length keeps >= 85% of the base score
SHORT = 1024  # NoLiMa's base lengths are 250, 500 and 1K tokens: the grid's lengths up to 1k (= 1024) here
EPS = 1e-9  # float error in acc >= t x base (ratios of small counts)


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
    """linear:N / sigmoid:N -> N distinct depth percents from 0 to 100 (0.1% steps); None for an explicit list. A
    count whose depths fall on one 0.1% slot after rounding (sigmoid:85 to 88) is refused, naming the counts near it
    that work: N depths always means N distinct depths."""
    kind, colon, n = depths.strip().partition(":")
    if not colon or kind not in ("linear", "sigmoid"):
        return None
    if not n.isdigit() or not 3 <= int(n) <= 101:
        raise PosbiasError(f"bad `depths` {depths!r}", "use linear:N or sigmoid:N with N from 3 to 101, e.g. "
                           "`depths=sigmoid:11`")
    pts = _spaced(kind, int(n))
    if len(set(pts)) < len(pts):
        below = max(k for k in range(3, int(n)) if len(set(_spaced(kind, k))) == k)
        above = min((k for k in range(int(n) + 1, 102) if len(set(_spaced(kind, k))) == k), default=None)
        raise PosbiasError(f"`depths={depths.strip()}` gives {len(set(pts))} distinct depths, not {n}: after rounding "
                           "to the 0.1% slots some fall on the same slot",
                           f"use `depths={kind}:{below}` (the largest count below {n} whose depths stay distinct)"
                           + (f" or `depths={kind}:{above}`" if above else ""))
    return [f"{p:g}" for p in pts]


def _spaced(kind: str, n: int) -> list[float]:
    from ..tasks import sigmoid_depths

    return sigmoid_depths(n) if kind == "sigmoid" else [round(100 * i / (n - 1), 1) for i in range(n)]


def fill_sizes(fill: str, window: int, answer: int) -> list[int]:
    """The token length of each share of the window; a full window keeps room for the answer."""
    return [min(int(f * window), window - answer) for f in fill_list(fill)]


def per_example(rows: list[dict], ids: list[str], score=lambda r: float(bool(r["correct"]))) -> np.ndarray:
    """Each example's mean score (default: all-or-nothing `correct`) over its rows (the depths of one length), in
    `ids` order."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["example_id"], []).append(score(r))
    return np.array([np.mean(by[i]) for i in ids])


def reference_record(rows: list[dict], ids: list[str]) -> dict:
    """A reference's accuracy over the examples with its exact (Clopper-Pearson) interval."""
    k, n = int(sum(bool(r["correct"]) for r in rows)), len(ids)
    lo, hi = exact_ci(k, n)
    return {"n": n, "correct": k, "accuracy": k / n, "ci_low": lo, "ci_high": hi}


def ratio_ci(a: np.ndarray, b: np.ndarray, z: float = z_of(ALPHA)) -> tuple[float, float]:
    """Interval for mean(a) / mean(b), a and b paired per-example scores in [0, 1] (module docstring): Fieller's
    quadratic on the data with z^2/4 pseudo-pairs at (1, 0) and (0, 1); (lo, inf) when mean(b) is not clear of 0."""
    w = z * z / 4
    x, y = np.r_[a, 1.0, 0.0], np.r_[b, 0.0, 1.0]
    wt = np.r_[np.ones(len(a)), w, w]
    n = wt.sum()
    mx, my = wt @ x / n, wt @ y / n
    vxx, vyy, vxy = wt @ (x - mx) ** 2 / n / n, wt @ (y - my) ** 2 / n / n, wt @ ((x - mx) * (y - my)) / n / n
    qa, qb, qc = my * my - z * z * vyy, mx * my - z * z * vxy, mx * mx - z * z * vxx
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return 0.0, math.inf
    return max(0.0, (qb - math.sqrt(disc)) / qa), (qb + math.sqrt(disc)) / qa


def keeps(acc: float, base: float, threshold: float) -> bool:
    """acc >= threshold x base, exact equality kept despite float error (17/28 against 20/28 at 0.85)."""
    return acc - threshold * base >= -EPS


def _longest(sizes: list[int], ok: list[bool]) -> int:
    """The longest length such that it and every shorter one are ok; 0 if the shortest is not."""
    k = next((j for j, o in enumerate(ok) if not o), len(sizes))
    return sizes[k - 1] if k else 0


def effective_length(per_size: dict[int, np.ndarray], base: np.ndarray, threshold: float = THRESHOLD) -> dict:
    """The effective length against one base (module docstring): per_size[L] = each example's accuracy at length L
    (mean over depths), base = each example's base score, all on the same examples in the same order. 0 means no
    length keeps the threshold. A base of 0 gives no point (None, with a note: nothing to relate the lengths to),
    while the interval still stands, unbounded above."""
    sizes, base = sorted(per_size), np.asarray(base, dtype=float)
    b = float(base.mean())
    z_sim = z_of(ALPHA / len(sizes))  # the upper ends hold together over the K lengths (Bonferroni)
    rows, lower_keeps, upper_keeps = [], [], []
    for s in sizes:
        acc = float(per_size[s].mean())
        lo, hi = ratio_ci(per_size[s], base)
        lower_keeps.append(lo >= threshold - EPS)
        upper_keeps.append(ratio_ci(per_size[s], base, z_sim)[1] >= threshold - EPS)
        rows.append({"length": s, "accuracy": acc, "ratio": acc / b if b else None,
                     "ci": [lo, None if math.isinf(hi) else hi], "keeps": keeps(acc, b, threshold) if b else None})
    out = {"threshold": threshold, "base": b, "base_ci": list(mean_ci(base)), "n": len(base), "lengths": sizes,
           "ci": [_longest(sizes, lower_keeps), _longest(sizes, upper_keeps)], "ratios": rows}
    if b == 0:
        return {**out, "effective_length": None, "note": "the base score is 0: no score to relate the lengths to"}
    return {**out, "effective_length": _longest(sizes, [r["keeps"] for r in rows])}


def nolima_base(per_size: dict[int, np.ndarray]) -> tuple[list[int], np.ndarray | None]:
    """NoLiMa's per-example base (module docstring): the grid's lengths <= 1K, and each example's best accuracy over
    them (None when the grid has none)."""
    short = sorted(s for s in per_size if s <= SHORT)
    return short, (np.max([per_size[s] for s in short], axis=0) if short else None)


def effective_lengths(per_size: dict[int, np.ndarray], needle: np.ndarray, threshold: float = THRESHOLD) -> dict:
    """The effective length under both bases, each under its own key (`nolima_base`, `needle_alone`)."""
    short, base = nolima_base(per_size)
    nolima = ({**effective_length(per_size, base, threshold), "base_lengths": short} if short else
              {"threshold": threshold, "base": None, "effective_length": None, "ci": None, "ratios": [],
               "base_lengths": [], "note": f"no grid length is <= {SHORT} tokens (NoLiMa's base is the task's own "
                                           "accuracy at 250, 500 and 1K tokens): add 1k to the lengths"})
    return {"threshold": threshold, "lengths": sorted(per_size), "nolima_base": nolima,
            "needle_alone": effective_length(per_size, needle, threshold)}


def long_record(record: dict, results: dict, refs: dict, window: int, threshold: float) -> None:
    """A niah grid's references (with their answers cut at the limit), effective lengths, each length's fill of the
    window and its needles' hit rates, into its record (grid.json); results and refs: the SweepResults per length and
    per reference."""
    ids = [r["example_id"] for r in refs["needle"].rows]
    record["references"] = {k: {**reference_record(v.rows, ids), "engine": v.config["engine"],
                                **({"cut": v.summary["cut"]} if "cut" in v.summary else {})} for k, v in refs.items()}
    per = {s: per_example(res.rows, ids) for s, res in results.items()}
    record["effective"] = effective_lengths(per, per_example(refs["needle"].rows, ids), threshold)
    record["window"] = window
    partial = partial_credit({s: res.rows for s, res in results.items()})  # several asked values: RULER's score
    for s in record["sizes"]:
        s["fill"] = s["tokens"]["mean"] / window
        if partial:
            s["partial"] = partial[s["size"]]["average"]
        hits = needle_hits(results[s["size"]].rows)
        if hits:
            s["needles"] = hits
    for c in record["cells"] if partial else ():
        c["partial"] = partial[c["size"]]["positions"][c["position"]]


def ruler_share(prediction: str, answers) -> float:
    """RULER's string_match_all for one answer: the share of the asked values found in it (case-insensitive
    substring, no punctuation stripped, so "1,234,567" does not hold 1234567)."""
    pred = prediction.lower()
    return sum(a.lower() in pred for a in answers) / len(answers)


def partial_credit(results: dict[int, list[dict]]) -> dict[int, dict] | None:
    """RULER's partial credit per length and depth (position) when the rows ask several values (multi-value,
    multi-query); None when each row asks one (partial credit is then the all-or-nothing score)."""
    if not any(len(r.get("answers") or ()) > 1 for rows in results.values() for r in rows):
        return None
    out = {}
    for size, rows in results.items():
        by: dict = {}
        for r in rows:
            by.setdefault(r["position"], []).append(ruler_share(r.get("prediction") or "", r["answers"]))
        out[size] = {"average": float(np.mean([v for vs in by.values() for v in vs])),
                     "positions": {p: float(np.mean(v)) for p, v in by.items()}}
    return out


def needle_hits(rows: list[dict], bins: int = 5) -> list[dict]:
    """With several needles (rows that carry `needle_answers` and a generated `prediction`): how often each role's
    value is in the answer (RULER's match: case-insensitive, punctuation kept), per true-depth bin of width 100/bins.
    [] when the rows carry none."""
    acc: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        if "needle_answers" not in r or "prediction" not in r:
            continue
        pred = r["prediction"].lower()
        for role, depth, ans in zip(r["needle_roles"], r["needle_depths"], r["needle_answers"]):
            b = min(int(depth // (100 / bins)), bins - 1)
            acc.setdefault((role, b), []).append(int(ans.lower() in pred))
    return [{"role": role, "depths": [b * 100 / bins, (b + 1) * 100 / bins], "n": len(v), "found": sum(v) / len(v)}
            for (role, b), v in sorted(acc.items())]


def _ci_text(ci) -> str:
    return f"[{ci[0]:.2f}, {'inf' if ci[1] is None else f'{ci[1]:.2f}'}]"


def _base_lines(b: dict, name: str) -> list[str]:
    """The effective length against one base, and each length's ratio to it, as lines."""
    if b.get("base") is None:
        return [f"{name}: unavailable ({b.get('note')})"]
    lo, hi = b.get("base_ci") or (float("nan"), float("nan"))
    over = f" over lengths {', '.join(map(str, b['base_lengths']))}" if b.get("base_lengths") else ""
    head = f"{name}{over} {b['base']:.3f} [{lo:.3f}, {hi:.3f}]"
    e = b["effective_length"]
    if e is None:
        ci = f", 95% CI [{b['ci'][0]}, {b['ci'][1]}]" if b.get("ci") else ""
        return [f"{head}; effective length vs {name}: none ({b.get('note')}){ci}"]
    length = f"{e} tokens" if e else "below the shortest length"
    return [f"{head}; effective length vs {name} (every length up to it keeps >= {b['threshold']:.0%} of it): {length}, "
            f"95% CI [{b['ci'][0]}, {b['ci'][1]}] (0 = below the shortest)",
            f"  ratio to {name}: " + "; ".join(f"{r['length']}: {r['ratio']:.2f} {_ci_text(r['ci'])}" for r in b["ratios"])]


def format_long(rec: dict) -> list[str]:
    """The references, the effective length under each base, RULER's partial credit and each length's fill and
    shape, as lines under the grid's table."""
    lines = []
    refs = rec.get("references") or {}
    if refs:
        engine = refs["needle"].get("engine")  # the cells' own engine (grids before it was recorded: none said)
        lines.append(f"references{f' ({engine})' if engine else ''}: " + "; ".join(
            f"{name} {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" for name, r in
            (("closed-book", refs["closed"]), ("needle alone", refs["needle"]))))
    for key, b in effective_bases(rec.get("effective")).items():
        lines += _base_lines(b, BASE_NAMES[key])
    partial = [s for s in rec["sizes"] if "partial" in s]
    if partial:
        lines.append("cells, averages and effective lengths above: all-or-nothing (every asked value found); RULER's "
                     "partial credit (share of the asked values found, string_match_all): "
                     + "; ".join(f"{s['size']}: {s['partial']:.3f}" for s in partial))
    for s in rec["sizes"]:
        sh = s["summary"].get("shape")
        fill = f", {s['fill']:.0%} of the window" if "fill" in s else ""
        if sh:
            lines.append(f"{s['size']} tokens{fill}: shape {sh['shape']} (first - interior "
                         f"{sh['first']['difference']:+.2f} [{sh['first']['ci'][0]:+.2f}, {sh['first']['ci'][1]:+.2f}]; "
                         f"last - interior {sh['last']['difference']:+.2f} "
                         f"[{sh['last']['ci'][0]:+.2f}, {sh['last']['ci'][1]:+.2f}])")
    return lines
