"""core.rollout: masks as graphs, masked softmax, decay/RoPE attention, rollout (eq. 4)."""

import ast
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posbias.core import rollout as R
from posbias.errors import PosbiasError

F64 = torch.float64
SRC = Path(R.__file__).parent


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: one thread is faster


def rand_mask(n: int, p: float, seed: int) -> torch.Tensor:
    """A random adjacency with self-loops (so every row attends to something)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, n, generator=g) < p) | torch.eye(n, dtype=torch.bool)


def bfs_centers(mask: torch.Tensor) -> list[int]:
    """Brute force Def. 3.1: v is a center iff a BFS along edges j -> i (mask[i, j]) from v reaches all."""
    n, out = mask.shape[0], []
    for v in range(n):
        seen, todo = {v}, [v]
        while todo:
            j = todo.pop()
            for i in mask[:, j].nonzero().flatten().tolist():
                if i not in seen:
                    seen.add(i)
                    todo.append(i)
        if len(seen) == n:
            out.append(v)
    return out


# ---------------------------------------------------------------- masks


def test_masks_by_hand():
    assert torch.equal(R.causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    w = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    assert torch.equal(R.sliding_window_mask(5, 3), w.bool())  # w counts the token itself
    p = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert torch.equal(R.prefix_mask(4, 2), p.bool())  # bidirectional prefix block
    assert torch.equal(R.sliding_window_mask(6, 6), R.causal_mask(6))
    assert torch.equal(R.prefix_mask(6, 1), R.causal_mask(6))
    assert R.full_mask(4).all()


def test_bad_masks_raise():
    with pytest.raises(PosbiasError):
        R.as_mask(torch.ones(3, 4))
    with pytest.raises(PosbiasError, match="attend to nothing"):
        R.as_mask(torch.tensor([[1, 0], [0, 0]]))
    with pytest.raises(PosbiasError):
        R.sliding_window_mask(4, 0)
    with pytest.raises(PosbiasError):
        R.prefix_mask(4, 5)


def test_center_nodes_hand_made():
    n = 6
    assert R.center_nodes(R.causal_mask(n)) == [0]
    assert R.center_nodes(R.sliding_window_mask(n, 2)) == [0]
    assert R.center_nodes(R.prefix_mask(n, 3)) == [0, 1, 2]
    assert R.center_nodes(R.full_mask(n)) == list(range(n))
    star = torch.eye(n, dtype=torch.bool)
    star[:, 2] = True  # everyone attends to token 2: edges 2 -> i
    assert R.center_nodes(star) == [2]
    reverse = torch.eye(n, dtype=torch.bool) | torch.ones(n, n, dtype=torch.bool).triu(1)  # i attends j >= i
    assert R.center_nodes(reverse) == [n - 1]
    cycle = torch.eye(n, dtype=torch.bool) | torch.roll(torch.eye(n, dtype=torch.bool), 1, dims=1)
    assert R.center_nodes(cycle) == list(range(n))
    two_blocks = torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool()
    assert R.center_nodes(two_blocks) == []


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), p=st.floats(0.0, 0.6), seed=st.integers(0, 10_000))
def test_center_nodes_match_bfs(n, p, seed):
    m = rand_mask(n, p, seed)
    assert R.center_nodes(m) == bfs_centers(m)


def test_walk_support_window():
    n, w = 10, 3
    for steps in (1, 2, 4):
        s = R.walk_support(R.sliding_window_mask(n, w), steps)
        d = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        assert torch.equal(s, (d >= 0) & (d <= steps * (w - 1)))


# ---------------------------------------------------------------- attention


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), p=st.floats(0.0, 0.8), seed=st.integers(0, 10_000))
def test_masked_softmax_rows_and_zeros(n, p, seed):
    m = rand_mask(n, p, seed)
    z = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=F64) * 5
    a = R.masked_softmax(z, m)
    torch.testing.assert_close(a.sum(-1), torch.ones(n, dtype=F64))
    assert (a[~m] == 0).all() and (a[m] > 0).all()


def test_decay_attention_matches_eq2():
    n, m = 7, 0.4
    x = R.random_inputs(n, 4, seed=3)
    w = R.random_weights(1, 4, 1.0, seed=3)
    a = R.attention(x, w.wq[0], w.wk[0], R.causal_mask(n), decay_m=m)
    z = (x @ w.wq[0]) @ (x @ w.wk[0]).T
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    ref = torch.where(j <= i, torch.exp(z - (i - j) * m), torch.zeros((), dtype=F64))
    torch.testing.assert_close(a, ref / ref.sum(-1, keepdim=True))
    # constant scores: consecutive keys differ by exactly e^{-m}
    a0 = R.attention(x, 0 * w.wq[0], w.wk[0], R.causal_mask(n), decay_m=m)
    torch.testing.assert_close(a0[-1, 1:-1] / a0[-1, 2:], torch.full((n - 2,), math.exp(-m), dtype=F64))


def test_rope_matches_paper_matrix_and_is_relative():
    th = torch.tensor([0.3, 0.05], dtype=F64)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, generator=g, dtype=F64), torch.randn(5, 4, generator=g, dtype=F64)
    rq = R.rope_rotate(q, th)
    for i in range(5):  # eq. (3): row vector times the block-diagonal R^d_{Theta, i}
        blocks = [torch.tensor([[math.cos(i * t), math.sin(i * t)], [-math.sin(i * t), math.cos(i * t)]], dtype=F64)
                  for t in th.tolist()]
        torch.testing.assert_close(rq[i], q[i] @ torch.block_diag(*blocks))
    z = rq @ R.rope_rotate(k, th).T
    shifted = torch.arange(5, dtype=F64) + 11
    torch.testing.assert_close(z, R.rope_rotate(q, th, shifted) @ R.rope_rotate(k, th, shifted).T)
    torch.testing.assert_close(R.rope_rotate(q, torch.zeros(2, dtype=F64)), q)
    torch.testing.assert_close(R.rope_angles(4, 100.0), torch.tensor([1.0, 0.1], dtype=F64))
    with pytest.raises(PosbiasError):
        R.rope_rotate(q, torch.zeros(3, dtype=F64))


def test_random_weights_satisfy_a1_a2():
    w = R.random_weights(5, 6, weight_norm=1.5, seed=1)
    for m in (w.wq, w.wk):
        torch.testing.assert_close(torch.linalg.matrix_norm(m, ord=2), torch.full((5,), 1.5, dtype=F64))
    torch.testing.assert_close(w.wv @ w.wv.transpose(-1, -2), torch.eye(6, dtype=F64).expand(5, 6, 6))
    n, mask = 16, R.causal_mask(16)
    attns, xs = R.san_forward(R.random_inputs(n, 6, seed=2), w, mask)
    for t, x in enumerate(xs):  # rows stay in the unit ball, so |Z| <= weight_norm^2
        assert (x.norm(dim=-1) <= 1 + 1e-12).all()
        assert R.attention_scores(x, w.wq[t], w.wk[t]).abs().max() <= 1.5**2 + 1e-12


# ---------------------------------------------------------------- rollout


MASKS = {
    "full": lambda n: R.full_mask(n),
    "causal": lambda n: R.causal_mask(n),
    "window": lambda n: R.sliding_window_mask(n, 3),
    "prefix": lambda n: R.prefix_mask(n, min(3, n)),
    "blocks": lambda n: torch.block_diag(R.causal_mask(n // 2), R.full_mask(n - n // 2)),
}


@pytest.mark.parametrize("kind", sorted(MASKS))
@pytest.mark.parametrize("pe", [{}, {"decay_m": 0.5}, {"theta": R.rope_angles(8)}])
def test_rollout_stochastic_and_on_paths(kind, pe):
    n, T = 12, 5
    mask = MASKS[kind](n)
    layers = R.random_attention_layers(n, T, mask, d=8, weight_norm=1.5, seed=4, **pe)
    ones = torch.ones(n, dtype=F64)
    for t, (a, p) in enumerate(zip(layers, R.iter_rollout(layers))):
        torch.testing.assert_close(a.sum(-1), ones)
        assert torch.equal(a > 0, mask)  # softmax keeps every edge and nothing else
        torch.testing.assert_close(p.sum(-1), ones)
        assert torch.equal(p > 0, R.walk_support(mask, t + 1))  # zero exactly where no walk exists
    if kind == "blocks":  # no path between the two blocks
        assert (p[: n // 2, n // 2:] == 0).all() and (p[n // 2:, : n // 2] == 0).all()


def test_rollout_order_is_last_layer_leftmost():
    n = 6
    layers = R.random_attention_layers(n, 3, R.causal_mask(n), seed=5)
    torch.testing.assert_close(R.rollout(layers), layers[2] @ layers[1] @ layers[0])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), T=st.integers(1, 6), alpha=st.sampled_from([0.0, 0.3, 0.5]), seed=st.integers(0, 999),
       kind=st.sampled_from(sorted(MASKS)))
def test_query_rows_equal_full_product(n, T, alpha, seed, kind):
    layers = R.random_attention_layers(n, T, MASKS[kind](n), d=4, weight_norm=2.0, seed=seed)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: max(1, n // 3)]
    full = R.rollout(layers, residual=alpha)
    got = R.rollout_rows(layers, rows, residual=alpha)
    assert (got - full[rows]).abs().max() < 1e-6
    torch.testing.assert_close(got.sum(-1), torch.ones(len(rows), dtype=F64))


def test_query_rows_callable_source_descending_order():
    n, T, seen = 40, 6, []
    fn = R.iid_layer_fn(n, R.causal_mask(n), d=8, seed=2, dtype=F64)

    def source(t):
        seen.append(t)
        return fn(t)

    got = R.rollout_rows(source, [n - 1, 7], n_layers=T)
    assert seen == list(range(T - 1, -1, -1))  # last layer first (eq. 4)
    full = R.rollout([fn(t) for t in range(T)])
    assert (got - full[[n - 1, 7]]).abs().max() < 1e-6
    torch.testing.assert_close(fn(3), fn(3))  # each layer is rebuilt identically from its seed


def test_residual_convention():
    n = 8
    layers = R.random_attention_layers(n, 3, R.causal_mask(n), seed=6)
    torch.testing.assert_close(R.rollout(layers, residual=1.0), torch.eye(n, dtype=F64))
    mixed = [0.5 * torch.eye(n, dtype=F64) + 0.5 * a for a in layers]
    torch.testing.assert_close(R.rollout(layers, residual=0.5), R.rollout(mixed))


def test_rollout_errors():
    with pytest.raises(PosbiasError):
        R.rollout([])
    with pytest.raises(PosbiasError):
        R.rollout_rows(lambda t: torch.eye(3), [0])
    with pytest.raises(PosbiasError):
        R.rollout([torch.eye(3)], residual=1.5)


def test_core_never_imports_transformers():
    for path in (SRC / "rollout.py", SRC.parent / "analysis" / "theorems.py", SRC.parent / "analysis" / "theorems_pe.py"):
        tree = ast.parse(path.read_text())
        mods = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
        mods += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not any(m.split(".")[0] == "transformers" for m in mods), path
