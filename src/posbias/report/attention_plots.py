"""Figures of the attention analysis (analysis/attention.py), drawn from its record (plain dicts).

  attention_heatmap.png   Pos2Distill Fig. 7: y = gold placement, x = item slot, colour = mean attention mass,
                          one panel per layer band; the gold cells are outlined (the diagonal for one gold)
  attention_gold.png      mass on the gold item against its placement, one line per band; accuracy on a
                          second axis
  attention_scales.png    LPES Fig. 5: the middle-third share of the item attention against the uniform factor
  attention_rollout.png   the real-model rollout's predicted gold share beside the measured accuracy
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.patches import Rectangle

from .plots import save_figure, subplots

BANDS = ("early", "middle", "late", "all")
_COLORS = {"early": "tab:blue", "middle": "tab:orange", "late": "tab:green", "all": "k"}


def _label(p) -> str:
    return f"{p[0]}:{p[1]}" if isinstance(p, (list, tuple)) else str(p)


def _gold_slots(p) -> list[int]:
    return list(p) if isinstance(p, (list, tuple)) else [p]


def _title(record: dict, what: str, scale) -> str:
    cfg = record["config"]
    at = f", scale {scale:g}" if scale is not None else ""
    return f"{cfg['task'] if isinstance(cfg['task'], str) else record['task']['name']} on {cfg['model']}{at}: {what} " \
           f"(n={cfg['n']}, rows={cfg['rows']})"


def plot_heatmap(record: dict, sc: dict, path: Path) -> None:
    """Fig. 7: mean mass per (gold placement, slot), one panel per band; gold cells outlined."""
    per = sc["per_position"]
    fig, axes = subplots(1, len(BANDS), figsize=(4.2 * len(BANDS), 0.32 * len(per) + 2.4), dpi=120, squeeze=False)
    for ax, band in zip(axes[0], BANDS):
        grid = [p["bands"][band]["items"] for p in per]
        im = ax.imshow(grid, aspect="auto", cmap="viridis", origin="lower")
        for y, p in enumerate(per):
            for g in _gold_slots(p["position"]):
                ax.add_patch(Rectangle((g - 0.5, y - 0.5), 1, 1, fill=False, ec="red", lw=1.2))
        ax.set_yticks(range(len(per)), [_label(p["position"]) for p in per], fontsize=7)
        ax.set_xlabel("item slot")
        ax.set_title(f"{band} layers", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    axes[0][0].set_ylabel("gold placement (red: gold cell)")
    fig.suptitle(_title(record, "attention mass per item", sc["scale"]), fontsize=10)
    save_figure(fig, path)


def plot_gold(record: dict, sc: dict, path: Path) -> None:
    """Gold mass by placement per band, with the accuracy on a second axis."""
    per = sc["per_position"]
    x = list(range(len(per)))
    fig, ax = subplots(figsize=(6.4, 3.8), dpi=120)
    for band in BANDS:
        ax.plot(x, [p["bands"][band]["gold"] for p in per], marker="o", color=_COLORS[band], label=f"gold mass, {band}")
    ax.set_xticks(x, [_label(p["position"]) for p in per], fontsize=8)
    ax.set_xlabel("gold placement")
    ax.set_ylabel("attention mass on the gold item")
    ax.grid(alpha=0.3)
    acc = ax.twinx()
    acc.plot(x, [p["accuracy"] for p in per], color="tab:red", ls="--", marker="s", label="accuracy")
    acc.set_ylim(0, 1.02)
    acc.set_ylabel("accuracy", color="tab:red")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = acc.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7)
    ax.set_title(_title(record, "gold attention vs accuracy", sc["scale"]), fontsize=9)
    save_figure(fig, path)


def plot_scales(record: dict, path: Path) -> None:
    """LPES Fig. 5: middle-third share of the item attention against the uniform scale factor."""
    scs = record["per_scale"]
    fig, ax = subplots(figsize=(5.6, 3.6), dpi=120)
    xs = [s["scale"] for s in scs]
    for band in BANDS:
        ax.plot(xs, [s["middle_share"][band] for s in scs], marker="o", color=_COLORS[band], label=band)
    n_slots, middle = record["task"]["n_slots"], record["middle_slots"]
    ax.axhline(len(middle) / n_slots, color="gray", ls=":", label="uniform over items")
    ax.set_xlabel("uniform RoPE scale factor s (positions i / s)")
    ax.set_ylabel("share of item attention on the middle third")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(_title(record, "middle-third attention", None), fontsize=9)
    save_figure(fig, path)


def plot_rollout(record: dict, sc: dict, path: Path) -> None:
    """The rollout's predicted gold share (last depth) beside the measured accuracy, by placement."""
    per = sc["per_position"]
    x = list(range(len(per)))
    fig, ax = subplots(figsize=(6.0, 3.6), dpi=120)
    ax.plot(x, [p["accuracy"] for p in per], marker="s", color="tab:red", label="measured accuracy")
    a = record["config"]["residual"]
    ax.plot(x, [p["rollout_gold_share"] for p in per], marker="o", color="tab:purple",
            label=f"rollout gold share of item mass (a={a:g})")
    ax.plot(x, [p["bands"]["late"]["gold_share"] for p in per], marker="^", color="tab:green",
            label="measured attention gold share, late layers")
    ax.axhline(1 / record["task"]["n_slots"], color="gray", ls=":", label="uniform over items")
    ax.set_xticks(x, [_label(p["position"]) for p in per], fontsize=8)
    ax.set_xlabel("gold placement")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(_title(record, "theory (rollout) next to measurement", sc["scale"]), fontsize=9)
    save_figure(fig, path)


def plot_attention(record: dict, out: Path) -> list[str]:
    """Every figure the record supports, into `out`; returns the file names. The first scale (or the method's
    single run) is the one drawn in the per-placement figures."""
    out = Path(out)
    sc = record["per_scale"][0]
    names = ["attention_heatmap.png", "attention_gold.png"]
    plot_heatmap(record, sc, out / names[0])
    plot_gold(record, sc, out / names[1])
    if len(record["per_scale"]) > 1:
        plot_scales(record, out / "attention_scales.png")
        names.append("attention_scales.png")
    if "rollout_gold_share" in sc["per_position"][0]:
        plot_rollout(record, sc, out / "attention_rollout.png")
        names.append("attention_rollout.png")
    return names
