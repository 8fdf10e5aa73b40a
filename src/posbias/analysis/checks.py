"""The emergence paper's theorems as one set of executable checks, and a compact summary of them.

`check_all(seed, n_tokens, depth)` runs every check of `theorems` (Thm 4.1, 4.3), `theorems_window`
(Thm 4.2), `theorems_pe` (Lemma 4.4, Thm 4.5), `theorems_rope` (Lemma 4.6, Thm 4.7) and
`theorems_rope_multi` (App. I), and PINE's mask (`theorems_pine`: not the paper's, the mitigation's claim in the same
terms); `check_kwargs` is the mapping from (N, T) to each check's arguments.
`summarize_checks` / `format_summary` give one line per theorem for the CLI and theory.json.
"""

from __future__ import annotations

import math

from ..errors import PosbiasError
from .theorems import check_causal, check_prefix
from .theorems_pe import check_decay_mask, decay_critical_distance
from .theorems_pine import check_pine
from .theorems_rope import check_rope
from .theorems_rope_multi import check_rope_multi
from .theorems_window import check_sliding_window

CHECKS = {"4.1": check_causal, "4.2": check_sliding_window, "4.3": check_prefix, "4.4-4.5": check_decay_mask,
          "4.6-4.7": check_rope, "I.1-I.2": check_rope_multi, "PINE": check_pine}
MIN_TOKENS, MIN_DEPTH = 16, 8
DECAY_MS, PROFILE_DEPTHS = (0.223, 0.5, 1.0, 2.0), (1, 2, 4, 8, 16)


def _depths(depth: int, grid) -> list[int]:
    return sorted({t for t in grid if t < depth} | {depth - 1})


def _window_widths(n: int, depth: int) -> list[int]:
    """Widths w = 1 + ceil((N-1)/k) for hop counts k = 1, 2, 4, ... with 2k + 2 <= depth (the measured
    t_conv is about 2k + 1, so every width can converge within `depth` layers) and k <= N-1."""
    ks = [2**e for e in range(12) if 2 ** (e + 1) + 2 <= depth and 2**e <= n - 1]
    return sorted({1 + math.ceil((n - 1) / k) for k in ks})


