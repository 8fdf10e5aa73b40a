"""Several synthetic runs trained at once on one device: R runs that share an
architecture are one batched computation, so a grid (and the paper preset, 100k steps x 5 seeds)
fits a GPU, where one run of these tiny networks (d = 64, 17 tokens) would use a sliver of it.

One module definition: the R networks' parameters are stacked (torch.func.stack_module_state) and
the network is run with torch.func.functional_call under torch.func.vmap over the stacked
parameters and the stacked batches; the fixed tables (mask, decay bias, sinusoidal and RoPE tables)
are buffers of the template module on the device, shared by all runs.

Each run is the single run of train.train up to float rounding: it starts from the weights
train.build(cfg) gives it, its batch at step s is task.train_batch(batch, generator("train",
seed, s)) generated on CPU exactly as there, then moved to the device; its loss is its own mean
cross-entropy. The learning-curve points are train.curve_point on a CPU copy of each run, and
the training loss/accuracy sums are accumulated in float64 in the order train.train uses.
A group checkpoint (stacked parameters, optimizer state, per-run states) is written atomically
every ckpt_every steps; a killed group resumes bit-identically on the same device. vmap needed no
workaround: masked_fill, softmax, the RoPE rotation and the MLP all have batching rules.

Grids (run_group, train_groups): the runs of a grid are partitioned into groups of <= `group` runs
of equal shape_key; each finished run writes run_one's record plus "trained_with". Final evaluation
runs on the CPU copies with synth.evaluate.evaluate (its batches are generated on CPU).
"""

from __future__ import annotations

import copy
import hashlib
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from ..errors import PosbiasError
from ..runs import cached_record, write_json_atomic
from ..runs import progress as progress_bar
from .data import generator
from .evaluate import evaluate
from .train import Run, RunConfig, TrainResult, _log_steps, _save, build, curve_point, versions

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(device: str) -> str:
    """'cpu' | 'cuda' | 'auto' (cuda if one is visible, else cpu) -> a torch device string."""
    if device not in DEVICES:
        raise PosbiasError(f"unknown device {device!r}", "use `device=cpu`, cuda or auto")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PosbiasError("no CUDA device here", "use `device=cpu`")
    return device


def shape_key(cfg: RunConfig) -> tuple:
    """What runs of one group must share: model, training and the data shapes (n, d, L)."""
    d = cfg.data
    return cfg.model, cfg.train, (d.n_items, d.dim, d.n_labels)


def check_group(cfgs: list[RunConfig]) -> None:
    """PosbiasError unless every cfg is valid and all share shape_key (seed and data values may differ)."""
    if not cfgs:
        raise PosbiasError("a training group needs at least one run", "pass one configuration or more")
    for c in cfgs:
        c.validate()
    keys = {shape_key(c) for c in cfgs}
    if len(keys) > 1:
        raise PosbiasError(f"the runs of one group differ in model, training or data shapes ({len(keys)} kinds)",
                           "group only runs with equal ModelConfig, TrainConfig, n_items, dim and n_labels")


def partition(keys: list, group: int) -> list[list[int]]:
    """Indices grouped by equal key (first-seen order), each group cut into chunks of <= `group`."""
    by_key: dict = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    return [idx[i:i + group] for idx in by_key.values() for i in range(0, len(idx), group)]


def _load(path: Path, cfgs: list[RunConfig], device: str) -> dict:
    try:
        saved = torch.load(path, map_location=device, weights_only=False)
        if not isinstance(saved, dict) or not {"configs", "params", "opt", "state"} <= set(saved):
            raise ValueError("not a group checkpoint")
    except Exception as e:  # truncated or foreign file: torch raises several kinds
        raise PosbiasError(f"checkpoint {path} is unreadable ({type(e).__name__})",
                           f"delete {path} to train that group from the start") from None
    if saved["configs"] != [c.to_dict() for c in cfgs]:
        raise PosbiasError(f"checkpoint {path} belongs to another group of runs", "delete it or pass another `out`")
    return saved


