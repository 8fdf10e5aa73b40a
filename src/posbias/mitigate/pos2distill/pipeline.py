"""The distillation pipeline: data (data.py) -> training (collator.py, trainer.py) -> OUT/model.

Files and methods: see the package docstring. The output folder follows runs.RunFolder: checks
before the model loads, one writer, run.json's fingerprint compared on resume (a finished run
with another configuration is refused, not reported), distill.json written last.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...backends import open_model
from ...errors import PosbiasError
from ...models.decoding import decoding_record
from ...models.dtype import choose_dtype
from ...models.gguf_cache import library_bars
from ...models.load import Loaded, resolve_device
from ...runs import MARKER, RunFolder, is_main_process, num_processes, read_json, write_json_atomic
from ...scoring.generate import eos_ids
from ...scoring.scorer import use_chat
from ...tasks import get_task, placement_key
from .collator import Collator, QuestionData
from .config import OPERATIONAL, DistillConfig
from .data import build_records, check_data, default_skip, expand_selftrain, read_records, resolve_anchor, write_records
from .trainer import final_model, make_student, make_trainer, step_plan, training_args

FILES = ("data.jsonl", "data.json", "checkpoints", "model", "model.tmp", "train_log.json", "distill.partial.json")
_DATA_KEYS = ("model", "task", "task_options", "data_dir", "n", "k", "anchor", "correct_only", "max_draw", "skip",
              "seed", "chat_used", "max_new_tokens", "dtype")


@dataclass
class DistillResult:
    """A distillation: `record` is distill.json; `rows` has one flat dict per logged training step (train_log.json:
    step, epoch, loss, its parts, learning rate, gradient norm); `format()` is what `posbias distill r1 | r2` prints."""

    model_dir: str  # a plain Hugging Face model directory: load it with load_model / --model
    data: dict  # questions, anchor accuracy, the training split
    train: dict  # steps, epochs, losses, seconds
    record: dict = field(repr=False)  # the content of distill.json
    rows: list[dict] = field(default_factory=list, repr=False)  # one per logged training step

    @classmethod
    def of(cls, record: dict, log: list[dict] | None = None) -> "DistillResult":
        rows = [h for h in log or [] if "loss" in h]
        return cls(record["model_dir"], record["data"], record["train"], record, rows)

    def format(self) -> str:
        """The training data (questions, anchor accuracy), the steps, self-training rows kept, and the loss."""
        d, t = self.data, self.train
        lines = [f"{d['questions']} questions (anchor {self.record['config']['anchor']} accuracy {d['anchor_accuracy']:.3f} "
                 f"on {d['looked_at']} looked at), {t['steps']} steps of {t['sequences_per_step']} sequences"]
        if "selftrain" in d:
            lines.append(f"self-training rows: {d['selftrain']['kept']} of {d['selftrain']['rows']} answered correctly "
                         "at their own placement")
        if t["first_loss"] is not None:
            lines.append(f"loss {t['first_loss']:.4f} -> {t['last_loss']:.4f}")
        return "\n".join(lines)


def _training_log(folder: RunFolder) -> list[dict]:
    """train_log.json of a finished run (the Trainer's log history), or nothing."""
    path = folder.file("train_log.json")
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def run_distill(cfg: DistillConfig | None = None, out: str | Path = "runs/distill", *, loaded: Loaded | None = None,
                resume: bool = False, overwrite: bool = False, progress: bool = True,
                callbacks: list | None = None) -> DistillResult:
    """Build the data, train, save OUT/model; returns the content of distill.json as a DistillResult.

    loaded: an already loaded base model; it is not modified (the student is a copy).
    callbacks: extra transformers TrainerCallbacks.
    """
    cfg = (cfg or DistillConfig()).validate()
    if out is None:
        raise PosbiasError("a distillation needs an output folder (checkpoints, the model)", "pass `out`")
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    if (task.n_gold == 2) != (cfg.stage == "r2"):
        what = "two hops (a reasoning task)" if task.n_gold == 2 else "one gold item (a retrieval task)"
        raise PosbiasError(f"{task.name} places {what}, so it is distilled by {'r2' if task.n_gold == 2 else 'r1'}, "
                           f"not {cfg.stage}", f"use posbias distill {'r2' if task.n_gold == 2 else 'r1'}")
    anchor, anchor_info = resolve_anchor(cfg.anchor, task, task.name)
    check_data(task, cfg.k, default_skip(task) if cfg.skip is None else cfg.skip)
    folder = RunFolder(out, "distillation", "distill.json", FILES)
    folder.check(resume, overwrite)
    if resume and folder.complete():  # finished: compare the configuration without loading a model
        chat = read_json(folder.file(MARKER), "run marker").get("fingerprint", {}).get("config", {}).get("chat_used")
        name = loaded.info.get("name") if loaded is not None else cfg.model
        dtype = loaded.info.get("dtype") if loaded is not None else choose_dtype(cfg.dtype, resolve_device(cfg.device))[0]
        with folder.open(_fingerprint(cfg, task, anchor, chat, name, dtype), resume, overwrite):
            return DistillResult.of(folder.read_result(), _training_log(folder))
    caller_owned = loaded is not None
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="Pos2Distill")
    fingerprint = _fingerprint(cfg, task, anchor, use_chat(loaded, cfg.chat), loaded.info.get("name"),
                               loaded.info.get("dtype"))
    resolved = cfg.resolved(task, anchor, fingerprint["config"]["chat_used"])
    with folder.open(fingerprint, resume, overwrite), library_bars(progress):
        records, data_summary = _data(loaded, task, resolved, folder.path, progress)
        t0 = time.perf_counter()
        trainer, plan, last = _train(loaded, cfg, resolved, records, folder.path, progress, caller_owned, callbacks,
                                     folder.resuming)
        record = {**fingerprint, "config": resolved, "anchor": anchor_info, "data": data_summary,
                  "train_split": data_summary["train_split"], "base_model": loaded.info,
                  "train": _train_summary(trainer, plan, time.perf_counter() - t0, last), "model_dir": str(folder.file("model"))}
        if is_main_process():
            _save_model(trainer, cfg.lora, loaded.tokenizer, folder.path, record)
            write_json_atomic(folder.file("train_log.json"), trainer.state.log_history, indent=1)
        folder.finish(record)  # last: its presence means "complete"
    return DistillResult.of(record, trainer.state.log_history)


