"""Attention rollout over masks, decay masks and RoPE (Wu et al., 2025,
"On the Emergence of Position Bias in Transformers", Sec. 3-4).

Conventions (code is 0-indexed, the paper 1-indexed: paper token j is index j-1 here):

* A mask is a boolean (N, N) tensor M with ``M[i, j] = True`` iff query i may attend
  to key j, i.e. the directed edge (j, i) is in E(G) (Sec. 3, "token j serves as a
  direct context for token i"). Row i is the neighbour set N_i.
* Attention matrices are row-stochastic: ``A[i, j]`` is the weight query i puts on key j.
* Rollout ``P^(t) = A^(t) ... A^(0)`` (eq. 4) has t+1 layers and
  ``P^(t)[i, j] = P^(t)(z_i = j | X^(0))``. Row i of P^(t) is ``e_i^T A^(t) ... A^(0)``,
  so a query-row rollout multiplies row vectors by the LAST layer first.
* Optional residual term (off by default): ``A -> alpha * I + (1 - alpha) * A``
  (Abnar & Zuidema, 2020, use alpha = 0.5). The paper's theorems assume alpha = 0.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import PosbiasError

Layers = Sequence[torch.Tensor] | Callable[[int], torch.Tensor]

# ---------------------------------------------------------------- masks as graphs


def full_mask(n: int) -> torch.Tensor:
    """No mask: G is complete (with self-loops). (n, n) bool."""
    return torch.ones(n, n, dtype=torch.bool)


def causal_mask(n: int) -> torch.Tensor:
    """Causal mask: query i attends to keys j <= i. (n, n) bool, lower triangular."""
    return torch.ones(n, n, dtype=torch.bool).tril()


def sliding_window_mask(n: int, w: int) -> torch.Tensor:
    """Sliding window of width w: query i attends to keys i-w < j <= i.

    The paper (Sec. 4.1, before Thm 4.2) defines w as "the maximal number of tokens each
    token can access", so the window counts the token itself: w tokens, i.e. one hop moves
    at most w-1 positions back. This is what makes ceil((N-1)/(w-1)) the number of hops
    from the last token to the first (Thm 4.2, Lemma B.1). w >= n gives the causal mask.
    """
    if w < 1:
        raise PosbiasError(f"sliding window width must be >= 1, got {w}")
    i = torch.arange(n)
    dist = i[:, None] - i[None, :]  # (n, n) = i - j
    return (dist >= 0) & (dist < w)


def prefix_mask(n: int, k: int) -> torch.Tensor:
    """Prefix mask with the first k tokens as prefix (Thm 4.3; Raffel et al. 2020).

    Prefix tokens attend to each other bidirectionally (the prefix-LM mask of T5/UniLM);
    every later token attends causally, hence to all k prefix tokens. Thm 4.3 says "all
    subsequent tokens attend to them", and its proof (App. C) treats the prefix as one
    strongly connected "super node", which needs the bidirectional block. k = 1 is causal.
    """
    if not 1 <= k <= n:
        raise PosbiasError(f"prefix length must be in [1, {n}], got {k}")
    m = causal_mask(n)
    m[:, :k] = True
    return m


def as_mask(adj) -> torch.Tensor:
    """Validate any user adjacency (array-like, M[i, j] = i attends to j) as a bool mask."""
    m = torch.as_tensor(adj).to(torch.bool)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise PosbiasError(f"a mask must be a square (N, N) matrix, got shape {tuple(m.shape)}")
    empty = (~m.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise PosbiasError(f"mask rows {empty[:5]} attend to nothing", "every query needs >= 1 key (add self-loops)")
    return m


def walk_support(mask: torch.Tensor, steps: int) -> torch.Tensor:
    """(N, N) bool: S[i, j] iff some walk of exactly `steps` edges goes from j to i.

    The support of a rollout over `steps` layers with positive softmax weights on every
    edge ("softmax cannot disconnect an edge", Sec. 4.1) is exactly this set.
    """
    m = as_mask(mask).to(torch.float64)
    s = torch.eye(m.shape[0], dtype=torch.float64)
    for _ in range(steps):
        s = ((s @ m) > 0).to(torch.float64)
    return s > 0


def reachability(mask: torch.Tensor) -> torch.Tensor:
    """(N, N) bool: R[i, j] iff j reaches i (j is direct or indirect context of i), reflexive."""
    m = as_mask(mask)
    r = (m | torch.eye(m.shape[0], dtype=torch.bool)).to(torch.float64)
    while True:  # repeated squaring: at most ceil(log2 N) rounds
        r2 = ((r @ r) > 0).to(torch.float64)
        if torch.equal(r2, r):
            return r > 0
        r = r2


def center_nodes(mask: torch.Tensor) -> list[int]:
    """Definition 3.1: nodes from which every node of G is reachable (0-indexed)."""
    return reachability(mask).all(dim=0).nonzero().flatten().tolist()


# ---------------------------------------------------------------- attention


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax_G (Sec. 3.1): normalise row i over N_i; exactly 0 off the mask. (..., N, N)."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def decay_bias(n: int, m: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Decay mask of eq. (2): D[i, j] = -(i - j) m for j <= i, 0 otherwise. (n, n)."""
    i = torch.arange(n, dtype=dtype)
    dist = i[:, None] - i[None, :]
    return torch.where(dist >= 0, -dist * m, torch.zeros((), dtype=dtype))


