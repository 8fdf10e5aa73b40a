"""Sec. 4.2-4.3 of Wu et al. (2025) as executable checks: the decay mask (Lemma 4.4,
Thm 4.5) and RoPE (Lemma 4.6, Thm 4.7). Result shape and conventions as in `theorems`.

The Theta(.) statements hold with constants that depend on the instance, so on a finite
instance they are only meaningful with the constants spelled out. We therefore check
(a) the lemma and theorem with the proofs' explicit constants measured on the instance
(exact inequalities), and (b) what the paper draws from them: the location of the peak of
the distance profile x -> P^(t)_{i, i-x} (the critical distance x*) and its trends in the
depth t, the decay m and the angle theta_1, with stated tolerances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.rollout import attention, attention_scores, causal_mask, random_inputs, random_weights, san_forward
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


def _non_decreasing(v) -> bool:
    return all(a <= b for a, b in zip(v, v[1:]))


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


def _decay_one_m(n, m, n_layers, d, weight_norm, seed, depths, n_query, rel_tol) -> dict:
    mask = causal_mask(n)
    w = random_weights(n_layers, d, weight_norm, seed)
    attns, xs = san_forward(random_inputs(n, d, seed + 1), w, mask, decay_m=m)
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


def check_decay_mask(n: int = 256, ms=(0.223, 0.5, 1.0), depths=(1, 2, 4, 8, 16), n_query: int = 32, d: int = 8,
                     weight_norm: float = 1.0, seed: int = 0, rel_tol: float = 0.1) -> dict:
    """Lemma 4.4 and Thm 4.5 (causal mask + decay mask D_ij = -(i-j) m, eq. 2).

    Checks:
      * lemma:  C_min e^{-(i-j)m} <= A_ij <= C_max e^{-(i-j)m} in every layer, with App. D's
                constants from the layer's realised score range (exact);
      * theta:  prod_l C_min^(l) <= P^(t)_ij / (C(t+i-j, i-j) e^{-(i-j)m}) <= prod_l C_max^(l)
                for every t, j <= i: App. E's path count made explicit (exact);
      * located: the argmax over x of the distance profile (mean of P^(t)_{i,i-x} over the last
                n_query rows, far from the first-token sink) is within 1 + rel_tol * x* of
                x* = t / (e^m - 1) (tolerance: 1 token + 10% by default). With constant scores
                the profile is negative-binomial and its mode is floor(x*) exactly;
      * deeper: the measured argmax is non-decreasing in t (for each m);
      * decay:  the measured argmax is non-increasing in m (for each t).
    `log_ratio_spread` = log(max/min) of the Theta ratio over all j <= i: how tight Theta is.
    """
    depths = sorted(depths)
    if n_query + decay_critical_distance(depths[-1], min(ms)) * 3 > n:
        raise PosbiasError("n is too small for the deepest distance profile", "raise n or lower the depths")
    per_m = [_decay_one_m(n, m, depths[-1] + 1, d, weight_norm, seed, depths, n_query, rel_tol) for m in sorted(ms)]
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
                  rel_tol=rel_tol)
    return result("4.4-4.5", params, checks, rows=rows)


# ---------------------------------------------------------------- Lemma 4.6 / Theorem 4.7 (RoPE, d = 2)


def _rot(a: float) -> torch.Tensor:
    """The paper's 2x2 RoPE block [[cos, sin], [-sin, cos]]: a row vector turns by +a."""
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


@dataclass(frozen=True)
class RopeInstance:
    """Attention matrices of a d = 2 RoPE SAN plus each layer's pre-rotation queries/keys."""

    attns: list[torch.Tensor]  # each (N, N)
    q: list[torch.Tensor]  # each (N, 2)
    k: list[torch.Tensor]  # each (N, 2)
    theta1: float


def rope_cone_instance(n: int, n_layers: int, theta1: float, scale: float = 5.0, spread: float = 0.5,
                       seed: int = 0) -> RopeInstance:
    """A seeded d = 2 causal RoPE SAN (eq. 1, eq. 3) meeting Lemma 4.6's hypotheses.

    Unit tokens at angles base + U(-spread, spread) theta1; W_Q = scale R(a), W_K = scale R(a + b)
    with b ~ U(-spread, spread) theta1 and W_V = R(c) (A1, A2). Convex averaging keeps the tokens in
    their cone, so every query/key angle obeys |phi_ij| <= 3 spread theta1 =: delta theta1 at every
    layer; choose theta1 <= pi / (N - 1 + 3 spread). Scores are about scale^2 cos(.).
    """
    g = torch.Generator().manual_seed(seed)

    def u() -> float:
        return float(torch.rand((), generator=g, dtype=torch.float64))

    base, mask, th = 2 * math.pi * u(), causal_mask(n), torch.tensor([theta1], dtype=torch.float64)
    ang = base + spread * theta1 * (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1)
    x = torch.stack((ang.cos(), ang.sin()), dim=1)  # (N, 2)
    attns, qs, ks = [], [], []
    for _ in range(n_layers):
        a0 = 2 * math.pi * u()
        wq, wk, wv = scale * _rot(a0), scale * _rot(a0 + spread * theta1 * (2 * u() - 1)), _rot(2 * math.pi * u())
        attns.append(attention(x, wq, wk, mask, theta=th))
        qs.append(x @ wq)
        ks.append(x @ wk)
        x = attns[-1] @ x @ wv
    return RopeInstance(attns, qs, ks, theta1)


