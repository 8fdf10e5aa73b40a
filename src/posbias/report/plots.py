"""Figures (matplotlib, drawn for files outside pyplot: no display needed, and the session's backend is left alone,
so a notebook's inline plots stay as they were after a run draws its figures)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..core.order import format_figure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, dpi=None, layout=None, **kw):
    """`plt.subplots` without pyplot: a Figure for a file (never shown, nothing to close) and its axes."""
    fig = Figure(figsize=figsize, dpi=dpi, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kw)


def save_figure(fig, path: str | Path, dpi: int | None = None, tight: bool = True) -> str:
    """Save through a temporary file and os.replace (no half-written PNG), close the figure."""
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    if tight:
        fig.tight_layout()
    fig.savefig(tmp, dpi=dpi)
    tmp.replace(path)
    return path.name


def _xs(per_position: list[dict]) -> tuple[list, list[str] | None]:
    """x values: the slots, or (two-hop pairs) 0..k-1 with the pairs "i:j" as tick labels."""
    pos = [r["position"] for r in per_position]
    if any(isinstance(p, (list, tuple)) for p in pos):
        return list(range(len(pos))), [f"{p[0]}:{p[1]}" for p in pos]
    return pos, None


def plot_curve(per_position: list[dict], title: str, path: str | Path) -> None:
    """Accuracy against gold position (or two-hop placement) with the 95% CI as a band."""
    x, labels = _xs(per_position)
    y = [r["accuracy"] for r in per_position]
    lo = [r["ci_low"] for r in per_position]
    hi = [r["ci_high"] for r in per_position]
    fig, ax = subplots(figsize=(6, 3.6), dpi=120)
    ax.fill_between(x, lo, hi, alpha=0.25, label="95% CI (Clopper-Pearson)")
    ax.plot(x, y, marker="o", label="accuracy")
    _position_axes(ax, x, title, legend_size=8, labels=labels)
    save_figure(fig, path)


def _position_axes(ax, x: list[int], title: str, legend_size: int, labels: list[str] | None = None) -> None:
    """Accuracy (0-1) against gold position, ticks at the positions swept (two-hop: the pairs)."""
    ax.set_xlabel("position of the gold item (0 = first)" if labels is None else "placement of the two hops (first:second)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(x)
    if labels is not None:
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, loc="best")


def _placement_labels(per: list[dict]) -> list[str]:
    return [f"{p['position'][0]}:{p['position'][1]}" if isinstance(p["position"], list) else str(p["position"]) for p in per]


def plot_shifting(summary: dict, title: str, path: str | Path) -> None:
    """Median perplexity, per placement, of the advantageous response and of the gold answer (log scale; Fig. 9)."""
    per = [p for p in summary["per_position"] if p["ppl_anchor"] and p["ppl_gold"]]
    labels = _placement_labels(per)
    x = list(range(len(per)))
    fig, ax = subplots(figsize=(max(5.0, 0.45 * len(per) + 2), 3.6), dpi=120)
    ax.bar([i - 0.2 for i in x], [p["ppl_anchor"]["median"] for p in per], width=0.4,
           label=f"advantageous response (anchor {summary['anchor_placement']})")
    ax.bar([i + 0.2 for i in x], [p["ppl_gold"]["median"] for p in per], width=0.4, label="gold answer")
    values = [p[k]["median"] for p in per for k in ("ppl_anchor", "ppl_gold")]
    if values and max(values) > 10 * min(values):  # log scale only where it is needed (thought shifting)
        ax.set_yscale("log")
    else:
        ax.set_ylim(1.0, max(values, default=2.0) * 1.05)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=60 if len(per) > 10 else 0, fontsize=7)
    ax.set_xlabel("placement of the prompt")
    ax.set_ylabel("median perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_divergence(summary: dict, rows: list[dict], title: str, path: str | Path) -> None:
    """Left: per placement, accuracy, the share of responses that leave the anchor's, and of the errors the share
    that one corrected token recovers and that keep the anchor's token in the top 10 (Fig. 3a). Right: the top
    tokens at the first divergence of the first error (Fig. 8), the anchor's token marked."""
    per = summary["per_position"]
    x = list(range(len(per)))
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 3.8), dpi=120, gridspec_kw={"width_ratios": [3, 2]})
    for key, name, style in (("accuracy", "accuracy", "o-"), ("diverged", "response leaves the anchor's", "s--"),
                             ("errors_single_token", "errors: single-token shift", "^-"),
                             ("errors_anchor_in_top10", "errors: anchor token in top 10", "v:")):
        ax.plot(x, [float("nan") if p[key] is None else p[key] for p in per], style, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(_placement_labels(per), rotation=60 if len(per) > 10 else 0, fontsize=7)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("placement of the prompt")
    ax.set_ylabel("share of rows")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    err = next((r for r in rows if r["anchor_correct"] and not r["correct"] and r.get("top")), None)
    if err is None:
        bx.text(0.5, 0.5, "no error with a divergence", ha="center", va="center")
        bx.set_axis_off()
    else:
        toks, probs = zip(*err["top"])
        colors = ["tab:green" if t == err["anchor_token"] else "tab:gray" for t in toks]
        bx.barh(range(len(toks))[::-1], probs, color=colors)
        bx.set_yticks(range(len(toks))[::-1])
        bx.set_yticklabels([repr(t) for t in toks], fontsize=7)
        bx.set_xlabel("probability at the first divergence")
        bx.set_title(f"{err['example_id']} at {err['position']}: step {err['diverge_at']}, anchor token "
                     f"{err['anchor_token']!r} rank {err['anchor_rank']}", fontsize=8)
    save_figure(fig, path)


def plot_pair_heatmap(per_position: list[dict], n_slots: int, title: str, path: str | Path) -> None:
    """Accuracy at each placement (first hop i: row, second hop j: column); cells not swept are blank."""
    import numpy as np

    grid = np.full((n_slots, n_slots), np.nan)
    for r in per_position:
        i, j = r["position"]
        grid[i, j] = r["accuracy"]
    size = min(9.0, 2.5 + 0.3 * n_slots)
    fig, ax = subplots(figsize=(size + 1, size), dpi=120)
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="upper")
    if n_slots <= 24:
        for r in per_position:
            i, j = r["position"]
            ax.text(j, i, f"{r['accuracy']:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if r["accuracy"] < 0.6 else "black")
    ax.set_xlabel("slot of the second hop")
    ax.set_ylabel("slot of the first hop")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="accuracy", shrink=0.8)
    save_figure(fig, path)