def _decay_kwargs(n: int, depths: list[int]) -> dict:
    """Decay check at N tokens: the ms of DECAY_MS whose deepest profile fits (n_query + 3 x* <= N)."""
    n_query = max(2, n // 8)
    ms = [m for m in DECAY_MS if n_query + 3 * decay_critical_distance(depths[-1], m) <= n]
    if not ms:
        raise PosbiasError(f"N = {n} tokens is too short for the decay-mask check at depth {depths[-1] + 1}",
                           "raise --tokens or lower --depth")
    return dict(n=n, ms=tuple(ms), depths=tuple(depths), n_query=n_query)


def check_kwargs(n_tokens: int | None = None, depth: int | None = None) -> dict[str, dict]:
    """Each check's arguments: its own defaults, with N = n_tokens and T = depth layers where given.

    PINE: n = N, n_layers = T (four documents between a prefix of 2 and a suffix of 3);
    4.1, 4.3: n = N, n_layers = T (prefix K = min(4, max(2, N // 4))); 4.2: n = N, n_layers = T, widths
    from `_window_widths`; 4.4-4.5: n = N, depths = {1, 2, 4, 8, 16} below T plus T-1, n_query = N // 8,
    ms from `_decay_kwargs`; 4.6-4.7 and App. I: n = N, depths = {1, 2, 4, 8} below T plus T-1.
    """
    if n_tokens is not None and n_tokens < MIN_TOKENS:
        raise PosbiasError(f"the theorem checks need at least {MIN_TOKENS} tokens, got {n_tokens}",
                           f"use --tokens {MIN_TOKENS} or more")
    if depth is not None and depth < MIN_DEPTH:
        raise PosbiasError(f"the theorem checks need at least {MIN_DEPTH} layers, got {depth}",
                           f"use --depth {MIN_DEPTH} or more")
    out: dict[str, dict] = {name: {} for name in CHECKS}
    n = {} if n_tokens is None else {"n": n_tokens}
    for name in ("4.1", "4.3", "4.6-4.7", "I.1-I.2", "PINE"):
        out[name].update(n)
    if n_tokens is not None:
        out["4.3"]["k"] = min(4, max(2, n_tokens // 4))
    if depth is not None:
        out["4.1"]["n_layers"] = out["4.3"]["n_layers"] = out["4.2"]["n_layers"] = out["PINE"]["n_layers"] = depth
        out["4.6-4.7"]["depths"] = out["I.1-I.2"]["depths"] = tuple(_depths(depth, (1, 2, 4, 8)))
    if n_tokens is not None or depth is not None:
        nw = 33 if n_tokens is None else n_tokens
        out["4.2"].update(n=nw, widths=tuple(_window_widths(nw, 160 if depth is None else depth)))
        out["4.4-4.5"] = _decay_kwargs(256 if n_tokens is None else n_tokens,
                                       list(PROFILE_DEPTHS) if depth is None else _depths(depth, PROFILE_DEPTHS))
    return out


def check_all(seed: int = 0, n_tokens: int | None = None, depth: int | None = None) -> dict[str, dict]:
    """Every check at N = n_tokens and T = depth (None: the check's own defaults; a few seconds on one
    core). Each result's `params` records what that check used."""
    return {name: CHECKS[name](seed=seed, **kw) for name, kw in check_kwargs(n_tokens, depth).items()}


def _deepest(rows: list[dict], key: str) -> list[dict]:
    t_max = max(r["t"] for r in rows)
    return [r for r in rows if r["t"] == t_max and key in r]


def _window_key(r: dict) -> str:
    fit, vac = r["fit"], r["vacuous_widths"]
    slope = "none" if fit["slope"] is None else f"{fit['slope']:.2f}"
    return ("t_conv/k: " + ", ".join(f"w={w['w']}: {w['t_conv']}/{w['hops']}" for w in r["rows"])
            + f"; slope {slope}; stated bound vacuous for w in {vac}")


def _rope_key(r: dict) -> str:
    rows = _deepest(r["rows"], "theta1")
    return (f"delta={r['delta']:.2f}, sink rows {r['n_sink_rows']}; closed form (t<=1) "
            f"{'ok' if r['checks']['closed_form'] else 'FAILS'}, sandwich (t>=2) {'ok' if r['checks']['sandwich'] else 'FAILS'}; "
            "argmax vs [x_tight, x_loose]: " + ", ".join(
                f"th={w['theta1']:.3f} t={w['t']}: {'sink' if w['sink_is_max'] else w['argmax']}"
                f" vs [{w['x_tight']}, {w['x_loose']}]" for w in rows))


def _tol_depth(r: dict) -> str:
    """Where the deficit reaches the tolerance: measured, or extrapolated at the fitted rate."""
    t, n = r.get("tol_depth"), r["params"]["n_layers"]
    if t is None:
        return ""
    return f", <= {r['params']['tol']:g} at t={t:.0f}" + (" (extrapolated)" if t > n - 1 else "")


def _key_numbers(theorem: str, r: dict) -> str:
    """A one-line digest of the numbers behind a check result."""
    if theorem == "4.1":
        rate = "none" if r["rate_measured"] is None else f"{r['rate_measured']:.3f}"
        return (f"eps={r['eps']:.3g}, centers {r['centers']}, 1-min P[i,0] at T: {r['final_deficit']:.1e}, "
                f"rate {rate} <= {r['rate_bound']:.4f}{_tol_depth(r)}")
    if theorem == "4.2":
        return _window_key(r)
    if theorem == "4.3":
        return (f"1-min prefix mass at T: {r['final_deficit']:.1e}, "
                f"kappa {r['kappa_measured']:.3f} >= {r['kappa_bound']:.3f}{_tol_depth(r)}")
    if theorem == "4.4-4.5":
        return "argmax vs x*: " + ", ".join(f"m={w['m']:g} t={w['t']}: {w['argmax']} vs {w['x_star']:.1f}"
                                           for w in _deepest(r["rows"], "m"))
    if theorem == "4.6-4.7":
        return _rope_key(r)
    if theorem == "I.1-I.2":
        p = r["params"]
        return (f"d={p['d']}, alphas {p['alphas']}, beta {min(t['beta_q'] for t in r['per_theta']):.2f}, condition "
                f"{max(t['condition_lhs'] for t in r['per_theta']):.2f} <= 2pi; argmax at T: "
                + ", ".join(str(w["argmax"]) for w in _deepest(r["rows"], "theta1")))
    if theorem == "PINE":
        return (f"largest spread of a document's influence over all {r['params']['orders']} orders, relative: "
                f"{r['spread_pine']:.1e} under PINE's mask, {r['spread_causal']:.2f} under the causal mask")
    return ""


def summarize_checks(checks: dict[str, dict]) -> list[dict]:
    """One row per theorem: {theorem, holds, failed (check names), params, key (a short string)}."""
    return [{"theorem": th, "holds": bool(r["holds"]), "failed": [k for k, ok in r["checks"].items() if not ok],
             "n": r["params"].get("n"), "key": _key_numbers(th, r)} for th, r in checks.items()]


def format_summary(summary: list[dict]) -> str:
    """The summary rows as aligned text lines, for the CLI."""
    lines = []
    for s in summary:
        verdict = "holds" if s["holds"] else "FAILS " + ",".join(s["failed"])
        kind = "Check" if s["theorem"] == "PINE" else "Thm"  # PINE's is a mitigation's claim, not the paper's
        lines.append(f"{kind} {s['theorem']:<{11 - len(kind)}} {verdict:<6}  {s['key']}")
    return "\n".join(lines)
