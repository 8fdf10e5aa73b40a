"""Distillation losses of Pos2Distill-R1 (Wang et al. 2025, Sec. 4.2), pure torch; and MoICE's router
load-balancing term (`load_balancing_loss`, Lin et al. 2024).

Shapes: S sequences, T response tokens (padded), V vocabulary. `mask[s, t]` is True where
token t of sequence s is a real response token. Row t of a logits tensor is the distribution
that predicts response token t (the caller aligns teacher and student so that the same row
means the same response token in both).

Choices where the paper leaves room (docs in methods/pos2distill/__init__.py):
- KL(P_teacher || P_student) per token over the full vocabulary (float32 log-softmax), averaged
  over the response tokens of a sequence: one number per (question, position) = L_Act^{P^{n_i}}.
  The released code does the same (`F.kl_div(..., reduction="batchmean")` per sequence).
- alpha_ij is a *weight*: computed from detached KLs, no gradient flows through it (the paper
  writes L_Act = sum_ij alpha_ij L_Act^j and calls alpha "a dynamic weight"; the released code
  detaches it too).
- intra-pos weight KL_ij / max_k KL_ik with a zero max (every sample of the bin already matches
  the teacher) is set to 0: at KL = 0 both the loss term and its gradient vanish, so any finite
  choice gives the same update.
- `count_factor`: the released code multiplies inter-pos by P / |B_i| (P = trivial bins present,
  |B_i| = samples in bin i), so that each *bin* rather than each sample carries the softmax mass.
  It is not in the paper's equation, so it is off by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean over response tokens of KL(P_teacher || P_student).

    teacher_logits, student_logits: [S, T, V]; mask: [S, T] (bool or 0/1). Returns [S] (float32);
    a sequence with no response token gets 0.
    """
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher {tuple(teacher_logits.shape)} and student {tuple(student_logits.shape)} logits differ")
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    s = F.log_softmax(student_logits.float(), dim=-1)
    per_token = F.kl_div(s, t, reduction="none", log_target=True).sum(-1)  # [S, T]: sum_v p_t (log p_t - log p_s)
    m = mask.to(per_token.dtype)
    return (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def alignment_weights(kl: torch.Tensor, bins: torch.Tensor, count_factor: bool = False) -> torch.Tensor:
    """alpha_ij of Sec. 4.2 for trivial-position samples with KLs `kl` [N] in position bins `bins` [N].

    inter-pos(i) = softmax over the bins present of mean_j KL_ij   (eq. for alpha_ij, first factor)
    intra-pos(ij) = KL_ij / max_k KL_ik                              (second factor; 0/0 -> 0)
    alpha_ij = inter-pos(i) * intra-pos(ij)   [* P / |B_i| with count_factor, as the released code]
    Computed on kl.detach(): the result carries no gradient.
    """
    kl = kl.detach().float().clamp(min=0.0)  # KL >= 0; rounding can give -1e-9
    if kl.ndim != 1 or bins.shape != kl.shape:
        raise ValueError(f"kl {tuple(kl.shape)} and bins {tuple(bins.shape)} must be equal 1-D shapes")
    if kl.numel() == 0:
        return kl
    _, inv = torch.unique(bins, return_inverse=True)
    n_bins = int(inv.max()) + 1
    counts = torch.bincount(inv, minlength=n_bins).to(kl.dtype)
    means = torch.zeros(n_bins, dtype=kl.dtype, device=kl.device).index_add_(0, inv, kl) / counts
    inter = torch.softmax(means, dim=0)  # over the trivial bins present in the batch
    maxes = torch.zeros(n_bins, dtype=kl.dtype, device=kl.device).scatter_reduce(0, inv, kl, "amax", include_self=False)
    top = maxes[inv]
    intra = torch.where(top > 0, kl / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(kl))
    alpha = inter[inv] * intra
    if count_factor:
        alpha = alpha * n_bins / counts[inv]
    return alpha


def pos2distill_loss(
    kl_trivial: torch.Tensor,
    bins: torch.Tensor,
    kl_anchor: torch.Tensor | None = None,
    lam: float = 1.0,
    align: bool = True,
    count_factor: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """L = L_Act + lam * L_Anc (Sec. 4.2, "Training Objective").

    kl_trivial [N]: per-sequence KLs at trivial positions, bins [N] their gold positions;
    kl_anchor [M]: KLs of the student on the advantageous prompt (anchoring), may be empty/None.
    align=True: L_Act = sum_ij alpha_ij KL_ij; align=False: the plain mean of kl_trivial
    (ablation "kl"). L_Anc = mean(kl_anchor) (the paper's expectation).
    Returns (loss, parts) with parts as floats for logging.
    """
    if kl_trivial.numel() == 0:
        act = kl_trivial.new_zeros(())
    elif align:
        act = (alignment_weights(kl_trivial, bins, count_factor) * kl_trivial).sum()
    else:
        act = kl_trivial.mean()
    has_anchor = kl_anchor is not None and kl_anchor.numel() > 0
    anc = kl_anchor.mean() if has_anchor else act.new_zeros(())
    loss = act + lam * anc if lam else act
    parts = {
        "act": float(act.detach()),
        "anc": float(anc.detach()),
        "kl_trivial": float(kl_trivial.detach().mean()) if kl_trivial.numel() else 0.0,
    }
    return loss, parts


def ce_loss(student_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level mean cross-entropy over the masked tokens (SFT and SeqKD baselines).

    student_logits [S, T, V] (row t predicts targets[:, t]); targets [S, T] (long); mask [S, T].
    """
    m = mask.bool()
    if not m.any():
        return student_logits.sum() * 0.0  # keeps the graph; no target tokens
    return F.cross_entropy(student_logits[m].float(), targets[m])


def load_balancing_loss(logits: list[torch.Tensor], top_k: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch-Transformer load balancing over router logits, as MoICE's public code computes it (its
    `load_balancing_loss_func`): every (layer, token, head) is one routed item;

        loss = N * sum_{i, j} f_ij * P_j,  f_ij = fraction of items whose i-th choice (of top_k) is expert j,
                                           P_j  = mean router probability of expert j,

    averaged over the items that are not padding. logits: one (B, T, H, N) tensor per layer; mask (B, T), 1 =
    real token. With top_k == N every expert is some item's i-th choice for each i, so sum_i f_ij = 1 and the
    loss is the constant N (no gradient): the paper's setting (7 experts, top-k 7) trains on the LM loss alone."""
    stacked = torch.stack([x.float() for x in logits])  # (L, B, T, H, N)
    n = stacked.shape[-1]
    probs = torch.softmax(stacked, dim=-1)
    chosen = F.one_hot(stacked.topk(top_k, dim=-1).indices, n).float()  # (L, B, T, H, k, N)
    if mask is None:
        weight = torch.ones(stacked.shape[:-1], device=stacked.device)
    else:
        weight = mask.to(stacked.device, torch.float32)[None, :, :, None].expand(stacked.shape[:-1])  # (L, B, T, H)
    total = weight.sum().clamp(min=1.0)
    f = (chosen * weight[..., None, None]).sum(dim=(0, 1, 2, 3)) / total  # (k, N)
    p = (probs * weight[..., None]).sum(dim=(0, 1, 2, 3)) / total  # (N,)
    return n * (f * p[None]).sum()
