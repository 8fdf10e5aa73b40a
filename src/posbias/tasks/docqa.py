"""Multi-document QA: the *Lost in the Middle* NQ files and the user's own JSONL data.

Both use the study's qa.prompt and its best_subspan_em metric.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from ..data import data_file
from ..errors import PosbiasError, shown
from .base import Doc, Prompt, RecordsTask, file_stamp, move, read_jsonl
from .twohop import HopExample, TwoHopQA

# The study's qa.prompt, verbatim.
INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)


# which gold answers count: every accepted alias (the study's metric), or only the first ("canonical") one.
# "first" makes teacher-forced scoring one sequence per prompt instead of one per alias (NQ: 1.76 aliases on
# average, 1.8x cheaper measured),
# at the price of marking a correct alias wrong; meant for search fitness, not for reported tables.
ANSWER_MODES = ("all", "first")


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    answers: tuple[str, ...]
    docs: tuple[Doc, ...]  # position-free order
    gold: int
    answer_prefix: str = ""  # a user's line may give what the reply starts with (teacher forcing scores after it)


def doc_lines(docs: list[Doc], numbered: bool = True) -> list[str]:
    """The study's search-result lines, "Document [i](Title: t) text", in order (numbered=False: "Document (Title: t)
    text", a line that does not change with its slot)."""
    return [f"Document {f'[{i + 1}]' if numbered else ''}(Title: {d.title}) {d.text}" for i, d in enumerate(docs)]


# where the question goes: after the documents (the study's qa.prompt, the default), or before and after them (the
# study's qa_with_query_aware_contextualization.prompt, verbatim in form; Found in the Middle's prompt has the question
# on both sides too). "both" changes what attention-reading methods (calib, attnsort, reorder:attention) read: the
# documents are then read knowing the question.
QUESTION_PLACES = ("after", "both")


def qa_prompt(question: str, docs: list[Doc], place: str = "after", numbered: bool = True) -> str:
    results = "\n".join(doc_lines(docs, numbered))
    before = f"Question: {question}\n\n" if place == "both" else ""
    return f"{INSTRUCTION}\n\n{before}{results}\n\nQuestion: {question}\nAnswer:"


class DocQA(RecordsTask):
    """Gold document moved to index k; the distractors keep their order."""

    metric = "best_subspan_em"
    default_engine = "generate"
    max_new_tokens = 48
    documents = True

    def __init__(self, name: str, records: list[QAExample], n_docs: int, answers: str = "all", question: str = "after",
                 derive_limit: bool = False):
        if answers not in ANSWER_MODES:
            raise PosbiasError(f"unknown answers mode {answers!r}", f"use one of {', '.join(ANSWER_MODES)}")
        if question not in QUESTION_PLACES:
            raise PosbiasError(f"unknown question place {question!r}", "use `question=after` or `question=both`")
        self.name, self._records, self._n_slots, self._answers = name, records, n_docs, answers
        self.question, self.derive_limit = question, derive_limit  # derive_limit: a user's file (generation_limit)
        self.numbered = True

    def unnumbered(self) -> "DocQA":
        """The task with its documents not numbered: a document's line is the same text in every slot (PINE)."""
        self.numbered, self.slot_label = False, None
        return self

    def config(self) -> dict:
        out = {**super().config(), "docs": self._n_slots, "answers": self._answers}
        out = {**out, "question": self.question} if self.question != "after" else out  # older fingerprints stay valid
        return out if self.numbered else {**out, "numbered": False}

    slot_label = r"Document \[\d+\]"  # the numbering stays with the slot when documents move
    dummy = "(Title: Empty) This document holds no information."

    def items(self, ex: QAExample, position: int) -> list[str]:
        return doc_lines(move(list(ex.docs), ex.gold, position), self.numbered)

    def generation_limit(self, count_tokens) -> tuple[int, str | None]:
        """NQ: the fixed 48 tokens every table here was measured with. A user's file: 48 tokens of room beyond its
        longest accepted answer (HotpotQA's answers are short, TruthfulQA's are sentences), over the whole file so
        that the limit does not depend on which examples a run draws."""
        if not self.derive_limit:
            return self.max_new_tokens, None
        longest = max(count_tokens(a) for r in self._records for a in r.answers)
        return self.max_new_tokens + longest, f"{self.max_new_tokens} + the file's longest answer ({longest} tokens)"

    def build(self, ex: QAExample, position: int) -> Prompt:
        docs = move(list(ex.docs), ex.gold, position)
        answers = ex.answers if self._answers == "all" else ex.answers[:1]
        return Prompt(ex.id, position, qa_prompt(ex.question, docs, self.question, self.numbered), ex.answer_prefix,
                      answers)


