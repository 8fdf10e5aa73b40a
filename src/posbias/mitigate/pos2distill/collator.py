"""Tokenised training questions and the batch collator: teacher and student rows share one target.

A question becomes one teacher row (anchor prompt + target) and its student rows (each trivial
prompt + the same target, plus the anchor prompt + target for anchoring / ce_anchor). The target
token ids are computed ONCE per question, continuing the anchor prompt exactly as the eval
engines do (scoring/encode.py), and appended to every row, so teacher and student see identical
response tokens whatever the chat template. The collator pads all rows (left by default: every
row then ends with its target, as in the eval batches; right works too) with
position_ids = cumsum(mask) - 1 and gives, per row,

  index  [rows, R]  the column whose logits predict target token r (prompt_len - 1 + r + pad offset),
  mask   [rows, R]  True for real target tokens (questions in a batch may have different R),
  targets[rows, R]  the target token ids,

so `model(..., logits_to_keep=index)` (transformers' 2-D index form) returns logits [rows, R, V]
whose row r predicts target token r for teacher and student alike; only R << T positions are
projected onto the vocabulary, which keeps long-context training in memory.

Targets: the teacher's greedy response (Pos2Distill, SeqKD) or the task's canonical gold answer
(SFT, tokenised as teacher-forced scoring does), then the model's end-of-turn token so the
distribution after the response is distilled too and CE baselines learn to stop (the released
code appends EOS the same way).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.utils.data import Dataset

from ...errors import PosbiasError
from ...scoring.encode import encode, pad, render
from .data import record_prompts


def prompt_ids(tokenizer, prompt, chat: bool) -> list[int]:
    """The prompt's token ids exactly as the eval engines build them."""
    return encode(tokenizer, replace(prompt, answers=()), chat).prompt_ids


def response_ids(tokenizer, prompt, chat: bool, response: str, ids: list[int]) -> list[int]:
    """Token ids of a generated `response` continuing the prompt (whose ids are `ids`), no separator."""
    if not response:
        return []
    special = not chat
    full = tokenizer(render(tokenizer, prompt, chat) + response, add_special_tokens=special)["input_ids"]
    if full[: len(ids)] == ids and len(full) > len(ids):
        return full[len(ids):]
    return tokenizer(response, add_special_tokens=False)["input_ids"]  # merged with the prompt's last token


def _bin(position) -> int:
    """An integer id of a placement (the alignment bins of Sec. 4.2): the slot, or 1000 i + j for a pair."""
    return position if isinstance(position, int) else 1000 * position[0] + position[1]


class QuestionData(Dataset):
    """Records of data.py, tokenised once. Item = one question (teacher row + student rows).

    target: 'response' (Pos2Distill, SeqKD) or 'gold' (SFT). with_anchor adds the anchor prompt as a
    student row (anchoring loss; CE on the anchor copy). end_id: appended to every target (None: nothing).
    """

    def __init__(self, records: list[dict], tokenizer, chat: bool, target: str = "response",
                 with_anchor: bool = True, end_id: int | None = None, window: int | None = None):
        if target not in ("response", "gold"):
            raise PosbiasError(f"unknown target {target!r}", "use response or gold")
        self.items = [self._item(r, tokenizer, chat, target, with_anchor, end_id) for r in records]
        if window is not None:
            self._check_window(window)

    @staticmethod
    def _item(rec: dict, tok, chat: bool, target: str, with_anchor: bool, end_id: int | None) -> dict:
        prompts = record_prompts(rec)
        anchor, trivial = prompts[0], prompts[1:]
        a_ids = prompt_ids(tok, anchor, chat)
        if target == "gold":  # the gold answer as the task writes a correct response ("The answer is: X" for reasoning)
            gold = rec.get("gold_target", rec["answers"][0])
            tgt = encode(tok, replace(anchor, answers=(gold,)), chat).answer_ids[0]
        else:
            tgt = response_ids(tok, anchor, chat, rec["response"], a_ids)
        tgt = list(tgt) + ([end_id] if end_id is not None else [])
        if not tgt:
            raise PosbiasError(f"question {rec['example_id']} has an empty target", "keep an end token (eos) or drop it")
        students = [prompt_ids(tok, p, chat) for p in trivial] + ([a_ids] if with_anchor else [])
        positions = [_bin(p.position) for p in trivial] + ([_bin(anchor.position)] if with_anchor else [])
        return {"teacher": a_ids, "students": students, "positions": positions,
                "anchor": [False] * len(trivial) + ([True] if with_anchor else []), "target": tgt}

    def _check_window(self, window: int) -> None:
        for it in self.items:
            need = max(len(s) for s in [it["teacher"], *it["students"]]) + len(it["target"])
            if need > window:
                raise PosbiasError(f"a training sequence needs {need} tokens but the context window is {window}",
                                   "use fewer facts/documents, a lower `max_new_tokens`, or a longer-context model")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def pad_rows(prompts: list[list[int]], targets: list[list[int]], pad_id: int, side: str, width_r: int) -> dict:
    """Rows prompt + target, padded; with index/mask/targets [rows, width_r] (see the module docstring)."""
    seqs = [p + t for p, t in zip(prompts, targets)]
    batch = pad(seqs, pad_id, side)
    w = batch["input_ids"].shape[1]
    n = len(seqs)
    index = torch.zeros((n, width_r), dtype=torch.long)
    mask = torch.zeros((n, width_r), dtype=torch.bool)
    tgt = torch.full((n, width_r), pad_id, dtype=torch.long)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        if not p:
            raise PosbiasError("a training prompt is empty", "check the task's prompts")
        offset = w - len(seqs[i]) if side == "left" else 0
        cols = offset + len(p) - 1 + torch.arange(len(t))
        index[i, : len(t)] = cols
        index[i, len(t):] = cols[-1]  # padding slots repeat a real column; the mask drops them
        mask[i, : len(t)] = True
        tgt[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    return {**batch, "index": index, "mask": mask, "targets": tgt}


class Collator:
    """Items of QuestionData -> teacher tensors t_* [Q, ...] and student tensors s_* [S, ...].

    s_teacher[s] is the teacher row (question) of student row s, s_position its gold slot (the
    alignment bin), s_anchor whether it is the anchor copy.
    """

    def __init__(self, pad_id: int, side: str = "left"):
        if side not in ("left", "right"):
            raise PosbiasError(f"unknown padding side {side!r}", "use left or right")
        self.pad_id, self.side = pad_id, side

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        width_r = max(len(it["target"]) for it in items)
        t = pad_rows([it["teacher"] for it in items], [it["target"] for it in items], self.pad_id, self.side, width_r)
        s_prompts, s_targets, owner, positions, anchor = [], [], [], [], []
        for q, it in enumerate(items):
            for ids, pos, is_anchor in zip(it["students"], it["positions"], it["anchor"]):
                s_prompts.append(ids)
                s_targets.append(it["target"])
                owner.append(q)
                positions.append(pos)
                anchor.append(is_anchor)
        s = pad_rows(s_prompts, s_targets, self.pad_id, self.side, width_r)
        out = {f"t_{k}": v for k, v in t.items()}
        out.update({f"s_{k}": v for k, v in s.items()})
        out["s_teacher"] = torch.tensor(owner, dtype=torch.long)
        out["s_position"] = torch.tensor(positions, dtype=torch.long)
        out["s_anchor"] = torch.tensor(anchor, dtype=torch.bool)
        return out
