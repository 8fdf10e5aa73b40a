"""The in-process backend: a transformers model loaded by posbias (models/load.py).

Everything posbias does to a model runs here: training-free methods (hooks on the module), prefix sharing (the
Scorer's), attention capture, training. The Scorer plans padded batches and the protocols run them
(scoring/teacher_forced.py, scoring/generate.py) on `loaded`.
"""

from __future__ import annotations

from ..models.load import Loaded, load_model
from .base import Backend, Capabilities

CAPS = Capabilities(prompt_logprobs=True, token_prompts=True, methods=True, prefix_sharing=True, batching="padded",
                    teacher_forcing="forward")


class HFBackend(Backend):
    name = "hf"
    description = "in process with transformers: methods, prefix sharing, hooks"

    def __init__(self, loaded: Loaded):
        self.loaded = loaded
        self.caps = CAPS
        self.tokenizer = loaded.tokenizer
        self.info = loaded.info  # as before backends existed: the fingerprints of in-process runs are unchanged

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        return CAPS

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "HFBackend":
        return cls(load_model(args["model"], dtype, device, progress, device_map))

    def check_method(self, method) -> None:
        method.check(self.loaded)

    def settings(self) -> dict:
        """How the model's attention reads grouped heads (models/compat.py): the stock arithmetic, recorded."""
        from ..models.compat import attention_record

        impl = getattr(self.loaded.model.config, "_attn_implementation", None)
        return {"attention": impl, **(attention_record() if impl == "sdpa" else {})}

    def decoding(self) -> dict:
        from ..models.decoding import decoding_record

        return decoding_record(self.loaded.model)
