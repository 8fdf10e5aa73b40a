"""Sec. 4.2 of Wu et al. (2025) as an executable check: the decay mask (Lemma 4.4, Thm 4.5), plus
the prediction helpers the RoPE checks (`theorems_rope`) share. Result shape and conventions as in
`theorems`.

The Theta(.) statements hold with constants that depend on the instance, so on a finite
instance they are only meaningful with the constants spelled out. We therefore check
(a) the lemma and theorem with the proofs' explicit constants measured on the instance
(exact inequalities), and (b) what the paper draws from them: the location of the peak of
the distance profile x -> P^(t)_{i, i-x} (the critical distance x*) and its trends in the
depth t, the decay m and the angle theta_1, with stated tolerances.
"""

from __future__ import annotations

import math

import torch

from ..core.rollout import attention_scores, causal_mask, random_inputs, random_weights, san_forward
from ..errors import PosbiasError
from .theorems import leq, result, rollouts

# ---------------------------------------------------------------- predictions


def log_binom(t: int, x: torch.Tensor) -> torch.Tensor:
    """log C(t + x, x): the number of causal paths of t+1 layers over distance x (App. E)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    return torch.lgamma(t + x + 1) - torch.lgamma(x + 1) - math.lgamma(t + 1)


def decay_critical_distance(t: int, m: float) -> float:
    """Thm 4.5: x* = t / (e^m - 1), the Stirling critical point of log C(t+x, x) - x m."""
    return t / math.expm1(m)


def rope_critical_distance(t: int, theta1: float, c: float = 1.0) -> float:
    """Thm 4.7 / App. H: the root of L'(x) = log((t+x)/x) - 2 c theta1^2 x (Stirling).

    App. H prints the derivative of theta1^2 x^2 as 2 theta1 x; we use 2 theta1^2 x (the
    sign conclusions dx*/dt > 0 and dx*/dtheta1 < 0 are unchanged). L' decreases in x, so
    bisection is exact. Returns 0 for t = 0.
    """
    if t == 0:
        return 0.0
    k = 2 * c * theta1**2
    lo, hi = 1e-12, 1.0
    while math.log1p(t / hi) > k * hi:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.log1p(t / mid) > k * mid else (lo, mid)
    return (lo + hi) / 2


def profile_argmax(t: int, log_kernel: torch.Tensor) -> int:
    """Integer argmax over x = 0..len-1 of log C(t+x, x) + log_kernel[x] (exact, no Stirling)."""
    x = torch.arange(len(log_kernel), dtype=torch.float64)
    return int((log_binom(t, x) + log_kernel).argmax())


def distance_profile(p: torch.Tensor, rows: torch.Tensor, n_dist: int) -> torch.Tensor:
    """Mean over query rows i of P[i, i - x] for x = 0..n_dist-1 (needs rows >= n_dist - 1). (n_dist,)."""
    x = torch.arange(n_dist)
    return p[rows[:, None], rows[:, None] - x[None, :]].mean(dim=0)


def _non_decreasing(v, slack: float = 0) -> bool:
    """v[0] <= v[1] + slack <= ... (each step may fall back by at most `slack`)."""
    return all(a <= b + slack for a, b in zip(v, v[1:]))


def _dist(n: int) -> torch.Tensor:
    i = torch.arange(n)
    return (i[:, None] - i[None, :]).to(torch.float64)  # (N, N) = i - j


# ---------------------------------------------------------------- Lemma 4.4 / Theorem 4.5 (decay)


def _decay_lemma(attns, xs, w, m: float, mask) -> dict:
    """Lemma 4.4 with App. D's constants from each layer's realised score range [I_min, I_max]
    on the mask: C_min = (1 - e^-m) e^(I_min - I_max), C_max = e^(I_max - I_min) / (1 + e^-m).
    App. D's C_max needs two keys in the row, so row 0 (A_00 = 1) is checked against e^(I_max - I_min)."""
    x = _dist(mask.shape[0])
    c_min, c_all, ok = [], [], True
    for t, a in enumerate(attns):
        z = attention_scores(xs[t], w.wq[t], w.wk[t])[mask]
        spread = float(z.max() - z.min())
        lo, hi = -math.expm1(-m) * math.exp(-spread), math.exp(spread) / (1 + math.exp(-m))
        r = (a * torch.exp(x * m))[mask]  # A_ij e^{(i-j)m} on the mask; r[0] is row 0
        ok &= leq(torch.tensor(lo), r) and leq(r[1:], hi) and leq(r[:1], math.exp(spread))
        c_min.append(lo)
        c_all.append(math.exp(spread))
    return dict(ok=ok, c_min=c_min, c_max=c_all)