def _score_envelope(q, k, theta1: float, n: int) -> dict:
    """App. F's bounds on Z_ij = |q_i||k_j| cos(psi_ij), |psi| in [max(x - delta, 0), x + delta] theta1:
    cos(y) >= 1 - y^2/2 and cos(y) <= 1 - 2 y^2 / pi^2 (|y| <= pi; App. F's c = pi^2 / 2). (N,) each."""
    tri = causal_mask(n)
    s = q.norm(dim=1)[:, None] * k.norm(dim=1)[None, :]  # (N, N) |q_i||k_j|
    phi = torch.atan2(q[:, None, 1], q[:, None, 0]) - torch.atan2(k[None, :, 1], k[None, :, 0])
    phi = torch.remainder(phi + math.pi, 2 * math.pi) - math.pi
    delta = float(phi[tri].abs().max()) / theta1
    s_lo, s_hi = float(s[tri].min()), float(s[tri].max())
    x = torch.arange(n, dtype=torch.float64)
    up = 1 - 2 * ((x - delta).clamp(min=0) * theta1) ** 2 / math.pi**2  # App. F writes |x - delta|
    low = 1 - ((x + delta) * theta1) ** 2 / 2
    return dict(delta=delta, assumption=(delta + n - 1) * theta1 <= math.pi,
                upper=torch.maximum(s_lo * up, s_hi * up), lower=torch.minimum(s_lo * low, s_hi * low))


def _rope_lemma(inst: RopeInstance, n: int) -> dict:
    """Lemma 4.6 with explicit constants: A_ij in [e^{lo(x)} / sum_{x'<=i} e^{up(x')}, e^{up(x)} / sum e^{lo(x')}]
    per row (exact), plus the row-uniform kernels used for the Thm 4.7 path bound."""
    x, tri = _dist(n).clamp(min=0).long(), causal_mask(n)
    ok, assumption, deltas, k_lo, k_hi = True, True, [], [], []
    for a, q, k in zip(inst.attns, inst.q, inst.k):
        env = _score_envelope(q, k, inst.theta1, n)
        y_lo, y_hi = env["lower"].exp().cumsum(0), env["upper"].exp().cumsum(0)  # (N,) row-i normaliser bounds
        lo = env["lower"].exp()[x] / y_hi[:, None]
        hi = env["upper"].exp()[x] / y_lo[:, None]
        ok &= leq(lo[tri], a[tri]) and leq(a[tri], hi[tri])
        assumption &= env["assumption"]
        deltas.append(env["delta"])
        k_lo.append(env["lower"].exp() / y_hi[-1])
        k_hi.append(env["upper"].exp() / y_lo[0])
    return dict(ok=ok, assumption=assumption, delta=max(deltas), k_lo=k_lo, k_hi=k_hi)


def fit_decay_constant(a: torch.Tensor, theta1: float) -> float:
    """Least-squares c in log A_ij - log A_ii ~ -c ((i-j) theta1)^2 over 0 < i-j (Lemma 4.6's form)."""
    x = _dist(a.shape[0])
    on = x > 0
    y, u = (a.log() - a.diagonal().log()[:, None])[on], -((x * theta1) ** 2)[on]
    return float((y * u).sum() / (u * u).sum())


def _conv_powers(kernels: list[torch.Tensor]) -> list[torch.Tensor]:
    """Running convolutions k_0 * k_1 * ... * k_t truncated to N: the sum over all causal paths of
    per-hop weights (App. G, eq. 12). [(N,)] * T."""
    n = len(kernels[0])
    x, tri = _dist(n).clamp(min=0).long(), causal_mask(n)
    out, cur = [], None
    for k in kernels:
        cur = k if cur is None else torch.where(tri, k[x], 0.0) @ cur  # Toeplitz (N, N) @ (N,)
        out.append(cur)
    return out