def _fingerprint(cfg: DistillConfig, task, anchor: int, chat: bool, model_name: str, dtype: str | None) -> dict:
    """What the result depends on: the settings but the operational ones, the task, the model and the dtype it ran
    in (dtype auto: bf16 or fp32 by the machine)."""
    resolved = cfg.resolved(task, anchor, chat)
    return {"config": {k: v for k, v in resolved.items() if k not in OPERATIONAL}, "task": task.config(), "model": model_name,
            "dtype_used": dtype}


def _train_summary(trainer, plan: dict, seconds: float, last: str | None) -> dict:
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {**plan, "steps": trainer.state.global_step, "epochs": trainer.state.epoch,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "seconds_this_run": seconds, "resumed_from": last}


def _data(loaded: Loaded, task, r: dict, out: Path, progress: bool) -> tuple[list[dict], dict]:
    """Reuse OUT's data made with the same settings, else generate it (main process first)."""
    fp = {k: r[k] for k in _DATA_KEYS}
    if r["stage"] == "r2" and r["method"] == "selftrain":  # the expanded data: own responses at each placement
        fp["selftrain"] = True
    if num_processes() > 1:
        from accelerate import PartialState

        with PartialState().main_process_first():
            return _data_once(loaded, task, r, out, fp, progress)
    return _data_once(loaded, task, r, out, fp, progress)