def _decay_one_m(n, m, n_layers, d, weight_norm, seed, depths, n_query, rel_tol, decay) -> dict:
    mask = causal_mask(n)
    w = random_weights(n_layers, d, weight_norm, seed)
    attns, xs = san_forward(random_inputs(n, d, seed + 1), w, mask, decay_m=m if decay else None)
    lemma = _decay_lemma(attns, xs, w, m, mask)
    ps = rollouts(attns)  # (T, N, N)
    x = _dist(n)
    rows, n_dist = torch.arange(n - n_query, n), n - n_query + 1
    theta_ok, out = True, []
    for t in range(n_layers):
        shape = torch.exp(log_binom(t, x.clamp(min=0)) - x.clamp(min=0) * m)  # C(t+x, x) e^{-xm}
        lo = math.prod(lemma["c_min"][: t + 1]) * shape
        hi = math.prod(lemma["c_max"][: t + 1]) * shape
        theta_ok &= leq(lo[mask], ps[t][mask]) and leq(ps[t][mask], hi[mask])
        if t in depths:
            ratio = ps[t][mask] / shape[mask]
            measured = int(distance_profile(ps[t], rows, n_dist).argmax())
            pred = decay_critical_distance(t, m)
            out.append(dict(m=m, t=t, x_star=pred, argmax=measured, located=abs(measured - pred) <= 1 + rel_tol * pred,
                            log_ratio_spread=float((ratio.max() / ratio.min()).log())))
    return dict(lemma_ok=lemma["ok"], theta_ok=theta_ok, rows=out)


CLAIM_45 = ("causal + decay mask D_ij = -(i-j) m: C_min e^{-(i-j)m} <= A_ij <= C_max e^{-(i-j)m} (Lemma 4.4), "
            "P^(t)(z_i = j) = Theta(C(t+i-j, i-j) e^{-(i-j)m}) (Thm 4.5), peak of the distance profile at "
            "x* = t/(e^m - 1): deeper -> further, larger m -> nearer")


def check_decay_mask(n: int = 256, ms=(0.223, 0.5, 1.0), depths=(1, 2, 4, 8, 16), n_query: int = 32, d: int = 8,
                     weight_norm: float = 1.0, seed: int = 0, rel_tol: float = 0.1, decay: bool = True) -> dict:
    """Lemma 4.4 and Thm 4.5 (causal mask + decay mask D_ij = -(i-j) m, eq. 2). `decay=False` builds
    the same SANs WITHOUT the decay bias (the predictions still use m): the check must then fail.

    Proof-constant checks:
      * lemma:  C_min e^{-(i-j)m} <= A_ij <= C_max e^{-(i-j)m} in every layer, with App. D's
                constants from the layer's realised score range (exact);
      * theta:  prod_l C_min^(l) <= P^(t)_ij / (C(t+i-j, i-j) e^{-(i-j)m}) <= prod_l C_max^(l)
                for every t, j <= i: App. E's path count made explicit (exact);
    Direct checks:
      * located: the argmax over x of the distance profile (mean of P^(t)_{i,i-x} over the last
                n_query rows, far from the first-token sink) is within 1 + rel_tol * x* of
                x* = t / (e^m - 1) (tolerance: 1 token + 10% by default). With constant scores
                the profile is negative-binomial and its mode is floor(x*) exactly;
      * deeper: the measured argmax is non-decreasing in t (for each m);
      * decay:  the measured argmax is non-increasing in m (for each t).
    `log_ratio_spread` = log(max/min) of the Theta ratio over all j <= i: how tight Theta is.
    """
    depths = sorted(depths)
    if not ms or not depths or n_query + decay_critical_distance(depths[-1], min(ms)) * 3 > n:
        raise PosbiasError(f"N = {n} is too small for the decay check's deepest profile (t = {max(depths, default=0)}, "
                           f"m = {min(ms, default=0)})", "raise the tokens or lower the depth")
    per_m = [_decay_one_m(n, m, depths[-1] + 1, d, weight_norm, seed, depths, n_query, rel_tol, decay) for m in sorted(ms)]
    rows = [r for pm in per_m for r in pm["rows"]]
    by_m = [[r["argmax"] for r in pm["rows"]] for pm in per_m]
    checks = {
        "lemma": all(pm["lemma_ok"] for pm in per_m),
        "theta": all(pm["theta_ok"] for pm in per_m),
        "located": all(r["located"] for r in rows),
        "deeper": all(_non_decreasing(v) for v in by_m),
        "decay": all(_non_decreasing(v[::-1]) for v in zip(*by_m)),
    }
    params = dict(n=n, ms=sorted(ms), depths=depths, n_query=n_query, d=d, weight_norm=weight_norm, seed=seed,
                  rel_tol=rel_tol, decay=decay)
    return result("4.4-4.5", CLAIM_45, params, checks, proof=("lemma", "theta"), rows=rows)
