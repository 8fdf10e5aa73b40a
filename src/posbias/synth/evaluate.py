"""Evaluation of a trained network on novel-class sequences (Sec. 5.1, App. K.4).

* Swap tests (Sec. 5.1): for a pair (a, b) of item positions, [a, b] puts the query's class at a
  and an exact copy of x_a at b; [b, a] the other way round. gap = acc[a, b] - acc[b, a] > 0
  means a bias toward a. The three pairs are (first, middle), (first, last), (middle, last), with
  first = item 1, middle = item n/2, last = item n; for a < b, gap > 0 is a bias toward the
  earlier position, as in the paper's figures. Both sets of a pair are drawn from one random
  stream, so they differ only where a and b differ (a paired comparison).
  The twin at b belongs to another class by default ("other"), so its label is always wrong and
  each test sequence is informative; "any" is the public code's variant, where b keeps the class
  the layout gives it (3/7 of the time the query's own class with n = 8, B = 4, which dilutes the
  gap by that fraction).
* Accuracy by answer position: for each item p, the query's class at p and an identical twin at a
  uniformly random other item (the swap test averaged over the partner position).
* Novel-class accuracy without a twin, answer uniform (in-context learning at all), accuracy on fresh
  training sequences (the training distribution, its position bias included), and the in-context
  accuracy: novel classes with the answer drawn like the training data's (its position bias
  included), i.e. the training task on classes never seen. A run *learned in context* when that
  accuracy reaches ICL_THRESHOLD = 0.8. Why 0.8: with n = 8, B = 4 a sequence holds two classes,
  so copying either context label gives 0.5, and the best label-copying rule that ignores the query
  (always the label at item 1, with first-last training data) gives 1/2 + 1/2 * 3/7 = 0.71; above
  0.8 the network must compare the query with the items.
* Attention-sink metric of Gu et al. (2025) as App. K.4 writes it, per token j:
      sink_j = 1/T sum_t (1 / sum_i M_ij) sum_i 1{A_ij^(t) > tau},  tau = 0.2,
  averaged over unbiased novel-class sequences; also per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PosbiasError
from .data import SynthTask, answer_positions, generator, named_position

PAIRS = (("first", "middle"), ("first", "last"), ("middle", "last"))
TWINS = ("other", "any")
ICL_THRESHOLD = 0.8  # in-context accuracy at which a run counts as having learned in context (see above)


@dataclass(frozen=True)
class EvalConfig:
    """How a trained network is evaluated (the module docstring describes each test).

    n_seqs: test sequences per swap-test set (Sec. 5.1: 10,000).
    twin: the swap test's twin item: other (of another class, so its label is wrong) | any (the public code's).
    tau: the sink metric's attention threshold (App. K.4).
    sink_seqs: sequences for the sink metric (App. K.4: 10,000).
    position_seqs: sequences per answer position (accuracy by position).
    batch: sequences per forward pass.
    """

    n_seqs: int = 10_000
    twin: str = "other"
    tau: float = 0.2
    sink_seqs: int = 10_000
    position_seqs: int = 2_000
    batch: int = 2_500

    def validate(self) -> "EvalConfig":
        if self.twin not in TWINS:
            raise PosbiasError(f"unknown twin mode {self.twin!r}", f"use one of {', '.join(TWINS)}")
        if min(self.n_seqs, self.sink_seqs, self.position_seqs, self.batch) < 1:
            raise PosbiasError("evaluation sizes must be >= 1", "use `eval_seqs=1` or more")
        return self


@torch.no_grad()
def predict(model, x: torch.Tensor, batch: int) -> torch.Tensor:
    """(b,) predicted labels, in chunks of `batch` sequences."""
    model.eval()
    return torch.cat([model(x[i:i + batch]).argmax(dim=-1) for i in range(0, len(x), batch)])


def _accuracy(model, b, batch: int) -> float:
    return float((predict(model, b.x, batch) == b.y).float().mean())


def _chunks(total: int, batch: int):
    for i in range(0, total, batch):
        yield i, min(batch, total - i)


def swap_accuracy(model, task: SynthTask, a: int, b: int, n: int, twin_other: bool, seed, batch: int) -> float:
    """Accuracy on n sequences [a, b]: answer at item a, exact copy of x_a at item b."""
    correct = 0
    for i, size in _chunks(n, batch):
        g = generator("swap", seed, min(a, b), max(a, b), i)  # one stream for [a, b] and [b, a]
        bt = task.novel_batch(size, g, answer=torch.tensor(a), twin=torch.tensor(b), twin_other=twin_other)
        correct += int((predict(model, bt.x, batch) == bt.y).sum())
    return correct / n


def swap_tests(model, task: SynthTask, ecfg: EvalConfig, seed, n: int | None = None) -> dict:
    """{"first_vs_middle": {"acc_ab", "acc_ba", "gap"}, ...} for the three pairs of Sec. 5.1."""
    n_items, out = task.cfg.n_items, {}
    for pa, pb in PAIRS:
        a, b = named_position(pa, n_items), named_position(pb, n_items)
        if a == b:
            raise PosbiasError(f"{pa} and {pb} are the same item for n={n_items}", "use n >= 4")
        args = (n or ecfg.n_seqs, ecfg.twin == "other", seed, ecfg.batch)
        ab, ba = swap_accuracy(model, task, a, b, *args), swap_accuracy(model, task, b, a, *args)
        out[f"{pa}_vs_{pb}"] = {"acc_ab": ab, "acc_ba": ba, "gap": ab - ba}
    return out


def accuracy_by_position(model, task: SynthTask, ecfg: EvalConfig, seed, n: int | None = None) -> list[float]:
    """Accuracy with the answer at item p (0-indexed), an identical twin at a random other item."""
    n_items, per = task.cfg.n_items, n or ecfg.position_seqs
    accs = []
    for p in range(n_items):
        correct = 0
        for i, size in _chunks(per, ecfg.batch):
            g = generator("position", seed, p, i)
            twin = (p + torch.randint(1, n_items, (size,), generator=g)) % n_items
            bt = task.novel_batch(size, g, answer=torch.tensor(p), twin=twin, twin_other=ecfg.twin == "other")
            correct += int((predict(model, bt.x, ecfg.batch) == bt.y).sum())
        accs.append(correct / per)
    return accs


def novel_accuracy(model, task: SynthTask, n: int, seed, batch: int) -> float:
    """Novel classes, no twin, answer anywhere: in-context accuracy (chance ~ B/n among context labels)."""
    return _accuracy(model, task.novel_batch(n, generator("novel", seed)), batch)


def icl_accuracy(model, task: SynthTask, n: int, seed, batch: int) -> float:
    """Novel classes, no twin, the answer item drawn from the training data's position bias."""
    g = generator("icl", seed)
    ans = answer_positions(task.cfg.bias, n, task.cfg.n_items, g)
    return _accuracy(model, task.novel_batch(n, g, answer=ans), batch)


