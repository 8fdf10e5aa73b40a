"""A prompt rearranger: the items in reverse order (the model runs as it is)."""

from contextlib import contextmanager

from posbias import Active, Method, register_method
from posbias.methods.base import refuse_without_items
from posbias.tasks.arrange import arrange


@register_method
class Reverse(Method):
    """The prompt's items in reverse order (the example plugin's rearranger)."""

    name = "reverse"
    changes_model = False
    prefix_safe = True
    rearranges = True

    def config(self) -> dict:
        return {"name": self.name}

    def check_task(self, task, positions, engine) -> None:
        refuse_without_items(self, task)

    def rearrange(self, prompts, task, attention):
        return [arrange(p, list(range(len(p.items)))[::-1], task.slot_label) for p in prompts]

    @contextmanager
    def apply(self, loaded):
        yield Active()