def rope_angles(d: int, base: float = 10000.0) -> torch.Tensor:
    """Base angles theta_l = base^(-2(l-1)/d), l = 1..d/2 (App. J; Su et al.). (d/2,) float64."""
    if d % 2:
        raise PosbiasError(f"RoPE needs an even dimension, got d={d}")
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def rope_rotate(x: torch.Tensor, theta: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. (3): row i of x times R^d_{Theta,i}; pair (2l, 2l+1) turns by angle i * theta_l.

    With the paper's block [[cos, sin], [-sin, cos]] acting on a row vector,
    (a, b) -> (a cos - b sin, a sin + b cos), so <q_i R_i, k_j R_j> = q_i R_{i-j} k_j^T.
    x: (..., N, d); theta: (d/2,); positions: (N,) defaults to 0..N-1.
    """
    n, d = x.shape[-2], x.shape[-1]
    if theta.numel() * 2 != d:
        raise PosbiasError(f"RoPE: {theta.numel()} angles need d={2 * theta.numel()}, got d={d}")
    pos = torch.arange(n, dtype=x.dtype) if positions is None else positions.to(x.dtype)
    ang = pos[:, None] * theta.to(x.dtype)[None, :]  # (N, d/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]  # (..., N, d/2)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def attention_scores(x, wq, wk, decay_m: float | None = None, theta: torch.Tensor | None = None) -> torch.Tensor:
    """Raw scores Z = X W_Q (X W_K)^T with d_QK = 1 (Sec. 3.1), plus RoPE (eq. 3) and/or decay (eq. 2)."""
    q, k = x @ wq, x @ wk  # (N, d')
    if theta is not None:
        q, k = rope_rotate(q, theta), rope_rotate(k, theta)
    z = q @ k.transpose(-1, -2)  # (N, N)
    if decay_m is not None:
        z = z + decay_bias(z.shape[-1], decay_m, z.dtype)
    return z


def attention(x, wq, wk, mask, decay_m: float | None = None, theta: torch.Tensor | None = None) -> torch.Tensor:
    """One attention matrix A = softmax_G(Z) (Sec. 3.2, eq. 2 with decay, eq. 3 with RoPE). (N, N)."""
    return masked_softmax(attention_scores(x, wq, wk, decay_m, theta), mask)


# ---------------------------------------------------------------- rollout (eq. 4)


def _n_layers(layers: Layers, n_layers: int | None) -> int:
    if callable(layers):
        if n_layers is None:
            raise PosbiasError("a callable layer source needs n_layers")
        return n_layers
    return len(layers) if n_layers is None else n_layers


def _layer(layers: Layers, t: int) -> torch.Tensor:
    return layers(t) if callable(layers) else layers[t]


def _check_residual(residual: float) -> None:
    if not 0.0 <= residual <= 1.0:
        raise PosbiasError(f"residual alpha must be in [0, 1], got {residual}")


def iter_rollout(layers: Layers, residual: float = 0.0, n_layers: int | None = None):
    """Yield P^(0), P^(1), ... with P^(t) = A'^(t) P^(t-1), A' = alpha I + (1-alpha) A. Each (N, N)."""
    _check_residual(residual)
    p = None
    for t in range(_n_layers(layers, n_layers)):
        a = _layer(layers, t)
        step = a if p is None else a @ p  # (N, N)
        if residual:
            step = residual * (torch.eye(a.shape[0], dtype=a.dtype) if p is None else p) + (1 - residual) * step
        p = step
        yield p


def rollout(layers: Layers, residual: float = 0.0, n_layers: int | None = None) -> torch.Tensor:
    """Full rollout P = A^(T-1) ... A^(0) (eq. 4), O(T N^3). (N, N), rows sum to one."""
    last = deque(iter_rollout(layers, residual, n_layers), maxlen=1)
    if not last:
        raise PosbiasError("rollout needs at least one layer")
    return last[0]


def rollout_rows(layers: Layers, rows, residual: float = 0.0, n_layers: int | None = None) -> torch.Tensor:
    """Rows `rows` of the full rollout, O(T N^2 |rows|): r <- r A^(t) for t = T-1 down to 0.

    Since row i of P = e_i^T A^(T-1) ... A^(0) (eq. 4), the row vectors meet the last layer
    first. With a callable source, layers are requested in that (descending) order, one at
    a time, so only one (N, N) matrix need exist at once. Returns (len(rows), N).
    """
    _check_residual(residual)
    rows = torch.as_tensor(rows, dtype=torch.long).flatten()
    r = None
    for t in reversed(range(_n_layers(layers, n_layers))):
        a = _layer(layers, t)  # (N, N)
        if r is None:
            r = torch.zeros(len(rows), a.shape[0], dtype=a.dtype)
            r[torch.arange(len(rows)), rows] = 1.0  # (R, N) one-hot query rows
        r = r @ a if not residual else residual * r + (1 - residual) * (r @ a)
    if r is None:
        raise PosbiasError("rollout needs at least one layer")
    return r


# ---------------------------------------------------------------- random networks under A1-A2


@dataclass(frozen=True)
class SANWeights:
    """Per-layer weights of a single-head self-attention network (eq. 1). Each (T, d, d)."""

    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor


def _spectral_normalize(w: torch.Tensor, norm: float) -> torch.Tensor:
    return w * (norm / torch.linalg.matrix_norm(w, ord=2))[..., None, None]


def random_weights(n_layers: int, d: int, weight_norm: float = 1.0, seed: int = 0,
                   dtype: torch.dtype = torch.float64) -> SANWeights:
    """Gaussian W_Q, W_K rescaled to spectral norm `weight_norm` (A1); orthogonal W_V (A2:
    every product of W_V has norm 1, so token norms never grow)."""
    g = torch.Generator().manual_seed(seed)
    wq, wk, wv = (torch.randn(n_layers, d, d, generator=g, dtype=dtype) for _ in range(3))
    wv = torch.linalg.qr(wv).Q
    return SANWeights(_spectral_normalize(wq, weight_norm), _spectral_normalize(wk, weight_norm), wv)


def random_inputs(n: int, d: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """X^(0): n Gaussian tokens scaled to unit norm. (n, d)."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def san_forward(x0: torch.Tensor, w: SANWeights, mask: torch.Tensor, decay_m: float | None = None,
                theta: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run eq. (1), X^(t+1) = A^(t) X^(t) W_V^(t); return ([A^(0..T-1)], [X^(0..T-1)]), (N, N) and (N, d).

    With unit-norm input rows, |Z_ij| <= weight_norm^2 at every layer (rows stay in the unit ball).
    """
    x, attns, xs = x0, [], []
    for t in range(w.wq.shape[0]):
        a = attention(x, w.wq[t], w.wk[t], mask, decay_m, theta)  # (N, N)
        attns.append(a)
        xs.append(x)
        x = a @ x @ w.wv[t]  # (N, d)
    return attns, xs


def random_attention_layers(n: int, n_layers: int, mask: torch.Tensor, d: int = 8, weight_norm: float = 1.0,
                            seed: int = 0, decay_m: float | None = None, theta: torch.Tensor | None = None,
                            dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """Seeded attention matrices of a random SAN satisfying A1-A2 (unit-norm X^(0))."""
    w = random_weights(n_layers, d, weight_norm, seed, dtype)
    return san_forward(random_inputs(n, d, seed + 1, dtype), w, as_mask(mask), decay_m, theta)[0]


def iid_layer_fn(n: int, mask: torch.Tensor, d: int = 16, weight_norm: float = 1.0, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> Callable[[int], torch.Tensor]:
    """A callable t -> A^(t) that builds each layer on the fly from its own seed (seed, t).

    Layers are independent (no eq.-1 coupling), so they can be requested in any order, as
    `rollout_rows` does; scores stay bounded by weight_norm^2 (A1). For large N.
    """

    blocked = ~as_mask(mask)  # (N, N), inverted once

    def layer(t: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + t)
        x = torch.randn(n, d, generator=g, dtype=dtype)
        x = x / x.norm(dim=-1, keepdim=True)
        wq, wk = (_spectral_normalize(torch.randn(d, d, generator=g, dtype=dtype), weight_norm) for _ in range(2))
        z = (x @ wq) @ (x @ wk).T  # (N, N) fresh, so masked in place
        return torch.softmax(z.masked_fill_(blocked, float("-inf")), dim=-1)

    return layer