def train_accuracy(model, task: SynthTask, n: int, seed, batch: int) -> float:
    """Fresh sequences from the training distribution (training classes and position bias)."""
    return _accuracy(model, task.train_batch(n, generator("train-eval", seed)), batch)


@torch.no_grad()
def sink_metric(model, task: SynthTask, ecfg: EvalConfig, seed, n: int | None = None) -> dict:
    """App. K.4: per-token sink score averaged over layers ("per_token", (N,)) and per layer."""
    model.eval()
    n = n or ecfg.sink_seqs
    mask = model.mask  # (N, N) bool
    allowed = mask.sum(dim=0).clamp(min=1).float()  # (N,) queries that may attend to key j
    total = torch.zeros(model.cfg.depth, mask.shape[0])
    for i, size in _chunks(n, ecfg.batch):
        bt = task.novel_batch(size, generator("sink", seed, i))
        _, maps = model(bt.x, attn=True)
        for t, a in enumerate(maps):  # a (b, N, N)
            total[t] += ((a > ecfg.tau) & mask).sum(dim=(0, 1)).float() / allowed
    per_layer = total / n  # (T, N)
    return {"per_token": per_layer.mean(dim=0).tolist(), "per_layer": per_layer.tolist(), "tau": ecfg.tau}


def learned(icl: float) -> dict:
    """{"icl_accuracy", "learned", "icl_threshold"}: the in-context verdict of a run."""
    return {"icl_accuracy": icl, "learned": icl >= ICL_THRESHOLD, "icl_threshold": ICL_THRESHOLD}


def evaluate(model, task: SynthTask, ecfg: EvalConfig, seed) -> dict:
    """Every metric of the final model, as plain floats and lists (JSON-ready)."""
    ecfg.validate()
    return {
        "swap": swap_tests(model, task, ecfg, seed),
        "accuracy_by_position": accuracy_by_position(model, task, ecfg, seed),
        "novel_accuracy": novel_accuracy(model, task, ecfg.n_seqs, seed, ecfg.batch),
        "train_accuracy": train_accuracy(model, task, ecfg.n_seqs, seed, ecfg.batch),
        **learned(icl_accuracy(model, task, ecfg.n_seqs, seed, ecfg.batch)),
        "sinks": sink_metric(model, task, ecfg, seed),
    }
