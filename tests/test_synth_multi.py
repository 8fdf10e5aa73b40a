"""Several synthetic runs at once (posbias.synth.multi): a group is the same runs as single ones up to
float rounding, its stacked AdamW is R separate AdamWs, a killed group resumes bit-identically, and
grids with group > 1 write the same per-run results, partitioned by architecture."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from posbias.errors import PosbiasError
from posbias.synth.data import DataConfig, generator
from posbias.synth.evaluate import EvalConfig
from posbias.synth.experiments import grid_runs, run_grid
from posbias.synth.model import ModelConfig
from posbias.synth.multi import _group_ckpt, check_group, partition, train_group
from posbias.synth.train import RunConfig, TrainConfig, build, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = DataConfig(n_classes=64, n_labels=8, burstiness=2, n_items=4, dim=16)
EV = EvalConfig(n_seqs=100, sink_seqs=50, position_seqs=20, batch=256)
# measured on CPU, 30 steps: the largest parameter difference between a grouped and a single run is
# 7e-8 (batched vs unbatched matmul rounding); curve losses differ by < 1e-7, accuracies not at all
TOL = 1e-5


def group_cfgs(pe="rope", mask="causal", iters=30, **train_kw) -> list[RunConfig]:
    """Three runs of one architecture: seeds 0 and 1, and seed 2 with first-item-biased data."""
    m = ModelConfig(depth=2, pe=pe, **({"mask": "window", "window": 3} if mask == "window" else {"mask": mask}))
    t = TrainConfig(iters=iters, batch=32, log_points=2, curve_seqs=64, **train_kw)
    return [RunConfig(TINY, m, t, EV, 0), RunConfig(TINY, m, t, EV, 1), RunConfig(replace(TINY, bias="first"), m, t, EV, 2)]


def max_param_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    return max((sa[k] - sb[k]).abs().max().item() for k in sa)


def same_history(h1: list[dict], h2: list[dict]) -> None:
    assert len(h1) == len(h2)
    for p, q in zip(h1, h2):
        assert p["step"] == q["step"]
        assert p["train_loss"] == pytest.approx(q["train_loss"], abs=TOL)
        assert (p["train_acc"], p["novel_acc"], p["gaps"]) == (q["train_acc"], q["novel_acc"], q["gaps"])


@pytest.mark.parametrize("mask", ["causal", "window", "prefix", "none"])
@pytest.mark.parametrize("pe", ["none", "sin", "rope", "decay"])
def test_group_equals_single_runs(pe, mask):
    cfgs = group_cfgs(pe, mask)
    grouped = train_group(cfgs, progress=False)
    for cfg, g in zip(cfgs, grouped):
        single = train(cfg, progress=False)
        assert g.step == single.step == 30
        assert max_param_diff(single.model, g.model) < TOL
        same_history(single.history, g.history)
    assert max_param_diff(grouped[0].model, grouped[1].model) > 1e-3  # the runs did not share anything


def test_stacked_adamw_is_separate_adamws():
    # elementwise: any gradients, stacked or sliced, give the same parameters bit for bit
    torch.manual_seed(0)
    w = torch.randn(3, 5, 4)
    stacked = w.clone().requires_grad_()
    parts = [w[i].clone().requires_grad_() for i in range(3)]
    opt = torch.optim.AdamW([stacked], lr=1e-2, weight_decay=1e-2)
    opts = [torch.optim.AdamW([p], lr=1e-2, weight_decay=1e-2) for p in parts]
    for _ in range(5):
        grad = torch.randn(3, 5, 4)
        stacked.grad = grad.clone()
        opt.step()
        for i, (p, o) in enumerate(zip(parts, opts)):
            p.grad = grad[i].clone()
            o.step()
    assert all(torch.equal(stacked[i], parts[i]) for i in range(3))
    # the network: loss = sum over runs of each run's mean cross-entropy, one AdamW on the stack,
    # against each model with its own loss and optimizer, k = 5 steps
    cfgs = group_cfgs()
    models = [build(c)[1] for c in cfgs]
    tasks = [build(c)[0] for c in cfgs]
    params, _ = stack_module_state(models)
    params = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    base = build(cfgs[0])[1]
    opt = torch.optim.AdamW(list(params.values()), lr=1e-2, weight_decay=1e-6)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=1e-6) for m in models]
    for step in range(5):
        bs = [t.train_batch(32, generator("train", c.seed, step)) for t, c in zip(tasks, cfgs)]
        logits = vmap(lambda p, x: functional_call(base, p, (x,)))(params, torch.stack([b.x for b in bs]))
        loss = sum(torch.nn.functional.cross_entropy(lg, b.y) for lg, b in zip(logits, bs))
        opt.zero_grad()
        loss.backward()
        opt.step()
        for m, o, b in zip(models, opts, bs):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(b.x), b.y).backward()
            o.step()
    for i, m in enumerate(models):
        for k, v in m.named_parameters():
            assert (params[k][i] - v).abs().max() < TOL, k


def test_group_resume_is_bit_identical(tmp_path):
    cfgs = group_cfgs(iters=30, ckpt_every=10)[:2]
    full = train_group(cfgs, progress=False)
    ck = tmp_path / "group.ckpt"
    part = train_group(cfgs, ck, progress=False, stop_at=17)  # "killed" after step 17 (checkpoints at 10, 17)
    assert part[0].step == 17 and ck.exists()
    done = train_group(cfgs, ck, progress=False)
    for f, d in zip(full, done):
        assert d.step == 30
        for (k, v), (_, w) in zip(f.model.state_dict().items(), d.model.state_dict().items()):
            assert torch.equal(v, w), k
        assert d.history == f.history
    with pytest.raises(PosbiasError, match="another group"):
        train_group(cfgs[::-1], ck, progress=False)


def test_groups_need_one_architecture():
    a, b = group_cfgs("rope")[0], group_cfgs("none")[0]
    with pytest.raises(PosbiasError, match="differ in model"):
        check_group([a, b])
    with pytest.raises(PosbiasError, match="differ in model"):
        check_group([a, replace(a, data=replace(TINY, dim=8))])
    check_group([a, replace(a, seed=5, data=replace(TINY, eps=0.1, n_classes=128))])  # values, not shapes
    assert partition(["x", "y", "x", "x", "y"], 2) == [[0, 2], [3], [1, 4]]


def flat(x, path="") -> dict:
    """A nested record as {path: number}, for a comparison within a tolerance."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in flat(val, f"{path}/{key}").items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in flat(val, f"{path}/{i}").items()}
    return {path: x}


