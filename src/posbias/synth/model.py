"""Attention-only network of Sec. 5 ("Network architecture"): L single-head attention layers,
then a ReLU MLP classifier on the query (last) token.

Layer t (eq. 1, with the usual 1/sqrt(d) temperature and optional residual):
    A = softmax_G(Q K^T / sqrt(d) + D),  Q = X W_Q (R_i for RoPE, eq. 3),  D = decay (eq. 2)
    X <- X + A X W_V   (residual)   or   X <- A X W_V   (no residual: the paper's "pure attention")

Options (each explicit; the defaults are the paper's where it fixes one):
  mask  none | causal | window (w tokens, itself included) | prefix (first k tokens attend to
        each other bidirectionally, later ones causally; App. K.4 after Gu et al. 2025)
  pe    none | sin (absolute sinusoidal, added to the input) | rope (theta_i = 10000^(-2(i-1)/d),
        App. J) | decay (eq. 2, m = -log 0.8, App. J)
Masks and the decay bias come from core.rollout, so the network and the theory share one
definition; windows and prefixes count tokens (items and labels alike), as in the public code.

Deviations from the public code's defaults, to follow the paper: decay m = -log 0.8 (the code's
gamma = 1 is no decay at all); residual connections on (its flag makes them off unless asked for);
window w = 5 rather than 20 (> 2n+1 = 17 tokens, i.e. the causal mask). The MLP has `mlp_layers`
Linear(d, d)+ReLU layers then a Linear(d, L) read-out, as in that code ("three-layer MLP with ReLU
activations and a softmax layer"; the softmax sits in the cross-entropy loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..core import rollout as R
from ..errors import PosbiasError

MASKS = ("none", "causal", "window", "prefix")
PES = ("none", "sin", "rope", "decay")


@dataclass(frozen=True)
class ModelConfig:
    """An attention-only network (the module docstring has the equations and the deviations from the public code).

    depth: attention layers, one head each.
    mask: none | causal | window (a sliding window of `window` tokens, itself included) | prefix (the first
        `prefix` tokens attend to each other, later ones causally); `one_run_config` and the CLI write windowN |
        prefixN.
    pe: the positional encoding: none | sin | rope | decay.
    residual: residual connections around each attention layer (off: the paper's pure attention).
    window: the sliding-window width w, in tokens (mask window).
    prefix: the prefix length k, in tokens (mask prefix).
    decay_m: the decay mask's rate m (eq. 2; App. J: -log 0.8).
    rope_base: the RoPE base (App. J: 10000).
    mlp_layers: Linear+ReLU layers of the classifier before its read-out.
    """

    depth: int = 2
    mask: str = "causal"
    pe: str = "none"
    residual: bool = True
    window: int = 5
    prefix: int = 2
    decay_m: float = -math.log(0.8)
    rope_base: float = 10000.0
    mlp_layers: int = 3

    def validate(self, n_tokens: int) -> "ModelConfig":
        if self.mask not in MASKS:
            raise PosbiasError(f"unknown mask {self.mask!r}", f"use one of {', '.join(MASKS)}")
        if self.pe not in PES:
            raise PosbiasError(f"unknown positional encoding {self.pe!r}", f"use one of {', '.join(PES)}")
        if self.depth < 1 or self.mlp_layers < 0:
            raise PosbiasError(f"`depth` must be >= 1 and mlp_layers >= 0, got {self.depth}, {self.mlp_layers}",
                               "use `depth=2` or more")
        if self.mask == "window" and self.window < 1:
            raise PosbiasError(f"window width must be >= 1, got {self.window}",
                               "write the mask as windowN with N >= 1, e.g. window5")
        if self.mask == "prefix" and not 1 <= self.prefix <= n_tokens:
            raise PosbiasError(f"prefix length must be in [1, {n_tokens}], got {self.prefix}",
                               f"write the mask as prefixK with 1 <= K <= {n_tokens}")
        return self

    @property
    def label(self) -> str:
        m = {"window": f"window{self.window}", "prefix": f"prefix{self.prefix}"}.get(self.mask, self.mask)
        return f"L{self.depth}-{m}-{self.pe}-{'res' if self.residual else 'nores'}"


def build_mask(cfg: ModelConfig, n: int) -> torch.Tensor:
    """(n, n) bool, M[i, j] = query i may attend to key j (core.rollout conventions)."""
    if cfg.mask == "none":
        return R.full_mask(n)
    if cfg.mask == "causal":
        return R.causal_mask(n)
    if cfg.mask == "window":
        return R.sliding_window_mask(n, cfg.window)
    return R.prefix_mask(n, cfg.prefix)


def sinusoidal(n: int, d: int) -> torch.Tensor:
    """Absolute sinusoidal PE (Vaswani et al. 2017): (n, d), sin on even, cos on odd columns."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    ang = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (n, d/2)
    return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Eq. (3) with precomputed tables, the pairing of core.rollout.rope_rotate. x (..., n, d)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (..., n, d/2)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class AttentionLayer(nn.Module):
    """One head: W_Q, W_K, W_V in R^{d x d}, no biases (as Reddy 2024 and the public code)."""

    def __init__(self, d: int):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)

    def forward(self, x, blocked, bias, rope) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.q(x), self.k(x)  # (b, n, d)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        s = q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1])  # (b, n, n)
        if bias is not None:
            s = s + bias
        a = torch.softmax(s.masked_fill(blocked, float("-inf")), dim=-1)  # softmax_G, Sec. 3.1
        return a @ self.v(x), a


class AttentionOnlyNet(nn.Module):
    """x (b, n_tokens, d) -> logits (b, n_labels); `attn=True` also returns the (b, n, n) maps."""

    def __init__(self, cfg: ModelConfig, dim: int, n_tokens: int, n_labels: int):
        super().__init__()
        self.cfg = cfg.validate(n_tokens)
        self.layers = nn.ModuleList(AttentionLayer(dim) for _ in range(cfg.depth))
        mlp: list[nn.Module] = []
        for _ in range(cfg.mlp_layers):
            mlp += [nn.Linear(dim, dim), nn.ReLU()]
        self.mlp = nn.Sequential(*mlp, nn.Linear(dim, n_labels))
        mask = build_mask(cfg, n_tokens)
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("blocked", ~mask, persistent=False)
        # fixed tables as non-persistent buffers: .to(device) moves them, state_dict leaves them out
        decay = R.decay_bias(n_tokens, cfg.decay_m, torch.float32) if cfg.pe == "decay" else None
        self.register_buffer("bias", decay, persistent=False)  # (n, n) or None
        self.register_buffer("pos", sinusoidal(n_tokens, dim) if cfg.pe == "sin" else None, persistent=False)
        cos = sin = None
        if cfg.pe == "rope":
            ang = torch.arange(n_tokens, dtype=torch.float64)[:, None] * R.rope_angles(dim, cfg.rope_base)[None]
            cos, sin = ang.cos().float(), ang.sin().float()  # (n, d/2) each
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The RoPE tables (cos, sin), (n, d/2) each, or None."""
        return None if self.rope_cos is None else (self.rope_cos, self.rope_sin)

    def forward(self, x: torch.Tensor, attn: bool = False):
        if self.pos is not None:
            x = x + self.pos
        maps = []
        for layer in self.layers:
            upd, a = layer(x, self.blocked, self.bias, self.rope)
            x = x + upd if self.cfg.residual else upd
            if attn:
                maps.append(a)
        logits = self.mlp(x[:, -1])  # the query token
        return (logits, maps) if attn else logits
