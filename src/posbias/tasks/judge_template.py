"""Judge templates: the prompt a judge reads, with named placeholders (docs/order-bias.md, "Judge templates").

    {question}               the item's question (an instruction, in LLMBar's files)
    {answer_a} {answer_b}    the answers in slot order: {answer_a} is shown first (k answers: up to {answer_j})
    {label_a} {label_b}      the labels shown with those slots' answers (A, B; the template's own "labels";
                             --labels; with --bind candidate each answer's own label, wherever it is shown)
    {option_a} {option_b}    the labels in their own order (A, B), for a reply instruction ("Reply with A or B"):
                             the same as {label_a} {label_b} unless the labels follow the answers (--bind candidate)
    {context}                the item's reference text ("" for an item without one)

A template file is plain text (the prompt alone; its final newlines dropped) or, named *.json, an object:

    {"prompt": "...",                 required: the prompt (every item's, unless the next key is given)
     "prompt_with_context": "...",    optional: the prompt of the items that carry a context (shows {context})
     "answer_prefix": "Verdict:",     optional (default "Verdict:"): what the judge's reply starts with; the
                                      verdict is the label the model gives after it (teacher forcing scores
                                      each label as the next token, after a space)
     "labels": ["a", "b"],            optional: one label per slot (default A, B; --labels replaces them)
     "verdict": "[[{label}]]",        optional: the pattern the prompt asks the verdict in, {label} once. Generation
                                      reads the LAST match in the reply (a reasoning-first prompt ends with its
                                      verdict; an explanation may quote the pattern before it) and keeps the whole
                                      reply (not its first line); teacher forcing scores each label where the pattern
                                      puts it, after the answer prefix and the pattern's text before {label}
     "tie": "C",                      optional (with "verdict"): the label of a tie; a generated tie verdict is a
                                      tie (choice -2), counted as neither slot, not as unread; teacher forcing is a
                                      forced choice between the slots' labels and never ties
     "max_new_tokens": 512}           optional: the room a reply needs (generation's default limit; 8 without it,
                                      a verdict alone; a reasoning-first prompt needs a few hundred)

Literal braces are written {{ and }} (Python's str.format). Checked when the task is built, before any model
loads: unknown placeholders, a missing question or answer, an answer shown twice or out of slot order, labels
that repeat. The built-in questions (`ask=correct|preference`) are templates of this form (`builtin`) rendered
by the same code, so their prompts are those posbias wrote before templates existed.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from ..core.order import parse_choice
from ..errors import PosbiasError, shown

SLOTS = "abcdefghij"  # {answer_a} .. {answer_j}: slot 0 .. 9
KEYS = ("prompt", "prompt_with_context", "answer_prefix", "labels", "verdict", "tie", "max_new_tokens")  # JSON keys
TIE = -2  # a row's choice for a tie verdict (-1: none read; core/order.py)
ASKS = {  # the built-in questions: an instruction and a question (the order of the answers must not matter)
    "correct": ("You are a fair judge. Decide which candidate answer to the question is correct{ref}. The order of the "
                "answers does not matter.", "Which answer is correct?"),
    "preference": ("You are an impartial judge. Compare the two answers to the user's question{ref} and decide which "
                   "one answers it better: more helpful, relevant, accurate and detailed. Neither the order in which "
                   "the answers are shown nor their length may influence your decision.", "Which answer is better?"),
}


@dataclass(frozen=True)
class JudgeTemplate:
    """A judge's prompt with placeholders (module docstring). `item` is one slot's text as Prompt.items lists it
    (verbatim in the prompt); `sha256` and `text` are a file's (None for a built-in template)."""

    name: str
    prompt: str
    with_context: str | None = None
    answer_prefix: str = "Verdict:"
    labels: tuple[str, ...] | None = None
    item: str = "{answer}"
    sha256: str | None = None
    text: str | None = None
    verdict: str | None = None  # the verdict's pattern, "{label}" once (module docstring)
    tie: str | None = None
    max_new_tokens: int | None = None

    @property
    def head(self) -> str:
        """The verdict pattern's text before {label} ("[[" for "[[{label}]]"; "" without a pattern): teacher forcing
        scores the labels after it."""
        return self.verdict.split("{label}")[0] if self.verdict else ""

    def read(self, text: str, labels) -> int:
        """The slot a generated reply names in the verdict pattern (the last match; TIE for the tie label; -1: none)."""
        if not self.verdict:
            return parse_choice(text, labels)
        names = [*labels, *([self.tie] if self.tie else [])]
        before, after = (re.escape(part) for part in self.verdict.split("{label}"))
        alts = "|".join(re.escape(x) for x in sorted(names, key=len, reverse=True))
        found = re.findall(rf"{before}\s*({alts})\s*{after}", text)
        if not found:
            return -1
        return TIE if found[-1] == self.tie else list(labels).index(found[-1])

    @property
    def shows_context(self) -> bool:
        """Whether an item's context reaches the prompt it is rendered with."""
        return "context" in _names(self.with_context or self.prompt)

    def render(self, question: str, answers: list[str], labels: tuple[str, ...], context: str,
               options: tuple[str, ...] | None = None) -> str:
        values = {"question": question, "context": context, **{f"answer_{s}": a for s, a in zip(SLOTS, answers)},
                  **{f"label_{s}": lb for s, lb in zip(SLOTS, labels)},
                  **{f"option_{s}": lb for s, lb in zip(SLOTS, options or labels)}}
        text = self.with_context if context and self.with_context is not None else self.prompt
        return text.format_map(values)

    def items(self, answers: list[str], labels: tuple[str, ...]) -> list[str]:
        return [self.item.format(answer=a, label=lb) for a, lb in zip(answers, labels)]

    def config(self) -> dict:
        """What a run records (and its fingerprint compares): the file's name, its sha256 and its text."""
        return {"name": self.name, "sha256": self.sha256, "text": self.text}

    def check(self, k: int) -> "JudgeTemplate":
        """Refuse a template that cannot show k answers (module docstring); -> itself."""
        known = ["question", "context", *(f"{kind}_{s}" for kind in ("answer", "label", "option") for s in SLOTS[:k])]
        for key, text in (("prompt", self.prompt), ("prompt_with_context", self.with_context)):
            if text is not None:
                _check_prompt(self.name, key, text, known, k)
        if self.with_context is not None and "context" not in _names(self.with_context):
            raise PosbiasError(f"judge template {self.name}: its prompt_with_context has no {{context}}",
                               "add {context} where the reference goes, or drop prompt_with_context")
        if self.labels is not None:
            _check_labels(self.name, self.labels, k)
        if self.tie is not None and self.tie in (self.labels or ()):
            raise PosbiasError(f"judge template {self.name}: the tie label {self.tie!r} is also a slot's label",
                               "give the tie its own label, e.g. \"tie\": \"C\"")
        return self


