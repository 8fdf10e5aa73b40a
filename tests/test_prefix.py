"""Prefix-shared scoring (scoring/prefix.py, models/prefix.py) against the plain path on tiny random models
(fp32, one thread): same verdicts, predictions and logprobs, for both engines, every slot, batch sizes 1 and
many, Gemma-3's sliding window included; sweep.json unchanged; methods that are not prefix-safe fall back."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import position_sensitive, random_seqs, tiny_loaded, tiny_model
from posbias import SweepConfig, get_method, get_task, run_sweep
from posbias.errors import PosbiasError
from posbias.measure import Scorer
from posbias.methods import MsPoE
from posbias.models.compat import attention_record, install_grouped_sdpa
from posbias.models.prefix import SharedKV, prefill, split_attention
from posbias.scoring.encode import left_pad, right_pad
from posbias.scoring.prefix import lcp, lcp_matrix, plan_shared, shares_of, tree_tokens, unique_ratio

pytestmark = pytest.mark.usefixtures("one_thread")
ARCHS = ("llama", "qwen2", "mistral", "gpt2", "gemma3")


def _docs_task(tmp_path, n=3, docs=4):
    lines = []
    for i in range(n):
        d = [{"title": f"T{i}{j}", "text": f"Doc {j} of {i} says the word is w{i}{j}x."} for j in range(docs)]
        lines.append(json.dumps({"id": f"q{i}", "question": f"what word does doc 0 of {i} say?",
                                 "answers": [f"w{i}0x", f"w{i}0"], "documents": d, "gold": 0}))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return get_task(f"jsonl:{path}")


def _by_key(results):
    return {(r["example_id"], json.dumps(r["position"])): r for r in results}


def _assert_same(plain, shared, logprob=True):
    a, b = _by_key(plain), _by_key(shared)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k]["correct"], a[k]["prediction"]) == (b[k]["correct"], b[k]["prediction"]), k
        if logprob:
            assert b[k]["logprob"] == pytest.approx(a[k]["logprob"], abs=1e-4), k


def test_lcp_matrix_equals_pairwise_lcp():
    """The vectorised LCP matrix (the planner's) against the scalar lcp, with shared prefixes, equal sequences,
    one a prefix of another and an empty one."""
    seqs = [[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 9, 9], [1, 2, 3, 4], [], [5], [1, 2, 3, 4, 7]]
    m = lcp_matrix(seqs)
    assert m.tolist() == [[lcp(a, b) for b in seqs] for a in seqs]


def test_tree_tokens_hand_built():
    # trie: 1-2-3, 1-2-4, 1-5, 6, 1-2 (a prefix: no new node), a duplicate 1-5: nodes 1,2,3,4,5,6
    assert tree_tokens([[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2], [1, 5]]) == 6
    assert tree_tokens([[7, 7, 7], [7, 7, 8], [9, 7, 7]]) == 3 + 1 + 3
    assert lcp([1, 2, 3], [1, 2, 4]) == 2 and lcp([], [1]) == 0 and lcp([1, 2], [1, 2]) == 2


def test_spine_shares_at_least_what_the_last_slot_prompt_shares():
    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=5, digits=3)
    rows = Scorer(lo, task).rows(task.examples(2, seed=0), [0, 1, 2, 3, 4])
    for share in shares_of(rows):
        prompts = [rows[i].prompt_ids for i in share.rows]
        last = prompts[-1]  # gold at the last slot: slot k shares the instruction and the k items before it
        assert sum(share.plen) >= sum(min(lcp(p, last), len(p) - 1) for p in prompts)
        assert all(p < len(rows[i].prompt_ids) for i, p in zip(share.rows, share.plen))  # a branch keeps a token
        assert all(rows[i].prompt_ids[:p] == share.spine[:p] for i, p in zip(share.rows, share.plen))
    total, unique = unique_ratio(rows)
    assert unique < total and unique == sum(tree_tokens([rows[i].prompt_ids for i in s.rows]) for s in shares_of(rows))


def test_plan_respects_the_token_budget():
    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=5, digits=3)
    rows = Scorer(lo, task).rows(task.examples(4, seed=0), [0, 2, 4])
    cost = lambda r, p: (len(r.answer_ids), len(r.prompt_ids) - p + 4)  # noqa: E731
    plan = plan_shared(rows, cost, batch_tokens=1500, max_batch=5)
    assert plan == plan_shared(rows, cost, batch_tokens=1500, max_batch=5)
    assert sorted(i for g in plan for b in g.batches for i in b) == list(range(len(rows)))
    plen = {i: p for g in plan for s in g.shares for i, p in zip(s.rows, s.plen)}
    for g in plan:
        for b in g.batches:
            kv = len(b) * (max(plen[i] for i in b) + max(cost(rows[i], plen[i])[1] for i in b))
            assert len(b) <= 5 and (kv <= 1500 or len(b) == 1)


def test_plan_closes_a_branch_batch_before_padding_wastes_its_work():
    """With no minimum size every branch batch of several rows wastes at most 5% (SLACK) of its work on padding
    (work model scoring.prefix.work). Two examples of 200 and 400 tokens, the gold token at 10 depths: equal branch
    widths come with different spine cuts (example A at depth 0 against B at depth 5), which must not share a
    batch. With the accelerator's minimum (the whole budget) the same rows take fewer batches."""
    from types import SimpleNamespace

    from posbias.scoring.prefix import SLACK, work

    assert SLACK == 0.95
    rows = []
    for e, n in enumerate((200, 400)):
        base = list(range(1000 * (e + 1), 1000 * (e + 1) + n))
        for k in range(10):
            cut = k * n // 10
            rows.append(SimpleNamespace(key=(f"ex{e}", k), prompt_ids=base[:cut] + [7] + base[cut + 1:]))
    cost = lambda r, p: (1, len(r.prompt_ids) - p + 2)  # noqa: E731
    tight = plan_shared(rows, cost, batch_tokens=100000, max_batch=64, min_tokens=0)
    loose = plan_shared(rows, cost, batch_tokens=100000, max_batch=64, min_tokens=100000)
    plen = {i: p for g in tight for s in g.shares for i, p in zip(s.rows, s.plen)}
    for b in (b for g in tight for b in g.batches if len(b) > 1):
        items = [(*cost(rows[i], plen[i]), plen[i]) for i in b]
        padded = work(sum(t[0] for t in items), max(t[1] for t in items), max(t[2] for t in items))
        assert padded * SLACK <= sum(work(*t) for t in items)
    assert not any({("ex0", 0), ("ex1", 5)} <= {rows[i].key for i in b} for g in tight for b in g.batches)
    assert sum(map(len, (g.batches for g in loose))) < sum(map(len, (g.batches for g in tight)))


def test_a_small_batch_closes_rather_than_pad_a_row_by_a_chunk():
    """The 2K needle sweep's case: a 1,008-token branch (under MIN_TOKENS) would carry a 505-token one padded to its
    width; with PAD_TOKENS it closes, without it (and on an accelerator: pad_tokens None) it carries it."""
    from types import SimpleNamespace

    base = list(range(100, 2100))
    rows = [SimpleNamespace(key=("ex", k), prompt_ids=base[:cut] + [7] + base[cut + 1:])
            for k, cut in enumerate((1000, 1500, 1999))]  # the last is the spine: 1,008- and ~500-token branches
    cost = lambda r, p: (1, len(r.prompt_ids) - p + 8)  # noqa: E731
    split = plan_shared(rows, cost, batch_tokens=100000, max_batch=64)
    joined = plan_shared(rows, cost, batch_tokens=100000, max_batch=64, pad_tokens=None)
    assert [len(b) for b in split[0].batches] == [1, 1, 1]
    assert sorted(map(len, joined[0].batches)) == [1, 2]


def _split_or_why(model, split: bool, arch: str, attn: str = "sdpa") -> bool:
    """Whether a test runs split attention: asked, and the model takes it; where it does not, the reason must be the
    model's (a sliding window: gemma3, and mistral's default 4,096; eager attention), never a missing hook."""
    if not split:
        return False
    install_grouped_sdpa()
    why = split_attention(model)
    expected = "attention implementation" if attn == "eager" else "sliding-window" if arch in ("gemma3", "mistral") else None
    assert (why is None) if expected is None else (expected in why), why
    return why is None


def _branch_batch(model, kv, rows, split=False):
    """rows = [(spine, p, branch tokens), ...] -> a SharedKV over them and their branches left-padded: ids, positions,
    which columns are real."""
    shared = SharedKV(model, kv, torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), split=split)
    width = max(len(b) for *_, b in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    pos, valid = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    for i, (_, p, b) in enumerate(rows):
        ids[i, width - len(b):], pos[i, width - len(b):] = torch.tensor(b), torch.arange(p, p + len(b))
        valid[i, width - len(b):] = True
    return shared, ids, pos, valid


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("split", [False, True], ids=["copy", "split"])
def test_shared_forward_equals_left_and_right_padded_plain(arch, attn, split):
    """Logits of every branch token, and of one decode step, equal a plain forward (left and right padded);
    Gemma-3's window (8) is shorter than the spines, so the branch masks must apply it. SDPA gets boolean masks,
    eager additive ones. Asked for split attention, these rows (from two spines) run the copy path."""
    model = tiny_model(arch, 100)
    model.set_attn_implementation(attn)
    split = _split_or_why(model, split, arch, attn)
    spines = random_seqs([30, 25], 100)
    rows = [(0, 5, [7, 8, 9]), (0, 20, [11, 12]), (1, 10, [13, 14, 15, 16, 17]), (1, 24, [5])]
    seqs = [spines[e][:p] + b for e, p, b in rows]
    kv = prefill(model, spines, 0)
    shared, ids, pos, valid = _branch_batch(model, kv, rows, split)
    assert shared.split is False  # several spines: their columns would be gathered, a copy either way
    width = ids.shape[1]
    got = shared.forward(ids, pos, valid)
    left, right = model(**left_pad(seqs, 0)).logits, model(**right_pad(seqs, 0)).logits
    for i, (s, (_, _, b)) in enumerate(zip(seqs, rows)):
        torch.testing.assert_close(got[i, width - len(b):], left[i, left.shape[1] - len(b):], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[i, width - len(b):], right[i, len(s) - len(b): len(s)], atol=1e-4, rtol=1e-4)
    chunked = SharedKV(model, kv, torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), split=split)
    torch.testing.assert_close(chunked.extend(ids, pos, valid, keep=3, chunk=2), got[:, -3:], atol=1e-4, rtol=1e-4)
    nxt = got[:, -1].argmax(-1)
    step = shared.forward(nxt[:, None], pos[:, -1:] + 1, torch.ones(len(rows), 1, dtype=torch.bool))[:, 0]
    plain = model(**left_pad([s + [int(t)] for s, t in zip(seqs, nxt)], 0)).logits[:, -1]
    torch.testing.assert_close(step, plain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
@pytest.mark.parametrize("split", [False, True], ids=["copy", "split"])
def test_joined_rows_decode_as_plain(arch, split):
    """SharedKV.joined: two parts of different widths (spine cuts and branches) stacked into one batch, the narrower
    one's rows padded with hidden columns; two decode steps give each row the logits of its plain forward. Split
    parts are joined as copies of their spine's and own columns where they read different spines, and stay split
    (the spine read in place, its columns past a row's cut hidden; only the own columns joined) where one spine
    is under them all."""
    model = tiny_model(arch, 100)
    split = _split_or_why(model, split, arch)
    spines = random_seqs([30, 12], 100)
    kv = prefill(model, spines, 0)
    parts = [[(0, 25, [7, 8, 9, 10, 11, 12]), (1, 3, [13])], [(0, 10, [14, 15]), (0, 4, [16])], [(1, 8, [17, 18])]]
    kvs, nxt, seqs = [], [], []
    for rows in parts:
        part, ids, pos, valid = _branch_batch(model, kv, rows, split)
        part.forward(ids, pos, valid, keep=1)
        kvs.append(part)
        nxt.append(pos[:, -1:] + 1)
        seqs += [spines[e][:p] + b for e, p, b in rows]
    assert kvs[0].kpos.shape[1] != kvs[1].kpos.shape[1] and [p.split for p in kvs] == [False, split, split]
    one = [(0, 20, [19, 20, 21]), (0, 30, [22])]  # a third part on spine 0, wider in both its cut and its own columns
    part, ids, pos, valid = _branch_batch(model, kv, one, split)
    part.forward(ids, pos, valid, keep=1)
    cases = [(kvs, torch.cat(nxt), seqs, False),
             ([kvs[1], part], torch.cat([nxt[1], pos[:, -1:] + 1]), seqs[2:4] + [spines[0][:p] + b for _, p, b in one], split)]
    for parts_, pos, seqs, stays_split in cases:
        joined = SharedKV.joined(parts_, room=2)
        assert joined.split == stays_split
        for tok in ([21, 22, 23, 24, 25], [31, 32, 33, 34, 35]):
            tok = tok[:len(seqs)]
            got = joined.forward(torch.tensor(tok)[:, None], pos, torch.ones_like(pos, dtype=torch.bool))[:, 0]
            seqs = [s + [t] for s, t in zip(seqs, tok)]
            torch.testing.assert_close(got, model(**left_pad(seqs, 0)).logits[:, -1], atol=1e-4, rtol=1e-4)
            pos = pos + 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_scorer_matches_plain_on_kv_lookup(arch, engine):
    lo = tiny_loaded(arch, chat=arch != "gpt2")
    position_sensitive(lo.model) if arch != "gpt2" else None
    task = get_task("kv-lookup", facts=4, digits=3)
    rows = Scorer(lo, task).rows(task.examples(3, seed=0), [0, 1, 2, 3])
    plain = Scorer(lo, task, engine, 6, prefix_sharing=False).score(rows)
    for max_batch in (1, 32):
        shared = Scorer(lo, task, engine, 6, max_batch=max_batch).score(rows)
        _assert_same(plain, shared, logprob=engine == "teacher-forced")


@pytest.mark.parametrize("arch", ("llama", "gemma3"))
@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_accelerator_profile_matches_plain(arch, engine, monkeypatch):
    """On an accelerator the spines run as one right-padded batch, branches unchunked and batches close only at
    the budget (models.prefix.launch_bound); run here on CPU by forcing the profile: still the plain path's
    verdicts, predictions and logprobs, and fewer forwards over prompts than the CPU profile."""
    import posbias.models.prefix as mp

    lo = tiny_loaded(arch)
    position_sensitive(lo.model)
    task = get_task("kv-lookup", facts=6, digits=3)
    rows = Scorer(lo, task).rows(task.examples(3, seed=0), list(range(6)))
    plain = Scorer(lo, task, engine, 6, prefix_sharing=False).score(rows)
    calls = {}
    for bound in (False, True):
        monkeypatch.setattr(mp, "launch_bound", lambda model, b=bound: b)
        n = [0]
        hook = lo.model.register_forward_pre_hook(  # forwards over prompts (a decode step, one token a row, not counted)
            lambda m, a, kw, n=n: n.__setitem__(0, n[0] + (kw["input_ids"].shape[1] > 1)), with_kwargs=True)
        shared = Scorer(lo, task, engine, 6, batch_tokens=4000).score(rows)
        hook.remove()
        calls[bound] = n[0]
        _assert_same(plain, shared, logprob=engine == "teacher-forced")
    assert calls[True] < calls[False], calls


@pytest.mark.parametrize("arch", ("llama", "gemma3"))
def test_joined_decode_takes_fewer_steps_and_generates_what_plain_does(arch, monkeypatch):
    """Generation on the prefix-shared path decodes the rows of consecutive branch batches together
    (SharedKV.joined, each part's columns padded with hidden ones): the plain path's texts and cut flags, in fewer
    decode steps than one loop per branch batch; the run's settings say so."""
    import posbias.scoring.engines as eng

    lo = tiny_loaded(arch)
    position_sensitive(lo.model)
    task = get_task("kv-lookup", facts=6, digits=3)
    rows = Scorer(lo, task).rows(task.examples(4, seed=0), list(range(6)))
    plain = Scorer(lo, task, "generate", 6, prefix_sharing=False).score(rows)
    steps = {}
    for joined in (True, False):
        if not joined:
            monkeypatch.setattr(eng, "_decode_runs", lambda parts, *a: [[p] for p in parts])
        n = [0]
        hook = lo.model.register_forward_pre_hook(
            lambda m, a, kw, n=n: n.__setitem__(0, n[0] + (kw["input_ids"].shape[1] == 1)), with_kwargs=True)
        scorer = Scorer(lo, task, "generate", 6, batch_tokens=4000, max_batch=16)
        shared = scorer.score(rows)
        hook.remove()
        steps[joined] = n[0]
        _assert_same(plain, shared, logprob=False)
        a, b = _by_key(plain), _by_key(shared)
        assert all(a[k]["cut"] == b[k]["cut"] for k in a)
    assert 0 < steps[True] < steps[False], steps
    assert scorer.settings("none")["decode"] == "joined"


@pytest.mark.parametrize("arch", ("llama", "gemma3"))
@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_scorer_matches_plain_on_documents(arch, engine, tmp_path):
    """A document task: several accepted answers (teacher forcing scores one sequence each), small budgets."""
    lo = tiny_loaded(arch)
    task = _docs_task(tmp_path)
    rows = Scorer(lo, task).rows(task.examples(3), [0, 1, 2, 3])
    plain = Scorer(lo, task, engine, 5, prefix_sharing=False).score(rows)
    shared = Scorer(lo, task, engine, 5, batch_tokens=2000, max_batch=3).score(rows)
    _assert_same(plain, shared, logprob=engine == "teacher-forced")


def test_sweep_json_unchanged_by_prefix_sharing(loaded, tmp_path):
    cfg = SweepConfig(model="tiny", task="kv-lookup", task_options={"facts": 5, "digits": 3}, n=4, dtype="fp32")
    records = {}
    for on in (True, False):
        res = run_sweep(cfg.__class__(**{**cfg.__dict__, "prefix_sharing": on}), tmp_path / str(on), loaded=loaded,
                        progress=False)
        rec = json.loads((tmp_path / str(on) / "sweep.json").read_text())
        assert rec["config"].pop("prefix_sharing") is on
        assert rec["config"].pop("scoring_path") == ("prefix-shared" if on else "plain")
        # fp32 on a CPU, a full-attention model: split attention, recorded (a plain run records none)
        assert rec["config"].pop("prefix_attention", None) == ("split" if on else None)
        records[on] = (rec, res.rows)
    assert records[True][0] == records[False][0]
    _assert_same(records[False][1], records[True][1])
    # the attention kernels are recorded beside the run (models/compat.py), not in its fingerprint
    assert records[True][0]["backend"]["settings"] == {"attention": "sdpa", **attention_record()}
    assert "attention" not in json.loads((tmp_path / "True" / "run.json").read_text())["fingerprint"]["config"]


@pytest.mark.parametrize("arch", ("llama", "gpt2", "qwen2"))
@torch.inference_mode()
def test_split_attention_reads_one_spine_in_place_and_a_long_branch_in_one_forward(arch):
    """The rows of one spine read its keys and values where prefill left them (views: same storage, the batch
    broadcast), the cache holds only the rows' own columns, and an unpadded branch runs as one forward whose
    logits are the plain forward's: what the copy path needs len / chunk forwards and a copy per batch for."""
    model = tiny_model(arch, 100)
    assert _split_or_why(model, True, arch)
    spine = random_seqs([40], 100)[0]
    kv = prefill(model, [spine], 0)
    branch = random_seqs([23], 100, seed=3)[0]
    rows = [(0, 17, branch), (0, 17, branch[::-1])]
    shared, ids, pos, valid = _branch_batch(model, kv, rows, split=True)
    for (k, v), (sk, sv) in zip(kv, shared.spine):
        assert sk.data_ptr() == k.data_ptr() and sv.data_ptr() == v.data_ptr() and sk.stride(0) == 0
        assert sk.shape[2] == 17 and shared.spine_mask is None  # every row cut at 17: nothing to hide
    assert all(layer.keys.shape[2] == 0 for layer in shared.cache.layers)
    calls = []
    forward = shared.forward
    shared.forward = lambda *a, **k: calls.append(a[0].shape[1]) or forward(*a, **k)
    got = shared.extend(ids, pos, valid, keep=2, chunk=4)
    assert calls == [23]  # one forward, though chunk=4 would cut the copy path's into 6
    assert all(layer.keys.shape[2] == 23 for layer in shared.cache.layers)
    plain = model(input_ids=torch.tensor([spine[:17] + b for *_, b in rows])).logits[:, -2:]
    torch.testing.assert_close(got, plain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_split_rows_of_one_spine_cut_at_different_places_equal_plain(arch):
    """Split attention with both masks: rows of one spine cut at different places (the spine's columns past a
    row's cut hidden) and branches of different widths (left padding hidden among the own columns), then a decode
    step (own columns under a padding mask); the logits of a plain forward. Windowed models run the copy path."""
    model = tiny_model(arch, 100)
    split = _split_or_why(model, True, arch)
    spine = random_seqs([30], 100)[0]
    rows = [(0, 5, [7, 8, 9]), (0, 20, [11, 12]), (0, 12, [13, 14, 15, 16, 17]), (0, 29, [5])]
    seqs = [spine[:p] + b for _, p, b in rows]
    shared, ids, pos, valid = _branch_batch(model, prefill(model, [spine], 0), rows, split)
    assert shared.split is split and (not split or shared.spine_mask is not None)
    got = shared.extend(ids, pos, valid, keep=1, chunk=2)[:, -1]
    torch.testing.assert_close(got, model(**left_pad(seqs, 0)).logits[:, -1], atol=1e-4, rtol=1e-4)
    nxt = got.argmax(-1)
    step = shared.forward(nxt[:, None], pos[:, -1:] + 1, torch.ones(len(rows), 1, dtype=torch.bool))[:, 0]
    plain = model(**left_pad([s + [int(t)] for s, t in zip(seqs, nxt)], 0)).logits[:, -1]
    torch.testing.assert_close(step, plain, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_split_attention_that_is_never_reached_fails_loudly(monkeypatch):
    """Should anything replace posbias's registered sdpa after split was chosen, the stock function would attend to
    the rows' own columns alone (wrong logits, no error): the forward counts the layers its hook saw and refuses."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny_model("llama", 100)
    assert _split_or_why(model, True, "llama")
    spine = random_seqs([12], 100)[0]
    shared, ids, pos, valid = _branch_batch(model, prefill(model, [spine], 0), [(0, 6, [7, 8, 9])], split=True)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"].__wrapped__)
    with pytest.raises(RuntimeError, match="split attention reached 0 of 2 layers"):
        shared.forward(ids, pos, valid)


def test_scorer_records_the_prefix_attention_it_runs(tmp_path, monkeypatch):
    """Unset: split on a full-attention fp32 model, recorded; "copy": the copy path, nothing recorded (as every run
    before split attention); "split" where the model cannot (gemma3's window): the copy path, and why, recorded.
    Split and copy give the same verdicts and logprobs. In bf16 unset means copy (split moves verdicts there), and
    "split" runs it."""
    task = _docs_task(tmp_path)
    lo = tiny_loaded("llama")
    rows = Scorer(lo, task).rows(task.examples(3), [0, 1, 2, 3])
    auto, copy = Scorer(lo, task, "teacher-forced"), Scorer(lo, task, "teacher-forced", prefix_sharing="copy")
    assert auto.settings("none")["prefix_attention"] == "split" and "prefix_attention" not in copy.settings("none")
    _assert_same(copy.score(rows), auto.score(rows))
    gemma = Scorer(tiny_loaded("gemma3"), task, "teacher-forced", prefix_sharing="split").settings("none")
    assert gemma["prefix_attention"].startswith("copy (sliding-window")
    monkeypatch.setitem(lo.info, "dtype", "bf16")  # the rule reads the dtype the model was loaded in
    assert "prefix_attention" not in Scorer(lo, task, "teacher-forced").settings("none")
    assert Scorer(lo, task, "teacher-forced", prefix_sharing="split").settings("none")["prefix_attention"] == "split"
    with pytest.raises(PosbiasError, match="unknown prefix_sharing 'fast'"):
        Scorer(lo, task, prefix_sharing="fast")
    with pytest.raises(PosbiasError, match="unknown prefix_attention"):
        SweepConfig(model="tiny", task="kv-lookup", prefix_attention="fast").validate()


def test_method_that_is_not_prefix_safe_falls_back(monkeypatch):
    import posbias.models.prefix as mp

    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=4, digits=3)
    rows = Scorer(lo, task).rows(task.examples(2, seed=0), [0, 3])
    scorer = Scorer(lo, task)
    mspoe = MsPoE(layers=[0, 1])
    settings = scorer.settings(mspoe)
    assert settings["scoring_path"] == "plain" and "Ms-PoE" in settings["scoring_note"]
    assert scorer.settings(get_method("pi:1.2"))["scoring_path"] == "prefix-shared"
    plain = Scorer(lo, task, prefix_sharing=False).score(rows, mspoe)

    def refuse(*a, **k):
        raise AssertionError("prefix path used")

    monkeypatch.setattr(mp, "prefill", refuse)
    assert scorer.score(rows, mspoe) == plain  # identical: the plain path ran
    with pytest.raises(AssertionError, match="prefix path"):
        scorer.score(rows, "none")


@pytest.mark.parametrize("spec", ["pi:1.3", "layers:1,1.6"])
def test_rope_scaling_under_prefix_sharing_equals_plain(spec):
    lo = tiny_loaded("llama")
    position_sensitive(lo.model)
    task = get_task("kv-lookup", facts=4, digits=3)
    rows = Scorer(lo, task).rows(task.examples(3, seed=0), [0, 1, 2, 3])
    plain = Scorer(lo, task, prefix_sharing=False).score(rows, spec)
    shared = Scorer(lo, task).score(rows, spec)
    _assert_same(plain, shared)
    base = Scorer(lo, task).score(rows)
    assert [r["logprob"] for r in base] != pytest.approx([r["logprob"] for r in shared], abs=1e-3)  # the method acts


def test_cli_no_prefix_sharing_and_the_fallback_note(model_dir, tmp_path):
    from typer.testing import CliRunner

    from posbias.cli import app

    base = ["sweep", "--model", str(model_dir), "--dtype", "fp32", "--facts", "4", "--digits", "3", "--n", "2", "--quiet"]
    res = CliRunner().invoke(app, base + ["--no-prefix-sharing", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert "prefix-shared" not in json.dumps(run) and '"scoring_path": "plain"' in json.dumps(run)
    res = CliRunner().invoke(app, base + ["--method", "buckets:10000,30000", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert res.output.count("note: buckets") == 1 and "no prefix sharing" in res.output


NEAR_TIE = 0.5  # logits: bf16 layout noise moves the plain path's own logprobs by ~0.2 (docs/sweep.md)


@torch.inference_mode()
def _margin(loaded, row) -> float:
    """min over answer steps of (gold logit - best other logit), one unpadded plain forward: > 0 iff correct."""
    ans = row.answer_ids[0]
    logits = loaded.model(input_ids=torch.tensor([row.prompt_ids + ans])).logits[0, -len(ans) - 1:-1].float()
    gold = torch.tensor(ans)[:, None]
    return float((logits.gather(-1, gold)[:, 0] - logits.scatter(-1, gold, float("-inf")).max(-1).values).min())


@pytest.mark.real
def test_smollm2_prefix_sharing_agrees_with_plain(smollm2):
    """bf16: every verdict that differs from the plain path is a near tie (|margin| < NEAR_TIE logits), so
    100% of the decided rows agree; the overall agreement and the near ties are printed."""
    torch.set_num_threads(1)
    task = get_task("kv-lookup", facts=10)
    scorer = Scorer(smollm2, task)
    rows = scorer.rows(task.examples(1, seed=0), list(range(10)))
    by_key = {(r.key[0], json.dumps(r.key[1])): r for r in rows}
    plain, shared = _by_key(Scorer(smollm2, task, prefix_sharing=False).score(rows)), _by_key(scorer.score(rows))
    flips = {k: _margin(smollm2, by_key[k]) for k in plain if plain[k]["correct"] != shared[k]["correct"]}
    print(f"\n{len(plain)} rows, agreement {1 - len(flips) / len(plain):.1%}; near-tie flips (row: margin): {flips}")
    assert all(abs(m) < NEAR_TIE for m in flips.values())
    assert max(abs(plain[k]["logprob"] - shared[k]["logprob"]) for k in plain) < 0.5


def test_on_cpu_a_group_of_examples_stays_small_so_rows_are_written_as_they_finish(monkeypatch):
    """The bar moves when a group's spines are prefilled and its first branch batch is done: where forwards are slow
    (fp32, or bf16 on a CPU without native bf16) a group holds at most GROUP_TOKENS padded spine tokens (the default
    sweep's 32-example groups kept `make sweep` at 0/1000 for minutes on a slow CPU); in bf16 on a CPU with native
    bf16, and on an accelerator, a group fills batch_tokens. The rows come out the same either way (fp32)."""
    import posbias.models.dtype as dt
    import posbias.models.prefix as mp
    import posbias.scoring.runners as sc
    from posbias.scoring.prefix import GROUP_TOKENS

    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=4, digits=3)
    rows = Scorer(lo, task).rows(task.examples(40, seed=0), [0, 1, 2, 3])
    monkeypatch.setattr(sc, "GROUP_TOKENS", 600)  # the tiny prompts are short: a budget of a few examples
    groups = Scorer(lo, task).runner._plan(rows)
    assert len(groups) > 4 and GROUP_TOKENS == 2048
    assert all(len(g.shares) == 1 or len(g.shares) * max(len(s.spine) for s in g.shares) <= 600 for g in groups)
    ticks: list[int] = []
    cpu = Scorer(lo, task).score(rows, on_batch=lambda new: ticks.append(len(new)))
    assert ticks[0] <= len(groups[0].rows) and len(ticks) >= len(groups)
    _assert_same(Scorer(lo, task, prefix_sharing=False).score(rows), cpu)
    native = ("AMD EPYC", frozenset({"avx512_bf16"}))
    monkeypatch.setattr(dt, "_cpu_info", lambda: native)
    monkeypatch.setattr(dt, "_onednn_cap", lambda: "")  # not capped to AVX2 by the environment (the AVX2 stand-in)
    assert len(Scorer(lo, task).runner._plan(rows)) == len(groups)  # fp32 stays small on any CPU
    monkeypatch.setitem(lo.info, "dtype", "bf16")  # the plan reads the dtype the model was loaded in
    assert len(Scorer(lo, task).runner._plan(rows)) < len(groups)
    monkeypatch.setattr(dt, "_cpu_info", lambda: ("Core i7", frozenset({"avx2"})))
    assert len(Scorer(lo, task).runner._plan(rows)) == len(groups)  # emulated bf16 is slow: small groups
    monkeypatch.setattr(mp, "launch_bound", lambda model: True)
    assert len(Scorer(lo, task).runner._plan(rows)) < len(groups)