def close(a, b) -> None:
    fa, fb = flat(a), flat(b)
    assert list(fa) == list(fb)
    assert all(fa[k] == pytest.approx(fb[k], abs=TOL) for k in fa), [(k, fa[k], fb[k]) for k in fa if fa[k] != fb[k]]


def _per_run(folder) -> dict:
    return {p.name: json.loads(p.read_text()) for p in sorted((folder / "runs").glob("*.json"))}


def test_grid_groups_match_single_runs_and_resume(tmp_path):
    over = dict(iters=8, seeds=2, eval_seqs=40, sink_seqs=20, position_seqs=8, curve_seqs=16, log_points=2,
                n_classes=64, n_labels=8, burstiness=2, n_items=4, dim=16, masks=["causal", "window3"])
    runs = grid_runs("sinks", "quick", **over)  # 2 architectures x 2 seeds
    one = run_grid("sinks", runs, tmp_path / "one", progress=False)
    # the second architecture finished, a group of the first "killed" at step 3; then the whole grid
    # with group 4 and 2 workers
    run_grid("sinks", runs[2:], tmp_path / "four", progress=False, group=4)
    paths = [tmp_path / "four" / "runs" / f"{r.name}.json" for r in runs[:2]]
    train_group([r.cfg for r in runs[:2]], _group_ckpt(paths), progress=False, stop_at=3)
    four = run_grid("sinks", runs, tmp_path / "four", progress=False, group=4, workers=2)
    a, b = _per_run(tmp_path / "one"), _per_run(tmp_path / "four")
    assert list(a) == list(b) and len(a) == 4
    for name in a:
        assert set(b[name]) == set(a[name])
        assert a[name]["trained_with"] == {"device": "cpu", "group": 1}
        assert b[name]["trained_with"] == {"device": "cpu", "group": 2}  # 2 architectures: never mixed
        close(b[name]["metrics"], a[name]["metrics"])
        for p, q in zip(a[name]["history"], b[name]["history"]):
            assert q["train_loss"] == pytest.approx(p["train_loss"], abs=TOL) and q["gaps"] == p["gaps"]
    assert len(four.configs) == len(one.configs) == 2
    assert not list((tmp_path / "four" / "runs").glob("*.ckpt"))
    # a finished run is skipped; a missing one is trained again (alone), with the same numbers
    gone = tmp_path / "four" / "runs" / list(b)[0]
    gone.unlink()
    run_grid("sinks", runs, tmp_path / "four", progress=False, group=4)
    again = _per_run(tmp_path / "four")
    assert again[gone.name]["trained_with"]["group"] == 1
    close(again[gone.name]["metrics"], b[gone.name]["metrics"])
    assert all(again[n] == b[n] for n in b if n != gone.name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("cmd", [["synth", "train"], ["synth", "depth"]])
def test_cuda_without_cuda_is_one_line_exit_2(cmd, tmp_path, monkeypatch, capsys):
    from posbias.cli import main

    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["posbias", *cmd, "--device", "cuda", "--quiet", "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2
    assert err == ["posbias: error: no CUDA device here -- use --device cpu"]
    assert not out.exists()