def nq_task(docs: int = 10, data_dir: str | Path | None = None, answers: str = "all", question: str = "after",
            numbered: str = "yes") -> DocQA:
    """NQ-open, 10 or 20 documents: gold (ctxs[0]) plus the first docs-1 distractors.

    docs: 10 or 20 documents, the gold one and the first 9 or 19 distractors
    answers: all (every accepted answer counts) | first (only the first: teacher forcing then scores one sequence
      per prompt, a cheaper search fitness; not for reported tables)
    question: where the question goes, after the documents (the study's prompt) | both (before and after them:
      query-aware contextualisation)
    numbered: yes ("Document [4](Title: ...)", the study's) | no ("Document (Title: ...)": a document's line is the
      same text in every slot, so PINE's rows can agree at every slot)
    """
    if numbered not in ("yes", "no"):
        raise PosbiasError(f"numbered must be yes or no, got {numbered!r}", "use `numbered=yes` or `numbered=no`")
    if docs not in (10, 20):
        raise PosbiasError(f"nq has 10 or 20 documents, not {docs}", "use `docs=10` or `docs=20`")
    path = data_file("nq", "nq/nq-open-20docs-gold_at_0.jsonl.gz", data_dir)
    task = DocQA("nq", list(_nq_records(path, docs, file_stamp(path))), docs, answers, question)
    task.inputs = (path,)
    return task if numbered == "yes" else task.unnumbered()


@functools.lru_cache(maxsize=4)
def _nq_records(path: Path, docs: int, stamp: tuple | None) -> tuple[QAExample, ...]:
    """The file's records, parsed once per process and file version (stamp: mtime and size): 2,655 questions of 20
    documents take 1.5 s to read, and a comparison, the order tasks and the tests build the task many times."""
    records = []
    for lineno, r in read_jsonl(path):
        ctxs = r.get("ctxs")
        rec = {"id": f"nq{lineno - 1}", "question": r.get("question"), "answers": r.get("answers"), "gold": 0,
               "documents": ctxs[:docs] if isinstance(ctxs, list) and len(ctxs) >= docs else f"{docs} ctxs needed"}
        try:
            records.append(_qa_record(f"{path}:{lineno}", rec, rec["id"]))
        except PosbiasError as e:
            raise PosbiasError(f"{e.problem} (not a Lost-in-the-Middle NQ record)", "use the study's file") from None
    return tuple(records)


JSONL_SCHEMA = """\
One JSON object per line:
  {"id": "q1",                         (optional; default: the line number)
   "question": "who wrote ...?",
   "answers": ["Jane Austen"],          (list of accepted answers; or "answer": "...")
   "documents": [{"title": "...", "text": "..."}, ...],   (title optional)
   "gold": 0,                           (index of the document holding the answer; for two-hop
                                         reasoning [i, j], the first-hop and the second-hop document)
   "answer_prefix": "The author is"}    (optional, one gold: what the reply starts with; teacher
                                         forcing scores the answer after it)
Every line must have the same number of documents and the same kind of gold."""


def jsonl_task(path: str | Path, answers: str = "all", prompt: str | None = None,
               question: str | None = None) -> DocQA | TwoHopQA:
    """The user's own data in the schema above (types checked field by field): multi-document QA, or two-hop
    reasoning when "gold" is a pair [first hop, second hop].

    answers, question: see `nq_task`
    prompt: two-hop data only, reasoning (the paper's template; unset: this) | coc (Chain-of-Citation)
    """
    records: list[QAExample | HopExample] = []
    first_line: dict[str, int] = {}  # id -> the line that gave it first
    for lineno, r in read_jsonl(path):
        ex = _qa_record(f"{path}:{lineno}", r, f"line{lineno}")
        if ex.id in first_line:  # LogiQA 2.0 repeats ids
            raise PosbiasError(f"{path}:{lineno}: id {ex.id!r} is also the id of line {first_line[ex.id]}: the rows of the "
                               "two examples could not be told apart", f"give line {lineno} another 'id', or remove 'id' "
                               "from every line (the line numbers are used)")
        first_line[ex.id] = lineno
        if records and type(ex) is not type(records[0]):
            raise PosbiasError(f"{path}:{lineno}: mixes one gold document and a pair of hops",
                               "give every line the same kind of gold: an index, or [first, second]")
        if records and len(ex.docs) != len(records[0].docs):
            raise PosbiasError(f"{path}:{lineno}: {len(ex.docs)} documents, but earlier lines have {len(records[0].docs)}",
                               "give every line the same number")
        records.append(ex)
    if not records:
        raise PosbiasError(f"{path} holds no examples", "add one JSON object per line")
    if isinstance(records[0], HopExample):
        extra = "answers" if answers != "all" else "question" if question is not None else None
        if extra:
            raise PosbiasError(f"`{extra}` applies to one-gold QA data, and this file has pairs of hops", f"drop `{extra}`")
        return TwoHopQA(f"jsonl:{path}", records, len(records[0].docs), prompt or "reasoning")
    if prompt is not None:
        raise PosbiasError("`prompt` applies to two-hop data (a pair of gold documents)", "drop `prompt`")
    return DocQA(f"jsonl:{path}", records, len(records[0].docs), answers, question or "after", derive_limit=True)


