"""The one interface every training-free mitigation shares.

A Method describes itself as JSON (`config`, part of a sweep's fingerprint, so a resumed sweep
cannot silently mix methods) and is applied to a loaded model as a reversible context manager:
inside `with method.apply(loaded) as active:` the model is mitigated, after it the model is
exactly as before. `active` (an `Active`) carries the callbacks the scoring engines make while
the method is on; a method that needs none yields the default, which does nothing.

Methods are registered by name (methods/registry.py) and built from spec strings: a short form such
as `pi:1.2` through their `from_spec` class method, or the generic `pi:factor=1.2` (posbias/specs.py)
through `from_params`, whose keys are the constructor's parameters unless a class says otherwise; a
user's own subclass can be registered, or passed to `run_sweep` / `run_compare` as an object.

Stages. Every pipeline calls each stage of every method, and the defaults do nothing, so a method of any kind is one
class that overrides the stages it needs (no pipeline asks what kind a method is):

    check_task / check / check_info   refuse, in one line, what it cannot run on (before anything is written)
    rearrange(prompts, task, attention)   the prompts as the model sees them (reordering; `rearranges` True)
    apply(loaded)                     the model while the method is on (a reversible context manager)
    read(view, rows, done, on_batch)    how each row is read: once (default) or under several orders (ensemble);
                                      `passes` reads per row, for the cost estimate
    calibration(n) / decide(rows, calibration, k)   held-out items to calibrate on and the verdict from every
                                      order's row (the order decision rules); default: none, the rows as read

A method sees the Scorer only through `ReadView`, a narrow view (scoring/scorer.py implements it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, ClassVar, Iterator, Protocol

from ..errors import PosbiasError
from ..models.load import Loaded
from ..specs import Param, parameters
from ..tasks import Prompt, Task


class Active:
    """Yielded by `Method.apply` while the method is on; the engines call these hooks (no-ops here)."""

    def set_prompt_end(self, cols) -> None:
        """Before a teacher-forced forward of prompt + answer: cols[i] is the column of row i's last
        prompt token (an input-dependent method such as Ms-PoE measures there, as generation would)."""

    def set_rows(self, rows, view: "HookView | None" = None) -> None:
        """Before each batch is scored: the batch's rows (scoring.encode.Encoded) and what the Scorer can say about their
        prompts (`HookView`), for a method that reads them (attention calibration measures each item first)."""


class HookView(Protocol):
    """What a method's active hooks (`Active.set_rows`) may ask of the Scorer about a batch's prompts."""

    task: Task
    chat: Any  # the chat setting the prompts are encoded with

    def item_attention(self, prompts: list[Prompt]) -> list[list[float]]:
        """Each item's attention from the last prompt token, on the model as it is (scoring/relevance.py)."""

    def item_spans(self, prompt: Prompt) -> Any:
        """Which prompt tokens belong to each item, as the Scorer encodes the prompt (scoring/spans.py)."""


