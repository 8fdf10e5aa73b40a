"""Sec. 4.1 of Wu et al. (2025) as executable checks: Thm 4.1 (causal) and 4.3 (prefix), plus the
helpers every check shares. Thm 4.2 (sliding window) is in `theorems_window`, the decay mask
(Lemma 4.4, Thm 4.5) in `theorems_pe`, RoPE (Lemma 4.6, Thm 4.7, App. I) in `theorems_rope`;
`checks.check_all` runs them all.

Every check builds seeded random single-head SANs that satisfy A1-A2 (see
`rollout.random_attention_layers`), computes the measured quantity and the paper's
prediction side by side, and returns a JSON-able dict::

    {"theorem": str, "claim": str, "holds": bool, "checks": {name: bool}, "direct": [names],
     "proof": [names], "params": {...}, ...numbers}

`claim` is the theorem's statement in short. `holds` is the AND of `checks`; nothing is hidden:
a failing check shows up as False next to the numbers that made it fail. Each check name is
either `direct` (it tests what the theorem claims, or a consequence that follows without the
proof's constants) or `proof` (an inequality of the proof with its constants measured on the
instance: exact, but it tests the proof's steps, and can be vacuous). Depth: "t" is the paper's index, so P^(t) has t+1 layers.
Indices are 0-based (paper token j is index j-1).

Where a statement is a limit (t -> inf) we check what the proof gives at finite t, with the
proof's own constants measured on the instance (eps = the smallest attention weight on an
edge over all layers, Lemma A.1), plus a stated numerical tolerance for the limit itself.
"""

from __future__ import annotations

import math

import torch

from ..core.rollout import as_mask, causal_mask, center_nodes, iter_rollout, prefix_mask, random_attention_layers
from ..errors import PosbiasError

RTOL = 1e-9  # float64 slack on exact inequalities: a <= b is checked as a <= b (1 + RTOL) + 1e-300


# ---------------------------------------------------------------- shared helpers


def result(theorem: str, claim: str, params: dict, checks: dict, proof=(), **numbers) -> dict:
    """The common, JSON-able result shape; `holds` = all checks; names in `proof` are proof-constant
    checks, the others direct."""
    checks = {k: bool(v) for k, v in checks.items()}
    return {"theorem": theorem, "claim": claim, "holds": all(checks.values()), "checks": checks,
            "direct": [k for k in checks if k not in proof], "proof": [k for k in checks if k in proof],
            "params": params, **numbers}


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


