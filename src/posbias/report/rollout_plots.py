"""Figures for the real-model rollout (analysis/rollout_real.py)."""

from __future__ import annotations

from pathlib import Path

from .plots import save_figure, subplots

_STYLE = {"first": "k", "begin": "tab:blue", "middle": "tab:orange", "end": "tab:green", "gold": "tab:red",
          "other": "tab:gray"}


def plot_mass_by_depth(result: dict, position: str, path: Path) -> None:
    """Mass of the last token's rollout row on each segment against depth, one panel per residual."""
    keys = [k for k in result if k.startswith("residual=")]
    fig, axes = subplots(1, len(keys), figsize=(5.2 * len(keys), 3.8), dpi=120, squeeze=False)
    for ax, key in zip(axes[0], keys):
        m = result[key][position]
        depth = range(1, len(m["first"]) + 1)
        for seg, color in _STYLE.items():
            ax.plot(depth, m[seg], color=color, label=seg, ls="--" if seg == "gold" else "-")
        ax.set_title(f"{key}, gold fact at position {position}", fontsize=9)
        ax.set_xlabel("layers rolled out (t + 1)")
        ax.set_ylabel("rollout mass of the last token")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{result['meta']['model']}: where the answer token's rollout mass sits", fontsize=10)
    save_figure(fig, path)


def plot_gold_by_position(result: dict, path: Path) -> None:
    """Gold fact's share of the fact-list mass (gold / (begin + middle + end)) against its position.

    The raw gold mass vanishes with depth (the first token takes nearly all of it), so the
    share among the facts is what shows how the gold fact's position matters.
    """
    keys = [k for k in result if k.startswith("residual=")]
    positions = [str(p) for p in result["meta"]["positions"]]
    n_layers = len(result[keys[0]][positions[0]]["gold"])
    depths = sorted({0, n_layers // 4, n_layers // 2, n_layers - 1})
    n_facts = result["meta"]["facts"]
    fig, axes = subplots(1, len(keys), figsize=(5.2 * len(keys), 3.6), dpi=120, squeeze=False)
    for ax, key in zip(axes[0], keys):
        for t in depths:
            ax.plot([int(p) for p in positions], [gold_share(result[key][p], t) for p in positions], marker="o",
                    label=f"after {t + 1} layers")
        ax.axhline(1 / n_facts, color="gray", ls=":", label="uniform over facts")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("position of the gold fact")
        ax.set_ylabel("gold share of the fact-list mass")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['meta']['model']}: how much of the facts' rollout mass is on the gold fact", fontsize=10)
    save_figure(fig, path)


def gold_share(masses: dict, t: int) -> float:
    facts = masses["begin"][t] + masses["middle"][t] + masses["end"][t]
    return masses["gold"][t] / facts if facts > 0 else float("nan")