def _bad(where: str, what: str) -> PosbiasError:
    return PosbiasError(f"{where}: {what}", "fix that line (the schema: posbias tasks)")


def _qa_record(where: str, r: dict, default_id: str) -> QAExample | HopExample:
    """One line of the JSONL schema, every field of the right type, or a PosbiasError naming the line and field."""
    missing = [k for k in ("question", "documents", "gold") if k not in r]
    missing += [] if "answers" in r or "answer" in r else ["answers"]
    if missing:
        raise _bad(where, f"missing or bad field {missing[0]!r}")
    answers = r["answers"] if "answers" in r else [r["answer"]]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise PosbiasError(f"{where}: 'answers' must be a non-empty list of non-empty strings, got {shown(answers)}",
                           'write answers as strings, e.g. "answers": ["5521"]')
    if not isinstance(r["question"], str) or not r["question"].strip():
        raise _bad(where, f"'question' must be a non-empty string, got {shown(r['question'])}")
    docs = r["documents"]
    if not isinstance(docs, list) or len(docs) < 2:
        raise _bad(where, f"'documents' must be a list of at least 2 documents, got {shown(docs)}")
    parsed = tuple(_doc(where, i, d) for i, d in enumerate(docs))
    gold = _gold(where, r["gold"], len(parsed))
    _check_distinct(where, parsed, gold if isinstance(gold, tuple) else (gold,))
    rid = r.get("id", default_id)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise _bad(where, f"'id' must be a string or an integer, got {rid!r}")
    prefix = r.get("answer_prefix", "")
    if not isinstance(prefix, str) or (prefix and isinstance(gold, tuple)):
        raise _bad(where, f"'answer_prefix' must be a string, on a line with one gold document; got {shown(prefix)}")
    if isinstance(gold, tuple):
        return HopExample(str(rid), r["question"], tuple(answers), parsed, gold)
    return QAExample(str(rid), r["question"], tuple(answers), parsed, gold, prefix.rstrip(" "))


def _check_distinct(where: str, docs: tuple, golds: tuple[int, ...]) -> None:
    """Moving a gold document must move something: no copy of it elsewhere, not every document the same."""
    if len(set(docs)) == 1:
        raise _bad(where, f"all {len(docs)} documents are the same, so no placement differs from another")
    for g in golds:
        copy = next((k for k, d in enumerate(docs) if d == docs[g] and k != g), None)
        if copy is not None:
            raise _bad(where, f"the gold document {g} appears again as document {copy}, so it is never only at one position")


def _gold(where: str, gold, n_docs: int) -> int | tuple[int, int]:
    """An index in range, or two distinct indices [first hop, second hop]."""

    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if isinstance(gold, list):
        if len(gold) != 2 or not all(map(is_int, gold)) or gold[0] == gold[1]:
            raise _bad(where, f"a two-hop 'gold' must be two different document indices [first, second], got {gold!r}")
        if not all(0 <= g < n_docs for g in gold):
            raise PosbiasError(f"{where}: gold={gold} but there are {n_docs} documents", "gold is a 0-based index")
        return tuple(gold)
    if not is_int(gold):
        raise _bad(where, f"'gold' must be an integer document index (or [first, second] for two hops), got {gold!r}")
    if not 0 <= gold < n_docs:
        raise PosbiasError(f"{where}: gold={gold} but there are {n_docs} documents", "gold is a 0-based index")
    return gold


def _doc(where: str, i: int, d) -> Doc:
    """A document: a string, or an object with a string 'text' and an optional string 'title'."""
    if isinstance(d, str):
        return Doc("", d)
    if isinstance(d, dict) and isinstance(d.get("text"), str) and isinstance(d.get("title", ""), str):
        return Doc(d.get("title", ""), d["text"])
    raise _bad(where, f"document {i} must be a string or {{'title': str, 'text': str}}, got {shown(d)}")
