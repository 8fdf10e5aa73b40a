"""reorder:curve, the slot policy a sweep measured: the relevance signal's best item goes into the slot where this model
reads best, its second into the second best, and so on (posbias/policy.py; the LangChain and LlamaIndex reorderers of
integrations/ apply the same placement in a user's pipeline).

    curve:RUN[:SIGNAL]       RUN: a finished sweep folder of the unmodified model (every slot, one gold item) or a policy
                             file (`posbias policy export RUN`); SIGNAL: bm25 (default) or oracle, as in reorder

Which colon ends RUN: a spec that names an existing file or folder as a whole is RUN (a path may hold colons);
otherwise the text after the last colon is SIGNAL where it holds no `/` (then it must be bm25 or oracle: anything
else is refused naming it), and the whole spec is RUN where it does (`curve:runs/a:b/sweep`).

It generalises reorder's fixed rules: on a primacy curve it is `first`, on a recency curve `last`, and on any other
shape it follows the measured ranking. The curve must come from the same model, the same task shape (task.config())
and slot count, and from examples a comparison does not evaluate (its `fitted_on`: compare refuses an overlap).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PosbiasError
from ..models.load import Loaded
from ..policy import arrangement, check_policy, read_policy
from ..tasks import Task
from .registry import register_method
from .reorder import Reorder, ranking

SIGNALS = ("bm25", "oracle")


@register_method
class Curve(Reorder):
    """Items placed by a measured slot ranking: the r-th most relevant into the r-th best-read slot."""

    name = "curve"
    usage = "curve:RUN|POLICY.json[:bm25|oracle]"

    def __init__(self, policy: str, signal: str = "bm25"):
        if signal not in SIGNALS:
            raise PosbiasError(f"unknown relevance signal {signal!r} for curve (curve:{policy}:{signal})",
                               f"write curve:{policy}:bm25 or curve:{policy}:oracle, or curve:{policy} for bm25")
        super().__init__(signal, "first")
        self.rule = "curve"
        self.policy_path = str(policy)
        self.policy = read_policy(policy)
        self.fitted_on = self.policy.get("fitted_on")

    @classmethod
    def from_spec(cls, arg: str) -> "Curve":
        if not arg:
            raise PosbiasError("curve needs a measured curve", f"write it as {cls.usage} (a sweep folder or a policy file)")
        path, _, signal = arg.rpartition(":")
        if Path(arg).exists() or not path or "/" in signal:  # the whole spec is RUN (module docstring)
            return cls(arg)
        if signal not in SIGNALS and not Path(path).exists():
            raise PosbiasError(f"no policy or finished sweep at {arg}, nor at {path} with the relevance signal {signal!r}",
                               "pass an existing policy file or sweep folder, as curve:RUN or curve:RUN:bm25|oracle")
        return cls(path, signal)

    @property
    def label(self) -> str:
        return f"curve:{Path(self.policy_path).name}" + (f":{self.signal}" if self.signal != "bm25" else "")

    def config(self) -> dict:
        return {"name": self.name, "policy": self.policy_path, "sha256": self.policy["sha256"], "signal": self.signal,
                "model": self.policy["model"], "ranking": self.policy["ranking"]}

    def check_task(self, task: Task, positions: list, engine: str) -> None:
        super().check_task(task, positions, engine)
        check_policy(self.policy, task=task.config(), n_slots=task.n_slots)

    def check(self, loaded: Loaded) -> None:
        self.check_info(loaded.info)

    def check_info(self, info: dict) -> None:
        check_policy(self.policy, model=info.get("name"))

    def place(self, scores: list[float]) -> list[int]:
        ranked = ranking(scores)  # the items' slots, most relevant first
        return [ranked[r] for r in arrangement(self.policy["ranking"])]
