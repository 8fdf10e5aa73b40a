"""Short checks on the real models (SmolLM2-135M default; Gemma-3-270M second architecture)."""

import pytest

from posbias import SweepConfig, get_task, run_sweep
from posbias.measure import Scorer

pytestmark = pytest.mark.real


def test_smollm2_shows_lost_in_the_middle(smollm2, tmp_path):
    # 10 examples (16 before): these give 1.00 at slot 0 and 0.00 at slot 5 in fp32 (2026-12-02), far from both bounds
    cfg = SweepConfig(task="kv-lookup", task_options={"facts": 10}, positions="0,5,9", n=10, seed=0)
    res = run_sweep(cfg, tmp_path / "s", loaded=smollm2, progress=False)
    acc = {r["position"]: r["accuracy"] for r in res.per_position}
    assert acc[0] >= 0.75  # measured 0.92 at n=200 (README)
    assert acc[5] <= acc[0] - 0.4  # measured ~0.05 in the middle
    assert (tmp_path / "s" / "sweep.json").exists()
    assert res.record["model"]["architecture"] == "LlamaForCausalLM" and res.record["model"]["n_layers"] == 30


def test_smollm2_teacher_forced_agrees_with_generate(smollm2):
    task = get_task("kv-lookup", facts=10)
    rows = Scorer(smollm2, task).rows(task.examples(8, seed=1), [0, 3, 6, 9])
    tf = Scorer(smollm2, task, "teacher-forced").score(rows)
    gen = Scorer(smollm2, task, "generate").score(rows)
    key = lambda r: (r["example_id"], r["position"])  # noqa: E731
    a = {key(r): r["correct"] for r in tf}
    b = {key(r): r["correct"] for r in gen}
    agree = sum(a[k] == b[k] for k in a) / len(a)
    assert agree >= 0.9, (agree, tf, gen)


def test_smollm2_nq_generate(smollm2):
    task = get_task("nq", docs=10)
    scorer = Scorer(smollm2, task, "generate", max_new_tokens=24)
    out = scorer.score(scorer.rows(task.examples(2, seed=0), [0]))
    assert len(out) == 2 and all(r["prediction"].strip() and "\n" not in r["prediction"] for r in out)


@pytest.fixture(scope="module")
def fp32(smollm2):
    """The real models in fp32, each made once for this module: SmolLM2 as an fp32 copy of the session's model (bf16
    or fp32; what the checks below need is fp32 arithmetic, not the GGUF's last bits; a first GGUF read costs 26 s),
    Gemma-3 loaded (it is loaded here only)."""
    import copy

    from posbias import load_model, wrap_model

    models: dict = {}

    def get(name: str):
        if name not in models:
            models[name] = wrap_model(copy.deepcopy(smollm2.model).float(), smollm2.tokenizer, name) \
                if name == "smollm2-135m" else load_model(name, "fp32", "cpu", False)
        return models[name]

    return get


def test_gemma3_second_architecture(fp32, tmp_path):
    lo = fp32("gemma3-270m")
    assert lo.info["model_type"].startswith("gemma3") and lo.info["context_window"] == 32768
    assert not lo.info["chat_template"]  # base model: plain prompts
    assert set(lo.model.config.layer_types) == {"sliding_attention", "full_attention"}
    cfg = SweepConfig(model="gemma3-270m", task="kv-lookup", task_options={"facts": 5}, positions="0,4", n=4)
    res = run_sweep(cfg, tmp_path / "g", loaded=lo, progress=False)
    assert len(res.rows) == 8 and all(isinstance(r["correct"], bool) for r in res.rows)
    _shares_prefixes_and_decodes_greedily(res.record)


def _shares_prefixes_and_decodes_greedily(record):
    """The registered models' generation_config asks for nothing beyond greedy (so making decoding greedy-only changed
    none of their numbers), and prefix sharing is exact for them (models.prefix.prefix_exact)."""
    assert record["config"]["decoding"] == {"rule": "greedy"}
    assert record["config"]["scoring_path"] == "prefix-shared" and "scoring_note" not in record["config"]


