"""The figure of a depth x length grid: accuracy per (context size, gold depth), the numbers in the cells.

For lengths in tokens (task niah, eval/longctx.py) the ticks also say how much of the model's window each length
fills, the title carries the closed-book and needle-alone references, and the effective length under each base
(NoLiMa's, the needle alone) is marked."""

from __future__ import annotations

from pathlib import Path


def plot_grid_heatmap(record: dict, title: str, path: str | Path) -> None:
    """Heatmap as in needle-in-a-haystack / RULER: x = context size (with its mean prompt tokens), y = depth of
    the gold item (0% = first, top), colour = accuracy on a fixed 0..1 scale, the accuracy written in each cell."""
    import numpy as np

    from .plots import save_figure, subplots

    sizes, depths = record["sizes"], record["depths"]
    col = {s["size"]: j for j, s in enumerate(sizes)}
    row = {d: i for i, d in enumerate(depths)}
    grid = np.full((len(depths), len(sizes)), np.nan)  # (depths, sizes)
    for c in record["cells"]:
        grid[row[c["depth"]], col[c["size"]]] = c["accuracy"]
    extra = 0.9 if record["size_option"] == "tokens" else 0.0  # title lines, the effective length's legend
    width = 1.6 + 1.15 * len(sizes)
    fig, ax = subplots(figsize=(max(width, 4.4) if extra else width, 1.4 + extra + 0.42 * len(depths)), dpi=120)
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
    for i in range(len(depths)):
        for j in range(len(sizes)):
            v = grid[i, j]
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v < 0.2 or v > 0.85 else "black")
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels(_tick_labels(record), fontsize=8)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{d}%" for d in depths], fontsize=8)
    ax.set_xlabel("context size (~ mean prompt tokens)" if record["size_option"] != "tokens"
                  else "length in tokens (share of the window)")
    ax.set_ylabel("depth of the gold item (0% = first)")
    lines = [title]
    if record["size_option"] == "tokens":
        lines += _long_marks(ax, record, col)
    ax.set_title("\n".join(lines), fontsize=9 if len(lines) == 1 else 8)
    fig.colorbar(im, ax=ax, label="accuracy", shrink=0.85)
    save_figure(fig, path)


def _tick_labels(record: dict) -> list[str]:
    """"<size> <unit>\\n~<mean tokens> tok"; lengths in tokens: "<size> tok\\n<fill> of window" (fill when known)."""
    if record["size_option"] != "tokens":
        return [f"{s['size']} {record['size_option']}\n~{round(s['tokens']['mean'])} tok" for s in record["sizes"]]
    return [f"{s['size']} tok" + (f"\n{s['fill']:.0%} of window" if s.get("fill") is not None else "")
            for s in record["sizes"]]


def _long_marks(ax, record: dict, col: dict) -> list[str]:
    """Draw the effective length under each base (NoLiMa's: dashed; the needle alone: dotted; a line at the right edge
    of its column, labelled); return the title's extra lines: the reference scores, and a note for a base under which
    no length keeps the threshold (or that has no score)."""
    from .longctx_blocks import BASE_NAMES, effective_bases

    lines = []
    refs = record.get("references") or {}
    if refs.get("closed") and refs.get("needle"):
        lines.append("; ".join(f"{name} {r['accuracy']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" for name, r in
                               (("closed-book", refs["closed"]), ("needle alone", refs["needle"]))))
    drawn = False
    for key, eff in effective_bases(record.get("effective")).items():
        name, style = BASE_NAMES[key], {"nolima_base": "--", "needle_alone": ":"}[key]
        length, threshold = eff.get("effective_length"), eff.get("threshold", 0.85)
        if length is None:
            lines.append(f"no effective length vs {name}: {eff.get('note') or 'no base score'}"[:90])
        elif length == 0:
            lines.append(f"no length keeps {threshold:.0%} of the {name} score")
        elif length in col:
            ax.axvline(col[length] + 0.5, color="black", linestyle=style, linewidth=1.6,
                       label=f"effective length {length} (≥{threshold:.0%} of {name})")
            drawn = True
    if drawn:
        from matplotlib.transforms import offset_copy

        below = offset_copy(ax.transAxes, fig=ax.figure, y=-48, units="points")  # under the ticks and the x label
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, fontsize=7, frameon=False)
    return lines
