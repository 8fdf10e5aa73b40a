"""One row's prompt exactly as the model receives it: `posbias show`, `posbias.measure.show_prompt`.

    shown = show_prompt("kv-lookup", 5)                  # example 0 of seed 0, the gold fact at slot 5
    print(shown.format())                                # header, where the gold sits, answers, the prompt verbatim
    shown = show_prompts("kv-lookup", "0,4,9")           # one ShownPrompt per placement, as a sweep names them

The example is the `example`-th of the seeded order (`task.examples(example + 1, seed, skip)[example]`: row number
`example` of a sweep with that seed and skip), the placement is resolved from a positions spec as a sweep resolves
it, and the prompt is encoded by the Scorer itself (`Scorer.rows`), so `text` and `n_tokens` are what that sweep
scores (its row's `prompt_tokens`). Only the tokenizer is needed: a model named by `model` is not loaded, its
tokenizer is (`models.load.load_tokenizer`); a model already loaded is used as it is (`loaded=`).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass, field, fields

from ..backends import Backend, Capabilities, as_backend, parse_spec
from ..errors import PosbiasError
from ..models.load import DEFAULT_MODEL, Loaded, load_tokenizer
from ..scoring.encode import Encoded, render
from ..scoring.engines import engine_kind
from ..scoring.scorer import Scorer
from ..scoring.spans import item_spans
from ..scoring.template import default_system, template_sha256
from ..tasks import Placement, Prompt, Task, as_json, get_task, label
from ..tasks.arrange import char_ranges


@dataclass
class ShownPrompt:
    """The prompt of one (example, placement) row as the model receives it. `record` is all of it as JSON; `rows`
    holds one flat dict, the record without the text, its gold items as the lists gold_slots, gold_texts, gold_chars
    and gold_tokens (one entry per gold item); `format()` is what `posbias show` prints.

    text: the rendered prompt (chat template, any system turn the template adds, the answer prefix; an order task's
    shared option-label tokens after it); n_tokens: its token count, a sweep's `prompt_tokens`; system: the system
    turn the chat template adds by itself (scoring/template.py), None without one; gold: one dict per gold item (two for
    a two-hop placement, first hop first): its slot and, where the task lists its items, its text, `chars` [start,
    end) in `text` and `tokens` [start, end) in the prompt ids (None where its tokens cannot be told apart)."""

    task: str
    model: str
    example_id: str
    position: Placement
    text: str = field(repr=False)
    n_tokens: int
    chat_used: bool
    system: str | None
    template_sha256: str | None
    gold: list[dict]
    answers: list[str]
    options: list[str]
    answer_prefix: str
    engine: str
    max_new_tokens: int
    judge_template: str | None = None  # a judge task's template: its file's name and sha256, or the built-in `ask`

    @property
    def record(self) -> dict:
        return {**asdict(self), "position": as_json(self.position)}

    @property
    def rows(self) -> list[dict]:
        r = {k: v for k, v in self.record.items() if k not in ("text", "gold")}
        for key, name in (("slot", "gold_slots"), ("text", "gold_texts"), ("chars", "gold_chars"), ("tokens", "gold_tokens")):
            r[name] = [g.get(key) for g in self.gold]
        return [r]

    def format(self) -> str:
        """A header (task, example, placement, tokens, chat template and its system turn), where each gold item sits,
        the accepted answers (and an order task's options), then the prompt verbatim between two rules."""
        chat = "chat template " + ("on" if self.chat_used else "off")
        if self.chat_used:
            chat += f" (system turn: {self.system!r})" if self.system else " (no system turn)"
        head = (f"task {self.task}, example {self.example_id} at slot {label(self.position)}: {self.n_tokens} tokens "
                f"({self.model}), {chat}")
        lines = [head, *(_gold_line(g, len(self.gold)) for g in self.gold)]
        lines.append(f"answers: {', '.join(map(repr, self.answers))}; engine {self.engine}"
                     + (f", up to {self.max_new_tokens} new tokens" if engine_kind(self.engine) == "generate" else ""))
        if self.options:
            lines.append(f"options: {', '.join(self.options)}")
        if self.judge_template:
            lines.append(f"judge template: {self.judge_template}")
        rule = "-" * 80
        return "\n".join([*lines, rule, self.text, rule])


def _gold_line(g: dict, n: int) -> str:
    what = "gold item" if n == 1 else ("first-hop item", "second-hop item")[g["hop"]]
    if "text" not in g:
        return f"{what} at slot {g['slot']}"
    where = (f" (tokens {g['tokens'][0]} to {g['tokens'][1] - 1})" if g["tokens"]
             else f" (characters {g['chars'][0]} to {g['chars'][1] - 1})" if g["chars"] else "")
    text = g["text"] if len(g["text"]) <= 70 else g["text"][:67] + "..."
    around = f"\n  between ...{g['around'][0]!r} and {g['around'][1]!r}..." if "around" in g else ""
    return f"{what} at slot {g['slot']}{where}: {text!r}{around}"


def _needle_at(gold: list[dict], ex, text: str) -> list[dict]:
    """A haystack's needle (tasks/haystack.py: its slot is a depth, not an item): its text, where it sits and the 30
    characters either side of it, so a sentence boundary can be seen."""
    needles = getattr(ex, "needles", None)
    at = text.find(needles[0].text) if needles and "text" not in gold[0] else -1
    if at >= 0:
        end = at + len(needles[0].text)
        gold[0].update(text=needles[0].text, chars=[at, end], tokens=None, around=[text[max(at - 30, 0):at],
                                                                                     text[end:end + 30]])
    return gold


class TokenizerOnly(Backend):
    """A model's tokenizer standing in for it: all `Scorer.rows` reads (the tokenizer and the backend's capabilities).
    The context window is not known without the model, so no prompt is refused for its length here (a sweep does)."""

    description = "a model's tokenizer only (posbias show)"

    def __init__(self, name: str, backend: str, caps: Capabilities, tokenizer):
        self.name, self.caps, self.tokenizer = backend, caps, tokenizer
        self.info = {"name": name}

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        raise NotImplementedError  # built from a model spec's own (`tokenizer_of`)

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "TokenizerOnly":
        raise NotImplementedError

    @property
    def context_window(self) -> int:
        return sys.maxsize

    def decoding(self) -> dict:
        return {}  # nothing decodes: `show` prints prompts


def tokenizer_of(model: str) -> TokenizerOnly:
    """The tokenizer of a model spec, loaded without the model (a served model's own `tokenizer=DIR`, if it names one)."""
    spec = parse_spec(model)
    source = spec.cls.tokenizer_source(spec.args)
    if source is None:
        raise PosbiasError(f"model '{model}' is served without a tokenizer, so its prompts are the server's to render",
                           "add tokenizer=DIR to the model spec (the served model's directory)")
    return TokenizerOnly(str(spec.args["model"]), spec.backend, spec.caps, load_tokenizer(str(source), progress=False))


def _placements(task: Task, position) -> list[Placement]:
    """The placements a positions spec names, as a sweep resolves them; None: the task's first default placement."""
    if isinstance(position, tuple) and len(position) == 2 and task.n_gold == 2:
        position = [position]  # one pair, not two slots
    try:
        found = task.placements(position)
    except PosbiasError as e:  # the spec is `position` here
        raise PosbiasError(e.problem.replace("`positions", "`position"),
                           e.fix and e.fix.replace("`positions", "`position")) from None
    return found if position is not None else found[:1]


def _placement(task: Task, position) -> Placement:
    """The one placement a positions spec names; None: the task's first default placement."""
    found = _placements(task, position)
    if len(found) != 1:
        shown = ", ".join(label(p) for p in found[:4]) + (", ..." if len(found) > 4 else "")
        raise PosbiasError(f"`position={position}` names {len(found)} placements ({shown}), and one prompt has one",
                           f"name one, e.g. `position={label(found[0])}`, or call show_prompts for each")
    return found[0]


def _example(task: Task, example: int, seed: int, skip: int):
    pool = task.pool_size
    if example < 0 or (pool is not None and skip + example >= pool):
        last = "" if pool is None else f" (task {task.name} has {pool} examples; `skip={skip}`)"
        fix = ("use `example=0` or more" if example < 0 else f"use `example={pool - skip - 1}` or less" if skip < pool
               else f"use `skip={pool - 1 - example}` or less" if example < pool  # past the pool, no example is left
               else f"use `skip=0` and `example={pool - 1}`")
        raise PosbiasError(f"there is no example {example}{last}", fix)
    return task.examples(example + 1, seed, skip)[example]


def _gold(tokenizer, row: Encoded, text: str, chat: bool) -> list[dict]:
    """Each gold item's slot and, where the prompt lists its items, its text and spans (ShownPrompt)."""
    p = row.prompt
    slots = list(p.position) if isinstance(p.position, tuple) else [p.position]
    out = [{"slot": s, "hop": k} if len(slots) == 2 else {"slot": s} for k, s in enumerate(slots)]
    if not p.items:
        return out
    ranges = spans = None
    # left None: an item the template rewrote, a tokenizer without offsets, an item without tokens of its own
    with contextlib.suppress(PosbiasError, NotImplementedError, ValueError, KeyError):
        ranges = char_ranges(text, p.items, max(text.find(p.user), 0), p.example_id)
        spans = item_spans(tokenizer, p, list(p.items), chat)
    for g in out:
        toks = spans.tokens(g["slot"]) if spans is not None else []
        g.update(text=p.items[g["slot"]], chars=list(ranges[g["slot"]]) if ranges else None,
                 tokens=[toks[0], toks[-1] + 1] if toks else None)
    return out


@dataclass(frozen=True)
class ShowSettings:
    """What a shown prompt depends on besides the task, placement and example, named as a sweep's config names it
    (`SweepConfig`): model (its tokenizer loads alone where no `loaded` is given), chat, seed, skip, data_dir,
    task_options, engine, max_new_tokens."""

    model: str = DEFAULT_MODEL
    chat: str | bool = "auto"
    seed: int = 0
    skip: int = 0
    data_dir: str | None = None
    task_options: dict | None = None
    engine: str | None = None
    max_new_tokens: int | None = None

    @classmethod
    def of(cls, given: dict) -> "ShowSettings":
        """The settings from keyword arguments; an unknown name or a negative skip refused in one line."""
        names = [f.name for f in fields(cls)]
        if unknown := sorted(set(given) - set(names)):
            raise PosbiasError(f"show_prompt takes no setting '{unknown[0]}'", f"use settings among: {', '.join(names)}")
        out = cls(**given)
        if out.skip < 0:
            raise PosbiasError(f"`skip` must be >= 0, got {out.skip}", "use `skip=0` or more")
        return out

    def task(self, task: str | Task) -> Task:
        return task if isinstance(task, Task) else get_task(task, data_dir=self.data_dir, **(self.task_options or {}))


def show_prompt(task: str | Task, position=None, example: int = 0, *, loaded: Loaded | Backend | None = None,
                **settings) -> ShownPrompt:
    """The prompt of row `example` (in the order `seed` and `skip` give) with the gold item at `position` (one slot,
    "50%", or one pair (0, 1) / "0:1" on a two-hop task; None: the task's first default placement), encoded as a
    sweep with these settings (`ShowSettings`: model, chat, seed, skip, data_dir, task_options, engine,
    max_new_tokens) encodes it. `loaded`: a model already loaded (or a backend); else `model`'s tokenizer is loaded
    alone. Bad input (an unknown task or setting, a position out of range, several placements) is a PosbiasError."""
    s = ShowSettings.of(settings)
    t = s.task(task)
    placement = _placement(t, position)
    ex = _example(t, example, s.seed, s.skip)
    backend = as_backend(loaded) if loaded is not None else tokenizer_of(s.model)
    if backend.tokenizer is None:
        raise PosbiasError("this backend has no tokenizer, so its prompts are the server's to render",
                           "open it with tokenizer=DIR in the model spec (the served model's directory)")
    scorer = Scorer(backend, t, s.engine, s.max_new_tokens, s.chat)
    row = scorer.rows([ex], [placement])[0]
    tok = backend.tokenizer
    text = render(tok, row.prompt, scorer.chat)
    shared = row.prompt_ids[len(tok(text, add_special_tokens=not scorer.chat)["input_ids"]):]
    text += tok.decode(shared) if shared else ""  # an order task: the option labels' shared leading tokens
    p: Prompt = row.prompt
    return ShownPrompt(
        task=t.name, model=str(backend.info.get("name", s.model)), example_id=p.example_id, position=placement,
        text=text, n_tokens=len(row.prompt_ids), chat_used=scorer.chat,
        system=default_system(tok) if scorer.chat else None, template_sha256=template_sha256(tok) if scorer.chat else None,
        gold=_needle_at(_gold(tok, row, text, scorer.chat), ex, text), answers=list(p.answers), options=list(p.options),
        answer_prefix=p.answer_prefix, engine=scorer.engine.name, max_new_tokens=scorer.max_new_tokens,
        judge_template=_judge_template(t))


def _judge_template(task: Task) -> str | None:
    """A judge task's template as `show` names it (tasks/judge_template.py): a file by name and sha256, the built-in
    question by its `ask`."""
    cfg = task.config()
    if "template" in cfg:
        return f"{cfg['template']['name']} (sha256 {cfg['template']['sha256']})"
    return f"built-in, ask={cfg['ask']}" if "ask" in cfg else None


def show_prompts(task: str | Task, positions=None, example: int = 0, *, loaded: Loaded | Backend | None = None,
                 **settings) -> list[ShownPrompt]:
    """`show_prompt` at every placement `positions` names, as a sweep names them ("all", "0,4,9", "0%,50%,100%", a
    list of slots; on a two-hop task pairs "0:1,5:13", "connected", a list of pairs), in the order a sweep scores
    them (`posbias show --position`); the task and the tokenizer are loaded once. None: the task's first default
    placement. Every check is made before the tokenizer loads."""
    s = ShowSettings.of(settings)
    t = s.task(task)
    found = _placements(t, positions)
    _example(t, example, s.seed, s.skip)
    backend = as_backend(loaded) if loaded is not None else tokenizer_of(s.model)
    kept = {k: v for k, v in vars(s).items() if k not in ("data_dir", "task_options")}  # the task is built
    return [show_prompt(t, p, example, loaded=backend, **kept) for p in found]
