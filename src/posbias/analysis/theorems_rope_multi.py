"""App. I of Wu et al. (2025) as an executable check: RoPE with d >= 2 (Lemma I.1, Lemma I.3,
Thm I.2). Result shape and conventions as in `theorems`; the Gaussian-form constants and path
bounds are `theorems_rope`'s, with u(x) = x^2 sum_l alpha_l^2 theta1^2 in place of x^2 theta1^2.

Setting (App. I): segment l of q and k (coordinates 2l, 2l+1) turns by theta_l = alpha_l theta1 per
position, alpha_1 = 1 <= ... <= alpha_{d/2}; A3: |q_l| >= beta_q |q| and |k_l| >= beta_k |k| for every
segment; |phi_ij| <= delta theta1 (phi: the angle between the full q_i and k_j) and
(sqrt(1/(beta_q beta_k)) delta pi + 2 (N-1) alpha_{d/2}) theta1 <= 2 pi.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.rollout import attention, causal_mask
from .theorems import result, rollouts
from .theorems_pe import _non_decreasing
from .theorems_rope import ANGLE_SLACK, _rot, _wrap, closed_form_rows, gaussian_lemma

CLAIM_I2 = ("causal mask, RoPE with d >= 2 (angles alpha_l theta1), A3, |phi_ij| <= delta theta1 and "
            "(sqrt(1/(beta_q beta_k)) delta pi + 2(N-1) alpha_max) theta1 <= 2 pi: |phi_l| <= (pi/2) "
            "sqrt(1/(beta_q beta_k)) |phi| (Lemma I.3), C_min e^{-c u} <= A_ij <= C_max e^{-c' u} (Lemma I.1) and "
            "P^(t)(z_i = j) = Theta(C(t+i-j, i-j) e^{-c u}) (Thm I.2), u = (i-j)^2 sum_l alpha_l^2 theta1^2")


@dataclass(frozen=True)
class MultiInstance:
    """Attention matrices of a d >= 2 RoPE SAN plus each layer's pre-rotation queries/keys."""

    attns: list[torch.Tensor]  # each (N, N)
    q: list[torch.Tensor]  # each (N, d)
    k: list[torch.Tensor]  # each (N, d)