def plot_compare(results: list[dict], title: str, path: str | Path) -> None:
    """Accuracy against gold position, one line per method (CI bands light)."""
    fig, ax = subplots(figsize=(6.4, 3.8), dpi=120)
    for r in results:
        per = r["per_position"]
        x, labels = _xs(per)
        line, = ax.plot(x, [p["accuracy"] for p in per], marker="o", label=f"{r['label']} (avg {r['summary']['average']:.2f})")
        ax.fill_between(x, [p["ci_low"] for p in per], [p["ci_high"] for p in per], alpha=0.12, color=line.get_color())
    _position_axes(ax, x, title, legend_size=7, labels=labels)
    save_figure(fig, path)


def plot_order(summary: dict, title: str, path: str | Path) -> None:
    """An order task: how often each slot is chosen (the choice share, 1/k for a model without order bias), the
    PriDe prior when a run estimated one, and the consistency / fairness figures with their CIs in the legend."""
    o, dec = summary["order"], summary.get("decision") or {}
    k = len(o["choice_share"])
    fig, ax = subplots(figsize=(6.4, 4.2), dpi=120)
    width = 0.4 if "prior" in dec else 0.7
    ax.bar([s - (width / 2 if "prior" in dec else 0) for s in range(k)], o["choice_share"], width, label="chosen")
    if "prior" in dec:
        ax.bar([s + width / 2 for s in range(k)], dec["prior"], width, label="PriDe prior")
    ax.axhline(1 / k, color="grey", linestyle="--", linewidth=1, label=f"no order bias (1/{k})")
    figs = [f"{name} {format_figure(o[key], 2)}"
            for key, name in (("consistency", "consistency"), ("preference_fairness", "pref. fairness"), ("rstd", "RStd"))
            if key in o and o[key]["value"] == o[key]["value"]]
    ax.set_xticks(range(k))
    ax.set_xlabel("slot of the option (0 = first)")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.02)
    ax.set_title(title + "\n" + "; ".join(figs), fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    save_figure(fig, path)


def plot_prior(record: dict, title: str, path: str | Path) -> None:
    """The positional attention prior (a content-free item's attention at each slot) per layer band, relative to its
    mean, beside the unmodified model's accuracy with the gold at that slot."""
    fig, ax = subplots(figsize=(6.4, 3.8), dpi=120)
    slots = list(range(len(record["prior"])))
    for band, values in [("all layers", record["prior"]), *record["bands"].items()]:
        mean = sum(values) / len(values) or 1.0
        ax.plot(slots, [v / mean for v in values], marker="o", linewidth=2 if band == "all layers" else 1,
                label=f"prior, {band}")
    if "items" in record:  # the attention real items get at each slot, and the gold's own (relative to the prompt's mean)
        ax.plot(slots, record["items"], color="gray", linewidth=3, alpha=0.6, label="real items (any gold slot)")
        ax.plot(slots, record["gold_attention"], color="gray", linestyle=":", marker="x", label="the gold item")
    ax.set_xlabel("slot of the content-free item (0 = first)")
    ax.set_ylabel("attention per token / its mean")
    acc = ax.twinx()
    acc.plot(slots, record["accuracy"], color="black", linestyle="--", marker="s", label="accuracy, gold at the slot")
    acc.set_ylabel("accuracy")
    acc.set_ylim(0, 1.02)
    lines = ax.get_legend_handles_labels()
    more = acc.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper center")
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)
