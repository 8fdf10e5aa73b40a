"""One decoding rule on every path: greedy (argmax), whatever the model's own `generation_config` asks for.

transformers fills every generation setting that a call leaves unset (None) from `model.generation_config`:
a checkpoint's repetition_penalty, no_repeat_ngram_size, min_new_tokens, suppress_tokens, do_sample with
temperature / top_k / top_p, ... would then reshape the logits of the plain path's `generate`, while the
prefix-shared path and teacher forcing take the plain argmax. `neutral_generation_config` swaps the model's
config for one that holds only its special token ids while posbias generates, so nothing can be filled in;
`decoding_record` says, for a run's record, which of the model's settings were set aside.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# bookkeeping and output switches: they change no token choice
_INERT = {"transformers_version", "_from_model_config", "use_cache", "output_attentions", "output_hidden_states",
          "output_scores", "output_logits", "return_dict_in_generate", "max_length", "max_new_tokens", *_IDS}


def ignored_settings(model) -> dict:
    """The model's generation_config settings (non-default) that posbias's greedy decoding does not follow."""
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return {}
    return {k: v if isinstance(v, (str, int, float, bool, list, type(None))) else str(v)
            for k, v in sorted(gc.to_diff_dict().items()) if k not in _INERT}


def decoding_record(model) -> dict:
    """{"rule": "greedy"} and, if any, the model's own settings set aside ({"repetition_penalty": 1.3, ...})."""
    ignored = ignored_settings(model)
    return {"rule": "greedy", **({"model_generation_config_ignored": ignored} if ignored else {})}


@contextmanager
def neutral_generation_config(model) -> Iterator[None]:
    """Inside, `model.generation_config` holds the special token ids and nothing else (restored on exit)."""
    from transformers import GenerationConfig

    old = model.generation_config
    model.generation_config = GenerationConfig(**{k: getattr(old, k, None) for k in _IDS})
    try:
        yield
    finally:
        model.generation_config = old
