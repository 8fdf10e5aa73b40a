"""Sec. 4.1 of Wu et al. (2025) as executable checks: Thm 4.1 (causal), 4.2 (sliding
window), 4.3 (prefix). Decay mask and RoPE (Lemma 4.4 - Thm 4.7) are in `theorems_pe`;
`theory.check_all` runs them all.

Every check builds seeded random single-head SANs that satisfy A1-A2 (see
`rollout.random_attention_layers`), computes the measured quantity and the paper's
prediction side by side, and returns a JSON-able dict::

    {"theorem": str, "holds": bool, "checks": {name: bool}, "params": {...}, ...numbers}

`holds` is the AND of `checks`; nothing is hidden: a failing check shows up as False next
to the numbers that made it fail. Depth: "t" is the paper's index, so P^(t) has t+1 layers.
Indices are 0-based (paper token j is index j-1).

Where a statement is a limit (t -> inf) we check what the proof gives at finite t, with the
proof's own constants measured on the instance (eps = the smallest attention weight on an
edge over all layers, Lemma A.1), plus a stated numerical tolerance for the limit itself.
"""

from __future__ import annotations

import math

import torch

from ..core.rollout import (
    as_mask,
    causal_mask,
    center_nodes,
    iter_rollout,
    prefix_mask,
    random_attention_layers,
    sliding_window_mask,
)

RTOL = 1e-9  # float64 slack on exact inequalities: a <= b is checked as a <= b (1 + RTOL) + 1e-300


# ---------------------------------------------------------------- shared helpers


def result(theorem: str, params: dict, checks: dict, **numbers) -> dict:
    """The common, JSON-able result shape; `holds` = all checks."""
    checks = {k: bool(v) for k, v in checks.items()}
    return {"theorem": theorem, "holds": all(checks.values()), "checks": checks, "params": params, **numbers}


def leq(a: torch.Tensor, b) -> bool:
    """a <= b elementwise with float slack."""
    return bool((a <= torch.as_tensor(b, dtype=a.dtype) * (1 + RTOL) + 1e-300).all())


def rollouts(layers: list[torch.Tensor]) -> torch.Tensor:
    """Stack of P^(0), ..., P^(T-1) (eq. 4). (T, N, N)."""
    return torch.stack(list(iter_rollout(layers)))


def min_edge_weight(layers: list[torch.Tensor], mask: torch.Tensor) -> float:
    """Lemma A.1's eps: min over layers and edges of A^(t)_ij."""
    return min(float(a[mask].min()) for a in layers)


def support_matches(ps: torch.Tensor, mask: torch.Tensor) -> bool:
    """P^(t)_ij > 0 exactly where a walk of t+1 edges goes from j to i (softmax keeps every edge)."""
    m = as_mask(mask).to(ps.dtype)
    s = torch.eye(m.shape[0], dtype=ps.dtype)
    for p in ps:
        s = ((s @ m) > 0).to(ps.dtype)
        if not torch.equal(p > 0, s > 0):
            return False
    return True


def decay_bound(eps: float, n_steps: int, n: int, offset: int = 0) -> torch.Tensor:
    """(1 - eps) (1 - (j - offset) eps)^t for t < n_steps, j < n: Thm 4.1 (offset 0) and
    Thm 4.3 (offset K-1), in 0-based j. Entries with j <= offset are set to 1 (no claim). (T, N)."""
    t = torch.arange(n_steps, dtype=torch.float64)[:, None]
    j = torch.arange(n, dtype=torch.float64)[None, :]
    b = (1 - eps) * (1 - (j - offset) * eps).clamp(min=0) ** t
    return torch.where(j > offset, b, torch.ones(()))


def first_depth(values: torch.Tensor, threshold: float) -> int | None:
    """Smallest t with values[t] >= threshold, or None."""
    hit = (values >= threshold).nonzero()
    return int(hit[0]) if len(hit) else None


def geometric_rate(deficit: torch.Tensor) -> float | None:
    """Per-layer contraction of a deficit over the second half of the depths (None if it hit 0)."""
    t0, t1 = len(deficit) // 2, len(deficit) - 1
    if t1 <= t0 or deficit[t1] <= 0 or deficit[t0] <= 0:
        return None
    return float((deficit[t1] / deficit[t0]) ** (1 / (t1 - t0)))


# ---------------------------------------------------------------- Theorem 4.1 (causal)


