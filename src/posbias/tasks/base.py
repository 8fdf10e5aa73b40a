"""Position-controlled tasks: the same example content at every position, only the gold moved."""

from __future__ import annotations

import gzip
import json
import random
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ..core.order import parse_choice
from ..errors import PosbiasError
from .placement import Placement, positions_spec, resolve_positions


@dataclass(frozen=True)
class Prompt:
    """What a task gives the scorer for one (example, gold position).

    user: the user-turn text (the whole prompt for models without a chat template);
    answer_prefix: text the assistant turn starts with (may be empty), after which
    both scoring engines continue; answers: accepted gold answers (first = canonical).
    options: an order task's option labels in slot order (tasks/order.py; empty elsewhere): the model picks
    one, and the gold answer is the label of the slot the correct candidate sits in.
    items: the item texts in slot order, verbatim as they appear in `user` (`Task.prompt` fills them where the
    task lists its items): what reordering and attention calibration rearrange or measure (tasks/arrange.py).
    meta: facts about this prompt a row records beside its score (a haystack's true needle depths and length).
    verdict_head: text the labels follow when teacher forcing scores them (a judge template's verdict pattern before
    {label}, "[[" for "[[{label}]]"): encode puts it after the answer prefix; generation does not see it.
    option_rank: each slot's label's place in the label set, where the labels go with their candidates (tasks/order.py,
    bind=candidate): equal scores fall to the label first in the set, not to the slot first shown (`tie_rank`).
    """

    example_id: str
    position: Placement  # a slot, or (first hop, second hop) for two-hop tasks
    user: str
    answer_prefix: str
    answers: tuple[str, ...]
    options: tuple[str, ...] = ()
    items: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    verdict_head: str = ""
    option_rank: tuple[int, ...] = ()

    def tie_rank(self, slot: int) -> int:
        """Where option `slot` stands when scores tie (lower first): its label's place in the label set, else the
        slot itself."""
        return self.option_rank[slot] if self.option_rank else slot


@dataclass(frozen=True)
class Doc:
    title: str
    text: str


class Task(ABC):
    """A family of examples with `n_slots` item slots, the gold item (or the two hops) movable to any slot.

    Subclasses set `name`, `metric` (a key of core.metrics.METRICS), `default_engine`,
    `max_new_tokens`, and implement `n_slots`, `pool_size`, `_example` and `build`. Two-hop
    tasks (tasks/twohop.py) place a pair of items and override `placements`.
    """

    name: str
    metric: str = "substring"
    default_engine: str = "teacher-forced"
    max_new_tokens: int = 16
    n_gold: int = 1  # gold items an example places: 1 (retrieval) or 2 (two-hop reasoning)
    order: bool = False  # an order task (judge, multiple choice): its slots are the candidates' order (tasks/order.py)
    lists_items: bool = True  # Prompt.items holds the items (False: a haystack, whose slots are depths in a text)
    multiline: bool = False  # generation goes on past a newline (a chain of thought) instead of stopping there
    also: tuple[str, ...] = ()  # further metrics scored beside `metric` (keys of core.metrics.METRICS)
    default_positions: str = "all"
    # the items are documents (retrieved passages: nq, musique, every jsonl file, whose schema holds "documents"),
    # not generated facts or key-value pairs; methods with a document-QA setting read it (Attention Buckets' RAG bases)
    documents: bool = False
    chance: float = 0.0  # accuracy by guessing (a free answer: 0; an order task: one over its options)
    score_name: str = "accuracy"  # what the curve measures (a judge file without "preferred": how often answers[0] wins)
    # tasks/arrange.py: a slot's fixed label at the start of each item (it stays in its slot when items move), and
    # the body of the content-free item that attention calibration puts in a slot to measure its positional prior
    slot_label: str | None = None  # a regex, e.g. r"Document \[\d+\]"
    dummy: str = "This line holds no information."
    shrink: str = "fewer facts/documents/pairs"  # how a prompt over the context window is made shorter
    inputs: tuple[Path, ...] = ()  # the data files (or folders) the task read: a run records each with its SHA-256

    def generation_limit(self, count_tokens) -> tuple[int, str | None]:
        """(the default max_new_tokens of generation on this task, how it was derived or None for the task's fixed
        default); count_tokens(text) -> the model's token count of an answer, for a task that derives its limit
        from its data (a user's QA file)."""
        return self.max_new_tokens, None

    def bind_tokens(self, prompt_tokens: Callable[[Prompt], int] | None, text_tokens: Callable | None) -> None:
        """The Scorer hands over the model's token counters (a whole prompt after the template; a list of texts),
        None without a tokenizer: a task that sizes its prompts in tokens (tasks/haystack.py) keeps them."""

    def check_engine(self, engine: str) -> None:
        """Refuse (one line) a scoring protocol this task cannot be scored with; most take both."""

    def read_choice(self, text: str, labels: tuple[str, ...]) -> int:
        """The slot a generated verdict names (an order task; -1: none, -2: a tie): core.order.parse_choice, or the
        verdict pattern of a judge template (OrderTask)."""
        return parse_choice(text, labels)

    def gold_target(self, prompt: Prompt) -> str:
        """The gold answer as a response the task scores correct (what SFT trains on)."""
        return prompt.answers[0]

    def advantageous(self) -> Placement:
        """The placement the model does best at, by the paper's account: the sink, slot 0 (Sec. 4.2)."""
        return 0

    def all_placements(self) -> list[Placement]:
        """Every placement: each slot."""
        return list(range(self.n_slots))

    def placements(self, spec: str | list | int | None) -> list[Placement]:
        """The placements a positions spec names (module tasks/placement.py; a list of slots too); None: the
        task's default."""
        spec = positions_spec(spec)
        return resolve_positions(self.default_positions if spec is None else spec, self.n_slots)

    @property
    @abstractmethod
    def n_slots(self) -> int: ...

    @property
    @abstractmethod
    def pool_size(self) -> int | None:
        """How many distinct examples exist (None: unlimited, generated)."""

    @abstractmethod
    def _example(self, index: int) -> Any:
        """The example content with pool index `index` (position-free)."""

    @abstractmethod
    def build(self, example: Any, position: Placement) -> Prompt:
        """The prompt with the gold item at slot `position` (two-hop: the hops at (i, j)); everything else unchanged."""

    def prompt(self, example: Any, position: Placement) -> Prompt:
        """`build(example, position)` with its items attached (`Prompt.items`) where the task lists them."""
        p = self.build(example, position)
        try:
            items = self.items(example, position)
        except PosbiasError:
            return p
        return replace(p, items=tuple(items))

    def items(self, example: Any, position: Placement) -> list[str]:
        """The texts of the n_slots items (facts / documents / pairs) in prompt order, each exactly as it appears in
        `build(example, position).user` (what the attention analysis maps to token spans)."""
        raise PosbiasError(f"task {self.name} does not list its items (Task.items)",
                           "implement `items(example, position)` for it, or use kv-lookup, kv-uuid, nq, kv-2hop, musique")

    def config(self) -> dict:
        return {"name": self.name, "n_slots": self.n_slots, "metric": self.metric}

    @property
    def kind(self) -> str:
        """What a slot means, for the records (sweep.json `task_kind`) and those who read them (policy.py): "order"
        (the candidates' order), "two-hop" (a pair of gold items placed), "depth" (a depth in one text: a haystack,
        whose prompts list no items), or "one-gold"."""
        return ("order" if self.order else "two-hop" if self.n_gold == 2 else "depth" if not self.lists_items
                else "one-gold")

    def as_plain(self) -> str:
        """The task in a config written as JSON: its name."""
        return self.name

    def examples(self, n: int, seed: int = 0, skip: int = 0) -> list[Any]:
        """n examples from offset `skip` (disjoint splits): a seeded permutation of the pool, or for a generated
        task (no pool) the examples numbered base + skip.. with base drawn from the seed, so another seed gives
        other content."""
        pool = self.pool_size
        if pool is None:
            base = random.Random(f"{self.name}-order/{seed}").randrange(10**9)
            return [self._example(base + i) for i in range(skip, skip + n)]
        if skip + n > pool:
            fix = (f"use `n={pool - skip}` or fewer" if skip < pool else f"use `skip={pool - n}` or less" if n <= pool
                   else f"use `skip=0` with `n={pool}`")
            raise PosbiasError(f"task {self.name} has {pool} examples but {skip + n} were asked for (`skip={skip}`, `n={n}`)",
                               fix)
        order = list(range(pool))
        random.Random(seed).shuffle(order)
        return [self._example(i) for i in order[skip : skip + n]]


