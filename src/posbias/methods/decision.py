"""Decision rules for order tasks (tasks/order.py): mitigations that leave the model as it is and change how its
answers over the candidates' orders become a verdict. They are methods like the others (registered, compared on
the same items with paired CIs, served models included) whose `apply` changes nothing; the sweep scores every
order of each item and calls `decide` on the rows (core/order.py holds the maths).

  swap         balanced position calibration (FairEval; MT-Bench's swap for two answers): every cyclic order of
               the candidates is read and the candidate with the best mean normalised label log-probability wins;
               with generated verdicts, a vote, where a tie (two answers: the orders disagree) is no verdict.
               Cost: k forward passes per verdict (k candidates).
  aswap[:T]    adaptive swap: the verdict of the order each item is first shown in stands when its label margin
               (top normalised label log-probability minus the second, nats) is >= T (default 1.0); else the full
               swap decides. The first order is not placement 0, which always shows the correct candidate first
               (a judge that always names the first answer would score 1.0): it is drawn per item, balanced over
               the k orders (`first_placements`). Generated verdicts have no margin: one read and not cut short counts as
               decided (margin inf), an unread or cut one as a tie (margin 0). T = 0 keeps every first verdict
               (1 pass each), T = inf is the swap (k each). Cost: the mean of 1 or k passes per verdict.
  pride[:F|N]  PriDe (Zheng et al., ICLR 2024): the option-ID prior estimated on calibration items (all k cyclic
               orders each; F a share of the evaluated items, default 0.05 as in the paper, or N items) taken
               after the evaluated ones in the seeded order, so never among them; each verdict is then
               argmax log P(label) - log prior(label). Cost: 1 forward pass per verdict, plus k per
               calibration item. Needs the label log-probabilities (engine=teacher-forced).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

import hashlib
import math

from ..core.order import balanced_choice, candidate, label_margin, pride_choice, pride_prior
from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method
from .registry import register_method


class DecisionRule(Method):
    """A verdict rule over the orders of an order task; the model is untouched (changes_model False)."""

    changes_model = False
    prefix_safe = True
    reuses_unmodified = True  # its rows are the unmodified model's in every order: compare hands over `none`'s
    calibration_share: float = 0.0  # items to calibrate on, as a share of the evaluated ones
    calibration_items: int | None = None  # or a fixed number of them

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        yield Active()

    def calibration(self, n: int) -> int:
        """How many calibration items a run of n evaluated items takes (0: none): a fixed number, or the share of n
        rounded down as the authors' PriDe code does (`int(0.05 * N)`), and at least 1. The authors' N is their whole
        set and the calibration items are among the items they score; here they are held out after the n evaluated
        ones (no verdict is scored on an item that shaped the prior), so n = 50 calibrates on 2 items."""
        if self.calibration_items is not None:
            return self.calibration_items
        return max(1, int(self.calibration_share * n + 1e-9)) if self.calibration_share else 0

    def check_task(self, task, positions: list, engine: str) -> None:
        """Refuse, in one line, a run this rule cannot decide (before any model loads)."""
        if not task.order:
            raise PosbiasError(f"method {self.key} decides between the orders of an order task, and {task.name} is not one",
                               "use it with judge-nq, mc-nq, judge-kv, mc-kv, judge:PATH or mc:PATH")
        if sorted(positions) != list(range(task.n_slots)):
            raise PosbiasError(f"method {self.key} needs every order of each item, got positions "
                               f"{','.join(map(str, positions))}", "drop `positions` (the default is all)")

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict]:
        """(the evaluated rows with this rule's choice and correctness, a record of the decision)."""
        raise NotImplementedError


def _by_item(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["example_id"], []).append(r)
    return {e: sorted(rs, key=lambda r: r["position"]) for e, rs in out.items()}


def _decided(row: dict, choice: int) -> dict:
    return {**row, "raw_choice": row.get("choice", -1), "choice": choice, "correct": choice == row["position"]}


@register_method
class Swap(DecisionRule):
    """Balanced position calibration: every cyclic order of the candidates read, the best mean label score wins."""

    name = "swap"
    usage = "swap"

    def config(self) -> dict:
        return {"name": "swap"}

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict]:
        out, ties = [], 0
        for rs in _by_item(rows).values():
            c = _swap_verdict(rs, k)
            ties += c < 0
            out += _verdict_rows(rs, c, k)
        return out, {"rule": "swap", "forward_passes_per_verdict": k, "no_verdict_items": ties}


