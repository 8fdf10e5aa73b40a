"""Reddy (2024)'s in-context classification task, as Wu et al. (2025) use it (Sec. 5, App. J, App. L).

A sequence is ``x_1, y_1, ..., x_n, y_n, x_query`` (2n+1 tokens of dimension d): item i is token
2i, its label token 2i+1, the query token 2n (0-indexed). The target is the label of the query's
class. Every sequence holds n/B classes, each B times ("burstiness"), in random order; the query
belongs to the class of the item at the *answer position*, which the position bias of the data
fixes (Sec. 5, "Task structure"):

  none        uniform over the n items           first   item 1
  middle      item n/2 (paper, Sec. 5.1)        last    item n
  first-last  item 1 or item n, equal odds (Sec. 5.2)

Gaussian mixture (App. J): class means mu_k and label vectors have i.i.d. N(0, 1/d) components;
an item of class k is (mu_k + eps * eta) / sqrt(1 + eps^2), eta ~ N(0, I/d). Labels are assigned to
the K classes before training, balanced (K/L classes per label). Fixed vocabulary (App. L): an
item of class k is always v_k = (mu_k + lam * omega) / sqrt(1 + lam^2) with one shared omega.

Novel-class test sequences (Sec. 5, "Tracking position bias") draw fresh class means for every
sequence (and, for the fixed vocabulary, reuse the training omega) and give the n/B classes of a
sequence distinct labels drawn from the L existing ones.

Deviations from the public code (github.com/xinyiwu98/position-bias-in-attention), all to follow
the paper's text: components have variance 1/d (the code samples std 1/d, i.e. variance 1/d^2);
labels are balanced over classes (the issue asks for it; the code draws each class's label
independently); the middle item is item n/2, 1-indexed, as Sec. 5.1 says (the code uses item
n/2 + 1); novel classes of one sequence get distinct labels, so the position of the retrieved label
is identifiable (the code draws them independently: 1 sequence in L has two classes with one label).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from ..errors import PosbiasError

BIASES = ("none", "first", "middle", "last", "first-last")
KINDS = ("gaussian", "fixed")


@dataclass(frozen=True)
class DataConfig:
    """The data-generating process (the module docstring has the details). Defaults are the paper's (Sec. 5 and
    App. J).

    n_classes: classes K.
    n_labels: labels L.
    burstiness: B, the times each class of a sequence occurs in it.
    eps: within-class noise (App. J writes it gamma).
    n_items: items n per sequence.
    dim: the token dimension d.
    bias: the position bias of the training data: none | first | middle | last | first-last.
    kind: gaussian | fixed (the fixed vocabulary of App. L).
    lam: anisotropy lambda of the fixed vocabulary (kind fixed, App. L).
    component_std: std of each component; None: 1/sqrt(d) (variance 1/d, App. J; the public code uses 1/d, which
        makes inputs sqrt(d) times smaller).
    """

    n_classes: int = 2048
    n_labels: int = 32
    burstiness: int = 4
    eps: float = 0.75
    n_items: int = 8
    dim: int = 64
    bias: str = "none"
    kind: str = "gaussian"
    lam: float = 0.75
    component_std: float | None = None

    @property
    def std(self) -> float:
        return self.component_std if self.component_std is not None else 1 / math.sqrt(self.dim)

    @property
    def n_tokens(self) -> int:
        return 2 * self.n_items + 1

    @property
    def classes_per_seq(self) -> int:
        return self.n_items // self.burstiness

    def validate(self) -> "DataConfig":
        n, b = self.n_items, self.burstiness
        if self.bias not in BIASES:
            raise PosbiasError(f"unknown data bias {self.bias!r}", f"use one of {', '.join(BIASES)}")
        if self.kind not in KINDS:
            raise PosbiasError(f"unknown data kind {self.kind!r}", f"use one of {', '.join(KINDS)}")
        if n < 2 or b < 1 or n % b:
            raise PosbiasError(f"n={n} items must be >= 2 and a multiple of the burstiness B={b}",
                               "pick `n_items` as a multiple of `burstiness`")
        if not self.classes_per_seq <= self.n_labels <= self.n_classes:
            raise PosbiasError(f"need n/B <= L <= K, got n/B={self.classes_per_seq}, L={self.n_labels}, "
                               f"K={self.n_classes}", "raise L or K, or lower n/B")
        if self.dim < 2 or self.dim % 2:
            raise PosbiasError(f"the dimension d must be even and >= 2, got {self.dim}", "use an even `dim`, e.g. `dim=64`")
        if self.eps < 0 or self.lam < 0:
            raise PosbiasError("`eps` and `lam` must be >= 0", "use e.g. `eps=0.75`")
        return self


def named_position(name: str, n_items: int) -> int:
    """0-indexed item of 'first' (item 1), 'middle' (item n/2) and 'last' (item n) of Sec. 5.1."""
    pos = {"first": 0, "middle": n_items // 2 - 1, "last": n_items - 1}
    if name not in pos:
        raise PosbiasError(f"unknown position {name!r}", "use first, middle or last")
    return pos[name]


def generator(*keys) -> torch.Generator:
    """A torch generator seeded by a stable hash of `keys` (independent streams per purpose/step)."""
    h = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "little") >> 1)


@dataclass
class Batch:
    x: torch.Tensor  # (b, 2n+1, d) token vectors
    y: torch.Tensor  # (b,) target label
    classes: torch.Tensor  # (b, n) class id of each item (novel classes: K + slot)
    query_class: torch.Tensor  # (b,)
    answer: torch.Tensor  # (b,) 0-indexed item whose class the query was assigned to
    labels: torch.Tensor  # (b, n) label id of each item


def distinct(b: int, k: int, m: int, g: torch.Generator) -> torch.Tensor:
    """(b, m) ids, m distinct ones per row, a uniform m-subset of range(k) (Floyd's algorithm)."""
    out = torch.empty(b, m, dtype=torch.long)
    for j in range(m):
        top = k - m + j
        r = torch.randint(0, top + 1, (b,), generator=g)
        dup = (out[:, :j] == r[:, None]).any(dim=1)
        out[:, j] = torch.where(dup, torch.full_like(r, top), r)
    return out


def shuffled_rows(base: torch.Tensor, b: int, g: torch.Generator) -> torch.Tensor:
    """(b, len(base)): each row an independent random permutation of `base`."""
    perm = torch.rand(b, base.numel(), generator=g).argsort(dim=1)
    return base[perm]


def answer_positions(bias: str, b: int, n: int, g: torch.Generator) -> torch.Tensor:
    """(b,) 0-indexed answer item for training data with the given position bias."""
    if bias == "none":
        return torch.randint(0, n, (b,), generator=g)
    if bias == "first-last":
        return torch.randint(0, 2, (b,), generator=g) * (n - 1)
    return torch.full((b,), named_position(bias, n), dtype=torch.long)


def bursty_layout(b: int, n: int, burst: int, g: torch.Generator) -> torch.Tensor:
    """(b, n) class slot 0..n/B-1 of every item, each slot B times, uniformly shuffled."""
    return shuffled_rows(torch.arange(n // burst).repeat_interleave(burst), b, g)


def swap_layout(a: torch.Tensor, bpos: torch.Tensor, n: int, burst: int, other: bool,
                g: torch.Generator) -> torch.Tensor:
    """(b, n) slots with slot 0 (the query's class) at item a; with other=True slot 1 at item bpos.

    Uniform over the bursty layouts that satisfy the constraint (classes are exchangeable).
    """
    b, m = a.numel(), n // burst
    counts = torch.full((m,), burst)
    counts[0] -= 1
    fixed = [a]
    if other:
        counts[1] -= 1
        fixed.append(bpos)
    rest = shuffled_rows(torch.arange(m).repeat_interleave(counts), b, g)  # (b, n - len(fixed))
    taken = torch.zeros(b, n, dtype=torch.bool)
    for f in fixed:
        taken[torch.arange(b), f] = True
    free = torch.where(taken, n + torch.arange(n), torch.arange(n)).argsort(dim=1)[:, : n - len(fixed)]
    slots = torch.empty(b, n, dtype=torch.long)
    slots.scatter_(1, free, rest)
    slots[torch.arange(b), a] = 0
    if other:
        slots[torch.arange(b), bpos] = 1
    return slots


class SynthTask:
    """The fixed tables of one task instance: class means, labels, label vectors (seeded)."""

    def __init__(self, cfg: DataConfig, seed: int = 0):
        self.cfg = cfg.validate()
        self.seed = seed
        k, d, lab = cfg.n_classes, cfg.dim, cfg.n_labels
        g = generator("task", seed)
        self.means = torch.randn(k, d, generator=g) * cfg.std  # (K, d) mu_k, App. J
        self.label_vecs = torch.randn(lab, d, generator=g) * cfg.std  # (L, d) label contents
        perm = torch.randperm(k, generator=g)
        self.class_label = torch.empty(k, dtype=torch.long)
        self.class_label[perm] = torch.arange(k) % lab  # balanced: K/L classes per label
        self.omega = torch.randn(d, generator=g) * cfg.std  # shared direction, App. L

    def items(self, mu: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """Items of the classes with means `mu` (..., d): App. J (gaussian) or App. L (fixed)."""
        c = self.cfg
        if c.kind == "fixed":
            return (mu + c.lam * self.omega) / math.sqrt(1 + c.lam**2)
        eta = torch.randn(mu.shape, generator=g) * c.std
        return (mu + c.eps * eta) / math.sqrt(1 + c.eps**2)

    def assemble(self, mu_items, mu_query, labels, g) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens x_1, y_1, ..., x_n, y_n, x_query: (b, 2n+1, d), and the items (b, n, d)."""
        x = self.items(mu_items, g)  # (b, n, d)
        q = self.items(mu_query, g)  # (b, d), fresh noise
        y = self.label_vecs[labels]  # (b, n, d)
        b, n, d = x.shape
        return torch.cat([torch.stack([x, y], dim=2).reshape(b, 2 * n, d), q[:, None]], dim=1), x

    def train_batch(self, b: int, g: torch.Generator, bias: str | None = None) -> Batch:
        """Training sequences over the K training classes, position bias `bias` (default: cfg.bias)."""
        c = self.cfg
        n, m = c.n_items, c.classes_per_seq
        chosen = distinct(b, c.n_classes, m, g)  # (b, m) class ids
        slots = bursty_layout(b, n, c.burstiness, g)  # (b, n)
        ans = answer_positions(bias or c.bias, b, n, g)
        rows = torch.arange(b)
        classes = chosen.gather(1, slots)  # (b, n)
        qc = classes[rows, ans]
        x, _ = self.assemble(self.means[classes], self.means[qc], self.class_label[classes], g)
        return Batch(x, self.class_label[qc], classes, qc, ans, self.class_label[classes])

    def novel_batch(self, b: int, g: torch.Generator, answer: torch.Tensor | None = None,
                    twin: torch.Tensor | None = None, twin_other: bool = True) -> Batch:
        """Novel-class test sequences (fresh means, distinct existing labels per sequence).

        answer: (b,) item of the query's class (default uniform). twin: (b,) item that becomes an
        exact copy of the answer item (the swap tests of Sec. 5.1); with twin_other it belongs to
        another class, so its label is wrong; otherwise its class is whatever the layout gives.
        """
        c = self.cfg
        n, m, d = c.n_items, c.classes_per_seq, c.dim
        if twin is not None and twin_other and m < 2:
            raise PosbiasError("swap tests need two classes per sequence", "use a burstiness B < n")
        mu = torch.randn(b, m, d, generator=g) * c.std  # (b, m, d) novel class means
        lab = torch.rand(b, c.n_labels, generator=g).argsort(dim=1)[:, :m]  # (b, m) distinct labels
        ans = torch.randint(0, n, (b,), generator=g) if answer is None else answer.expand(b).clone()
        if twin is None:
            slots = bursty_layout(b, n, c.burstiness, g)
            slots = slots - slots[torch.arange(b), ans][:, None]  # make the answer's slot 0
            slots = slots % m
        else:
            slots = swap_layout(ans, twin.expand(b), n, c.burstiness, twin_other, g)
        rows = torch.arange(b)
        labels = lab.gather(1, slots)  # (b, n)
        seq, _ = self.assemble(mu.gather(1, slots[..., None].expand(b, n, d)), mu[:, 0], labels, g)
        if twin is not None:
            seq[rows, 2 * twin.expand(b)] = seq[rows, 2 * ans]  # identical item vectors at a and b
        return Batch(seq, lab[:, 0], c.n_classes + slots, torch.full((b,), c.n_classes), ans, labels)