def _data_once(loaded, task, r: dict, out: Path, fp: dict, progress: bool):
    saved = read_records(out, fp)
    if saved is not None:
        return saved
    gen = {"chat": r["chat_used"], "max_new_tokens": r["max_new_tokens"], "batch_tokens": r["gen_batch_tokens"],
           "max_batch": r["gen_max_batch"], "progress": progress}
    records, summary = build_records(loaded, task, n=r["n"], k=r["k"], anchor=placement_key(r["anchor"]), seed=r["seed"],
                                     skip=r["skip"], correct_only=r["correct_only"], max_draw=r["max_draw"], **gen)
    if fp.get("selftrain"):
        records, summary["selftrain"] = expand_selftrain(loaded, task, records, **gen)
    summary["decoding"] = decoding_record(loaded.model)  # greedy responses, whatever the checkpoint's config says
    if is_main_process():
        write_records(out, records, summary, fp)
    return records, summary


def build_trainer(loaded: Loaded, cfg: DistillConfig, records: list[dict], out: str | Path, *, chat: bool, lr: float,
                  progress: bool = False, copy_base: bool = True, callbacks: list | None = None):
    """(trainer, plan): the Trainer over `records` (data.py) with student/teacher set up; not trained yet."""
    spec = cfg.spec()
    ends = eos_ids(loaded.model, loaded.tokenizer)
    end = ends[0] if cfg.eos and ends else None
    data = QuestionData(records, loaded.tokenizer, chat, spec.target, spec.with_anchor, end, loaded.context_window)
    plan = step_plan(cfg.batch_size, len(data[0]["students"]), cfg.micro_batch, num_processes())
    lora = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "dropout": cfg.lora_dropout, "targets": cfg.lora_targets}
    student, teacher = make_student(loaded.model, lora if cfg.lora else None, copy_base=copy_base, seed=cfg.seed)
    args = training_args(cfg, Path(out), plan, lr, progress, bf16=loaded.info.get("dtype") == "bf16")
    collator = Collator(loaded.tokenizer.pad_token_id, cfg.padding_side)
    return make_trainer(student, teacher, spec, args, data, collator, callbacks), plan


def drop_torn_checkpoints(folder: Path, last: str | None) -> None:
    """Delete the checkpoints newer than `last` (the newest complete one): a kill cut them mid-write, and their
    half-written weights would otherwise stay on disk beside the run."""
    if not folder.is_dir():
        return
    keep = int(Path(last).name.split("-")[1]) if last else -1
    for p in folder.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and p.is_dir() and int(m[1]) > keep:
            shutil.rmtree(p)


def last_checkpoint(folder: Path) -> str | None:
    """The newest complete Trainer checkpoint in `folder`: trainer_state.json is written last and must parse,
    so a checkpoint cut by a kill is skipped for the one before it."""
    if not folder.is_dir():
        return None
    steps = sorted((int(m[1]), p) for p in folder.iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir())
    for _, p in reversed(steps):
        try:
            json.loads((p / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        return str(p)
    return None


def _train(loaded, cfg, r: dict, records, out: Path, progress, caller_owned, callbacks, resume):
    trainer, plan = build_trainer(loaded, cfg, records, out, chat=r["chat_used"], lr=r["lr"], progress=progress,
                                  copy_base=caller_owned, callbacks=callbacks)
    last = last_checkpoint(out / "checkpoints") if resume else None
    if resume:
        drop_torn_checkpoints(out / "checkpoints", last)
    trainer.train(resume_from_checkpoint=last)
    return trainer, plan, last


def _save_model(trainer, lora: bool, tokenizer, out: Path, record: dict) -> None:
    """OUT/model: a plain HF model dir (load_model(DIR) reads it), renamed into place when complete."""
    tmp, final = out / "model.tmp", out / "model"
    shutil.rmtree(tmp, ignore_errors=True)
    model = final_model(trainer.accelerator.unwrap_model(trainer.model), lora)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_json_atomic(tmp / "posbias_distill.json", record, indent=2)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
