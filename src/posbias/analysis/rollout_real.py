"""Attention rollout on a real model for kv-lookup prompts (emergence paper, eq. 4).

For the last prompt token (the one that predicts the answer) we follow the rollout
P^(t) = A^(t) ... A^(0) through the layers, where A^(l) is layer l's attention
averaged over heads, and report how its mass splits over: the first token, the fact
list's beginning / middle / end thirds, the gold fact, and the rest (chat template,
instructions, question). Two variants: attention alone (residual = 0, the paper's
setting) and with the residual stream as identity, A' = 0.5 I + 0.5 A (Abnar &
Zuidema, 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.rollout import iter_rollout
from ..models.attention import layer_attentions
from ..models.load import Loaded
from ..runs import write_json_atomic
from ..scoring.spans import item_spans
from ..tasks.kv_lookup import KVLookup

SEGMENTS = ("first", "begin", "middle", "end", "gold", "other")
FILES = ("real_rollout.json", "real_rollout_depth.png", "real_rollout_gold.png")


@dataclass
class Spans:
    ids: list[int]
    segments: dict[str, list[int]]  # segment -> token indices


def kv_spans(loaded: Loaded, task: KVLookup, example, position: int, chat: bool) -> Spans:
    """Token indices of each segment of a kv-lookup prompt with the gold fact at `position` (the facts' token
    spans from scoring.spans, shared with the attention analysis)."""
    spans = item_spans(loaded.tokenizer, task.build(example, position), task.items(example, position), chat)
    fact_tokens = [spans.tokens(i) for i in range(spans.n_items)]
    f = spans.n_items
    third = [range(0, f // 3), range(f // 3, f - f // 3), range(f - f // 3, f)]
    seg = {name: sorted({t for i in rng for t in fact_tokens[i]}) for name, rng in zip(("begin", "middle", "end"), third)}
    seg["first"] = [0]
    seg["gold"] = fact_tokens[position]
    taken = set(seg["first"]) | {t for toks in fact_tokens for t in toks}
    seg["other"] = [k for k in range(len(spans.ids)) if k not in taken]
    return Spans(list(spans.ids), seg)


def _masses(layers: torch.Tensor, spans: Spans, residual: float) -> dict[str, list[float]]:
    """Mass of the last token's rollout row on each segment, at every depth."""
    out = {s: [] for s in SEGMENTS}
    for p in iter_rollout(list(layers), residual=residual):  # p: (N, N) = P^(t)
        row = p[-1]
        for s in SEGMENTS:
            out[s].append(float(row[spans.segments[s]].sum()))
    return out


def real_rollout(
    loaded: Loaded,
    facts: int = 10,
    positions: list[int] | None = None,
    n: int = 8,
    seed: int = 0,
    residuals: tuple[float, ...] = (0.0, 0.5),
) -> dict:
    """Rollout masses averaged over n kv-lookup examples, per residual, gold position and depth.

    Returns {"residual=<a>": {"<position>": {segment: [mass at depth 0..L-1]}}} plus metadata.
    """
    task = KVLookup(facts=facts)
    positions = positions if positions is not None else [0, facts // 2, facts - 1]
    chat = bool(getattr(loaded.tokenizer, "chat_template", None))
    acc: dict[str, dict[str, list[dict]]] = {f"residual={a}": {str(p): [] for p in positions} for a in residuals}
    for ex in task.examples(n, seed=seed):
        for p in positions:
            spans = kv_spans(loaded, task, ex, p, chat)
            layers = layer_attentions(loaded.model, spans.ids)  # (L, N, N)
            for a in residuals:
                acc[f"residual={a}"][str(p)].append(_masses(layers, spans, a))
    result = {
        key: {p: {s: np.mean([m[s] for m in runs], axis=0).tolist() for s in SEGMENTS} for p, runs in by_pos.items()}
        for key, by_pos in acc.items()
    }
    meta = {"model": loaded.info.get("name"), "facts": facts, "positions": positions, "n": n, "seed": seed,
            "query": "last prompt token", "heads": "averaged", "segments": list(SEGMENTS),
            "residual_convention": "A' = a*I + (1-a)*A; a=0 is attention alone (the paper's setting)"}
    return {"meta": meta, **result}


def run_real_rollout(loaded: Loaded, out_dir: Path | None, **kw) -> dict:
    """real_rollout, and with `out_dir` its figures and real_rollout.json (written atomically, last)."""
    result = real_rollout(loaded, **kw)
    if out_dir is None:
        return result
    from ..report.rollout_plots import plot_gold_by_position, plot_mass_by_depth

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    middle = str(result["meta"]["positions"][len(result["meta"]["positions"]) // 2])
    plot_mass_by_depth(result, middle, out_dir / FILES[1])
    plot_gold_by_position(result, out_dir / FILES[2])
    write_json_atomic(out_dir / FILES[0], result, indent=1)
    return result


def format_real(result: dict) -> list[str]:
    """One line per residual and gold position: first-token mass and the gold fact's share, first/last layer."""
    from ..report.rollout_plots import gold_share

    lines = []
    model = result["meta"]["model"]
    for key in (k for k in result if k.startswith("residual=")):
        for p, m in result[key].items():
            last = len(m["first"]) - 1
            lines.append(f"{model} {key} gold@{p}: first-token mass after 1/{last + 1} layers {m['first'][0]:.3f}/"
                         f"{m['first'][-1]:.3f}; gold share of facts {gold_share(m, 0):.3f}/{gold_share(m, last):.3f}")
    return lines
