"""The figure of a depth x length grid: accuracy per (context size, gold depth), the numbers in the cells."""

from __future__ import annotations

from pathlib import Path


def plot_grid_heatmap(record: dict, title: str, path: str | Path) -> None:
    """Heatmap as in needle-in-a-haystack / RULER: x = context size (with its mean prompt tokens), y = depth of
    the gold item (0% = first, top), colour = accuracy on a fixed 0..1 scale, the accuracy written in each cell."""
    import numpy as np

    from .plots import save_figure, subplots

    sizes, depths, option = record["sizes"], record["depths"], record["size_option"]
    col = {s["size"]: j for j, s in enumerate(sizes)}
    row = {d: i for i, d in enumerate(depths)}
    grid = np.full((len(depths), len(sizes)), np.nan)  # (depths, sizes)
    for c in record["cells"]:
        grid[row[c["depth"]], col[c["size"]]] = c["accuracy"]
    fig, ax = subplots(figsize=(1.6 + 1.15 * len(sizes), 1.4 + 0.42 * len(depths)), dpi=120)
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
    for i in range(len(depths)):
        for j in range(len(sizes)):
            v = grid[i, j]
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v < 0.2 or v > 0.85 else "black")
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([f"{s['size']} {option}\n~{round(s['tokens']['mean'])} tok" for s in sizes], fontsize=8)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{d}%" for d in depths], fontsize=8)
    ax.set_xlabel("context size (~ mean prompt tokens)")
    ax.set_ylabel("depth of the gold item (0% = first)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="accuracy", shrink=0.85)
    save_figure(fig, path)
