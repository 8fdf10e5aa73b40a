"""One batch of the attention analysis: capture forward, accuracy through the task's engine, rollout.

For every (example, placement) row of a batch this yields one tidy row per layer: the attention mass that
the answer-producing query rows put on each item slot, on the gold item(s), on the first token and on the
rest (Pos2Distill Sec. 4, Fig. 7: attention over the documents as the gold moves), whether the model got
the row right, and optionally the real-model rollout of the last prompt token up to that layer
(emergence paper eq. 4, with the residual as identity A' = a I + (1 - a) A).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.rollout import iter_rollout
from ..methods import Active
from ..models.attention import layer_attentions, span_attention
from ..scoring.encode import Encoded, left_pad
from ..scoring.scorer import Scorer
from ..scoring.spans import Spans
from ..tasks import as_json, placement_key

ROWS = ("last", "answer")


@dataclass
class Item:
    """One row to measure: the encoded prompt (+ answers) and its token spans."""

    row: Encoded
    spans: Spans

    @property
    def gold(self) -> list[int]:
        p = placement_key(self.row.prompt.position)
        return list(p) if isinstance(p, tuple) else [p]


def _queries(items: list[Item], rows: str, width: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """(sequences, query columns [B, q], weights [B, q]) of a left-padded batch of width `width`.

    last: the last prompt token (it predicts the answer's first token). answer: that token and the
    teacher-forced gold answer tokens but the last, i.e. every column that predicts an answer token."""
    seqs = [it.spans.ids + (it.row.answer_ids[0] if rows == "answer" else []) for it in items]
    n_ans = [len(it.row.answer_ids[0]) if rows == "answer" else 0 for it in items]
    q = max(n_ans) if rows == "answer" else 1
    cols = torch.zeros(len(items), q, dtype=torch.long)
    weights = torch.zeros(len(items), q)
    for b, a in enumerate(n_ans):
        k = max(a, 1)
        first = width - 1 - a  # the last prompt column (left padding: sequences end in the last column)
        cols[b] = first
        cols[b, :k] = torch.arange(first, first + k)
        weights[b, :k] = 1.0 / k
    return seqs, cols, weights


def _span_table(items: list[Item], seqs: list[list[int]], width: int) -> torch.Tensor:
    """[B, width] span id of every column: the prompt's spans, answer tokens as OTHER, padding past all spans."""
    n_spans = items[0].spans.n_spans
    table = torch.full((len(items), width), n_spans, dtype=torch.long)
    for b, (it, seq) in enumerate(zip(items, seqs)):
        start = width - len(seq)
        spans = it.spans.span_of + [it.spans.other] * (len(seq) - len(it.spans.ids))
        table[b, start:] = torch.tensor(spans, dtype=torch.long)
    return table


@torch.inference_mode()
def capture_batch(loaded, items: list[Item], rows: str) -> torch.Tensor:
    """[B, L, H, n_spans] attention masses of the selected query rows, one left-padded forward (logits of
    the last column only)."""
    width = max(len(it.spans.ids) + (len(it.row.answer_ids[0]) if rows == "answer" else 0) for it in items)
    seqs, cols, weights = _queries(items, rows, width)
    batch = left_pad(seqs, loaded.tokenizer.pad_token_id)
    model, dev = loaded.model, loaded.device
    with span_attention(model) as cap:
        cap.set_batch(_span_table(items, seqs, width), items[0].spans.n_spans, cols, weights)
        model(**{k: v.to(dev) for k, v in batch.items()}, use_cache=False, logits_to_keep=1)
        masses = [cap.masses[layer] for layer in sorted(cap.masses)]
    return torch.stack(masses, dim=1)  # [B, L, H, S]


def rollout_masses(loaded, item: Item, residual: float) -> torch.Tensor:
    """[L, n_spans] span masses of the last prompt token's rollout row after layers 0..l (full attention:
    one eager forward of the prompt alone, float64)."""
    layers = layer_attentions(loaded.model, item.spans.ids)  # (L, N, N)
    span_of = torch.tensor(item.spans.span_of)
    out = []
    for p in iter_rollout(list(layers), residual=residual):  # p: (N, N) = P^(t)
        out.append(torch.zeros(item.spans.n_spans, dtype=torch.float64).index_add_(0, span_of, p[-1]))
    return torch.stack(out)


def _layer_row(base: dict, layer: int, m: torch.Tensor, gold: list[int], n: int, heads: bool) -> dict:
    """One tidy row from the [H, S] masses of one layer."""
    avg = m.double().mean(0)  # [S]
    row = {**base, "layer": layer, "items": [round(float(x), 7) for x in avg[:n]],
           "gold": float(avg[gold].sum()), "first": float(avg[n]), "other": float(avg[n + 1])}
    if heads:
        row["head_items"] = [[round(float(x), 7) for x in h[:n]] for h in m.double()]
        row["head_gold"] = [float(h[gold].sum()) for h in m.double()]
        row["head_first"] = [float(h[n]) for h in m.double()]
    return row


def measure_batch(scorer: Scorer, active: Active, items: list[Item], scale: float | None, rows: str, heads: bool,
                  rollout: float | None) -> list[dict]:
    """Tidy rows (one per item x layer) for one batch: capture, correctness, optional rollout (`rollout` = the
    residual weight a, or None for no rollout)."""
    masses = capture_batch(scorer.loaded, items, rows)  # [B, L, H, S]
    verdicts = scorer.engine.score(scorer, [it.row for it in items], active)
    out = []
    for it, m, v in zip(items, masses, verdicts):
        n = it.spans.n_items
        base = {"example_id": it.row.prompt.example_id, "position": as_json(it.row.prompt.position)}
        if scale is not None:
            base["scale"] = scale
        base["correct"] = bool(v["correct"])
        roll = rollout_masses(scorer.loaded, it, rollout) if rollout is not None else None
        for layer in range(m.shape[0]):
            row = _layer_row(base, layer, m[layer], it.gold, n, heads)
            if roll is not None:
                r = roll[layer]
                row.update({"rollout_items": [round(float(x), 7) for x in r[:n]], "rollout_gold": float(r[it.gold].sum()),
                            "rollout_first": float(r[n])})
            out.append(row)
    return out
