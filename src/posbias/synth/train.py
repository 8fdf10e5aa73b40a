"""Training (App. J): AdamW, lr 1e-3, weight decay 1e-6, batch 128, cross-entropy on the query's
label; the paper trains 100k iterations (the public code's default is 50k).

Reproducibility: the task tables, the initial weights and the batch of every step come from
generators seeded by (seed, purpose, step), so a run is a pure function of its RunConfig (on a
fixed torch build and thread count). A checkpoint (model, optimizer, step, learning curve) is
written atomically every `ckpt_every` steps; calling `train` again with the same checkpoint path
continues from it and ends with the same parameters as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import PosbiasError
from ..runs import progress as progress_bar
from ..runs import versions as library_versions
from .data import DataConfig, SynthTask, generator
from .evaluate import EvalConfig, icl_accuracy, novel_accuracy, swap_tests
from .model import AttentionOnlyNet, ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    """How a network is trained (AdamW on the cross-entropy of the query's label).

    iters: training iterations (App. J: 100,000).
    batch: sequences per training step.
    lr: AdamW learning rate (App. J: 1e-3).
    weight_decay: AdamW weight decay.
    log_points: learning-curve points, evenly spaced.
    curve_seqs: sequences per set for each learning-curve point.
    ckpt_every: steps between checkpoints (a killed run resumes from the last).
    """

    iters: int = 100_000
    batch: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-6
    log_points: int = 10
    curve_seqs: int = 512
    ckpt_every: int = 500

    def validate(self) -> "TrainConfig":
        if min(self.iters, self.batch, self.log_points, self.curve_seqs, self.ckpt_every) < 1:
            raise PosbiasError("`iters`, batch, log_points, curve_seqs and ckpt_every must be >= 1", "use `iters=1` or more")
        if self.lr <= 0 or self.weight_decay < 0:
            raise PosbiasError(f"need `lr` > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}", "use e.g. `lr=0.001`")
        return self


@dataclass(frozen=True)
class RunConfig:
    """One training run: data x model x training x evaluation x seed.

    data: the data-generating process (DataConfig).
    model: the network (ModelConfig).
    train: how it is trained (TrainConfig).
    eval: how it is evaluated (EvalConfig).
    seed: the run's seed: the task tables, the initialisation and every data stream derive from it.
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(DataConfig(**d["data"]), ModelConfig(**d["model"]), TrainConfig(**d["train"]),
                   EvalConfig(**d["eval"]), d["seed"])

    def key(self) -> str:
        """Short stable hash of the whole configuration (cache key)."""
        return hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:10]

    def validate(self) -> "RunConfig":
        self.data.validate()
        self.model.validate(self.data.n_tokens)
        self.train.validate()
        self.eval.validate()
        return self


@dataclass(frozen=True)
class Run:
    """One run of a grid: its grid coordinates and its configuration (shared by experiments and multi)."""
    factors: dict  # the grid coordinates of this run, seed excluded
    cfg: RunConfig

    @property
    def name(self) -> str:
        f = self.factors
        res = "res" if f["residual"] else "nores"
        return f"L{f['depth']}-{f['mask']}-{f['pe']}-{res}-{f['bias']}-seed{self.cfg.seed}-{self.cfg.key()}"


def versions() -> dict:
    """Library versions and the torch thread count, for a run record."""
    return {**library_versions(), "threads": torch.get_num_threads()}


@dataclass
class TrainResult:
    model: AttentionOnlyNet
    task: SynthTask
    history: list[dict]
    seconds: float  # training wall time, summed over resumed calls
    step: int


def build(cfg: RunConfig) -> tuple[SynthTask, AttentionOnlyNet]:
    """The seeded task tables and the freshly initialised network (global RNG left untouched)."""
    task = SynthTask(cfg.data, cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int.from_bytes(hashlib.sha1(f"init-{cfg.seed}".encode()).digest()[:7], "little"))
        model = AttentionOnlyNet(cfg.model, cfg.data.dim, cfg.data.n_tokens, cfg.data.n_labels)
    return task, model


def _save(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path) -> dict:
    try:
        saved = torch.load(path, weights_only=False)
        if not isinstance(saved, dict) or not {"config", "model", "opt", "state"} <= set(saved):
            raise ValueError("not a training checkpoint")
    except Exception as e:  # truncated or foreign file: torch raises several kinds
        raise PosbiasError(f"checkpoint {path} is unreadable ({type(e).__name__})",
                           f"delete {path} to train that run from the start") from None
    return saved


def curve_point(model, task, cfg: RunConfig, step: int, acc: dict) -> dict:
    """One learning-curve point: mean train loss/accuracy since the last point, quick eval."""
    n = cfg.train.curve_seqs
    swaps = swap_tests(model, task, cfg.eval, ("curve", cfg.seed), n=n)
    model.train()
    return {"step": step, "train_loss": acc["loss"] / acc["count"], "train_acc": acc["correct"] / acc["count"],
            "novel_acc": novel_accuracy(model, task, n, ("curve", cfg.seed), cfg.eval.batch),
            "icl_acc": icl_accuracy(model, task, n, ("curve", cfg.seed), cfg.eval.batch),
            "gaps": {k: v["gap"] for k, v in swaps.items()}}


def _log_steps(t: TrainConfig) -> set[int]:
    return {round(t.iters * (k + 1) / t.log_points) for k in range(t.log_points)}


def train(cfg: RunConfig, ckpt: str | Path | None = None, progress: bool = True,
          stop_at: int | None = None) -> TrainResult:
    """Train (or continue from `ckpt`) up to cfg.train.iters steps, or to `stop_at` (a deliberate stop)."""
    cfg.validate()
    t = cfg.train
    task, model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    st = {"step": 0, "history": [], "acc": {"loss": 0.0, "correct": 0, "count": 0}, "seconds": 0.0}
    path = Path(ckpt) if ckpt is not None else None
    if path is not None and path.exists():
        saved = _load_checkpoint(path)
        if saved["config"] != cfg.to_dict():
            raise PosbiasError(f"checkpoint {path} belongs to another configuration", "delete it or pass another `out`")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        st = saved["state"]
    logs, end = _log_steps(t), min(t.iters, stop_at or t.iters)
    bar = progress_bar(t.iters, cfg.model.label, "step", initial=st["step"], enabled=progress, mininterval=1.0, leave=False)
    t0 = time.perf_counter()
    model.train()
    for step in range(st["step"], end):
        b = task.train_batch(t.batch, generator("train", cfg.seed, step))
        logits = model(b.x)
        loss = F.cross_entropy(logits, b.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        acc = st["acc"]
        acc["loss"] += loss.item() * len(b.y)
        acc["correct"] += int((logits.argmax(-1) == b.y).sum())
        acc["count"] += len(b.y)
        st["step"] = step + 1
        if st["step"] in logs:
            st["history"].append(curve_point(model, task, cfg, st["step"], acc))
            st["acc"] = {"loss": 0.0, "correct": 0, "count": 0}
        if path is not None and (st["step"] % t.ckpt_every == 0 or st["step"] == end):
            st["seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            _save(path, {"config": cfg.to_dict(), "model": model.state_dict(), "opt": opt.state_dict(), "state": st})
        bar.update(1)
        if st["history"]:
            h = st["history"][-1]
            bar.set_postfix(loss=f"{h['train_loss']:.3f}", novel=f"{h['novel_acc']:.3f}", refresh=False)
    bar.close()
    st["seconds"] += time.perf_counter() - t0
    return TrainResult(model, task, st["history"], st["seconds"], st["step"])
