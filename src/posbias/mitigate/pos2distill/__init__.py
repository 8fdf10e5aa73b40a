"""Pos2Distill-R1 (Wang et al. 2025, Sec. 4.2) and its SFT / SeqKD baselines, by training.

    import posbias
    res = posbias.distill.run_distill(posbias.distill.DistillConfig.from_preset("paper", task="kv-lookup"), "runs/p2d")
    # then: posbias.run_sweep(posbias.SweepConfig(model=res.model_dir), ...) or posbias sweep --model runs/p2d/model

Pipeline (files in OUT):
  data.jsonl, data.json   training questions: the frozen model's greedy response at the anchor slot
                          and K trivial slots each (data.py); reused on --resume
  checkpoints/            Trainer checkpoints (weights, optimizer, scheduler, RNG): --resume continues
                          from the last one and ends with the same weights as an uninterrupted run
  model/                  the final plain Hugging Face model (LoRA merged) + tokenizer + posbias_distill.json;
                          written to model.tmp/ and renamed, so it exists complete or not at all
  train_log.json          Trainer's log history (loss, act, anc, kl_trivial / ce, lr, grad norm per step)
  run.json                the run's fingerprint (runs.RunFolder protocol; resume compares it)
  distill.json            config + data/training summary, written last: its presence means complete

Methods: pos2distill with ablation kl (mean trivial KL), kl+align (position-aware alignment, alpha_ij),
full (kl + align + lambda * anchoring, the paper's L = L_Act + lambda L_Anc); seqkd (CE on the
teacher response at trivial slots); sft (CE on the gold answer at trivial slots). All use the same
questions and slots ("identical data compositions", Sec. 5.2.1); ce_anchor adds the anchor copy to
the CE baselines, which is the released code's data (K random slots + 1 "strengthen" copy at 0).

Presets (config.py): paper = Appendix C (lr 3e-6, batch 32, 2 epochs, 300 questions, lambda 1,
greedy responses, K = 5 from Sec. 5.2.2's 4-6); cpu (the default) = 64 questions and lr 1e-4 for
full fine-tuning on 2 cores (docs/pos2distill.md), everything else as the paper. Where the paper
is silent the released code (github.com/AMAP-ML/Pos2Distill) sets them: AdamW betas (0.9, 0.95), weight decay 0.01, cosine
schedule to 0.1 lr with 5% warm-up, gradient clipping 1.0, correct-only filtering of questions.
LoRA (lora=True) is a practical option (the paper fine-tunes fully); its default lr is 1e-4.

Where the released code differs from the paper (we follow the paper unless noted):
- anchor responses are sampled (vLLM, temperature 0.7, top-p 0.95), not greedy; for Mistral they are
  generated with the gold document LAST, while the teacher prompt of training puts it first (our
  --anchor N | auto:SWEEP uses one slot for both);
- the student prompts re-shuffle the distractor documents for every row while the teacher keeps the
  original order (our tasks move only the gold item, so the rows differ by its position alone);
- KL is taken on unshifted logits (the distribution after each response token, so the first response
  token is never distilled); ours predicts each response token from the one before it;
- alpha carries an extra P/|B_i| factor (our count_factor option), is computed over the micro-batches of
  all GPUs at once (all_gather), and the anchor copies enter as lambda * SUM of their KLs (ours: the
  paper's lambda * mean);
- the NQ script trains 1 epoch on 400 questions with K = 4 (the paper: 2 epochs, 300 questions).
"""
from .config import ABLATIONS, LORA_LR, METHODS, PRESETS, STAGES, DistillConfig
from .pipeline import DistillResult, build_trainer, last_checkpoint, run_distill
from .trainer import LossSpec

__all__ = ["ABLATIONS", "LORA_LR", "METHODS", "PRESETS", "STAGES", "DistillConfig", "DistillResult", "LossSpec", "build_trainer",
           "last_checkpoint", "run_distill"]
