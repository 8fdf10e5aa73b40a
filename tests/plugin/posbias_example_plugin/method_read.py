"""A reading: each row read twice, with the method on and on the unmodified model, kept as read the first time."""

from contextlib import contextmanager

from posbias import Active, Method, register_method
from posbias.tasks import placement_key


@register_method
class Twice(Method):
    """Each row read twice; records whether the second reading agrees (the example plugin's read stage)."""

    name = "twice"
    changes_model = False
    prefix_safe = True
    passes = 2

    def config(self) -> dict:
        return {"name": self.name}

    @contextmanager
    def apply(self, loaded):
        yield Active()

    def read(self, reader, rows, done, on_batch):
        by_key, out = {r.key: r for r in rows}, []

        def again(batch):
            second = reader.read_unmodified([by_key[(b["example_id"], placement_key(b["position"]))].prompt for b in batch])
            for b, s in zip(batch, second):
                b["agrees"] = s.get("prediction") == b.get("prediction")
            out.extend(batch)
            if on_batch:
                on_batch(batch)

        reader.read(rows, done, again)
        return out