def _names(text: str) -> list[str]:
    """The placeholders of a prompt in the order they appear (repeats kept)."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _check_prompt(name: str, key: str, text: str, known: list[str], k: int) -> None:
    where = f"judge template {name}" + ("" if key == "prompt" else f" ({key})")
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as e:  # a lone { or }
        raise PosbiasError(f"{where}: {e}", "write a literal brace as {{ or }}") from None
    fancy = next((n for _, n, spec, conv in parts if n is not None and (spec or conv)), None)
    if fancy is not None:
        raise PosbiasError(f"{where}: {{{fancy}}} carries a conversion or format spec",
                           f"write it plainly as {{{fancy}}} (a literal brace as {{{{ or }}}})")
    names = [n for _, n, _, _ in parts if n is not None]
    unknown = [n for n in dict.fromkeys(names) if n not in known]
    if unknown:
        raise PosbiasError(f"{where}: unknown placeholder{'s' * (len(unknown) > 1)} "
                           f"{', '.join('{' + n + '}' for n in unknown)} ({k} answers are shown)",
                           f"use {' '.join('{' + n + '}' for n in known)}; write a literal brace as {{{{ or }}}}")
    answers = [f"answer_{s}" for s in SLOTS[:k]]
    missing = [n for n in ("question", *answers) if n not in names]
    if missing:
        more = ", or use `options=2`" if k > 2 and "question" not in missing else ""
        raise PosbiasError(f"{where} has no {', '.join('{' + n + '}' for n in missing)}: the judge would not see "
                           f"{'it' if len(missing) == 1 else 'them'}", f"add {' '.join('{' + n + '}' for n in missing)} "
                           f"to its {key}{more}")
    shown = [n for n in names if n in answers]
    if shown != answers:
        raise PosbiasError(f"{where} shows the answers as {' '.join('{' + n + '}' for n in shown)}: each once, in slot "
                           "order, is how a slot is defined", f"show {' '.join('{' + n + '}' for n in answers)} once "
                           "each, in that order")


def _check_labels(name: str, labels, k: int) -> None:
    if not isinstance(labels, (list, tuple)) or len(labels) != k or not all(
            isinstance(x, str) and x.strip() == x and x and "\n" not in x for x in labels):
        raise PosbiasError(f"judge template {name}: 'labels' must be a list of {k} non-empty strings without white "
                           f"space around them, got {shown(labels)}", 'e.g. "labels": ["a", "b"]')
    if len(set(labels)) != len(labels):
        raise PosbiasError(f"judge template {name}: 'labels' lists {labels!r}: the verdicts could not be told apart",
                           "give every slot its own label")


def builtin(ask: str, k: int) -> JudgeTemplate:
    """The built-in question `ask` (ASKS) as a template for k answers: the prompt posbias has always written, with
    "Reference: ..." and ", using the reference" for items that carry a context."""
    instruction, question = ASKS[ask]
    shown = "\n\n".join(f"[Answer {{label_{s}}}]\n{{answer_{s}}}" for s in SLOTS[:k])
    reply = (" or " if k == 2 else ", ").join(f"{{option_{s}}}" for s in SLOTS[:k])

    def prompt(ref: str) -> str:
        return (instruction.format(ref=ref) + "\n\n" + ("Reference:\n{context}\n\n" if ref else "")
                + "Question: {question}\n\n" + shown + f"\n\n{question} Reply with {reply} only.")

    return JudgeTemplate(ask, prompt(""), prompt(", using the reference"), item="[Answer {label}]\n{answer}")


def load_template(path: str | Path) -> JudgeTemplate:
    """A template file (module docstring): plain text, or a JSON object with KEYS. Not yet checked for k answers
    (`check`)."""
    p = Path(path)
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "does not exist"
        raise PosbiasError(f"judge template '{p}' {what}", "give the path of a template file (.txt or .json)")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PosbiasError(f"judge template {p}: not UTF-8 text ({e.reason})", "save the file as UTF-8") from None
    fields = _json_fields(p, text) if p.suffix.lower() == ".json" else {"prompt": text.rstrip("\r\n")}
    labels = fields.get("labels")
    return JudgeTemplate(p.name, fields["prompt"], fields.get("prompt_with_context"),
                         fields.get("answer_prefix", "Verdict:"), None if labels is None else tuple(labels),
                         sha256=hashlib.sha256(raw).hexdigest(), text=text, verdict=fields.get("verdict"),
                         tie=fields.get("tie"), max_new_tokens=fields.get("max_new_tokens"))


def _json_fields(p: Path, text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PosbiasError(f"judge template {p}: not valid JSON (line {e.lineno}: {e.msg})",
                           "fix the JSON, or save the prompt alone as a .txt file") from None
    if not isinstance(obj, dict):
        raise PosbiasError(f"judge template {p}: a JSON template is an object", 'write {"prompt": "..."}')
    unknown = [k for k in obj if k not in KEYS]
    if unknown:
        system = " (a system turn is not supported: put its text at the top of the prompt)" if "system" in unknown else ""
        raise PosbiasError(f"judge template {p}: unknown key{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}",
                           f"use the keys {', '.join(KEYS)}{system}")
    if "prompt" not in obj:
        raise PosbiasError(f"judge template {p} has no 'prompt'", 'add "prompt": "..." with {question}, {answer_a} and '
                           "{answer_b}")
    bad = next((k for k in KEYS[:3] if k in obj and not isinstance(obj[k], str)), None)
    if bad is not None:
        raise PosbiasError(f"judge template {p}: {bad!r} must be a string, got {shown(obj[bad])}", f"write {bad!r} as a "
                           "JSON string")
    if "labels" in obj:
        _check_labels(p.name, obj["labels"], len(obj["labels"]) if isinstance(obj["labels"], list) else 2)
    _check_verdict(p, obj)
    return obj


def _check_verdict(p: Path, obj: dict) -> None:
    """"verdict" (a string with {label} once), "tie" (with a verdict: a non-empty label), "max_new_tokens" (1..4096)."""
    verdict, tie, room = obj.get("verdict"), obj.get("tie"), obj.get("max_new_tokens")
    if verdict is not None and (not isinstance(verdict, str) or verdict.count("{label}") != 1 or not verdict.strip()
                                or verdict.strip() == "{label}"):
        raise PosbiasError(f"judge template {p}: 'verdict' must be text around {{label}} (once), got {shown(verdict)}",
                           'e.g. "verdict": "[[{label}]]" for a reply that ends in [[A]], [[B]] or [[C]]')
    if tie is not None:
        if verdict is None:
            raise PosbiasError(f"judge template {p}: 'tie' names the label of a tie in the verdict pattern, and there "
                               "is no 'verdict'", 'add "verdict": "[[{label}]]" (or the pattern your prompt asks for)')
        if not isinstance(tie, str) or not tie.strip() or tie.strip() != tie:
            raise PosbiasError(f"judge template {p}: 'tie' must be a label without white space around it, got "
                               f"{shown(tie)}", 'e.g. "tie": "C"')
    if room is not None and (isinstance(room, bool) or not isinstance(room, int) or not 1 <= room <= 4096):
        raise PosbiasError(f"judge template {p}: 'max_new_tokens' must be a whole number from 1 to 4096, got "
                           f"{shown(room)}", 'e.g. "max_new_tokens": 512 for a reply that explains before its verdict')