def check_causal(n: int = 32, n_layers: int = 40, d: int = 8, weight_norm: float = 1.0, seed: int = 0,
                 tol: float = 1e-3) -> dict:
    """Thm 4.1: under the causal mask P^(t)(z_i = first) -> 1, and for 0 < j <= i (0-based)
    P^(t)_ij <= C (1 - j eps)^t with C = 1 - eps (App. A, eps from Lemma A.1).

    Checks (all exact consequences of the proof except `converged`):
      * bound_j:      P^(t)_ij <= (1 - eps)(1 - j eps)^t for every t, i, j >= 1;
      * deficit_bound: 1 - min_i P^(t)_i0 <= sum_{j>=1} (1 - eps)(1 - j eps)^t;
      * monotone:     min_i P^(t)_i0 is non-decreasing in t (rows of P^(t+1) average rows of P^(t));
      * support:      P^(t) > 0 exactly on the lower triangle;
      * converged:    1 - min_i P^(T-1)_i0 <= tol (the limit, numerically, at depth T-1).
    """
    mask = causal_mask(n)
    layers = random_attention_layers(n, n_layers, mask, d, weight_norm, seed)
    ps = rollouts(layers)  # (T, N, N)
    eps = min_edge_weight(layers, mask)
    bound = decay_bound(eps, n_layers, n)  # (T, N)
    sink = ps[:, :, 0].min(dim=1).values  # (T,) min_i P^(t)_i0
    deficit = 1 - sink
    checks = {
        "bound_j": leq(ps[:, :, 1:], bound[:, None, 1:]),
        "deficit_bound": leq(deficit, bound[:, 1:].sum(dim=1)),
        "monotone": leq(sink[:-1], sink[1:]),
        "support": support_matches(ps, mask),
        "converged": float(deficit[-1]) <= tol,
    }
    params = dict(n=n, n_layers=n_layers, d=d, weight_norm=weight_norm, seed=seed, tol=tol)
    return result("4.1", params, checks, eps=eps, sink_mass=sink.tolist(), final_deficit=float(deficit[-1]),
                  rate_measured=geometric_rate(deficit), rate_bound=1 - eps,
                  max_bound_ratio=float((ps[:, :, 1:] / bound[:, None, 1:]).max()))


# ---------------------------------------------------------------- Theorem 4.2 (sliding window)


def hops(n: int, w: int) -> int:
    """ceil((N-1)/(w-1)): hops from the last token to the first under a width-w window (Thm 4.2)."""
    return math.ceil((n - 1) / (w - 1))


def block_bound(eps: float, k: int, n_steps: int, n: int) -> torch.Tensor:
    """App. B: with s = floor((t+1)/k) >= 1 full blocks of k layers (entries >= eps^k, Lemma B.1),
    max_i P^(t)_ij <= (1 - eps^k)(1 - j eps^k)^(s-1) for j >= 1. Entries with s = 0 or j = 0 are 1. (T, N)."""
    ek = eps**k
    s = (torch.arange(n_steps) + 1) // k  # (T,)
    j = torch.arange(n, dtype=torch.float64)
    b = (1 - ek) * (1 - j[None, :] * ek).clamp(min=0) ** (s[:, None] - 1).clamp(min=0)
    return torch.where((s[:, None] >= 1) & (j[None, :] >= 1), b, torch.ones(()))


def _window_row(n, w, n_layers, d, weight_norm, seed, tau) -> dict:
    mask = sliding_window_mask(n, w)
    layers = random_attention_layers(n, n_layers, mask, d, weight_norm, seed)
    ps = rollouts(layers)
    eps, k = min_edge_weight(layers, mask), hops(n, w)
    sink = ps[:, :, 0].min(dim=1).values
    t_conv = first_depth(sink, 1 - tau)
    return dict(w=w, hops=k, eps=eps, t_conv=t_conv, t_conv_over_hops=None if t_conv is None else t_conv / k,
                final_deficit=float(1 - sink[-1]), support=support_matches(ps, mask),
                block_bound=leq(ps, block_bound(eps, k, n_layers, n)[:, None, :]))


