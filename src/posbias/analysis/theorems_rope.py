"""Sec. 4.3 of Wu et al. (2025) as executable checks: RoPE with d = 2 (Lemma 4.6, Thm 4.7), plus the
Gaussian-form constants and path bounds that App. I's d >= 2 check (`theorems_rope_multi`) shares.
Result shape and conventions as in `theorems`.

Thm 4.7's closed form Theta(C(t+x, x) e^{-c x^2 theta1^2}) rests on App. G's step
sum_l x_l^2 >= x^2 / 2 over the hops x_l of a path (eq. 16). By Cauchy-Schwarz a path of h hops has
sum_l x_l^2 >= x^2 / h with equality for equal hops, so the step holds for every path exactly when
h <= 2, i.e. for P^(0) and P^(1) (one and two layers, t <= 1), and fails for t >= 2 (equal hops give
x^2 / (t+1) < x^2 / 2). The check therefore tests the closed form, with the lemma's constants
measured, at t <= 1, and the sandwich that does hold at every depth (lower: sum x_l^2 <= x^2; upper:
sum x_l^2 >= x^2 / (t+1)) at t >= 2; each row says which one applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.rollout import attention, causal_mask, rope_rotate
from .theorems import leq, result, rollouts
from .theorems_pe import _dist, _non_decreasing, log_binom, profile_argmax, rope_critical_distance

# ---------------------------------------------------------------- Lemma 4.6 / Theorem 4.7 (RoPE, d = 2)


def _rot(a: float) -> torch.Tensor:
    """The paper's 2x2 RoPE block [[cos, sin], [-sin, cos]]: a row vector turns by +a."""
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)

ANGLE_SLACK = 1  # tokens: each theta1 has its own seeded instance, so the integer argmax may fall back by one


@dataclass(frozen=True)
class RopeInstance:
    """Attention matrices of a d = 2 RoPE SAN plus each layer's pre-rotation queries/keys."""

    attns: list[torch.Tensor]  # each (N, N)
    q: list[torch.Tensor]  # each (N, 2)
    k: list[torch.Tensor]  # each (N, 2)
    theta1: float


def rope_cone_instance(n: int, n_layers: int, theta1: float, scale: float = 5.0, spread: float = 0.5,
                       seed: int = 0, rope: bool = True) -> RopeInstance:
    """A seeded d = 2 causal RoPE SAN (eq. 1, eq. 3) meeting Lemma 4.6's hypotheses.

    Unit tokens at angles base + U(-spread, spread) theta1; W_Q = scale R(a), W_K = scale R(a + b)
    with b ~ U(-spread, spread) theta1 and W_V = R(c) (A1, A2). Convex averaging keeps the tokens in
    their cone, so every query/key angle obeys |phi_ij| <= 3 spread theta1 =: delta theta1 at every
    layer; choose theta1 <= pi / (N - 1 + 3 spread). Scores are about scale^2 cos(.).
    `rope=False` builds the same network without the rotation (to test that the checks then fail).
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
        attns.append(attention(x, wq, wk, mask, theta=th if rope else None))
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


@dataclass(frozen=True)
class GaussForm:
    """One layer's Lemma 4.6 / Lemma I.1 constants: log C_min - c u(x) <= log A_ij <= log C_max - c' u(x)."""

    log_cmin: float
    c: float
    log_cmax: float
    c_prime: float
    delta: float  # max |phi_l| / theta1 over causal pairs and segments
    ok: bool  # the two inequalities hold on every causal entry


def _log_leq(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a <= b for log-values, with an absolute float slack."""
    return bool((a <= b + 1e-9 * (1 + b.abs())).all())


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def gaussian_lemma(q: torch.Tensor, k: torch.Tensor, alphas: torch.Tensor, theta1: float, a: torch.Tensor) -> GaussForm:
    """Lemma 4.6 (d = 2) / Lemma I.1 (d >= 2) for one layer, with App. F / App. I.2's constants explicit.

    q, k: (N, d) pre-rotation queries/keys; segment l turns by alpha_l theta1 per position; a: (N, N).
    With s_l = |q_il||k_jl|, delta = max |phi_l| / theta1, u(x) = x^2 sum_l alpha_l^2 theta1^2:
    c = max s_l, log C_min = sum_l s_l^- (1 - delta^2 theta1^2) - log max_i Y_i, c' = min s_l / pi^2,
    log C_max = sum_l max s_l (1 + 2 delta^2 theta1^2 / pi^2) - log min_i Y_i, using cos y >= 1 - y^2/2,
    cos y <= 1 - 2 y^2 / pi^2 (|y| <= pi), (x a + delta)^2 / 2 <= x^2 a^2 + delta^2,
    ((x a - delta)^+)^2 >= x^2 a^2 / 2 - delta^2; s^- is min s_l (max s_l if 1 - delta^2 theta1^2 < 0);
    Y_i = sum_{j<=i} e^{Z_ij} (the softmax normaliser) is measured."""
    n, tri = q.shape[0], causal_mask(q.shape[0])
    th = theta1 * alphas.to(torch.float64)  # (L,)
    qn, kn = q.reshape(n, -1, 2).norm(dim=-1), k.reshape(n, -1, 2).norm(dim=-1)  # (N, L)
    s = (qn[:, None, :] * kn[None, :, :])[tri]  # (E, L) over causal pairs
    ang_q, ang_k = torch.atan2(q[:, 1::2], q[:, 0::2]), torch.atan2(k[:, 1::2], k[:, 0::2])  # (N, L)
    delta = float(_wrap(ang_q[:, None, :] - ang_k[None, :, :])[tri].abs().max()) / theta1
    z = rope_rotate(q, th) @ rope_rotate(k, th).T  # (N, N) eq. 3
    log_y = torch.logsumexp(z.masked_fill(~tri, float("-inf")), dim=1)  # (N,)
    k0 = 1 - (delta * theta1) ** 2
    s_lo = s.min(dim=0).values if k0 >= 0 else s.max(dim=0).values
    log_cmin = float((s_lo * k0).sum() - log_y.max())
    log_cmax = float((s.max(dim=0).values * (1 + 2 * (delta * theta1) ** 2 / math.pi**2)).sum() - log_y.min())
    c, c_prime = float(s.max()), float(s.min()) / math.pi**2
    u = (_dist(n).clamp(min=0) ** 2 * float((th**2).sum()))[tri]
    la = a[tri].clamp_min(1e-300).log()
    ok = _log_leq(log_cmin - c * u, la) and _log_leq(la, log_cmax - c_prime * u)
    return GaussForm(log_cmin, c, log_cmax, c_prime, delta, ok)


