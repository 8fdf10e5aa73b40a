"""The emergence paper's theorems as one set of executable checks, and a compact summary of them.

`check_all(seed)` runs every check of `theorems` (Thm 4.1-4.3, masks) and `theorems_pe` (Lemma
4.4 - Thm 4.7, decay mask and RoPE) with its defaults; `summarize_checks` / `format_summary` give
one line per theorem for the CLI and theory.json.
"""

from __future__ import annotations

from .theorems import check_causal, check_prefix
from .theorems_window import check_sliding_window
from .theorems_pe import check_decay_mask
from .theorems_rope import check_rope


def check_all(seed: int = 0) -> dict[str, dict]:
    """Every check with its defaults (a few seconds on one core)."""
    return {
        "4.1": check_causal(seed=seed),
        "4.2": check_sliding_window(seed=seed),
        "4.3": check_prefix(seed=seed),
        "4.4-4.5": check_decay_mask(seed=seed),
        "4.6-4.7": check_rope(seed=seed),
    }


def _deepest(rows: list[dict], key: str) -> list[dict]:
    t_max = max(r["t"] for r in rows)
    return [r for r in rows if r["t"] == t_max and key in r]


def _key_numbers(theorem: str, r: dict) -> str:
    """A one-line digest of the numbers behind a check result."""
    if theorem == "4.1":
        rate = "none" if r["rate_measured"] is None else f"{r['rate_measured']:.3f}"
        return f"eps={r['eps']:.3g}, 1-min P[i,0] at T: {r['final_deficit']:.1e}, rate {rate} <= {r['rate_bound']:.4f}"
    if theorem == "4.2":
        return "t_conv/hops: " + ", ".join(f"w={w['w']}: {w['t_conv']}/{w['hops']}" for w in r["rows"])
    if theorem == "4.3":
        return (f"1-min prefix mass at T: {r['final_deficit']:.1e}, "
                f"kappa {r['kappa_measured']:.3f} >= {r['kappa_bound']:.3f}")
    if theorem == "4.4-4.5":
        return "argmax vs x*: " + ", ".join(f"m={w['m']:g} t={w['t']}: {w['argmax']} vs {w['x_star']:.1f}"
                                           for w in _deepest(r["rows"], "m"))
    if theorem == "4.6-4.7":
        return f"delta={r['delta']:.2f}, sink rows {r['n_sink_rows']}; argmax vs [x_tight, x_loose]: " + ", ".join(
            f"th={w['theta1']:.3f} t={w['t']}: {'sink' if w['sink_is_max'] else w['argmax']}"
            f" vs [{w['x_tight']}, {w['x_loose']}]" for w in _deepest(r["rows"], "theta1"))
    return ""


def summarize_checks(checks: dict[str, dict]) -> list[dict]:
    """One row per theorem: {theorem, holds, failed (check names), key (a short string)}."""
    return [{"theorem": th, "holds": bool(r["holds"]), "failed": [k for k, ok in r["checks"].items() if not ok],
             "key": _key_numbers(th, r)} for th, r in checks.items()]


def format_summary(summary: list[dict]) -> str:
    """The summary rows as aligned text lines, for the CLI."""
    lines = []
    for s in summary:
        verdict = "holds" if s["holds"] else "FAILS " + ",".join(s["failed"])
        lines.append(f"Thm {s['theorem']:<8} {verdict:<6}  {s['key']}")
    return "\n".join(lines)