class _Group:
    """The stacked state of R runs: parameters (R, ...), AdamW, accumulators, per-run histories."""

    def __init__(self, cfgs: list[RunConfig], device: str):
        self.cfgs, self.device = cfgs, device
        built = [build(c) for c in cfgs]
        self.tasks = [t for t, _ in built]
        self.models = [m for _, m in built]  # CPU copies, refreshed before each curve point
        self.base = copy.deepcopy(self.models[0]).to(device)  # the one module definition, its buffers on device
        params, _ = stack_module_state(self.models)  # name -> (R, ...) leaf tensors
        self.params = {k: v.detach().to(device).requires_grad_() for k, v in params.items()}
        t = cfgs[0].train
        # AdamW is elementwise (each entry's update reads only its own gradient and moments, and the
        # step count, lr and weight decay are shared), and the gradient of sum_r loss_r with respect to
        # run r's slice is the gradient of loss_r alone: so one AdamW on the stacked parameters with
        # loss = sum over runs of each run's mean cross-entropy is R separate AdamW optimizers.
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=t.lr, weight_decay=t.weight_decay)
        self.step, self.seconds = 0, 0.0
        self.histories: list[list[dict]] = [[] for _ in cfgs]
        self._reset_acc()

    def _reset_acc(self) -> None:
        r = len(self.cfgs)
        self.acc_loss = torch.zeros(r, dtype=torch.float64, device=self.device)  # sum of loss * batch, per run
        self.acc_correct = torch.zeros(r, dtype=torch.long, device=self.device)
        self.acc_count = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (R, b, n, d) -> logits (R, b, L): run r's network on run r's batch."""
        return vmap(lambda p, xr: functional_call(self.base, p, (xr,)))(self.params, x)

    def batches(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The single-run batches of this step, on CPU as in train.train, stacked: (R, b, n, d), (R, b)."""
        bs = [t.train_batch(c.train.batch, generator("train", c.seed, step)) for t, c in zip(self.tasks, self.cfgs)]
        x, y = torch.stack([b.x for b in bs]), torch.stack([b.y for b in bs])
        if self.device == "cpu":
            return x, y
        # pinned + non_blocking: the copy does not wait for the previous step's kernels, so the next
        # step's batches are generated on CPU while the device still computes
        return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)

    def train_step(self, step: int) -> None:
        x, y = self.batches(step)
        logits = self.forward(x)  # (R, b, L)
        r, b = y.shape
        losses = F.cross_entropy(logits.reshape(r * b, -1), y.reshape(-1), reduction="none").view(r, b).mean(1)  # (R,)
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        self.opt.step()
        with torch.no_grad():  # float64 sums in train.train's order: loss.item() * len(y), added
            self.acc_loss += losses.detach().double() * b
            self.acc_correct += (logits.argmax(-1) == y).sum(1)
        self.acc_count += b
        self.step = step + 1

    def unstack(self) -> list:
        """The CPU models with the current parameters of each run."""
        with torch.no_grad():
            for i, m in enumerate(self.models):
                m.load_state_dict({k: v[i].detach().cpu() for k, v in self.params.items()})
        return self.models

    def log_point(self) -> None:
        loss, correct = self.acc_loss.cpu().tolist(), self.acc_correct.cpu().tolist()
        for i, m in enumerate(self.unstack()):
            acc = {"loss": loss[i], "correct": correct[i], "count": self.acc_count}
            self.histories[i].append(curve_point(m, self.tasks[i], self.cfgs[i], self.step, acc))
        self._reset_acc()

    def state(self) -> dict:
        return {"configs": [c.to_dict() for c in self.cfgs], "params": {k: v.detach() for k, v in self.params.items()},
                "opt": self.opt.state_dict(), "device": self.device,
                "state": {"step": self.step, "seconds": self.seconds, "histories": self.histories,
                          "acc": (self.acc_loss, self.acc_correct, self.acc_count)}}

    def restore(self, saved: dict) -> None:
        with torch.no_grad():
            for k, v in self.params.items():
                v.copy_(saved["params"][k])
        self.opt.load_state_dict(saved["opt"])
        st = saved["state"]
        self.step, self.seconds, self.histories = st["step"], st["seconds"], st["histories"]
        loss, correct, self.acc_count = st["acc"]
        self.acc_loss, self.acc_correct = loss.to(self.device), correct.to(self.device)


