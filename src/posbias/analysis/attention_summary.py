"""Summaries of the attention analysis's tidy rows (plain dicts in, plain dicts out; no model).

Layer bands: the early / middle / late thirds of the layers, and all layers. Per scale and placement:
accuracy, and per band the mean mass on the gold item(s), on each slot, on the first token and on the
rest, and the gold share of the item mass. Per scale: the middle-third share, mass on the items in the
middle third of the slots / mass on all items (LPES Appendix A, Fig. 5). With the rollout: the predicted
gold share (rollout gold mass / rollout item mass of the last prompt token) after every depth.
"""

from __future__ import annotations

from statistics import fmean

from ..tasks import as_json, placement_key


def layer_bands(n_layers: int) -> dict[str, list[int]]:
    """early / middle / late thirds of the layers (the middle takes the remainder), and all. Models with fewer
    than three layers get overlapping one-layer bands (no band is empty)."""
    k = n_layers // 3
    w = max(k, 1)
    middle = list(range(k, n_layers - k)) if n_layers >= 3 else [n_layers // 2]
    return {"early": list(range(0, w)), "middle": middle, "late": list(range(n_layers - w, n_layers)),
            "all": list(range(n_layers))}


def middle_slots(n_slots: int) -> list[int]:
    """The middle third of the slots (same cut as the real rollout: n // 3 on each side)."""
    return list(range(n_slots // 3, n_slots - n_slots // 3))


def dedupe(rows: list[dict]) -> list[dict]:
    """One row per (example, placement, scale, layer): the first one (a resumed batch may repeat rows)."""
    seen, out = set(), []
    for r in rows:
        k = (r["example_id"], placement_key(r["position"]), r.get("scale"), r["layer"])
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def _share(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _band_stats(rows: list[dict], layers: list[int]) -> dict:
    sel = [r for r in rows if r["layer"] in layers]
    if not sel:
        return {}
    n = len(sel[0]["items"])
    return {"gold": fmean(r["gold"] for r in sel), "first": fmean(r["first"] for r in sel),
            "other": fmean(r["other"] for r in sel), "items": [fmean(r["items"][k] for r in sel) for k in range(n)],
            "gold_share": fmean(_share(r["gold"], sum(r["items"])) for r in sel)}


def _rollout_by_depth(rows: list[dict], n_layers: int) -> list[float] | None:
    if "rollout_gold" not in rows[0]:
        return None
    return [fmean(_share(r["rollout_gold"], sum(r["rollout_items"])) for r in rows if r["layer"] == layer)
            for layer in range(n_layers)]


def _position_summary(rows: list[dict], bands: dict[str, list[int]], n_layers: int) -> dict:
    """Accuracy, per-band masses and the rollout's predicted gold share of one scale x placement."""
    verdicts = {r["example_id"]: r["correct"] for r in rows}
    out = {"n": len(verdicts), "correct": sum(verdicts.values()), "accuracy": sum(verdicts.values()) / len(verdicts),
           "bands": {b: _band_stats(rows, layers) for b, layers in bands.items()}}
    depth = _rollout_by_depth(rows, n_layers)
    if depth is not None:
        out["rollout_gold_share"] = depth[-1]
        out["rollout_gold_share_by_depth"] = depth
    return out


def _middle_share(rows: list[dict], layers: list[int], middle: list[int]) -> float:
    sel = [r for r in rows if r["layer"] in layers]
    return fmean(_share(sum(r["items"][k] for k in middle), sum(r["items"])) for r in sel) if sel else float("nan")


def summarize(rows: list[dict], scales: list, positions: list, n_layers: int, n_slots: int) -> dict:
    """The record's summary: bands, per scale the middle-third share per band and each placement's stats."""
    rows = dedupe(rows)
    bands = layer_bands(n_layers)
    middle = middle_slots(n_slots)
    per_scale = []
    for s in scales:
        at_scale = [r for r in rows if r.get("scale") == s]
        per = []
        for p in positions:
            sel = [r for r in at_scale if placement_key(r["position"]) == p]
            if sel:
                per.append({"position": as_json(p), **_position_summary(sel, bands, n_layers)})
        per_scale.append({"scale": s, "middle_share": {b: _middle_share(at_scale, layers, middle)
                                                       for b, layers in bands.items()},
                          "per_position": per})
    return {"bands": bands, "middle_slots": middle, "per_scale": per_scale}
