"""Prompt -> token ids, and padded batches with correct position ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import PosbiasError
from ..tasks.base import Prompt

BATCH_TOKENS, MAX_BATCH = 16384, 32  # the default batch: padded tokens, and rows at most


@dataclass
class Encoded:
    """One (example, position) row, tokenised.

    answer_ids[k] continues prompt_ids with the k-th accepted answer; both engines
    start after prompt_ids (which ends with the task's answer prefix). option_ids: an order task's option
    labels, each as the one token that continues the prompt (in slot order; empty for other tasks).
    """

    prompt: Prompt
    prompt_ids: list[int]
    answer_ids: list[list[int]]
    option_ids: list[int] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt.example_id, self.prompt.position)


def render(tokenizer, prompt: Prompt, chat: bool) -> str:
    """Prompt text as the model sees it: chat template (if used) plus the answer prefix."""
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.user}], tokenize=False, add_generation_prompt=True
        )
        return text + prompt.answer_prefix
    return prompt.user + ("\n" + prompt.answer_prefix if prompt.answer_prefix else "")


def encode(tokenizer, prompt: Prompt, chat: bool, continuation: bool = False, options: bool = True) -> Encoded:
    """Token ids of the prompt and of each answer after it. An answer is joined with a space unless the prompt
    ends with white space; continuation=True joins it as it is (a response the model generated from the prompt,
    which carries its own leading space). tokenizer None (a chat-only server): no ids, the prompt travels as text.
    options: an order task's labels become option_ids (teacher forcing scores them; generation reads text)."""
    if tokenizer is None:
        return Encoded(prompt, [], [[] for _ in dict.fromkeys(prompt.answers)])
    text = render(tokenizer, prompt, chat)
    # Chat templates write their own special tokens (BOS included where the model uses one).
    special = not chat
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    sep = "" if (continuation or not text or text[-1].isspace()) else " "

    def after(ans: str) -> list[int]:
        full = tokenizer(text + sep + ans, add_special_tokens=special)["input_ids"]
        if full[: len(ids)] == ids and len(full) > len(ids):
            return full[len(ids) :]
        return tokenizer(sep + ans, add_special_tokens=False)["input_ids"]  # merged with the prompt's last token

    if prompt.options and options and prompt.verdict_head:  # the labels where a judge template's pattern puts them
        text += ("" if not text or text[-1].isspace() else " ") + prompt.verdict_head
        ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        sep = ""
    if prompt.options and options:  # an order task scored by its labels: their shared leading tokens join the prompt
        common, options = option_tokens(prompt.options, after)
        return Encoded(prompt, ids + common, [[options[prompt.options.index(prompt.answers[0])]]], options)
    answers = [after(ans) for ans in dict.fromkeys(prompt.answers)]  # de-duplicated, order kept
    return Encoded(prompt, ids, answers)


def option_tokens(labels: tuple[str, ...], after) -> tuple[list[int], list[int]]:
    """(the tokens every option label starts with, the one token that then tells each label apart): the labels
    are scored by one next-token distribution, so a label that needs more than one token after the shared ones,
    or two labels with the same token, are refused."""
    toks = [after(label) for label in labels]
    n = 0
    while all(len(t) > n + 1 for t in toks) and len({t[n] for t in toks}) == 1:
        n += 1
    long = next((label for label, t in zip(labels, toks) if len(t) != n + 1 or t[:n] != toks[0][:n]), None)
    if long is not None:
        raise PosbiasError(f"option label {long!r} is several tokens for this tokenizer, and teacher forcing scores one "
                           "next token per label", "use `labels=letters` or `labels=digits`, or `engine=generate`")
    last = [t[n] for t in toks]
    clash = next(((a, b) for i, a in enumerate(labels) for b in labels[i + 1:]
                  if last[i] == last[labels.index(b)]), None)
    if clash:
        raise PosbiasError(f"option labels {clash[0]!r} and {clash[1]!r} are the same token for this tokenizer",
                           "give the options distinct labels, e.g. `labels=letters`")
    return toks[0][:n], last


def pad(seqs: list[list[int]], pad_id: int, side: str = "left") -> dict[str, torch.Tensor]:
    """Padded input_ids/attention_mask with position_ids = cumsum(mask) - 1.

    Plain model(...) would use arange positions and shift every left-padded row; see
    docs/sweep.md. Left padding keeps every row's last token in the last column.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols] = torch.tensor(s, dtype=torch.long)
        mask[i, cols] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}


def left_pad(seqs: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    return pad(seqs, pad_id, "left")


def right_pad(seqs: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch (used by tests to check padding-side invariance)."""
    return pad(seqs, pad_id, "right")


def plan_batches(lengths: list[int], max_tokens: int, max_rows: int, groups: list | None = None) -> list[list[int]]:
    """Group row indices into batches, longest first, within a padded-token budget; given `groups` (a key per row), a
    batch holds one group's rows only (methods/base.py, `batch_keys`).

    Deterministic in its input, so a resumed sweep recomputes the very same batches.
    """
    if groups is not None:
        members: dict = {}
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            members.setdefault(groups[i], []).append(i)
        return [[idx[j] for j in b] for idx in members.values()
                for b in plan_batches([lengths[i] for i in idx], max_tokens, max_rows)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # first row is the longest
        if cur and ((len(cur) + 1) * width > max_tokens or len(cur) >= max_rows):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches
