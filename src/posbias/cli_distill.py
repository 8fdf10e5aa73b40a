"""`posbias distill r1 ...`: Pos2Distill-R1 and the SFT / SeqKD baselines (a thin shell over
posbias.methods.pos2distill). Multi-GPU: `accelerate launch -m posbias.cli distill r1 ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

# Presets. paper: Appendix C (300 questions, lr 3e-6, batch 32, 2 epochs). cpu: SmolLM2 on 2 cores, sized by
# measurement (docs/pos2distill.md): a 30-row step of kv-lookup costs ~25 s at one thread, so 64 questions x 2 epochs
# = 26 steps take ~12 min. Its lr 1e-4 is chosen, not swept (the paper's 3e-6 suits 7-8B models and 4.6x more
# steps); at 1e-4 the trivial-slot KL fell 0.19 -> 0.013 in 26 steps without the anchor drifting.
PRESETS = {"paper": {"n": 300, "lr": 3e-6}, "cpu": {"n": 64, "lr": 1e-4}}

distill_app = typer.Typer(no_args_is_help=True, help="Train a model to lose its position bias (Pos2Distill, SFT, SeqKD).")


@distill_app.callback()
def _group() -> None:
    """Train a model to lose its position bias (Pos2Distill, SFT, SeqKD)."""


@distill_app.command()
def r1(
    model: str = typer.Option("smollm2-135m", help="registered name, HF model dir or hub id, or a .gguf file"),
    task: str = typer.Option("kv-lookup", help="kv-lookup | kv-uuid | nq | jsonl:PATH"),
    out: Path = typer.Option(Path("runs/distill"), help="output directory (data, checkpoints, model/, distill.json)"),
    method: str = typer.Option("pos2distill", help="pos2distill | sft (gold answers) | seqkd (teacher responses, CE)"),
    ablation: str = typer.Option("full", help="pos2distill: kl | kl+align | full (= kl + align + anchoring)"),
    preset: str = typer.Option("cpu", help="cpu (64 questions, lr 1e-4; docs/pos2distill.md) | paper (300, lr 3e-6)"),
    n: Optional[int] = typer.Option(None, help="training questions (default: the preset's; Appendix C: 300)"),
    k: int = typer.Option(5, help="trivial positions per question (Sec. 5.2.2: 4-6)"),
    anchor: str = typer.Option("0", help="advantageous slot: a number, or auto:PATH (best slot of a sweep.json)"),
    correct_only: bool = typer.Option(True, "--correct-only/--keep-all",
                                      help="keep only questions answered correctly at the anchor (released code)"),
    lora: bool = typer.Option(False, "--lora/--full", help="LoRA adapters (merged at the end) or full fine-tuning (paper)"),
    lr: Optional[float] = typer.Option(None, help="learning rate (default: the preset's for full fine-tuning; 1e-4 LoRA)"),
    batch_size: int = typer.Option(32, help="training sequences per optimizer step (paper 32); whole questions kept"),
    micro_batch: int = typer.Option(0, help="questions per forward (0: a whole step); smaller saves memory"),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="recompute activations in the backward pass (less memory, ~30% slower)"),
    epochs: float = typer.Option(2.0, help="epochs (paper 2)"),
    max_steps: int = typer.Option(0, help="stop after this many optimizer steps (0: use --epochs)"),
    lam: float = typer.Option(1.0, help="lambda, the weight of the anchoring loss (paper 1)"),
    seed: int = typer.Option(0, help="example order, trivial slots and training seed"),
    skip: Optional[int] = typer.Option(None, help="training split starts here (default 2000; sweeps use 0..)"),
    max_new_tokens: Optional[int] = typer.Option(None, help="anchor response length (default: the task's)"),
    facts: Optional[int] = typer.Option(None, help="kv-lookup: number of facts (default 10)"),
    digits: Optional[int] = typer.Option(None, help="kv-lookup: digits per key/value (default 6)"),
    docs: Optional[int] = typer.Option(None, help="nq: 10 or 20 documents"),
    pairs: Optional[int] = typer.Option(None, help="kv-uuid: pairs"),
    chat: str = typer.Option("auto", help="auto | on | off"),
    dtype: str = typer.Option("bf16", help="bf16 (mixed precision, float32 master weights) | fp32"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    save_steps: int = typer.Option(10, help="checkpoint every this many steps"),
    data_dir: Optional[Path] = typer.Option(None, help="benchmark data dir (default ../shared/data)"),
    resume: bool = typer.Option(False, "--resume", help="continue a stopped run in OUT from its last checkpoint"),
    overwrite: bool = typer.Option(False, "--overwrite", help="discard what OUT holds and start again"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bars"),
) -> None:
    """Distil the anchor slot's behaviour into the other slots; write OUT/model (load it with --model OUT/model)."""
    from .errors import PosbiasError
    from .methods.pos2distill import DistillConfig, run_distill

    if preset not in PRESETS:
        raise PosbiasError(f"unknown preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    n = n if n is not None else PRESETS[preset]["n"]
    if lr is None and not lora:
        lr = PRESETS[preset]["lr"]
    opts = {"facts": facts, "digits": digits, "docs": docs, "pairs": pairs}
    cfg = DistillConfig(
        model=model, task=task, task_options={a: v for a, v in opts.items() if v is not None},
        data_dir=str(data_dir) if data_dir else None, method=method, ablation=ablation, n=n, k=k, anchor=anchor,
        correct_only=correct_only, skip=skip, seed=seed, chat=chat, max_new_tokens=max_new_tokens, lora=lora, lr=lr,
        batch_size=batch_size, micro_batch=micro_batch, epochs=epochs, max_steps=max_steps, lam=lam, dtype=dtype,
        device=device, save_steps=save_steps, gradient_checkpointing=gradient_checkpointing,
    )
    typer.echo(f"loading {model} ({dtype}, {device}) ...", err=True)
    res = run_distill(cfg, out, resume=resume, overwrite=overwrite, progress=not quiet)
    d, t = res["data"], res["train"]
    typer.echo(f"{d['questions']} questions (anchor slot {res['config']['anchor']} accuracy {d['anchor_accuracy']:.3f} "
               f"on {d['looked_at']} looked at), {t['steps']} steps of {t['sequences_per_step']} sequences")
    if t["first_loss"] is not None:
        typer.echo(f"loss {t['first_loss']:.4f} -> {t['last_loss']:.4f}")
    typer.echo(f"wrote {res['model_dir']}; evaluate it with: posbias sweep --model {res['model_dir']} --task {task}")
