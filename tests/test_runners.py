"""The Scorer's two runners (scoring/runners.py): chosen once, by the word a backend declares for its batching; the
cost meter asks the runner (its units, a row's price, its in-flight size) and nothing else asks in process or served.
The served runner against a real server is tested in tests/test_llamacpp.py, test_served.py and test_cost.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import tiny_loaded
from posbias import PosbiasError, get_task
from posbias.backends.base import Capabilities
from posbias.eval.cost import Meter
from posbias.scoring.runners import RUNNERS, InProcess, Served, register_runner, runner_for
from posbias.scoring.scorer import Scorer

SRC = Path(__file__).resolve().parent.parent / "src" / "posbias"


def test_the_runner_is_the_one_the_backend_s_batching_names_and_an_unknown_word_is_refused():
    scorer = Scorer(tiny_loaded("llama"), get_task("kv-lookup", facts=4, digits=3))
    assert type(scorer.runner) is InProcess and scorer.runner.in_flight is None and not scorer.runner.billed
    assert RUNNERS == {"padded": InProcess, "requests": Served}
    with pytest.raises(PosbiasError, match="a runner named 'padded' is already registered"):
        register_runner(type("Mine", (InProcess,), {}))
    caps = Capabilities(prompt_logprobs=False, token_prompts=True, methods=False, prefix_sharing=False, batching="stream")
    odd = SimpleNamespace(backend=SimpleNamespace(caps=caps, name="mine"))
    with pytest.raises(PosbiasError, match="backend 'mine' declares batching 'stream'.*declare one of: padded, requests"):
        runner_for(odd)  # type: ignore[arg-type]


def test_an_in_process_row_is_priced_as_on_a_server_with_prompt_logprobs():
    """teacher forcing: one logprobs request per accepted answer of prompt + answer ids (an order task: one per label);
    generate: one generation of max_new_tokens from the prompt's ids."""
    lo, task = tiny_loaded("llama"), get_task("kv-lookup", facts=4, digits=3)
    tf = Scorer(lo, task, "teacher-forced")
    row = tf.rows(task.examples(1), [2])[0]
    qs = tf.runner.price(row)
    assert [(q.kind, q.ids, q.start) for q in qs] == [("logprobs", row.prompt_ids + a, len(row.prompt_ids))
                                                      for a in row.answer_ids]
    gen = Scorer(lo, task, "generate", max_new_tokens=7)
    (q,) = gen.runner.price(gen.rows(task.examples(1), [2])[0])
    assert (q.kind, q.ids, q.max_tokens) == ("generate", row.prompt_ids, 7)


class _Runner:
    """What a meter asks of a runner: its units, its in-flight size, a row's price (here $1: one prompt token at
    $1M per 1M) and the backend's counters (none: spent is priced from the rows)."""

    billed = True

    def __init__(self, units, in_flight):
        self._units, self.in_flight = units, in_flight

    def units(self, rows, method):
        return self._units

    def price(self, row):
        from posbias.backends import Request

        return [Request("logprobs", ids=[7], start=0)]

    def counters(self):
        return {}


@pytest.mark.parametrize("in_flight, units, done, want", [
    (None, [[0, 1], [2], [3, 4], [5]], {("e1", 0)}, [[0, 1], [2], [3, 4], "stop"]),  # in process: a unit a piece
    (None, [[0, 1], [2], [3, 4], [5]], {("e0", 0), ("e1", 0)}, [[2], [3, 4], [5]]),  # a finished unit skipped; $4 fit
    (2, [[0], [1], [2], [3], [4], [5]], set(), [[0, 1], [2, 3], "stop"]),  # served: rows while 2 requests
])
def test_a_budget_s_pieces_are_runs_of_units_within_the_in_flight_size_and_stop_at_the_budget(in_flight, units, done,
                                                                                                want, capsys):
    """The budget is $4.50 and a row costs $1."""
    from posbias.eval.cost import BudgetReached

    rows = [SimpleNamespace(key=(f"e{i}", 0)) for i in range(6)]
    meter = Meter(prices=(1e6, 0.0), budget=4.5)
    meter.begin(_Runner(units, in_flight), rows, [])
    out: list[dict] = []
    got = []
    try:
        for piece in meter.pieces(rows, None, done, out):
            got.append([int(r.key[0][1:]) for r in piece])
            out.extend({"example_id": r.key[0], "position": 0} for r in piece if r.key not in done)
    except BudgetReached:
        got.append("stop")
    assert got == want


def test_nothing_outside_the_runners_asks_in_process_or_served():
    """The batching word is read where a runner is chosen (and declared by backends); no fake Scorer, no getattr on a
    backend for its capacity, no getattr on an error for a resume hint."""
    asks, fakes = [], []
    for path in SRC.rglob("*.py"):
        text, rel = path.read_text(), str(path.relative_to(SRC))
        if rel != "scoring/runners.py" and not rel.startswith("backends/"):
            asks += [f"{rel}: {m.group(0)}" for m in re.finditer(r"caps\.batching|\.loaded is (not )?None", text)]
        fakes += [f"{rel}: {m.group(0)}" for m in re.finditer(
            r"SimpleNamespace\(|getattr\((self\.)?backend, \"(concurrency|batch|in_flight)\"|getattr\(\w+, \"fix_\w+\"", text)]
        ast.parse(text)
    assert asks == [] and fakes == []
