"""What a slot policy file (policy.py) must hold: its version, and the one-line refusal of a policy whose field the
code reads is missing or of another type (naming the policy, the field and what it must be), or whose ranking is not
each of its slots once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .core.stats import ALPHA
from .errors import PosbiasError

VERSION = 1


def validate_policy(pol: dict, where: str | Path) -> None:
    """Refuse, in one line, a policy (a file's, or a dict: `where` names it) of another version, or with a field the
    code reads missing or of the wrong type (naming the field and what it must be), or a broken ranking."""
    if pol.get("posbias_policy") != VERSION:
        raise PosbiasError(f"{where} is policy version {pol.get('posbias_policy')!r}, this posbias reads {VERSION}",
                           "export the policy again with this posbias (posbias policy export RUN)")
    need = _Fields(pol, where)
    need("model", isinstance(pol.get("model"), str) and pol["model"], "the name of the model the curve belongs to")
    need("task", isinstance(pol.get("task"), dict), "an object (the task's shape, task.config())")
    need("n_slots", is_whole(pol.get("n_slots")) and pol["n_slots"] >= 1, "a whole number of slots, 1 or more")
    ranking, n = pol.get("ranking"), pol["n_slots"]
    need("ranking", isinstance(ranking, list) and all(map(is_whole, ranking)), "a list of slots (whole numbers), best first")
    if sorted(ranking) != list(range(n)):
        raise PosbiasError(f"{where} ranks slots {ranking}, not each of its {n} slots once", "export the policy again")
    for k, s in enumerate(_optional(pol, "slots", list, need, "a list of per-slot objects")):
        ok = (isinstance(s, dict) and is_whole(s.get("slot")) and is_number(s.get("accuracy")) and is_whole(s.get("n"))
              and is_pair(s.get("ci")))
        need(f"slots[{k}]", ok, 'an object {"slot": whole number, "accuracy": number, "ci": [low, high], "n": whole number}')
    run = _optional(pol, "measured", dict, need, "an object (how the curve was measured)").get("run")
    need("measured.run", run is None or isinstance(run, str), "the path of the sweep record, or null")
    split = _optional(pol, "fitted_on", dict, need, "an object (the examples the curve was measured on), or null")
    if split:
        need("fitted_on.task", isinstance(split.get("task"), str), "a task name")
        for key in ("seed", "skip", "n"):
            need(f"fitted_on.{key}", is_whole(split.get(key)) and split[key] >= 0, "a whole number, 0 or more")
    _validate_curve(_optional(pol, "curve", dict, need, "an object (the curve's test, gap and shape), or null"), need)


def _validate_curve(curve: dict, need: "_Fields") -> None:
    """The curve's fields ranking_note reads: the gap, its interval and the average (shown), and the position-effect
    test (decides): {"name": text, "statistic": number, "p": number in [0, 1], "n": whole, "permutations": whole}, or
    null in a policy of an older posbias; `separable` must agree with it (p < ALPHA)."""
    need("curve.gap_ci", curve.get("gap_ci") is None or is_pair(curve["gap_ci"]), "[low, high] (two numbers), or null")
    for key in ("gap", "average"):
        need(f"curve.{key}", curve.get(key) is None or is_number(curve[key]), "a number, or null")
    test = curve.get("position_test")
    need("curve.position_test", test is None or isinstance(test, dict), "an object (the position-effect test), or null")
    if test is not None:
        need("curve.position_test.name", isinstance(test.get("name"), str), "the test's name")
        need("curve.position_test.p", is_number(test.get("p")) and 0 <= test["p"] <= 1, "a p-value, a number in [0, 1]")
        need("curve.position_test.statistic", is_number(test.get("statistic")), "a number")
        for key in ("n", "permutations"):
            need(f"curve.position_test.{key}", is_whole(test.get(key)) and test[key] >= 0, "a whole number, 0 or more")
    sep, want = curve.get("separable"), None if test is None else bool(test["p"] < ALPHA)
    need("curve.separable", sep in (None, True, False) and (test is None or sep is want),
         "true, false or null" if test is None else f"{json.dumps(want)} (position_test.p {test['p']} "
                                                    f"{'<' if want else '>='} {ALPHA})")


_MISSING = object()


class _Fields:
    """need(field, ok, must): refuse in one line, naming the policy, the field and what it must be, unless ok."""

    def __init__(self, pol: dict, where: str | Path):
        self.pol, self.where = pol, where

    def __call__(self, name: str, ok: Any, must: str) -> None:
        if ok:
            return
        got: Any = self.pol
        for part in name.replace("[", ".").replace("]", "").split("."):
            got = got.get(part, _MISSING) if isinstance(got, dict) else got[int(part)]
        shown = "nothing (no such field)" if got is _MISSING else json.dumps(got)
        raise PosbiasError(f"{self.where}: '{name}' must be {must}, got {shown if len(shown) <= 60 else shown[:57] + '...'}",
                           "correct that field, or export the policy again (posbias policy export RUN)")


def _optional(pol: dict, name: str, kind: type, need: _Fields, must: str):
    """A field the policy may leave out (or null): its value, or an empty one of `kind`; a value of another type refused."""
    value = pol.get(name)
    need(name, value is None or isinstance(value, kind), must)
    return value or kind()


def is_whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_pair(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 2 and all(map(is_number, x))