def _rope_one_theta(n, theta1, depths, scale, spread, seed) -> dict:
    inst = rope_cone_instance(n, depths[-1] + 1, theta1, scale, spread, seed)
    lemma = _rope_lemma(inst, n)
    c = sum(fit_decay_constant(a, theta1) for a in inst.attns) / len(inst.attns)
    ps, x, tri = rollouts(inst.attns), _dist(n).clamp(min=0).long(), causal_mask(n)
    lo, hi = _conv_powers(lemma["k_lo"]), _conv_powers(lemma["k_hi"])
    theta_ok = all(leq(lo[t][x][tri], ps[t][tri]) and leq(ps[t][tri], hi[t][x][tri]) for t in range(len(ps)))
    xs, out = torch.arange(n, dtype=torch.float64), []
    for t in depths:
        prof = ps[t][-1].flip(0)  # last query row, x = 0..N-1; x = N-1 is the first token
        measured = int(prof.argmax())
        sink = measured == n - 1
        tight = profile_argmax(t, -c * (xs * theta1) ** 2)  # all distance in one hop: sum x_l^2 = x^2
        loose = profile_argmax(t, -c * (xs * theta1) ** 2 / (t + 1))  # equal hops: sum x_l^2 = x^2 / (t+1)
        out.append(dict(theta1=theta1, t=t, c=c, x_star=rope_critical_distance(t, theta1, c), x_tight=tight,
                        x_loose=loose, argmax=measured, sink_is_max=sink,
                        located=None if sink else tight - 1 <= measured <= loose + 1))
    return dict(lemma_ok=lemma["ok"], assumption=lemma["assumption"], delta=lemma["delta"], theta_ok=theta_ok, rows=out)


def check_rope(n: int = 64, fractions=(0.3, 0.6, 0.9), depths=(1, 2, 4, 8), scale: float = 5.0,
               spread: float = 0.5, seed: int = 0) -> dict:
    """Lemma 4.6 and Thm 4.7 (causal mask, RoPE with d = 2 and base angle theta1).

    theta1 = f * pi / (N - 1 + 3 spread) for f in `fractions`, so (delta + N - 1) theta1 <= pi.
    Checks:
      * assumption: Lemma 4.6's hypotheses hold on the instance (measured delta);
      * lemma:     App. F's sandwich with explicit constants, per row (exact);
      * theta:     P^(t)_ij between the t+1-fold convolutions of the row-uniform per-hop lower and
                   upper kernels (App. G: a sum over causal paths; exact, loose);
      * located:   the argmax of x -> P^(t)_{N-1, N-1-x} lies in [x_tight - 1, x_loose + 1], the
                   exact maximisers of log C(t+x, x) - c x^2 theta1^2 / h with h = 1 (App. G's
                   lower path bound, eq. 15, = the paper's L(x)) and h = t+1 (equal hops; App. G's
                   eq. 16 uses h = 2), c fitted per instance with `fit_decay_constant`. Rows whose
                   argmax is the first token itself (`sink_is_max`: Thm 4.1's sink beats every
                   interior peak, a boundary effect the Theta constants absorb) have no interior
                   critical point to locate: `located` is None there and they are counted in
                   `n_sink_rows`; they still enter the two trend checks below;
      * deeper:    the measured argmax (first token included) is non-decreasing in t (each theta1);
      * angle:     the measured argmax (first token included) is non-increasing in theta1 (each t);
      * formula:   App. H's x*(t, theta1) is increasing in t and decreasing in theta1 on the grid.
    The measured peak sits between the two envelopes: its growth with depth is closer to the
    equal-hops (h = t+1) one than to the paper's L(x); see `x_star` (Stirling root of L').
    """
    depths = sorted(depths)
    thetas = [f * math.pi / (n - 1 + 3 * spread) for f in sorted(fractions)]
    per = [_rope_one_theta(n, th, depths, scale, spread, seed + i) for i, th in enumerate(thetas)]
    rows = [r for p in per for r in p["rows"]]
    by_th = [[r["argmax"] for r in p["rows"]] for p in per]
    xstar = [[rope_critical_distance(t, th) for t in depths] for th in thetas]  # paper's L(x), c = 1
    checks = {
        "assumption": all(p["assumption"] for p in per),
        "lemma": all(p["lemma_ok"] for p in per),
        "theta": all(p["theta_ok"] for p in per),
        "located": all(r["located"] for r in rows if r["located"] is not None),
        "deeper": all(_non_decreasing(v) for v in by_th),
        "angle": all(_non_decreasing(v[::-1]) for v in zip(*by_th)),
        "formula": all(_non_decreasing(v) for v in xstar) and all(_non_decreasing(v[::-1]) for v in zip(*xstar)),
    }
    params = dict(n=n, thetas=thetas, depths=depths, scale=scale, spread=spread, seed=seed)
    return result("4.6-4.7", params, checks, delta=max(p["delta"] for p in per),
                  n_sink_rows=sum(r["sink_is_max"] for r in rows), rows=rows)
