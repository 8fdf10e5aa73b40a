"""What a tokenizer's chat template adds to every prompt: its hash and its default system turn.

A run's record holds both (`template_settings`, in `Scorer.settings`), so two runs whose templates differ have
different fingerprints; `posbias show` (eval/show.py) prints the system turn beside the prompt.

The default system turn is found by rendering the template twice, without a generation prompt: once with only a
user message whose content is a sentinel ("\\x00"), once with a sentinel system message ("\\x01") before it. The
second rendering splits into the markup before a system text (`pre`) and the markup between it and the user text
(`mid`); if the user-only rendering reads `pre` + S + `mid` up to its user text, with S not empty, the template wrote
S as the system turn of its own (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."). A template without a
system role, or that writes no system turn when none is given, gives None; so does one that writes only fixed text
around any system message (Llama 3's dates), which the rendered prompt shows but this does not single out.
"""

from __future__ import annotations

import hashlib
import json

USER, SYSTEM = "\x00", "\x01"  # sentinels no task writes


def _render(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


def default_system(tokenizer) -> str | None:
    """The system turn text the chat template writes when a conversation has none (module docstring); None without."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    alone = _render(tokenizer, [{"role": "user", "content": USER}])
    try:
        both = _render(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    except Exception:  # a template without a system role raises (e.g. "System role not supported")
        return None
    if USER not in alone or SYSTEM not in both or USER not in both:
        return None
    head = alone[: alone.index(USER)]
    pre, mid = both[: both.index(SYSTEM)], both[both.index(SYSTEM) + 1 : both.index(USER)]
    if not mid or len(head) <= len(pre) + len(mid) or not (head.startswith(pre) and head.endswith(mid)):
        return None
    return head[len(pre) : len(head) - len(mid)]


def template_sha256(tokenizer) -> str | None:
    """sha256 (hex) of the tokenizer's chat template source; None without one."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)  # named templates: a dict
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def template_settings(tokenizer, chat: bool) -> dict:
    """{"template": {"sha256", "system"}} for a run's record when prompts go through the tokenizer's chat template;
    {} when they do not (chat off, or a chat-only server whose own template posbias cannot see)."""
    if not chat or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return {}
    return {"template": {"sha256": template_sha256(tokenizer), "system": default_system(tokenizer)}}
