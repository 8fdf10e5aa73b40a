"""The depth x length grid's configuration (eval/grid.py runs it): the sizes, depths and lengths it takes, each
checked without loading a model, and the task option a grid grows (`size_option`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PosbiasError
from ..methods import Method
from ..tasks import TASKS, Task, get_task
from .config import ModelChoice, Scoring, TaskChoice, check_split, config_dict, jsonable
from .longctx import depth_spacing, fill_list, parse_size

DEFAULT_DEPTHS = ",".join(f"{d}%" for d in range(0, 101, 10))
SIZES = "5,10,20,40,80"  # the default `sizes`; with `fill` any other is refused (fill sets the lengths)


@dataclass
class GridConfig(Scoring, TaskChoice, ModelChoice):
    """A depth x length grid: sweeps at several context sizes, the gold item at relative depths, one heatmap.

    sizes: context sizes, comma-separated, in the task's size option: kv-lookup facts, kv-uuid pairs, nq docs
        (10,20), niah tokens (1k = 1024: 1k,2k,4k).
    depths: depths of the gold item, comma-separated percents of the context: 0%,50%,100% (slot = round(d/100 *
        (size - 1)); niah: the sentence boundary nearest that share of the haystack's tokens); linear:N or
        sigmoid:N spaces N depths from 0% to 100% evenly or denser at both ends (NIAH's sigmoid).
    fill: niah: lengths as shares of the model's context window instead of `sizes`, comma-separated percents
        (25%,50%,100%; 100% leaves room for the answer).
    threshold: niah: the effective length is the longest length up to which every length's accuracy stays at least
        this share of the base (NoLiMa's 0.85), under two bases: NoLiMa's (the grid's own accuracy at its lengths
        <= 1k) and the needle alone (no haystack).
    n: examples per cell.
    seed: example selection / generation seed.
    skip: start offset in the seeded example order (disjoint splits).
    method: a training-free method: a spec (`posbias.METHODS`; docs/mitigations.md) or a Method object.
    engine, max_new_tokens, batch_tokens, max_batch, prefix_sharing, prefix_attention: see `Scoring`.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    sizes: str = SIZES
    depths: str = DEFAULT_DEPTHS
    n: int = 20
    seed: int = 0
    skip: int = 0
    method: str | Method = "none"
    fill: str | None = field(default=None, metadata={"record": "if set"})
    threshold: float | None = field(default=None, metadata={"record": "if set"})

    def validate(self) -> "GridConfig":
        self._validate_task()
        self._validate_model()
        self._validate_scoring()
        check_split(self.n, self.skip)
        option, allowed = size_option(self.task)
        if option in self.task_options:
            raise PosbiasError(f"the grid sets `{option}` itself (from `sizes`)", f"drop `{option}`, list the sizes in `sizes`")
        if (self.fill or self.threshold is not None) and option != "tokens":
            raise PosbiasError("`fill` and `threshold` are for lengths in tokens (task niah)", "drop them, or use `task=niah`")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise PosbiasError(f"`threshold` must be in (0, 1], got {self.threshold}", "use e.g. `threshold=0.85`")
        if self.fill and self.sizes != SIZES:  # one of them sets the lengths: the other would be ignored in silence
            raise PosbiasError(f"`fill` ({self.fill} of the model's window) and `sizes` ({self.sizes}) both set the "
                               "lengths", f"drop `sizes` to size them by the window, or drop `fill` to run "
                               f"`sizes={self.sizes}`")
        if self.fill:
            fill_list(self.fill)
            self.depth_list()
            return self
        sizes = self.size_list()
        if allowed is not None and any(s not in allowed for s in sizes):
            bad = ",".join(str(s) for s in sizes if s not in allowed)
            raise PosbiasError(f"{jsonable(self.task)} has no size {bad} (the shared data has {option} "
                               f"{' or '.join(map(str, allowed))})", f"use `sizes={','.join(map(str, allowed))}`")
        self.depth_list()
        return self

    def size_list(self) -> list[int]:
        """`sizes` as a list of distinct whole numbers >= 2, in the order given."""
        try:
            sizes = [parse_size(s.strip()) for s in self.sizes.split(",") if s.strip()]
        except ValueError:
            raise PosbiasError(f"bad `sizes` {self.sizes!r}",
                               "write comma-separated whole numbers, e.g. `sizes=5,10,20` (tokens: `sizes=1k,2k`)") from None
        if not sizes or min(sizes) < 2:
            raise PosbiasError(f"`sizes` must be whole numbers of at least 2, got {self.sizes!r}", "e.g. `sizes=5,10,20`")
        if len(set(sizes)) != len(sizes):
            raise PosbiasError(f"a size is listed twice in `sizes` {self.sizes}", "list each size once")
        return sizes

    def depth_list(self) -> list[float]:
        """`depths` as percents in 0..100 ('50%' or '50'), each once, in the order given."""
        out: list[float] = []
        spaced = depth_spacing(self.depths)
        for part in (p.strip() for p in (spaced or self.depths.split(",")) if p.strip()):
            try:
                d = float(part.removesuffix("%"))
            except ValueError:
                raise PosbiasError(f"bad depth {part!r} in `depths` {self.depths}",
                                   "write percents of the context, e.g. `depths=0%,50%,100%`") from None
            if not 0 <= d <= 100:
                raise PosbiasError(f"depth {part} is outside 0%..100%", "use depths between 0% and 100%")
            out.append(int(d) if d == int(d) else d)
        if not out:
            raise PosbiasError("no depths in `depths`", "e.g. `depths=0%,50%,100%`")
        if len(set(out)) != len(out):
            raise PosbiasError(f"a depth is listed twice in `depths` {self.depths}", "list each depth once")
        return out

    def to_dict(self) -> dict:
        return config_dict(self)


def size_option(task: str | Task) -> tuple[str, tuple[int, ...] | None]:
    """The task option that is the grid's size, and the sizes it allows (None: any), as the task's registration
    declares it (tasks/registry.py `size`); a clear error if none."""
    name = jsonable(task).partition(":")[0] if isinstance(task, str) else getattr(task, "name", str(task))
    entry = TASKS.get(name)
    if isinstance(task, Task) or entry is None or entry.size is None:
        has = ", ".join(f"{t} ({e.size[0]})" for t, e in TASKS.items() if e.size)
        why = "a depth grid grows the context of one gold item"
        if _kind(task) == "two-hop":
            raise PosbiasError(f"{name} is a two-hop task: {why}", f"use a task with a size: {has}")
        raise PosbiasError(f"task {name} has no size option to grow ({why})", f"use a task with a size: {has}")
    return entry.size


def _kind(task: str | Task) -> str | None:
    """The task's kind (Task.kind), for the refusal's reason; None where it cannot be built as it is written."""
    try:
        return (task if isinstance(task, Task) else get_task(jsonable(task))).kind
    except PosbiasError:
        return None