def train_group(cfgs: list[RunConfig], ckpt: str | Path | None = None, device: str = "cpu", progress: bool = True,
                stop_at: int | None = None) -> list[TrainResult]:
    """Train R runs at once (or continue from `ckpt`) to cfg.train.iters or `stop_at`; one TrainResult per run.

    The models of the results are CPU copies; `seconds` is each run's share of the group's wall time."""
    check_group(cfgs)
    device = resolve_device(device)
    g = _Group(cfgs, device)
    path = Path(ckpt) if ckpt is not None else None
    if path is not None and path.exists():
        g.restore(_load(path, cfgs, device))
    t = cfgs[0].train
    logs, end = _log_steps(t), min(t.iters, stop_at or t.iters)
    label = f"{cfgs[0].model.label} x{len(cfgs)}"
    bar = progress_bar(t.iters, label, "step", initial=g.step, enabled=progress, mininterval=1.0, leave=False)
    t0 = time.perf_counter()
    for step in range(g.step, end):
        g.train_step(step)
        if g.step in logs:
            g.log_point()
        if path is not None and (g.step % t.ckpt_every == 0 or g.step == end):
            g.seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            _save(path, g.state())
        bar.update(1)
    bar.close()
    g.seconds += time.perf_counter() - t0
    share = g.seconds / len(cfgs)
    return [TrainResult(m, task, h, share, g.step) for m, task, h in zip(g.unstack(), g.tasks, g.histories)]


# ----------------------------------------------------------------------------- grids


def _group_ckpt(out_jsons: list[Path]) -> Path:
    names = "\n".join(p.name for p in out_jsons)
    return out_jsons[0].parent / f"group-{hashlib.sha1(names.encode()).hexdigest()[:10]}.ckpt"


def run_group(cfgs: list[RunConfig], out_jsons: list[str | Path], device: str = "cpu", progress: bool = True,
              threads: int | None = 1) -> list[dict]:
    """run_one for runs of one architecture trained at once (synth.multi.train_group) on `device`.

    Each run writes the record run_one writes, plus "trained_with": {"device", "group": R}, and its
    `seconds.train` is its share of the group's wall time. Finished runs are returned from their JSONs;
    a group checkpoint of all the runs is resumed, otherwise only the unfinished runs are trained."""
    check_group(cfgs)
    device, paths = resolve_device(device), [Path(p) for p in out_jsons]
    records = [cached_record(p, c.to_dict()) for p, c in zip(paths, cfgs)]
    todo = [i for i, r in enumerate(records) if r is None]
    if not todo:
        return records
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    idx = list(range(len(cfgs))) if _group_ckpt(paths).exists() else todo
    ckpt = _group_ckpt([paths[i] for i in idx])
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        results = train_group([cfgs[i] for i in idx], ckpt, device=device, progress=progress)
        for i, res in zip(idx, results):
            if records[i] is None:
                t0 = time.perf_counter()
                metrics = evaluate(res.model, res.task, cfgs[i].eval, ("test", cfgs[i].seed))
                records[i] = {"config": cfgs[i].to_dict(), "metrics": metrics, "history": res.history,
                              "seconds": {"train": res.seconds, "eval": time.perf_counter() - t0},
                              "versions": versions(), "trained_with": {"device": device, "group": len(idx)}}
                write_json_atomic(paths[i], records[i], indent=1)
                paths[i].with_suffix(".ckpt").unlink(missing_ok=True)  # a single-run checkpoint of an earlier call
    finally:
        torch.set_num_threads(before)
    ckpt.unlink(missing_ok=True)
    return records


def _group_worker(cfg_dicts: list[dict], out_jsons: list[str], device: str) -> list[dict]:
    return run_group([RunConfig.from_dict(c) for c in cfg_dicts], out_jsons, device, progress=False)


def train_groups(runs: list[Run], records: dict, rundir: Path, how: tuple, progress: bool, bar) -> None:
    """Partition every run of the grid (finished ones too, so a rerun finds the same groups and their
    checkpoints) into groups of <= `group` with equal architecture; train the unfinished ones."""
    device, group, workers = how
    groups = [[runs[i] for i in idx] for idx in partition([shape_key(r.cfg) for r in runs], group)]
    groups = [g for g in groups if any(r.name not in records for r in g)]
    jobs = [([r.cfg for r in g], [rundir / f"{r.name}.json" for r in g], g) for g in groups]

    def done(g: list[Run], recs: list[dict]) -> None:
        new = sum(r.name not in records for r in g)
        records.update({r.name: rec for r, rec in zip(g, recs)})
        bar.update(new)

    if workers == 1:
        for cfgs, paths, g in jobs:
            done(g, run_group(cfgs, paths, device, progress))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as ex:
        futs = {ex.submit(_group_worker, [c.to_dict() for c in cfgs], [str(p) for p in paths], device): g
                for cfgs, paths, g in jobs}
        for f in as_completed(futs):
            done(futs[f], f.result())
