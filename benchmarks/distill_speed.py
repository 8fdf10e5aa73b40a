"""Pos2Distill-R1 training benchmarks: (a) throughput of a full training step (teacher forward +
student forward/backward + loss + optimizer, through our Trainer) against a raw student
forward+backward on the same batches; (b) peak memory of full fine-tuning vs LoRA.

    python benchmarks/distill_speed.py [--n 10] [--k 5] [--steps 3] [--task kv-lookup]

(a) Both sides see the same collated batches (30 student rows = 5 questions at K = 5, bf16
autocast on CPU, logits only at the response positions). Tokens = non-pad tokens of the student
rows. The raw side is the floor any trainer pays: the student's forward and backward with the
same `logits_to_keep`, and a plain cross-entropy on the targets. The other side is
`Trainer.train` itself (every batch once per epoch, step times from a callback); the ratio says
what the teacher forward, the KL/alignment loss, clipping, AdamW and Trainer bookkeeping add.
Medians over steps are reported (run on an idle machine).
(b) Each mode trains --steps steps in a fresh subprocess; peak = the process's max resident set
size (CPU) or torch.cuda.max_memory_allocated (CUDA), reported above the same process's size after
loading the model and building the batches.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def setup(a, lora: bool):
    from posbias import get_task, load_model
    from posbias.distill import DistillConfig
    from posbias.measure import dtype_note
    from posbias.mitigate.pos2distill import build_trainer
    from posbias.mitigate.pos2distill.data import build_records
    from posbias.scoring.scorer import use_chat

    loaded = load_model(a.model, "auto", a.device)  # bf16 on a CPU with native bf16, else fp32
    print(f"dtype {dtype_note('auto', a.device)}")
    task = get_task(a.task)
    chat = use_chat(loaded, "auto")
    records, _ = build_records(loaded, task, n=a.n, k=a.k, anchor=0, seed=0, skip=7000, chat=chat, correct_only=False,
                               max_draw=a.n, max_new_tokens=task.max_new_tokens)
    cfg = DistillConfig(model=a.model, task=a.task, n=a.n, k=a.k, lora=lora, max_steps=10**6, save_steps=10**6,
                        device=a.device, warmup=0)
    out = tempfile.mkdtemp(prefix="distill-bench-")
    trainer, plan = build_trainer(loaded, cfg, records, out, chat=chat, lr=1e-5 if not lora else 1e-4)
    batches = [trainer._prepare_inputs(b) for b in trainer.get_train_dataloader()]
    return trainer, plan, batches


def tokens(batch) -> int:
    return int(batch["s_attention_mask"].sum())


def raw_step(model, batch, autocast) -> None:
    """Student forward (response logits only) + CE + backward: the floor of any training step."""
    from posbias.core.losses import ce_loss
    from posbias.mitigate.pos2distill.trainer import logits_of

    with autocast():
        logits = logits_of(model, batch, "s_")
        loss = ce_loss(logits, batch["s_targets"], batch["s_mask"])
    loss.backward()
    model.zero_grad(set_to_none=True)


class StepTimer:
    """A TrainerCallback recording the wall time of every optimizer step of Trainer.train."""

    def __init__(self):
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t0)


def train_steps(trainer, steps: int) -> list[float]:
    """Trainer.train for `steps` optimizer steps (the real path: accelerate's bf16 autocast, clipping,
    AdamW, scheduler, logging); seconds of each step."""
    from transformers import TrainerCallback

    timer = type("Timer", (StepTimer, TrainerCallback), {})()
    trainer.add_callback(timer)
    trainer.args.max_steps = steps
    trainer.train()
    return timer.times


def throughput(a) -> None:
    trainer, plan, batches = setup(a, lora=False)
    model = trainer.model
    model.train()
    autocast = trainer.accelerator.autocast
    per_epoch = len(batches)
    tok = statistics.mean(tokens(b) for b in batches)  # every batch is seen once per epoch by both sides
    raw_step(model, batches[0], autocast)  # warm-up
    raw = []
    for _ in range(a.rounds):
        for b in batches:
            t0 = time.perf_counter()
            raw_step(model, b, autocast)
            raw.append(tokens(b) / (time.perf_counter() - t0))
    steps = train_steps(trainer, 1 + a.rounds * per_epoch)[1:]  # the first step warms up
    r, f = statistics.median(raw), tok / statistics.median(steps)
    print(f"(a) training throughput, {plan['sequences_per_step']} student rows/step ({plan['questions_per_step']} "
          f"questions x {plan['rows_per_question']}), {tok:.0f} tokens/step on average, {torch.get_num_threads()} "
          f"threads, {a.rounds} rounds x {per_epoch} batches")
    print(f"    raw student forward+backward : {r:8.0f} tokens/s")
    print(f"    Pos2Distill step (Trainer)   : {f:8.0f} tokens/s   = {f / r:.2f} of raw ({r / f:.2f}x the time; "
          "a teacher forward is ~1/3 of a forward+backward)")


def peak_child(a) -> None:
    lora = a.child == "lora"
    trainer, plan, batches = setup(a, lora=lora)
    cuda = a.device == "cuda"
    before = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sec = statistics.median(train_steps(trainer, a.steps))
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    print(json.dumps({"mode": a.child, "peak": peak, "before": before, "trainable": trainable, "sec_per_step": sec}))


def memory(a) -> None:
    res = {}
    for mode in ("full", "lora"):
        cmd = [sys.executable, __file__, "--child", mode, "--n", str(a.n), "--k", str(a.k), "--steps", str(a.steps),
               "--task", a.task, "--model", a.model, "--device", a.device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        res[mode] = json.loads(out)
    gib = 2**30
    print(f"(b) peak memory over {a.steps} training steps ({'CUDA allocated' if a.device == 'cuda' else 'max RSS'}):")
    for mode, r in res.items():
        print(f"    {mode:<5}: peak {r['peak'] / gib:5.2f} GiB, {(r['peak'] - r['before']) / gib:5.2f} GiB above the loaded "
              f"model + batches; {r['trainable'] / 1e6:6.2f} M trainable parameters; {r['sec_per_step']:.1f} s/step")
    f, lo = res["full"], res["lora"]
    print(f"    LoRA / full: peak {lo['peak'] / f['peak']:.2f}, training overhead "
          f"{(lo['peak'] - lo['before']) / max(f['peak'] - f['before'], 1):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="kv-lookup")
    p.add_argument("--n", type=int, default=10, help="questions (2 batches of 5 at K = 5)")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="batches per round / training steps for memory")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--skip", default="", help="comma list of parts to skip: a,b")
    a = p.parse_args()
    from posbias.measure import set_threads

    set_threads()
    if a.child:
        return peak_child(a)
    if "a" not in a.skip:
        throughput(a)
    if "b" not in a.skip:
        memory(a)


if __name__ == "__main__":
    main()