def check_sliding_window(n: int = 33, widths=(2, 3, 5, 9, 17, 33), n_layers: int = 160, d: int = 8,
                         weight_norm: float = 1.0, seed: int = 0, tau: float = 0.5) -> dict:
    """Thm 4.2: the sink still forms on the first token, but more slowly as the window narrows,
    at a rate set by k = ceil((N-1)/(w-1)) (the rollout needs k layers to connect the ends).

    Per width: t_conv = first depth with min_i P^(t)_i0 >= 1 - tau (default tau = 0.5).
    Checks:
      * support:      P^(t) > 0 exactly on (t+1)-step walks (all widths);
      * block_bound:  App. B's bound with the instance's eps (exact; loose as eps^k is tiny);
      * reach:        t_conv >= k - 1 (exact: no walk of fewer than k edges spans the sequence);
      * slower:       t_conv is non-increasing in w (narrower window -> slower convergence);
      * converged:    every width reaches the threshold within n_layers.
    `t_conv_over_hops` shows the scaling with k (the proof's exponent is t / (2k)).
    """
    rows = [_window_row(n, w, n_layers, d, weight_norm, seed + 7 * i, tau) for i, w in enumerate(sorted(widths))]
    tc = [r["t_conv"] for r in rows]
    converged = all(t is not None for t in tc)
    checks = {
        "support": all(r["support"] for r in rows),
        "block_bound": all(r["block_bound"] for r in rows),
        "reach": all(t is None or t >= r["hops"] - 1 for t, r in zip(tc, rows)),
        "slower": converged and all(a >= b for a, b in zip(tc, tc[1:])),
        "converged": converged,
    }
    params = dict(n=n, widths=list(sorted(widths)), n_layers=n_layers, d=d, weight_norm=weight_norm, seed=seed, tau=tau)
    return result("4.2", params, checks, rows=rows)


# ---------------------------------------------------------------- Theorem 4.3 (prefix)


def prefix_ratio(a0: torch.Tensor, k: int) -> float:
    """App. C's constant: min over rows l and prefix keys k1, k2 of A^(0)_{l k1} / A^(0)_{l k2}."""
    pre = a0[:, :k]  # (N, K); every row attends to every prefix token
    return float((pre.min(dim=1).values / pre.max(dim=1).values).min())


def check_prefix(n: int = 32, k: int = 4, n_layers: int = 40, d: int = 8, weight_norm: float = 1.0,
                 seed: int = 0, tol: float = 1e-3) -> dict:
    """Thm 4.3: under a prefix mask with K prefix tokens, the mass goes to the prefix and every
    prefix token keeps a share >= kappa > 0; non-prefix j decays like (1 - (j-K+1) eps)^t.

    Checks:
      * centers:      center nodes (Def. 3.1) of the mask are exactly the K prefix tokens;
      * share_bound:  P^(t)_ik >= rho S_i^(t) / K for all t, i and k < K, where S_i^(t) is the
                      prefix mass and rho = min_l A^(0)_{l k1} / A^(0)_{l k2} (App. C, exact);
      * bound_j:      P^(t)_ij <= (1 - eps)(1 - (j-K+1) eps)^t for j >= K (App. C via App. A);
      * support:      P^(t) > 0 exactly on (t+1)-step walks;
      * converged:    1 - min_i S_i^(T-1) <= tol (the limit, numerically).
    kappa_measured = min_{i, k<K} P^(T-1)_ik; kappa_bound = rho min_i S_i^(T-1) / K.
    """
    mask = prefix_mask(n, k)
    layers = random_attention_layers(n, n_layers, mask, d, weight_norm, seed)
    ps = rollouts(layers)
    eps, rho = min_edge_weight(layers, mask), prefix_ratio(layers[0], k)
    mass = ps[:, :, :k].sum(dim=-1)  # (T, N) prefix mass S_i^(t)
    bound = decay_bound(eps, n_layers, n, offset=k - 1)
    checks = {
        "centers": center_nodes(mask) == list(range(k)),
        "share_bound": leq(rho * mass[:, :, None] / k, ps[:, :, :k]),
        "bound_j": leq(ps[:, :, k:], bound[:, None, k:]),
        "support": support_matches(ps, mask),
        "converged": float(1 - mass[-1].min()) <= tol,
    }
    params = dict(n=n, k=k, n_layers=n_layers, d=d, weight_norm=weight_norm, seed=seed, tol=tol)
    return result("4.3", params, checks, eps=eps, rho=rho, prefix_mass=mass.min(dim=1).values.tolist(),
                  final_deficit=float(1 - mass[-1].min()), kappa_measured=float(ps[-1, :, :k].min()),
                  kappa_bound=rho * float(mass[-1].min()) / k,
                  final_shares=ps[-1, -1, :k].tolist())