class ReadView(Protocol):
    """What a method's `read` stage may ask of the Scorer."""

    task: Task

    def read(self, rows: list, done: set, on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        """Each row not in `done` read once with the method on (the default reading): one result dict per row."""

    def read_unmodified(self, prompts: list[Prompt]) -> list[dict]:
        """The prompts encoded, checked against the window and read once each on the unmodified model: one result
        dict per prompt, in the prompts' order (an order ensemble reads its orders so)."""


class Method(ABC):
    """A training-free mitigation. Subclasses set `name` and `usage`, implement `config` and `apply`,
    and parse their spec argument in `from_spec` (the part after `name:`)."""

    name: ClassVar[str]
    usage: ClassVar[str] = ""  # the spec forms, e.g. "pi:FACTOR|pi:FACTORS.json"
    example: ClassVar[str | None] = None  # a spec that runs on any model, for the conformance suites (None: the name)
    spec: str | None = None  # the spec string it was built from (set by get_method)
    # the examples it was fitted on ({"task", "seed", "skip", "n"}, e.g. an LPES search split):
    # compare refuses to report it on those examples
    fitted_on: dict | None = None
    # Prefix sharing (scoring/prefix.py) reuses the keys/values of a prompt prefix computed once for several prompts:
    # exact only for a method that treats each position independently of the rest of the prompt (RoPE scaling by
    # position: none, pi, layers, lpes). Others run the plain path; prefix_note says why, in the run's record.
    prefix_safe: ClassVar[bool] = False
    changes_model: ClassVar[bool] = True  # False: the model runs as it is (none, the order decision rules), served too
    prefix_note: ClassVar[str] = "not declared prefix-safe"
    rearranges: ClassVar[bool] = False  # True: `rearrange` rewrites the prompts before they are scored (reordering)
    reads_attention: bool = False  # True: it measures the model's attention in process (not on a served model)
    passes: int = 1  # forward passes (reads) per row, for the cost estimate (an order ensemble: its K orders)
    # True: its rows are the unmodified model's, read in every order (the order decision rules), so compare hands it
    # the `none` entry's rows instead of reading them again
    reuses_unmodified: ClassVar[bool] = False

    @classmethod
    def from_spec(cls, arg: str) -> "Method":
        """The method for `name:arg` in the class's own short form (arg may be empty); `name:key=value,...` goes to
        `from_params` instead (methods/registry.py)."""
        if arg:
            raise PosbiasError(f"method {cls.name} takes no argument, got {arg!r}", f"write it as {cls.usage or cls.name}")
        return cls()

    @classmethod
    def from_params(cls, **params) -> "Method":
        """The method for `name:key=value,...`: by default the constructor. A class whose constructor takes more than
        a user writes (a file's contents, bookkeeping) overrides this with the keys it accepts as parameters."""
        return cls(**params)

    @classmethod
    def spec_params(cls) -> dict[str, Param]:
        """The keys of the key=value form, with their types: the parameters of `from_params`, or of the constructor
        where `from_params` is not overridden."""
        own = cls.from_params.__func__ is not Method.from_params.__func__  # type: ignore[attr-defined]
        return parameters(cls.from_params if own else cls.__init__)

    @classmethod
    def pairs_form(cls) -> str:
        """The key=value form, for help and errors: `pi:factor=..,source=..` (the name alone: no keys)."""
        keys = cls.spec_params()
        return f"{cls.name}:" + ",".join(f"{k}=.." for k in keys) if keys else cls.name

    @classmethod
    def spec_forms(cls) -> str:
        """Every spec form: the short ones (`usage`), then the key=value one."""
        short, generic = cls.usage or cls.name, cls.pairs_form()
        return short if generic == cls.name else f"{short}|{generic}"

    @abstractmethod
    def config(self) -> dict:
        """JSON-able description (name and every parameter)."""

    def for_task(self, task: Task) -> "Method":
        """The method as it runs on `task`: self, or a resolved copy for a method whose default depends on the
        task (Attention Buckets' base list). Every pipeline calls it once, before it fingerprints the run, so
        config() and run.json record what actually runs; calling it again on the result returns that result."""
        return self

    def check(self, loaded: Loaded) -> None:
        """Raise PosbiasError if the method cannot be applied to this model (called before a run writes anything)."""
        return  # any model

    def batch_keys(self, rows: list, view: "HookView") -> list | None:
        """A key per row (scoring.encode.Encoded) that the rows of a padded batch share, with their length, so that a
        row's computation does not depend on which rows share its batch; None: rows batch freely (PINE: its key
        blocks take their sizes from the batch, and padding moves the keys)."""
        return None

    def check_info(self, info: dict) -> None:
        """Raise PosbiasError if the method cannot run on the model `info` describes (a served model's record; in
        process `check` gets the loaded model and may call this)."""
        return  # any model

    def check_task(self, task: Task, positions: list, engine: str) -> None:
        """Raise PosbiasError, in one line, if the method cannot run on this task, these placements and this scoring
        engine (called before any model loads; the conformance matrix, tests/test_conformance.py, expects every
        other combination to run)."""
        return  # any task

    def rearrange(self, prompts: list[Prompt], task: Task, attention: Callable | None) -> list[Prompt]:
        """The prompts as this method presents them to the model (a reordering method moves their items); each keeps
        its example id and position. attention(prompts) -> per prompt, the attention each item receives (the
        Scorer's measurement; None on a served model). Called only when `rearranges` is True."""
        return prompts

    @abstractmethod
    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        """Context manager: the model is mitigated inside, restored exactly on exit; yields an Active."""

    def read(self, view: ReadView, rows: list, done: set, on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        """The result dicts of the rows not in `done` (on_batch called with each batch of them as it is scored):
        by default each row read once with the method on."""
        return view.read(rows, done, on_batch)

    def calibration(self, n: int) -> int:
        """How many held-out calibration items a run of n evaluated items takes (read in every order after them)."""
        return 0

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict | None]:
        """(the evaluated rows as this method answers them, a record of how it decided or None); `calibration` holds
        the calibration items' rows, k the orders per item. By default the rows as read."""
        return rows, None

    @property
    def label(self) -> str:
        return self.name

    @property
    def key(self) -> str:
        """A stable short name: the spec it came from, else its label."""
        return self.spec or self.label

    def as_plain(self) -> Any:
        """The method in a config written as JSON: its key."""
        return self.key


@contextmanager
def active_while(cm: AbstractContextManager) -> Iterator[Active]:
    """Run a model-side context manager (models/) and yield a plain Active for its duration."""
    with cm:
        yield Active()


class Baseline(Method):
    """The unmodified model."""

    name = "none"
    usage = "none"
    prefix_safe = True
    changes_model = False

    def config(self) -> dict:
        return {"name": "none"}

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        yield Active()


def refuse_without_items(method: Method, task: Task) -> None:
    """Refuse, in one line, a method that moves or measures the items of a task whose prompts list none (a haystack)."""
    if not getattr(task, "lists_items", True):
        raise PosbiasError(f"{method.key} moves or measures the prompt's items, and {task.name} lists none (its slots "
                           "are depths in one text)", "use a task with items: kv-lookup, kv-uuid, nq, jsonl:PATH")
