"""A model change: the output logits divided by a temperature while the method is on (a forward hook, removed after)."""

from contextlib import contextmanager

from posbias import Active, Method, register_method


@register_method
class Temper(Method):
    """Logits divided by T (the example plugin's model change): greedy answers stay, log-probabilities soften."""

    name = "temper"
    usage = "temper[:T]"
    example = "temper:2"
    prefix_safe = True  # per-token, independent of the rest of the prompt

    def __init__(self, t: float = 2.0):
        self.t = float(t)

    @classmethod
    def from_spec(cls, arg: str) -> "Temper":
        return cls(float(arg)) if arg else cls()

    def config(self) -> dict:
        return {"name": self.name, "t": self.t}

    @contextmanager
    def apply(self, loaded):
        head = loaded.model.get_output_embeddings()
        handle = head.register_forward_hook(lambda module, args, out: out / self.t)
        try:
            yield Active()
        finally:
            handle.remove()
