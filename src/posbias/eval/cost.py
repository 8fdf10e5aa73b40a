"""What a sweep costs on a served model: the estimate printed before scoring, a budget checked before each further
piece of work, and sweep.json's "cost" record (docs/backends.md, "Cost and budget").

  estimate  from the rendered rows and the requests the engine sends for each (`Engine.requests`): a request's
            prompt tokens are its token ids (a chat prompt without ids: its characters / 4, "estimated"); its
            completion tokens 1 for a logprobs request (sent with max_tokens 1) and max_tokens for a generation (an
            upper bound). In process, rows are priced as the requests of a server with prompt logprobs: teacher
            forcing one request per answer (or option label) of prompt + answer tokens, generation one request of
            the prompt and max_new_tokens.
  spent     this invocation's rows: the served backend's counters (the tokens the server counted) where it counts
            them, else each row's estimate with its generated answer's own tokens; rows an earlier invocation left in
            examples.jsonl (resume) are priced the second way; rows compare hands over (`handed`) are not counted.
  budget    before each further piece (in process: a unit of the batch plan, `runners.InProcess.units`; served: a
            window of rows whose requests fill the backend's declared `in_flight`, sent together) the spent USD plus
            the piece's estimate must stay within it, else `BudgetReached`: every scored row logged, no sweep.json
            (resumable).

The sweep's run object (eval/sweep.py, `SweepRun`) holds its `Meter` and scores the pieces `Meter.pieces` gives.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Iterator

from ..backends import Request
from ..errors import PosbiasError
from ..runs import is_main_process, num_processes
from ..tasks import placement_key

PER = 1_000_000  # prices are USD per 1M tokens
CHARS_PER_TOKEN = 4  # a chat prompt without token ids (a chat-only server): its tokens estimated from its characters


@dataclass(frozen=True)
class Tokens:
    requests: int = 0
    prompt: int = 0
    completion: int = 0

    def __add__(self, other: "Tokens") -> "Tokens":
        return Tokens(self.requests + other.requests, self.prompt + other.prompt, self.completion + other.completion)

    def times(self, k: float) -> "Tokens":
        """K passes of the same requests (an order ensemble reads each row K times)."""
        return Tokens(round(self.requests * k), round(self.prompt * k), round(self.completion * k))

    def usd(self, prices: tuple[float, float] | None) -> float | None:
        return None if prices is None else (self.prompt * prices[0] + self.completion * prices[1]) / PER


def total(items) -> Tokens:
    return sum(items, Tokens())


def usd(x: float) -> str:
    """$1.00, $0.15, $0.0912, $0.000123: cents where they say it all, else four significant digits."""
    return f"${x:,.2f}" if abs(x - round(x, 2)) < 1e-12 else f"${x:,.4g}"


class BudgetReached(PosbiasError):
    """The run stopped at its budget: every scored row is in examples.jsonl, no result file (the folder resumes)."""

    def __init__(self, budget: float, done: int, rows: int, spent: float):
        self.budget, self.done, self.rows, self.spent = budget, done, rows, spent
        super().__init__(f"budget of {usd(budget)} reached after {done} of {rows} rows ({usd(spent)} spent)",
                         "resume with `resume` and a larger `budget`")
        self.fix_before_resume = "raise `budget`"  # where a caller adds its own resume hint (compare: with_resume_hint)


def request_tokens(q: Request) -> tuple[Tokens, bool]:
    """(one request's tokens: its prompt, its completion at most; whether the prompt tokens are counted, not estimated)."""
    if q.ids is not None:
        prompt, counted = len(q.ids), True
    else:
        chars = sum(len(str(m.get("content") or "")) for m in q.messages or [])
        prompt, counted = -(-chars // CHARS_PER_TOKEN), False
    return Tokens(1, prompt, 1 if q.kind == "logprobs" else q.max_tokens), counted


def _key(row: dict) -> tuple:
    return (row["example_id"], placement_key(row["position"]))


class Meter:
    """One sweep's cost: `begin` before scoring (the estimate, printed; what the logged rows cost), `end` after (this
    invocation's spent: `rec`, sweep.json's "cost", given prices), and between them the pieces to score (`pieces`).
    Off (counts and prints nothing) in process without prices.
    elsewhere: USD that runs sharing the budget spent before this one (a compare's earlier entries); handed: the
    keys of rows handed over, not scored here (compare's unmodified rows)."""

    def __init__(self, prices: tuple[float, float] | None = None, budget: float | None = None, elsewhere: float = 0.0,
                 handed: frozenset = frozenset()):
        self.prices, self.budget, self.elsewhere, self.handed = prices, budget, elsewhere, handed
        self.on, self.rec = False, None
        self.passes = 1  # requests per row are read this many times (an order ensemble's K; adaptive: at most K)

    @classmethod
    def of(cls, cfg, elsewhere: float = 0.0, handed: list[dict] | None = None, passes: int = 1) -> "Meter":
        """A sweep config's meter (cost.Cost fields); passes: how often each row's requests are read (an order
        ensemble's K). A budget under several processes is refused here."""
        if cfg.budget is not None and num_processes() > 1:
            raise PosbiasError("a `budget` is checked by one process, and this run has several",
                               "run it in one process, or drop `budget`")
        prices = None if cfg.price_in is None else (float(cfg.price_in), float(cfg.price_out))  # USD per 1M tokens
        meter = cls(prices, cfg.budget, elsewhere, frozenset(_key(r) for r in handed or []))
        meter.passes = passes
        return meter

    def begin(self, runner, rows: list, done_rows: list[dict]) -> None:
        """Before scoring: the estimate (printed on stderr) and the rows already paid for. runner: how the rows reach
        the model (scoring/runners.py): it prices a row and says how work splits into pieces."""
        self.on = runner.billed or self.prices is not None
        if not self.on:
            return
        self.runner, self.rows, self.est, self.counted = runner, rows, {}, True
        for r in rows:
            priced = [request_tokens(q) for q in runner.price(r)]
            self.est[r.key] = total(t for t, _ in priced).times(self.passes)
            self.counted = self.counted and all(c for _, c in priced)
        done = {_key(d) for d in done_rows}
        self.left = [r for r in rows if r.key not in done]
        self.estimate = total(self.est[r.key] for r in self.left)
        paid = [d for d in done_rows if _key(d) not in self.handed and _key(d) in self.est]
        self.before, self.rows_before, self.done_before = total(map(self.row_cost, paid)), len(paid), len(done_rows)
        self.counters0 = dict(runner.counters())
        if self.left and is_main_process():  # (a resumed run with nothing left to score says nothing)
            print(self.line(), file=sys.stderr, flush=True)

    def row_cost(self, row: dict) -> Tokens:
        """A scored row's cost from its estimate: a generated answer that stopped before the limit, its own tokens
        (and the stop)."""
        est = self.est[_key(row)]
        if "passes" in row and self.passes > 1:  # an order ensemble: the orders it read (adaptive: maybe fewer)
            est = est.times(row["passes"] / self.passes)
        if row.get("cut") is False and est.requests == 1:
            return replace(est, completion=min(est.completion, self.runner.count_tokens(row.get("prediction") or "") + 1))
        return est

    def measured(self, new_rows: list[dict]) -> tuple[Tokens, str]:
        """This invocation's spent tokens: the backend's counters (since `begin`) where they count the tokens, else
        the rows' estimates -> (tokens, how counted)."""
        now = self.runner.counters()
        d = {k: v - self.counters0.get(k, 0) for k, v in now.items() if isinstance(v, (int, float))}
        sent = d.get("replies", d.get("requests", 0))  # replies (the openai backend) leave out cache hits
        if "prompt_tokens" in d and (d["prompt_tokens"] > 0 or sent == 0):
            return Tokens(0, int(d["prompt_tokens"]), int(d.get("completion_tokens", 0))), "server"
        return total(map(self.row_cost, new_rows)), "estimate"

    def spent(self, new_rows: list[dict]) -> float:
        """USD spent so far: elsewhere, the logged rows, and this invocation's."""
        return self.elsewhere + (self.before + self.measured(new_rows)[0]).usd(self.prices)

    def fits(self, cost: Tokens, spent: float) -> bool:
        """Whether `cost` more, after `spent` USD, stays within the budget."""
        return spent + cost.usd(self.prices) <= self.budget * (1 + 1e-12)

    def stop(self, new_rows: list[dict]) -> None:
        raise BudgetReached(self.budget, self.done_before + len(new_rows), len(self.rows), self.spent(new_rows))

    def end(self, new_rows: list[dict]) -> None:
        """After scoring: the record, with this invocation's spent (given prices: without them a served run's sweep.json
        keeps only its backend counters, how requests went, beside results two runs of the same rows share)."""
        if not self.on or self.prices is None:
            return
        this, how = self.measured(new_rows)
        rows, p = self.rows_before + len(new_rows), self.prices
        spent = {"this_run": {"rows": len(new_rows), "prompt_tokens": this.prompt, "completion_tokens": this.completion,
                              "usd": this.usd(p), "counted_by": how},
                 "total": {"rows": rows, "prompt_tokens": self.before.prompt + this.prompt,
                           "completion_tokens": self.before.completion + this.completion,
                           "usd": (self.before + this).usd(p)}}
        if self.elsewhere:
            spent["elsewhere_usd"] = self.elsewhere
        e = self.estimate
        self.rec = {"prices": {"prompt": p[0], "completion": p[1], "per": "USD per 1M tokens"},
                    "budget": self.budget,
                    "estimate": {"rows": len(self.left), "of": len(self.rows), "requests": e.requests,
                                 "prompt_tokens": e.prompt, "completion_tokens": e.completion, "usd": e.usd(p),
                                 "prompt": "counted" if self.counted else "estimated (characters / 4)",
                                 "completion": "upper bound"},
                    "spent": spent}

    def line(self) -> str:
        """cost estimate: 412 requests, 301,220 prompt + 3,296 completion tokens (upper bound) = $0.0912 at $0.15/$0.60
        per 1M"""
        e, p = self.estimate, self.prices
        head = "cost estimate" + (f" for the {len(self.left)} rows left of {len(self.rows)}"
                                  if len(self.left) < len(self.rows) else "")
        prompt = f"{e.prompt:,} prompt" + ("" if self.counted else " (estimated: characters / 4)")
        out = f"{head}: {e.requests:,} requests, {prompt} + {e.completion:,} completion tokens (upper bound)"
        if p is not None:
            out += f" = {usd(e.usd(p))} at {usd(p[0])}/{usd(p[1])} per 1M"
        if self.budget is not None:
            out += f"; budget {usd(self.budget)}, {usd(self.elsewhere + self.before.usd(p))} spent before"
        return out

    def pieces(self, rows: list, method, done: set, out: list[dict]) -> Iterator[list]:
        """What to score, in pieces: all the rows at once without a budget; with one, each piece only when the spent
        cost (`out`: the rows scored so far, which the caller extends) plus its estimate stays within it. A piece is a
        run of the runner's units (in process: units of the one-call plan, each planned into the very same batches,
        so identical numbers; served: rows) holding at most its `in_flight` requests (None: one unit a piece)."""
        if self.budget is None or not self.on:
            yield rows
            return
        units = [u for u in self.runner.units(rows, method) if any(rows[i].key not in done for i in u)]
        cap, k = self.runner.in_flight, 0
        while k < len(units):
            piece, cost, spent = [], Tokens(), self.spent(out)  # nothing in flight: every reply is counted
            while k < len(units):
                more = total(self.est[rows[i].key] for i in units[k] if rows[i].key not in done)
                if piece and (cap is None or cost.requests + more.requests > cap) or not self.fits(cost + more, spent):
                    break
                piece, cost, k = piece + units[k], cost + more, k + 1
            if not piece:
                self.stop(out)
            yield [rows[i] for i in piece]


def spent_usd(record: dict) -> float:
    """USD a finished sweep spent in total (its record's cost; 0 without one)."""
    return ((record.get("cost") or {}).get("spent", {}).get("total", {}).get("usd")) or 0.0
