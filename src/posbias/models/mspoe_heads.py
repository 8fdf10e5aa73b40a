"""Ms-PoE's per-input maths (Zhang et al., 2024): which token ranks the heads, their outlier scores, the ranking,
the ratio ladder, and the per-head RoPE rotation f(x, i / r_h). Tensors only; models/mspoe.py hooks it into the
model. Query head h reads KV head h // G everywhere (transformers' repeat_kv order).
"""

from __future__ import annotations

import torch

from ..errors import PosbiasError

# The outlier threshold: a weight counts when it exceeds ALPHA times its row's mean (ALPHA / n over n valid keys). 3, the
# public code's (VITA-Group/Ms-PoE, utils/modify_arch/llama.py `_calculate_outlier`: `attn_weights > 3 * average`,
# scored on the last query row), unchanged there since commit aa9bb6a (2024-03-05) and in its open pull request #3;
# the value moved 3, 1, 5, 4, 2, 3, 2, 3 over its first day of commits. The paper's text was not at hand to check;
# this was 4 until 2026-11, cited as "public code and paper" without a source.
ALPHA = 3.0


def ratio_ladder(min_ratio: float, max_ratio: float, n: int) -> torch.Tensor:
    """The n scaling ratios, min_ratio .. max_ratio inclusive (rank k gets entry k)."""
    if n == 1:
        return torch.tensor([float(min_ratio)])
    return torch.linspace(float(min_ratio), float(max_ratio), n)


def outlier_scores(q_row: torch.Tensor, k: torch.Tensor, valid: torch.Tensor, scaling: float) -> torch.Tensor:
    """Position-awareness score per query head: the fraction of valid keys with weight > ALPHA / n.

    q_row: [B, Hq, D] un-rotated query of the probed token; k: [B, Hk, S, D] un-rotated keys;
    valid: [B, S] keys the probed query may attend to. -> [B, Hq] float32.
    """
    b, hq, d = q_row.shape
    hk = k.shape[1]
    q = q_row.float().view(b, hk, hq // hk, d)
    logits = torch.einsum("bkgd,bksd->bkgs", q, k.float()).reshape(b, hq, -1) * scaling
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    n = valid.sum(-1).clamp(min=1).float()[:, None, None]  # [B, 1, 1]
    outliers = (weights > ALPHA / n) & valid[:, None, :]
    return outliers.sum(-1).float() / n[..., 0]


def rank_groups(scores: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hq] head scores -> [B, Hq / groups] rank of each unit of `groups` consecutive heads (0 = highest mean
    score). groups = G: KV groups ranked by their query heads' mean; groups = 1: every query head by its own score.

    Ties go to the lower index (stable sort), so equal scores give a deterministic ordering.
    """
    b, hq = scores.shape
    unit_score = scores.view(b, hq // groups, groups).mean(-1)  # [B, Hq / groups]
    order = torch.sort(-unit_score, dim=-1, stable=True).indices  # order[:, k] = unit ranked k
    return torch.argsort(order, dim=-1)  # inverse permutation: rank of each unit


def _row_mask(mask, b: int, s: int) -> torch.Tensor | None:
    """The backend's mask as bool [B, Q, S] (True = may attend), or None (sdpa without padding: plain causal)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        raise PosbiasError(f"mspoe cannot read an attention mask of type {type(mask).__name__}",
                           "use the sdpa or eager attention implementation")
    if mask.dim() == 2:  # [B, S] padding only (no causal / window structure to read)
        return None
    rows = mask[:, 0, :, :s].expand(b, -1, -1)
    if rows.dtype != torch.bool:
        rows = rows > torch.finfo(rows.dtype).min if rows.is_floating_point() else rows != 0
    return rows


def probe_valid(mask, b: int, s: int, device, order_query: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(query column [B], valid keys [B, S]) of the row whose attention ranks the heads, on a prefill (Q = S).

    The probe is `order_query` or each row's last real token (the last column whose query sees itself: padding
    rows see nothing); its valid keys are its own mask row, so padding, causality and a sliding window all hold.
    """
    cols = torch.arange(s, device=device)
    rows = _row_mask(mask, b, s)
    pad = mask[:, :s].expand(b, s).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    if order_query is not None:
        probe = order_query.to(device).long().view(-1).expand(b)
    elif rows is not None:
        probe = (torch.diagonal(rows[:, -s:], dim1=-2, dim2=-1) * cols).argmax(-1)  # last real token of each row
    elif pad is not None:
        probe = (pad * cols).argmax(-1)
    else:
        probe = torch.full((b,), s - 1, device=device)
    if rows is None:
        valid = cols[None] <= probe[:, None]
        return probe, valid if pad is None else valid & pad
    q0 = rows.shape[1] - s  # 0 on a prefill; kept general for a mask with more query rows than keys
    return probe, rows[torch.arange(b, device=device), q0 + probe]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """f(x, i / r_h): x [..., T, D] with cos/sin broadcastable to [..., T, d] (same formula as transformers). d < D:
    partial rotary (Phi-3's partial_rotary_factor, GPT-NeoX's rotary_pct): only the first d channels rotate, as in
    transformers' apply_rotary_pos_emb for those models; the rest pass through."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return (x * cos) + (rotate_half(x) * sin)
    head = x[..., :d]
    out = (head * cos) + (rotate_half(head) * sin)  # broadcast, e.g. over MoICE's experts
    return torch.cat([out, x[..., d:].expand(*out.shape[:-1], -1)], dim=-1)


def rotate_heads(q, k, cos, sin, rank: torch.Tensor, groups: int, per_query: bool):
    """Rotate q [B, Hq, T, D] and k [B, Hk, T, D] per head with the ratio of its rank.

    cos/sin: [R, B', T, D] tables at position_ids / r_k for every ladder entry k (B' = 1 or B). rank: [B, Hk]
    (group mode: one ratio per KV group, its keys and all its queries) or [B, Hq] (per_query: every query head its
    own ratio; the keys are repeated per query head first, so k comes back as [B, Hq, T, D]).
    """
    b = q.shape[0]
    cos = cos.expand(-1, b, -1, -1).transpose(0, 1)  # [B, R, T, D]
    sin = sin.expand(-1, b, -1, -1).transpose(0, 1)
    rows = torch.arange(b, device=q.device)[:, None]
    rank = rank.to(q.device)
    if per_query:
        idx_q = idx_k = rank  # [B, Hq]
        k = k.repeat_interleave(groups, dim=1)  # [B, Hq, T, D]: query head h reads KV head h // G
    else:
        idx_k = rank  # [B, Hk]
        idx_q = rank.repeat_interleave(groups, dim=1)  # [B, Hq]
    return rotate(q, cos[rows, idx_q], sin[rows, idx_q]), rotate(k, cos[rows, idx_k], sin[rows, idx_k])