def test_smollm2_shares_prefixes_and_decodes_greedily(smollm2, tmp_path):
    cfg = SweepConfig(task="kv-lookup", task_options={"facts": 4}, positions="0", n=1, seed=0)
    _shares_prefixes_and_decodes_greedily(run_sweep(cfg, tmp_path / "s", loaded=smollm2, progress=False).record)


def test_smollm2_two_hops_adjacent_late_beat_apart_early(smollm2, tmp_path):
    # docs/pos2distill.md: kv-2hop, n = 100: 8:9 (connected, late) ~0.27, 0:4 (disconnected, early) ~0.01; these 20
    # examples (30 before) give 0.40 and 0.05 in fp32 (2026-12-02): a 0.35 difference against the 0.1 asked
    cfg = SweepConfig(task="kv-2hop", positions="8:9,0:4", n=20, seed=0)
    res = run_sweep(cfg, tmp_path / "s", loaded=smollm2, progress=False)
    acc = {tuple(r["position"]): r["accuracy"] for r in res.per_position}
    assert acc[(8, 9)] >= 0.1 and acc[(8, 9)] >= acc[(0, 4)] + 0.1, acc
    assert set(res.record["summary"]["modes"]) == {"connected", "disconnected"}


def test_smollm2_token_shifting_keeps_the_right_token_near_the_top(smollm2, tmp_path):
    """Pos2Distill Fig. 8 on the real model: where a middle-slot answer leaves the sink's, the sink's token is still
    among the 10 most probable (measured: in all 84 errors at n = 30, docs/analyses.md)."""
    from posbias.explain import ShiftingConfig, run_shifting

    res = run_shifting(ShiftingConfig(task="kv-lookup", positions="0,5", n=6), tmp_path / "s", loaded=smollm2,
                       progress=False)
    s = res.summary
    assert s["anchor_accuracy"] >= 0.8 and s["diverged"] >= 0.5  # slot 0 right, slot 5 mostly not (0.83 diverged)
    assert s["diverged_anchor_in_top10"] >= 0.8
    assert all(r["diverge_at"] is None or r["anchor_rank"] >= 1 for r in res.rows)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_hidden_scaling_is_exact_and_cache_consistent_on_real_models(fp32, name):
    """Llama and Gemma-3 (sliding and global layers), fp32: bit-identical after exit, prefill + one decode step equal
    to one full forward told where the prompt ends (measured 5e-5 / 7e-5), a left-padded row equal to itself alone."""
    import torch

    from posbias import get_method
    from posbias.models.compat import cache_key, output_cache
    from posbias.scoring.encode import left_pad

    lo = fp32(name)
    method = get_method(f"hidden:{lo.model.config.hidden_size // 3}:0")
    ids = torch.randint(200, 20000, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = lo.model(input_ids=ids).logits
        with method.apply(lo) as active:
            active.set_prompt_end(torch.tensor([118]))
            full = lo.model(input_ids=ids).logits[:, -1]
            pre = lo.model(input_ids=ids[:, :-1], use_cache=True)
            step = lo.model(input_ids=ids[:, -1:], **{cache_key(lo.model): output_cache(pre)}, use_cache=True).logits[:, -1]
            seqs = [ids[0, :70].tolist(), ids[0].tolist()]
            batch = lo.model(**left_pad(seqs, 0)).logits[:, -1]
            alone = torch.cat([lo.model(input_ids=torch.tensor([s])).logits[:, -1] for s in seqs])
        assert torch.equal(lo.model(input_ids=ids).logits, before)
    assert (full - before[:, -1]).abs().max() > 0.05
    torch.testing.assert_close(step, full, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(batch, alone, atol=1e-3, rtol=1e-3)
