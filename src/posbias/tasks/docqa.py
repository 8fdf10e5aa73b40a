"""Multi-document QA: the *Lost in the Middle* NQ files and the user's own JSONL data.

Both use the study's qa.prompt and its best_subspan_em metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PosbiasError
from .base import Prompt, Task, move, read_jsonl, shared_data_dir

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
class Doc:
    title: str
    text: str


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    answers: tuple[str, ...]
    docs: tuple[Doc, ...]  # position-free order
    gold: int


def qa_prompt(question: str, docs: list[Doc]) -> str:
    results = "\n".join(f"Document [{i + 1}](Title: {d.title}) {d.text}" for i, d in enumerate(docs))
    return f"{INSTRUCTION}\n\n{results}\n\nQuestion: {question}\nAnswer:"


class DocQA(Task):
    """Gold document moved to index k; the distractors keep their order."""

    metric = "best_subspan_em"
    default_engine = "generate"
    max_new_tokens = 48

    def __init__(self, name: str, records: list[QAExample], n_docs: int, answers: str = "all"):
        if answers not in ANSWER_MODES:
            raise PosbiasError(f"unknown answers mode {answers!r}", f"use one of {', '.join(ANSWER_MODES)}")
        self.name, self._records, self._n_docs, self._answers = name, records, n_docs, answers

    @property
    def n_slots(self) -> int:
        return self._n_docs

    @property
    def pool_size(self) -> int:
        return len(self._records)

    def config(self) -> dict:
        return {**super().config(), "docs": self._n_docs, "answers": self._answers}

    def _example(self, index: int) -> QAExample:
        return self._records[index]

    def build(self, ex: QAExample, position: int) -> Prompt:
        docs = move(list(ex.docs), ex.gold, position)
        answers = ex.answers if self._answers == "all" else ex.answers[:1]
        return Prompt(ex.id, position, qa_prompt(ex.question, docs), "", answers)


def nq_task(docs: int = 10, data_dir: str | Path | None = None, answers: str = "all") -> DocQA:
    """NQ-open, 10 or 20 documents: gold (ctxs[0]) plus the first docs-1 distractors."""
    if docs not in (10, 20):
        raise PosbiasError(f"nq has 10 or 20 documents, not {docs}", "use `docs=10` or `docs=20`")
    path = Path(data_dir or shared_data_dir()) / "nq" / "nq-open-20docs-gold_at_0.jsonl.gz"
    records = []
    for lineno, r in read_jsonl(path):
        try:
            ctxs = r["ctxs"][:docs]
            records.append(
                QAExample(
                    id=f"nq{lineno - 1}",
                    question=r["question"],
                    answers=tuple(r["answers"]),
                    docs=tuple(Doc(c["title"], c["text"]) for c in ctxs),
                    gold=0,
                )
            )
        except (KeyError, IndexError, TypeError) as e:
            raise PosbiasError(f"{path}:{lineno}: not a Lost-in-the-Middle NQ record ({e})", "use the study's file") from None
    return DocQA("nq", records, docs, answers)


JSONL_SCHEMA = """\
One JSON object per line:
  {"id": "q1",                         (optional; default: the line number)
   "question": "who wrote ...?",
   "answers": ["Jane Austen"],          (list of accepted answers; or "answer": "...")
   "documents": [{"title": "...", "text": "..."}, ...],   (title optional)
   "gold": 0}                           (index of the document holding the answer)
Every line must have the same number of documents."""


def jsonl_task(path: str | Path, answers: str = "all") -> DocQA:
    """The user's own RAG data in the schema above."""
    mode = answers  # `answers` is reused per line below
    records: list[QAExample] = []
    n_docs = None
    for lineno, r in read_jsonl(path):
        where = f"{path}:{lineno}"
        try:
            answers = r["answers"] if "answers" in r else [r["answer"]]
            if isinstance(answers, str):
                answers = [answers]
            docs = tuple(
                Doc(str(d.get("title", "")), str(d["text"])) if isinstance(d, dict) else Doc("", str(d))
                for d in r["documents"]
            )
            gold = int(r["gold"])
            question = str(r["question"])
        except (KeyError, TypeError, ValueError) as e:
            raise PosbiasError(f"{where}: missing or bad field {e}", "see `posbias tasks` for the JSONL schema") from None
        if not answers or not all(isinstance(a, str) and a for a in answers):
            raise PosbiasError(f"{where}: 'answers' must be a non-empty list of strings", "fix that line")
        if len(docs) < 2:
            raise PosbiasError(f"{where}: needs at least 2 documents, got {len(docs)}", "fix that line")
        if not 0 <= gold < len(docs):
            raise PosbiasError(f"{where}: gold={gold} but there are {len(docs)} documents", "gold is a 0-based index")
        if n_docs is not None and len(docs) != n_docs:
            raise PosbiasError(
                f"{where}: {len(docs)} documents, but earlier lines have {n_docs}", "give every line the same number"
            )
        n_docs = len(docs)
        records.append(QAExample(str(r.get("id", f"line{lineno}")), question, tuple(answers), docs, gold))
    if not records:
        raise PosbiasError(f"{path} holds no examples", "add one JSON object per line")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise PosbiasError(f"{path}: duplicate ids", "give every line a unique 'id'")
    return DocQA(f"jsonl:{path}", records, n_docs, mode)