class FactsTask(Task):
    """A generated task with one slot per fact (`self.facts`) and no fixed pool: example i is drawn from the seed."""

    facts: int

    @property
    def n_slots(self) -> int:
        return self.facts

    @property
    def pool_size(self) -> None:
        return None


class RecordsTask(Task):
    """A task over a fixed list of position-free records (a data file), `_n_slots` items each."""

    _records: list
    _n_slots: int

    @property
    def n_slots(self) -> int:
        return self._n_slots

    @property
    def pool_size(self) -> int:
        return len(self._records)

    def _example(self, index: int) -> Any:
        return self._records[index]


def move(items: list, gold_index: int, position: int) -> list:
    """Return items with items[gold_index] moved to `position`; the others keep their order."""
    rest = items[:gold_index] + items[gold_index + 1 :]
    return rest[:position] + [items[gold_index]] + rest[position:]


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(mtime, size) of a data file, the version a per-process cache of its parsed records is keyed by; None for a
    missing file (read_jsonl then says so in one line)."""
    if not path.is_file():
        return None
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for a .jsonl or .jsonl.gz file (UTF-8); a clear error on bad lines, text that is
    not UTF-8, and a .gz file that is not gzip or is cut short."""
    p = Path(path)
    if p.is_dir():
        raise PosbiasError(f"data file '{p}' is a folder", "pass the .jsonl or .jsonl.gz file inside it")
    if not p.is_file():
        raise PosbiasError(f"data file '{p}' does not exist", "check the path")
    opener = gzip.open if p.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(p, "rt", encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, _record(p, lineno, line)
    except UnicodeDecodeError as e:
        raise PosbiasError(f"{p}:{lineno + 1}: not UTF-8 text ({e.reason})", "save the file as UTF-8") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise PosbiasError(f"{p}: not a complete gzip file ({e})", "re-create it with gzip, or drop the .gz suffix") from None


def _record(p: Path, lineno: int, line: str) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise PosbiasError(f"{p}:{lineno}: not valid JSON ({e.msg})", "fix or remove that line") from None
    if not isinstance(rec, dict):
        raise PosbiasError(f"{p}:{lineno}: expected a JSON object", "each line must be one object")
    return rec