def _block_diag(angles: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Block-diagonal (d, d) of the paper's 2x2 rotation blocks, one per segment."""
    return scale * torch.block_diag(*[_rot(float(a)) for a in angles])


def rope_multi_instance(n: int, n_layers: int, theta1: float, alphas, scale: float = 5.0, spread: float = 0.5,
                        seed: int = 0, rope: bool = True) -> MultiInstance:
    """A seeded causal RoPE SAN with d = 2 len(alphas) meeting App. I's assumptions: every segment of
    every token lies in its own narrow cone (angles base_l + U(-spread, spread) theta1, norm 1/sqrt(d/2)),
    W_Q = scale diag(R(a_l)), W_K = scale diag(R(a_l + b_l)), b_l ~ U(-spread, spread) theta1, W_V =
    diag(R(c_l)) (A1, A2). Convex averaging keeps each segment in its cone, so |phi_l| <= 3 spread theta1
    and A3 holds with beta about 1/sqrt(d/2). `rope=False` drops the rotation."""
    g = torch.Generator().manual_seed(seed)
    al = torch.as_tensor(alphas, dtype=torch.float64)
    m, mask = len(al), causal_mask(n)
    base = 2 * math.pi * torch.rand(m, generator=g, dtype=torch.float64)
    ang = base[None, :] + spread * theta1 * (2 * torch.rand(n, m, generator=g, dtype=torch.float64) - 1)  # (N, L)
    x = torch.stack((ang.cos(), ang.sin()), dim=-1).flatten(1) / math.sqrt(m)  # (N, d), unit rows
    attns, qs, ks = [], [], []
    for _ in range(n_layers):
        a0, b, c = (torch.rand(m, generator=g, dtype=torch.float64) for _ in range(3))
        wq = _block_diag(2 * math.pi * a0, scale)
        wk = _block_diag(2 * math.pi * a0 + spread * theta1 * (2 * b - 1), scale)
        attns.append(attention(x, wq, wk, mask, theta=theta1 * al if rope else None))
        qs.append(x @ wq)
        ks.append(x @ wk)
        x = attns[-1] @ x @ _block_diag(2 * math.pi * c)
    return MultiInstance(attns, qs, ks)


def _segment_stats(q: torch.Tensor, k: torch.Tensor) -> dict:
    """beta_q, beta_k (A3), the full angle phi_ij (N, N) and the segment angles phi_l (N, N, L), pre-rotation."""
    n = q.shape[0]
    qn, kn = q.reshape(n, -1, 2).norm(dim=-1), k.reshape(n, -1, 2).norm(dim=-1)  # (N, L)
    cos = (q @ k.T) / (q.norm(dim=1)[:, None] * k.norm(dim=1)[None, :])
    phi = torch.arccos(cos.clamp(-1, 1))  # (N, N) in [0, pi]
    phi_l = _wrap(torch.atan2(q[:, 1::2], q[:, 0::2])[:, None, :] - torch.atan2(k[:, 1::2], k[:, 0::2])[None, :, :])
    return dict(beta_q=float((qn / q.norm(dim=1, keepdim=True)).min()), beta_k=float((kn / k.norm(dim=1, keepdim=True)).min()),
                phi=phi, phi_l=phi_l)


def _assumptions(inst: MultiInstance, theta1: float, alphas: torch.Tensor) -> dict:
    """A3's betas, delta = max |phi_ij| / theta1 over causal pairs and layers, App. I's angle condition, and
    Lemma I.3 (|phi_l| <= (pi/2) sqrt(1/(beta_q beta_k)) |phi|, exact) on every causal pair and layer."""
    n, tri = inst.q[0].shape[0], causal_mask(inst.q[0].shape[0])
    stats = [_segment_stats(q, k) for q, k in zip(inst.q, inst.k)]
    bq, bk = min(s["beta_q"] for s in stats), min(s["beta_k"] for s in stats)
    delta = max(float(s["phi"][tri].max()) for s in stats) / theta1
    factor = math.pi / 2 * math.sqrt(1 / (bq * bk))
    lemma_i3 = all(bool((s["phi_l"][tri].abs() <= factor * s["phi"][tri][:, None] + 1e-12).all()) for s in stats)
    lhs = (math.sqrt(1 / (bq * bk)) * delta * math.pi + 2 * (n - 1) * float(alphas.max())) * theta1
    return dict(beta_q=bq, beta_k=bk, delta=delta, condition_lhs=lhs, assumption=bq > 0 and bk > 0 and lhs <= 2 * math.pi,
                lemma_i3=lemma_i3)


def _multi_one_theta(n, theta1, alphas, depths, scale, spread, seed, rope) -> dict:
    inst = rope_multi_instance(n, depths[-1] + 1, theta1, alphas, scale, spread, seed, rope)
    forms = [gaussian_lemma(q, k, alphas, theta1, a) for q, k, a in zip(inst.q, inst.k, inst.attns)]
    ps = rollouts(inst.attns)  # (T, N, N)
    rows = closed_form_rows(ps, forms, float((alphas * theta1).pow(2).sum()))
    out = [dict(theta1=theta1, t=t, argmax=int(ps[t][-1].flip(0).argmax()),
                **{k: v for k, v in rows[t].items() if k != "t"}) for t in depths]
    return dict(**_assumptions(inst, theta1, alphas), lemma=all(f.ok for f in forms), rows=out,
                closed_form=all(r["closed_form"] for r in rows if r["t"] <= 1), sandwich=all(r["sandwich"] for r in rows),
                c_range=[max(f.c for f in forms), min(f.c_prime for f in forms)])


def check_rope_multi(n: int = 64, alphas=(1.0, 2.0, 4.0), fractions=(0.3, 0.6, 0.9), depths=(1, 2, 4, 8),
                     scale: float = 5.0, spread: float = 0.5, seed: int = 0, rope: bool = True) -> dict:
    """Lemma I.1, Lemma I.3 and Thm I.2 on seeded d = 2 len(alphas) instances (`rope_multi_instance`),
    theta1 = f 2 pi / (2 sqrt(d/2) 3 spread pi + 2 (N-1) alpha_max) for f in `fractions` (inside App. I's
    condition with room for the measured delta and betas). `rope=False`: no rotation, the check must fail.

    Direct checks:
      * assumption:  A3 (beta_q, beta_k > 0) and the angle condition, measured;
      * closed_form: Thm I.2's closed form with the lemma's constants, at t <= 1 (`theorems_rope`);
      * deeper:      the argmax of x -> P^(t)_{N-1, N-1-x} is non-decreasing in t (each theta1);
      * angle:       that argmax is non-increasing in theta1 (each t), up to ANGLE_SLACK = 1 token.
    Proof-constant checks (exact):
      * lemma_i3:    |phi_l| <= (pi/2) sqrt(1/(beta_q beta_k)) |phi| for every segment, pair and layer;
      * lemma:       Lemma I.1 in its stated form with explicit constants (`gaussian_lemma`);
      * sandwich:    the path bounds with sum of squared hops >= x^2 / (t+1), at every depth.
    """
    depths, al = sorted(depths), torch.as_tensor(alphas, dtype=torch.float64)
    room = 2 * math.sqrt(len(al)) * 3 * spread * math.pi + 2 * (n - 1) * float(al.max())
    thetas = [f * 2 * math.pi / room for f in sorted(fractions)]
    per = [_multi_one_theta(n, th, al, depths, scale, spread, seed + i, rope) for i, th in enumerate(thetas)]
    by_th = [[r["argmax"] for r in p["rows"]] for p in per]
    checks = {
        "assumption": all(p["assumption"] for p in per),
        "closed_form": all(p["closed_form"] for p in per),
        "deeper": all(_non_decreasing(v) for v in by_th),
        "angle": all(_non_decreasing(v[::-1], ANGLE_SLACK) for v in zip(*by_th)),
        "lemma_i3": all(p["lemma_i3"] for p in per),
        "lemma": all(p["lemma"] for p in per),
        "sandwich": all(p["sandwich"] for p in per),
    }
    params = dict(n=n, d=2 * len(al), alphas=al.tolist(), thetas=thetas, depths=depths, scale=scale, spread=spread,
                  seed=seed, rope=rope)
    keep = ("beta_q", "beta_k", "delta", "condition_lhs", "c_range")
    return result("I.1-I.2", CLAIM_I2, params, checks, proof=("lemma_i3", "lemma", "sandwich"),
                  per_theta=[{k: p[k] for k in keep} for p in per], rows=[r for p in per for r in p["rows"]])
