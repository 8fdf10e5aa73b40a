"""Token shifting (Pos2Distill Fig. 3a, 8, 9): the token-level details against hand-computed values on a tiny
model, the single-token-shift rule, and resume after a kill."""

from __future__ import annotations

import json

import pytest
import torch

from posbias import PosbiasError
from posbias.analysis.shifting import summarize
from posbias.explain import ShiftingConfig, run_shifting
from posbias.scoring.encode import encode
from posbias.scoring.teacher_forced import token_details
from posbias.tasks import get_task


def test_token_details_match_a_step_by_step_forward(loaded):
    """Each field recomputed independently: one unbatched forward per answer step, argmax and ranks by sorting."""
    task = get_task("kv-lookup", facts=4, digits=3)
    rows = [encode(loaded.tokenizer, task.build(ex, p), True) for ex in task.examples(2) for p in (0, 3)]
    got = token_details(loaded.model, loaded.tokenizer, rows, loaded.tokenizer.pad_token_id, top=5)
    for row, d in zip(rows, got):
        ans = row.answer_ids[0]
        with torch.no_grad():
            logits = loaded.model(torch.tensor([row.prompt_ids + ans])).logits[0].float()
        steps = torch.log_softmax(logits[len(row.prompt_ids) - 1 : -1], -1)  # step t predicts ans[t]
        miss = [t for t in range(len(ans)) if int(steps[t].argmax()) != ans[t]]
        assert d["tokens"] == len(ans) and d["mismatches"] == len(miss)
        assert d["logprob"] == pytest.approx(sum(float(steps[t, ans[t]]) for t in range(len(ans))), abs=1e-4)
        assert d["diverge_at"] == (miss[0] if miss else None)
        if miss:
            order = steps[miss[0]].argsort(descending=True).tolist()
            assert d["anchor_rank"] == order.index(ans[miss[0]]) + 1 > 1
            assert d["anchor_prob"] == pytest.approx(float(steps[miss[0], ans[miss[0]]].exp()), abs=1e-5)
            assert [t for t, _ in d["top"]] == [loaded.tokenizer.decode([i]) for i in order[:5]]
    assert any(d["diverge_at"] is not None for d in got)  # the check above ran on real divergences


def test_summary_counts_single_token_shifts_among_errors_only():
    rows = [  # anchor right everywhere; two errors: one single-token shift (rank 3), one with two steps off (rank 12)
        {"correct": False, "anchor_correct": True, "diverge_at": 1, "mismatches": 1, "anchor_rank": 3, "anchor_prob": 0.2},
        {"correct": False, "anchor_correct": True, "diverge_at": 0, "mismatches": 2, "anchor_rank": 12, "anchor_prob": 0.0},
        {"correct": True, "anchor_correct": True, "diverge_at": 4, "mismatches": 1, "anchor_rank": 2, "anchor_prob": 0.4},
        {"correct": True, "anchor_correct": True, "diverge_at": None, "mismatches": 0},
    ]
    s = summarize(rows)
    assert s["errors"] == 2 and s["errors_single_token"] == 0.5 and s["errors_anchor_in_top10"] == 0.5
    assert s["diverged_single_token"] == pytest.approx(2 / 3) and s["diverged_anchor_in_top10"] == pytest.approx(2 / 3)
    assert s["diverged"] == 0.75 and s["accuracy"] == 0.5 and s["diverge_at_mean"] == pytest.approx(5 / 3)


def test_shifting_rows_per_example_and_placement_and_resume(model_dir, loaded, tmp_path, monkeypatch):
    import posbias.analysis.shifting as sh

    cfg = ShiftingConfig(model=str(model_dir), task="kv-lookup", task_options={"facts": 4, "digits": 3}, n=5,
                         positions="0,1,3", dtype="fp32")
    full = run_shifting(cfg, tmp_path / "a", loaded=loaded, progress=False)
    assert len(full.rows) == 5 * 2 and {r["position"] for r in full.rows} == {1, 3}
    assert all(r["ppl_gold"] >= 1 and "anchor_response" in r for r in full.rows)
    monkeypatch.setattr(sh, "CHUNK", 2)
    real, calls = sh._Measure.chunk, []

    def killed_on_second_chunk(self, examples):
        calls.append(len(examples))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, examples)

    monkeypatch.setattr(sh._Measure, "chunk", killed_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run_shifting(cfg, tmp_path / "b", loaded=loaded, progress=False)
    assert not (tmp_path / "b" / "shifting.json").exists()
    assert len((tmp_path / "b" / "rows.jsonl").read_text().splitlines()) == 2 * 2
    monkeypatch.setattr(sh._Measure, "chunk", real)
    with pytest.raises(PosbiasError, match="already holds"):
        run_shifting(cfg, tmp_path / "b", loaded=loaded, progress=False)
    res = run_shifting(cfg, tmp_path / "b", loaded=loaded, resume=True, progress=False)
    a, b = (json.loads((tmp_path / d / "shifting.json").read_text()) for d in ("a", "b"))
    assert a["per_position"] == b["per_position"] and a["all"] == b["all"] and res.rows == full.rows