def path_bounds(forms: list[GaussForm], t: int, u_unit: float, n: int, hops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """App. G (eqs. 12-16) with Lemma 4.6's constants: log of
    C(t+x, x) prod_l C_min^(l) e^{-max c u(x)} and C(t+x, x) prod_l C_max^(l) e^{-min c' u(x) / hops},
    u(x) = x^2 u_unit, over layers 0..t. `hops` = 2 is Thm 4.7's closed form (valid for t <= 1), t+1 the
    sandwich valid at every depth (sum of squared hops >= x^2 / (t+1)). Each (N, N), on j <= i."""
    x = _dist(n).clamp(min=0)  # (N, N) = i - j on the causal part
    lb, u = log_binom(t, x), x**2 * u_unit
    f = forms[: t + 1]
    lo = lb + sum(g.log_cmin for g in f) - max(g.c for g in f) * u
    hi = lb + sum(g.log_cmax for g in f) - min(g.c_prime for g in f) * u / hops
    return lo, hi


def closed_form_rows(ps: torch.Tensor, forms: list[GaussForm], u_unit: float) -> list[dict]:
    """Per depth t: whether log P^(t) lies in Thm 4.7's closed form (hops = 2) and in the sandwich
    (hops = t+1), and which one the theorem's proof supports there ("closed form" for t <= 1)."""
    n, tri, out = ps.shape[-1], causal_mask(ps.shape[-1]), []
    for t, p in enumerate(ps):
        lp = p[tri].clamp_min(1e-300).log()
        ok = []
        for hops in (2, t + 1):
            lo, hi = path_bounds(forms, t, u_unit, n, hops)
            ok.append(_log_leq(lo[tri], lp) and _log_leq(lp, hi[tri]))
        out.append(dict(t=t, applied="closed form" if t <= 1 else "sandwich", closed_form=ok[0], sandwich=ok[1]))
    return out


def _rope_one_theta(n, theta1, depths, scale, spread, seed, rope) -> dict:
    inst = rope_cone_instance(n, depths[-1] + 1, theta1, scale, spread, seed, rope)
    lemma = _rope_lemma(inst, n)
    one = torch.ones(1, dtype=torch.float64)
    forms = [gaussian_lemma(q, k, one, theta1, a) for q, k, a in zip(inst.q, inst.k, inst.attns)]
    c = sum(fit_decay_constant(a, theta1) for a in inst.attns) / len(inst.attns)
    ps, x, tri = rollouts(inst.attns), _dist(n).clamp(min=0).long(), causal_mask(n)
    lo, hi = _conv_powers(lemma["k_lo"]), _conv_powers(lemma["k_hi"])
    theta_ok = all(leq(lo[t][x][tri], ps[t][tri]) and leq(ps[t][tri], hi[t][x][tri]) for t in range(len(ps)))
    xs, out, forms_rows = torch.arange(n, dtype=torch.float64), [], closed_form_rows(ps, forms, theta1**2)
    for t in depths:
        prof = ps[t][-1].flip(0)  # last query row, x = 0..N-1; x = N-1 is the first token
        measured = int(prof.argmax())
        sink = measured == n - 1
        tight = profile_argmax(t, -c * (xs * theta1) ** 2)  # all distance in one hop: sum x_l^2 = x^2
        loose = profile_argmax(t, -c * (xs * theta1) ** 2 / (t + 1))  # equal hops: sum x_l^2 = x^2 / (t+1)
        out.append(dict(theta1=theta1, t=t, c=c, x_star=rope_critical_distance(t, theta1, c), x_tight=tight,
                        x_loose=loose, argmax=measured, sink_is_max=sink,
                        located=None if sink else tight - 1 <= measured <= loose + 1,
                        **{k: v for k, v in forms_rows[t].items() if k != "t"}))
    return dict(lemma_ok=lemma["ok"], assumption=lemma["assumption"], delta=lemma["delta"], theta_ok=theta_ok, rows=out,
                form_ok=all(f.ok for f in forms), c_range=[max(f.c for f in forms), min(f.c_prime for f in forms)],
                closed_form=all(r["closed_form"] for r in forms_rows if r["t"] <= 1),
                sandwich=all(r["sandwich"] for r in forms_rows))


CLAIM_47 = ("causal mask, RoPE with d = 2, |phi_ij| <= delta theta1, (delta + N - 1) theta1 <= pi: "
            "C_min e^{-c (i-j)^2 theta1^2} <= A_ij <= C_max e^{-c' (i-j)^2 theta1^2} (Lemma 4.6) and "
            "P^(t)(z_i = j) = Theta(C(t+i-j, i-j) e^{-c (i-j)^2 theta1^2}) (Thm 4.7); the peak x* grows with t "
            "and shrinks as theta1 grows (App. H)")


def check_rope(n: int = 64, fractions=(0.3, 0.6, 0.9), depths=(1, 2, 4, 8), scale: float = 5.0,
               spread: float = 0.5, seed: int = 0, rope: bool = True) -> dict:
    """Lemma 4.6 and Thm 4.7 (causal mask, RoPE with d = 2 and base angle theta1). `rope=False` builds
    the same networks without the rotation (the predictions stay): the check must then fail.

    theta1 = f * pi / (N - 1 + 3 spread) for f in `fractions`, so (delta + N - 1) theta1 <= pi.
    Checks (proof-constant: lemma, lemma_form, theta, sandwich; the rest direct):
      * assumption: Lemma 4.6's hypotheses hold on the instance (measured delta);
      * lemma:     App. F's sandwich with explicit constants, per row (exact);
      * lemma_form: Lemma 4.6 in its stated form, C_min e^{-c x^2 theta1^2} <= A_ij <= C_max e^{-c' x^2 theta1^2},
                   constants from `gaussian_lemma` (exact);
      * closed_form: Thm 4.7's closed form with those constants, C(t+x, x) prod C_min e^{-c x^2 theta1^2} <=
                   P^(t)_ij <= C(t+x, x) prod C_max e^{-c' x^2 theta1^2 / 2}, at t <= 1 where App. G's
                   sum x_l^2 >= x^2 / 2 holds (see the module docstring);
      * sandwich:  the same with x^2 / (t+1) in the upper bound, at every depth (what holds for t >= 2);
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
      * angle:     the measured argmax (first token included) is non-increasing in theta1 (each t), up to
                   ANGLE_SLACK = 1 token (each theta1 is its own seeded instance);
      * formula:   App. H's x*(t, theta1) is increasing in t and decreasing in theta1 on the grid.
    The measured peak sits between the two envelopes: its growth with depth is closer to the
    equal-hops (h = t+1) one than to the paper's L(x); see `x_star` (Stirling root of L').
    """
    depths = sorted(depths)
    thetas = [f * math.pi / (n - 1 + 3 * spread) for f in sorted(fractions)]
    per = [_rope_one_theta(n, th, depths, scale, spread, seed + i, rope) for i, th in enumerate(thetas)]
    rows = [r for p in per for r in p["rows"]]
    by_th = [[r["argmax"] for r in p["rows"]] for p in per]
    xstar = [[rope_critical_distance(t, th) for t in depths] for th in thetas]  # paper's L(x), c = 1
    checks = {
        "assumption": all(p["assumption"] for p in per),
        "lemma": all(p["lemma_ok"] for p in per),
        "lemma_form": all(p["form_ok"] for p in per),
        "closed_form": all(p["closed_form"] for p in per),
        "sandwich": all(p["sandwich"] for p in per),
        "theta": all(p["theta_ok"] for p in per),
        "located": all(r["located"] for r in rows if r["located"] is not None),
        "deeper": all(_non_decreasing(v) for v in by_th),
        "angle": all(_non_decreasing(v[::-1], ANGLE_SLACK) for v in zip(*by_th)),
        "formula": all(_non_decreasing(v) for v in xstar) and all(_non_decreasing(v[::-1]) for v in zip(*xstar)),
    }
    params = dict(n=n, thetas=thetas, depths=depths, scale=scale, spread=spread, seed=seed, rope=rope)
    return result("4.6-4.7", CLAIM_47, params, checks, proof=("lemma", "lemma_form", "sandwich", "theta"),
                  delta=max(p["delta"] for p in per), c_range=[p["c_range"] for p in per],
                  n_sink_rows=sum(r["sink_is_max"] for r in rows), rows=rows)