def deficit_curve(ps: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """max_i of the mass OFF the target columns, per depth: 1 - min_i P^(t)[i, targets], summed
    directly so that it stays accurate far below float64's 1e-16 next to 1. (T,)."""
    off = torch.ones(ps.shape[-1], dtype=torch.bool)
    off[targets] = False
    return ps[:, :, off].sum(dim=-1).max(dim=1).values


def geometric_rate(deficit: torch.Tensor) -> float | None:
    """Per-layer contraction of a deficit: exp of the least-squares slope of log(deficit) against t
    over the second half of the depths (where it is > 0). 0.0 if the deficit reached exactly 0;
    None if there are fewer than 2 points to fit."""
    tail = deficit[len(deficit) // 2:]
    t = torch.arange(len(deficit) // 2, len(deficit), dtype=torch.float64)
    on = tail > 0
    if int(on.sum()) < 2:
        return 0.0 if len(tail) and float(tail[-1]) == 0 else None
    t, y = t[on], tail[on].log()
    slope = ((t - t.mean()) * (y - y.mean())).sum() / ((t - t.mean()) ** 2).sum()
    return float(slope.exp())


def converges(deficit: torch.Tensor, tol: float) -> tuple[bool, float | None]:
    """The finite-depth face of a limit deficit -> 0: (verdict, depth at which the deficit reaches tol).

    True if the deficit is <= tol at the last layer, or if it is still shrinking geometrically toward 0
    there: over the second half of the depths it fell by at least half and its fitted per-layer rate is
    < 1 (a deficit levelling off at a positive value, as token 0's under a prefix mask, falls by less).
    The second number is the measured depth (reached) or the extrapolated one (contracting), else None."""
    last, mid = float(deficit[-1]), float(deficit[len(deficit) // 2])
    if last <= tol:
        return True, float(first_depth(-deficit, -tol))
    rate = geometric_rate(deficit)
    if rate is None or not 0 < rate < 1 or last > 0.5 * mid:
        return False, None
    return True, len(deficit) - 1 + math.log(tol / last) / math.log(rate)


def instance(n_layers: int, mask, layers, d: int, weight_norm: float, seed: int):
    """(mask, layers): the given ones, or a seeded random SAN (A1-A2) on `mask`. A mask defaults to the
    support of the first given layer; `layers` override n and n_layers."""
    if layers is not None:
        layers = [torch.as_tensor(a, dtype=torch.float64) for a in layers]
        if not layers:
            raise PosbiasError("a theorem check needs at least one layer", "pass a non-empty `layers` list")
        mask = as_mask(layers[0] > 0 if mask is None else mask)
        if any(a.shape != mask.shape for a in layers):
            raise PosbiasError(f"layers and mask disagree in shape: {tuple(layers[0].shape)} vs {tuple(mask.shape)}",
                               "pass (N, N) layers and an (N, N) mask")
        return mask, layers
    mask = as_mask(mask)
    return mask, random_attention_layers(mask.shape[0], n_layers, mask, d, weight_norm, seed)


# ---------------------------------------------------------------- Theorem 4.1 (causal)

CLAIM_41 = ("causal mask: P^(t)(z_i = first token) -> 1 for every i as t -> inf, and for 1 < j <= i "
            "(1-based) P^(t)(z_i = j) <= C (1 - (j-1) eps)^t with 0 < C, eps < 1, N eps < 1")


def check_causal(n: int = 32, n_layers: int = 40, d: int = 8, weight_norm: float = 1.0, seed: int = 0,
                 tol: float = 1e-3, mask=None, layers=None) -> dict:
    """Thm 4.1 on a seeded SAN over `mask` (default: causal; inject `mask` / `layers` to test others).

    Direct checks (the claim itself):
      * first_is_center: the center nodes (Def. 3.1) of the mask are exactly {first token}: the
                         sink the theorem names is the graph's only center (False on a full mask,
                         where every node is a center, or on a mask with another center set);
      * monotone:   min_i P^(t)_i0 is non-decreasing in t;
      * converges:  the deficit 1 - min_i P^(t)_i0 -> 0: <= tol at the last layer, or still shrinking
                    geometrically there (`converges`: a stack too shallow to reach tol is not a
                    counterexample; the depth where it would is reported as `tol_depth`);
      * rate:       the deficit's measured geometric rate (log-linear fit over the second half of
                    the depths) is no slower than the proof's 1 - eps (App. A: the bound's slowest
                    term, j = 1, contracts by 1 - eps per layer).
    Proof-constant checks (App. A with eps = min edge weight, Lemma A.1, measured):
      * proof_bound_j: P^(t)_ij <= (1 - eps)(1 - j eps)^t for all t, i and j >= 1 (0-based);
      * proof_deficit: 1 - min_i P^(t)_i0 <= sum_{j>=1} (1 - eps)(1 - j eps)^t;
      * support:       P^(t) > 0 exactly on (t+1)-step walks (softmax keeps every edge).
    """
    injected = mask is not None or layers is not None
    mask, layers = instance(n_layers, causal_mask(n) if mask is None and layers is None else mask, layers, d, weight_norm, seed)
    n, n_layers = mask.shape[0], len(layers)
    ps = rollouts(layers)  # (T, N, N)
    eps = min_edge_weight(layers, mask)
    bound = decay_bound(eps, n_layers, n)  # (T, N)
    sink = ps[:, :, 0].min(dim=1).values  # (T,) min_i P^(t)_i0
    deficit = deficit_curve(ps, [0])  # (T,) = 1 - sink, accurately
    rate, centers = geometric_rate(deficit), center_nodes(mask)
    conv = converges(deficit, tol)
    checks = {
        "first_is_center": centers == [0],
        "monotone": leq(sink[:-1], sink[1:]),
        "converges": conv[0],
        "rate": rate is not None and rate <= (1 - eps) * (1 + RTOL),
        "proof_bound_j": leq(ps[:, :, 1:], bound[:, None, 1:]),
        "proof_deficit": leq(deficit, bound[:, 1:].sum(dim=1)),
        "support": support_matches(ps, mask),
    }
    params = dict(n=n, n_layers=n_layers, d=d, weight_norm=weight_norm, seed=seed, tol=tol, injected=injected)
    return result("4.1", CLAIM_41, params, checks, proof=("proof_bound_j", "proof_deficit", "support"),
                  eps=eps, centers=centers[:8], n_centers=len(centers), sink_mass=sink.tolist(),
                  deficit=deficit.tolist(), final_deficit=float(deficit[-1]), tol_depth=conv[1], rate_measured=rate,
                  rate_bound=1 - eps, max_bound_ratio=float((ps[:, :, 1:] / bound[:, None, 1:]).max()))


# ---------------------------------------------------------------- Theorem 4.3 (prefix)

CLAIM_43 = ("prefix mask with K prefix tokens: P^(t)(z_i in [K]) -> 1, liminf_t P^(t)(z_i = k) >= kappa > 0 "
            "for every prefix token k, and P^(t)(z_i = j) <= C (1 - (j-K) eps)^t for K < j <= i (1-based)")


def prefix_ratio(a0: torch.Tensor, k: int) -> float:
    """App. C's constant: min over rows l and prefix keys k1, k2 of A^(0)_{l k1} / A^(0)_{l k2}."""
    pre = a0[:, :k]  # (N, K); every row attends to every prefix token
    return float((pre.min(dim=1).values / pre.max(dim=1).values).min())


def check_prefix(n: int = 32, k: int = 4, n_layers: int = 40, d: int = 8, weight_norm: float = 1.0,
                 seed: int = 0, tol: float = 1e-3, mask=None, layers=None) -> dict:
    """Thm 4.3 on a seeded SAN over `mask` (default: the prefix mask with K = k; inject `mask` /
    `layers` to test others). S_i^(t) = sum_{k<K} P^(t)_ik is the prefix mass.

    Direct checks:
      * centers:        the center nodes (Def. 3.1) of the mask are exactly the K prefix tokens;
      * converges:      1 - min_i S_i^(t) -> 0 (`converges`: reached tol, or shrinking geometrically);
      * shares_persist: every prefix token keeps mass: kappa(t) = min_{i, k<K} P^(t)_ik is > 0 at the
                        last layer and has not decayed (kappa(T-1) >= kappa(T//2) / 2), the finite-depth
                        face of liminf >= kappa > 0 (under a causal mask tokens 1..K-1 decay geometrically).
    Proof-constant checks (App. C):
      * proof_share_bound: P^(t)_ik >= rho S_i^(t) / K for all t, i, k < K, with
                           rho = min_l A^(0)_{l k1} / A^(0)_{l k2} > 0 (rho = 0 makes it vacuous: False);
      * proof_bound_j:     P^(t)_ij <= (1 - eps)(1 - (j-K+1) eps)^t for j >= K (App. C via App. A);
      * support:           P^(t) > 0 exactly on (t+1)-step walks.
    """
    injected = mask is not None or layers is not None
    default = prefix_mask(n, k) if mask is None and layers is None else mask
    mask, layers = instance(n_layers, default, layers, d, weight_norm, seed)
    n, n_layers = mask.shape[0], len(layers)
    if not 1 <= k < n:
        raise PosbiasError(f"prefix length must be in [1, {n - 1}], got {k}", "use a shorter prefix")
    ps = rollouts(layers)
    eps, rho = min_edge_weight(layers, mask), prefix_ratio(layers[0], k)
    mass = ps[:, :, :k].sum(dim=-1)  # (T, N) prefix mass S_i^(t)
    deficit = deficit_curve(ps, list(range(k)))  # (T,) 1 - min_i S_i^(t)
    kappa = ps[:, :, :k].min(dim=2).values.min(dim=1).values  # (T,)
    bound = decay_bound(eps, n_layers, n, offset=k - 1)
    conv = converges(deficit, tol)
    checks = {
        "centers": center_nodes(mask) == list(range(k)),
        "converges": conv[0],
        "shares_persist": float(kappa[-1]) > 0 and float(kappa[-1]) >= float(kappa[n_layers // 2]) / 2,
        "proof_share_bound": rho > 0 and leq(rho * mass[:, :, None] / k, ps[:, :, :k]),
        "proof_bound_j": leq(ps[:, :, k:], bound[:, None, k:]),
        "support": support_matches(ps, mask),
    }
    params = dict(n=n, k=k, n_layers=n_layers, d=d, weight_norm=weight_norm, seed=seed, tol=tol, injected=injected)
    return result("4.3", CLAIM_43, params, checks, proof=("proof_share_bound", "proof_bound_j", "support"),
                  eps=eps, rho=rho, prefix_mass=mass.min(dim=1).values.tolist(), final_deficit=float(deficit[-1]),
                  tol_depth=conv[1], kappa=kappa.tolist(), kappa_measured=float(kappa[-1]), kappa_bound=rho * float(mass[-1].min()) / k,
                  final_shares=ps[-1, -1, :k].tolist())
