"""A decision rule: every order of an item answered as its first order answered (consistent by construction)."""

from posbias import register_method
from posbias.methods.decision import DecisionRule


@register_method
class FirstOrder(DecisionRule):
    """The candidate chosen in each item's first order, in every order (the example plugin's decision rule)."""

    name = "first-order"

    def config(self) -> dict:
        return {"name": self.name}

    def decide(self, rows, calibration, k):
        first = {r["example_id"]: r for r in rows if r["position"] == 0}
        out = []
        for r in rows:
            slot = first[r["example_id"]].get("choice", -1)
            choice = -1 if slot < 0 else (slot + r["position"]) % k  # candidate `slot` sits here in this order
            out.append({**r, "raw_choice": r.get("choice", -1), "choice": choice, "correct": choice == r["position"]})
        return out, {"rule": self.name, "forward_passes_per_verdict": k}
