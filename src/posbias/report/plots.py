"""Figures (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path: str | Path, dpi: int | None = None, tight: bool = True) -> str:
    """Save through a temporary file and os.replace (no half-written PNG), close the figure."""
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    if tight:
        fig.tight_layout()
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    tmp.replace(path)
    return path.name


def plot_curve(per_position: list[dict], title: str, path: str | Path) -> None:
    """Accuracy against gold position with the 95% CI as a band."""
    x = [r["position"] for r in per_position]
    y = [r["accuracy"] for r in per_position]
    lo = [r["ci_low"] for r in per_position]
    hi = [r["ci_high"] for r in per_position]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.fill_between(x, lo, hi, alpha=0.25, label="95% CI (Wilson)")
    ax.plot(x, y, marker="o", label="accuracy")
    _position_axes(ax, x, title, legend_size=8)
    save_figure(fig, path)


def _position_axes(ax, x: list[int], title: str, legend_size: int) -> None:
    """Accuracy (0-1) against gold position, ticks at the positions swept."""
    ax.set_xlabel("position of the gold item (0 = first)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(x)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, loc="best")


def plot_compare(results: list[dict], title: str, path: str | Path) -> None:
    """Accuracy against gold position, one line per method (CI bands light)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for r in results:
        per = r["per_position"]
        x = [p["position"] for p in per]
        line, = ax.plot(x, [p["accuracy"] for p in per], marker="o", label=f"{r['label']} (avg {r['summary']['average']:.2f})")
        ax.fill_between(x, [p["ci_low"] for p in per], [p["ci_high"] for p in per], alpha=0.12, color=line.get_color())
    _position_axes(ax, x, title, legend_size=7)
    save_figure(fig, path)