def _swap_verdict(rs: list[dict], k: int) -> int:
    """The candidate the swap names from an item's rows in every order (-1: no verdict)."""
    placements = [r["position"] for r in rs]
    if all("option_logprobs" in r for r in rs):
        return balanced_choice(placements, k, logps=[r["option_logprobs"] for r in rs])
    return balanced_choice(placements, k, choices=[r["choice"] for r in rs])


def _verdict_rows(rs: list[dict], c: int, k: int) -> list[dict]:
    """An item's rows, each choosing the slot where candidate c sits in its order (-1 everywhere: no verdict)."""
    return [_decided(r, c if c < 0 else (c + r["position"]) % k) for r in rs]  # no verdict (-1) or a tie (-2) as is


def verdict_margin(row: dict) -> float:
    """How decided one row's verdict is: the label margin (core.order.label_margin) of a teacher-forced row; a
    generated one has none, so read and not cut short counts as decided (inf), unread or cut as a tie (0)."""
    if "option_logprobs" in row:
        return label_margin(row["option_logprobs"])
    return math.inf if row.get("choice", -1) >= 0 and not row.get("cut") else 0.0


THRESHOLDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # nats: the table every adaptive-swap record carries


@register_method
class AdaptiveSwap(DecisionRule):
    """Swap only when the first order's verdict is unsure (module docstring)."""

    name = "aswap"
    usage = "aswap|aswap:T"

    def __init__(self, threshold: float = 1.0):
        if not threshold >= 0:  # NaN too
            raise PosbiasError(f"aswap's margin threshold must be a number >= 0 (nats), got {threshold}",
                               "write it as aswap, aswap:1.0 or aswap:inf (the full swap)")
        self.threshold = float(threshold)

    @classmethod
    def from_spec(cls, arg: str) -> "AdaptiveSwap":
        try:
            return cls(float(arg)) if arg else cls()
        except ValueError:
            raise PosbiasError(f"bad aswap threshold {arg!r}", "write it as aswap, aswap:1.0 or aswap:inf") from None

    def config(self) -> dict:
        return {"name": "aswap", "threshold": self.threshold}

    @property
    def label(self) -> str:
        return f"aswap:{self.threshold:g}"

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict]:
        items = _by_item(rows)
        shown = first_placements(list(items), k)
        out, early, swaps, verdicts, firsts, margins = [], [], [], [], [], []
        for e, rs in items.items():
            first = next(r for r in rs if r["position"] == shown[e])  # the order the item is first shown in
            full = _swap_verdict(rs, k)
            margins.append(verdict_margin(first))
            firsts.append(candidate(first.get("choice", -1), shown[e], k))
            stop = self.threshold < math.inf and margins[-1] >= self.threshold
            c = candidate(first.get("choice", -1), shown[e], k) if stop else full
            early.append(stop)
            swaps.append(full)
            verdicts.append(c)
            out += _verdict_rows(rs, c, k)
        record = adaptive_record(self.threshold, np.array(early, bool), np.array(verdicts), np.array(swaps), k)
        record["thresholds"] = threshold_table(np.array(margins, float), np.array(firsts), np.array(swaps), k)
        return out, {**record, "first_placements": np.bincount(list(shown.values()), minlength=k).tolist()}


def threshold_table(margins: np.ndarray, firsts: np.ndarray, swaps: np.ndarray, k: int) -> list[dict]:
    """What other thresholds would have done on the same rows (every order is scored, so this costs nothing): per T
    in THRESHOLDS, the share stopped early, their agreement with the full swap, and the passes per verdict. Pick T
    on one split, report it on another."""
    out = []
    for t in THRESHOLDS:
        early = margins >= t
        out.append({"threshold": t, "early_stop_share": float(early.mean()) if len(early) else None,
                    "early_agreement": float((firsts == swaps)[early].mean()) if early.any() else None,
                    "forward_passes_per_verdict": round(float(np.where(early, 1, k).mean()), 4) if len(early) else k})
    return out


def first_placements(example_ids: list[str], k: int) -> dict[str, int]:
    """The order each item is first shown in (the adaptive swap's single pass): the items ranked by a hash of their
    id, the one of rank i shown in placement i mod k. Balanced over the k orders (counts differ by at most one),
    reproducible, and blind to which candidate is correct; placement 0 for every item would show the correct one
    first every time and credit a judge's primacy bias as accuracy."""
    ranked = sorted(example_ids, key=lambda e: hashlib.sha256(f"aswap/{e}".encode()).hexdigest())
    return {e: i % k for i, e in enumerate(ranked)}


def adaptive_record(threshold: float, early: np.ndarray, verdicts: np.ndarray, swaps: np.ndarray, k: int) -> dict:
    """The adaptive swap's decision record: passes per verdict (the mean of 1 or k), the share stopped early, how
    often the verdicts agree with the full swap's (on the early items, and on all), and both accuracies (the correct
    candidate is 0; an item without a verdict is wrong). Agreement compares candidates, -1 (no verdict) included."""
    n, agree = len(early), verdicts == swaps
    mean = lambda x: float(np.mean(x)) if len(x) else None  # noqa: E731 - four uses
    return {"rule": "aswap", "threshold": threshold,
            "forward_passes_per_verdict": round(float(np.where(early, 1, k).mean()), 4) if n else k,
            "items": n, "early_items": int(early.sum()), "early_stop_share": mean(early),
            "early_agreement": mean(agree[early]), "agreement_with_swap": mean(agree),
            "accuracy": mean(verdicts == 0), "swap_accuracy": mean(swaps == 0), "no_verdict_items": int((verdicts < 0).sum())}


@register_method
class PriDe(DecisionRule):
    """PriDe (Zheng et al. 2024): the option-ID prior from calibration items, divided out of each verdict."""

    name = "pride"
    usage = "pride|pride:SHARE|pride:ITEMS"

    def __init__(self, calibration_share: float = 0.05, calibration_items: int | None = None):
        """The parameters are named as config() records them, so `pride:calibration_items=20` is the key=value form."""
        share, items = calibration_share, calibration_items
        if items is not None and items < 1 or items is None and not 0 < share <= 1:
            raise PosbiasError(f"pride calibrates on a share in (0, 1] or a number of items >= 1, got {items or share}",
                               "write it as pride, pride:0.05 or pride:20")
        self.calibration_share, self.calibration_items = share, items

    @classmethod
    def from_spec(cls, arg: str) -> "PriDe":
        if not arg:
            return cls()
        try:
            return cls(calibration_items=int(arg)) if arg.isdigit() else cls(calibration_share=float(arg))
        except ValueError:
            raise PosbiasError(f"bad pride calibration {arg!r}", "write it as pride, pride:0.05 or pride:20") from None

    def config(self) -> dict:
        return {"name": "pride", "calibration_share": None if self.calibration_items else self.calibration_share,
                "calibration_items": self.calibration_items}

    def check_task(self, task, positions: list, engine: str) -> None:
        super().check_task(task, positions, engine)
        if engine != "teacher-forced":
            raise PosbiasError("pride estimates its prior from the option labels' log-probabilities, which generation "
                               "does not give", "use `engine=teacher-forced`, or the swap method with generate")

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict]:
        cal = _by_item(calibration)
        if not cal or any(len(rs) != k for rs in cal.values()):
            raise PosbiasError("pride: the calibration items were not scored in every order", "run the sweep again")
        prior = pride_prior(np.array([[r["option_logprobs"] for r in rs] for rs in cal.values()]))  # [Q, k, k] -> [k]
        out = [_decided(r, pride_choice(r["option_logprobs"], prior)) for r in rows]
        return out, {"rule": "pride", "prior": [float(x) for x in np.exp(prior)], "calibration_items": sorted(cal),
                     "forward_passes_per_verdict": 1, "calibration_forward_passes": k * len(cal)}
