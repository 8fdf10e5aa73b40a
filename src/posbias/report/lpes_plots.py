"""The figure of an LPES search: per-layer factors with the control points, fitness by generation."""

from __future__ import annotations

from pathlib import Path


def plot_search(result: dict, path: str | Path) -> None:
    from .plots import save_figure, subplots

    fig, (a, b) = subplots(1, 2, figsize=(9, 3.4), dpi=120)
    f = result["factors"]
    a.plot(range(len(f)), f, marker="o", ms=3, label=f"per-layer factor s_h ({result['curve']})")
    cp = result.get("control_points")
    if cp:
        a.plot([p[0] for p in cp], [p[1] for p in cp], "s--", color="gray", alpha=0.7, label="control points")
    a.axhline(1.0, color="k", lw=0.6)
    a.set_xlabel("layer h")
    a.set_ylabel("position scaling factor")
    a.legend(fontsize=7)
    a.grid(alpha=0.3)
    h = result["history"]
    if h:
        g = [e["generation"] for e in h]
        a_best = [e["best_fitness"] for e in h]
        b.plot(g, a_best, marker="o", label="best fitness")
        if "mean_fitness" in h[0]:
            b.plot(g, [e["mean_fitness"] for e in h], marker=".", alpha=0.6, label="population mean")
    b.axhline(result["baseline"]["fitness"], color="k", ls=":", label="unmodified model")
    b.set_xlabel("generation")
    b.set_ylabel("fitness (0.2 B + 0.3 M + 0.5 E)")
    b.legend(fontsize=7)
    b.grid(alpha=0.3)
    fig.suptitle(f"LPES search: {result['model']} on {result['task']} ({result['space']})", fontsize=9)
    save_figure(fig, path)


def plot_gain_vs_length(points: list[dict], path: str | Path) -> None:
    """Average minus the unmodified model's (paired 95% CI) against prompt length, one line per (model, method)."""
    from .plots import save_figure, subplots

    fig, ax = subplots(figsize=(9, 3.8), dpi=120)
    lines: dict[tuple, list[dict]] = {}
    for p in points:
        if not p.get("reference"):  # the first entry of each comparison is what the others are measured against
            lines.setdefault((p["model"], p["label"]), []).append(p)
    for (model, lab), ps in sorted(lines.items()):
        ps = sorted(ps, key=lambda p: p["tokens"])
        x, y = [p["tokens"] for p in ps], [p["difference"] for p in ps]
        err = [[p["difference"] - p["ci"][0] for p in ps], [p["ci"][1] - p["difference"] for p in ps]]
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=f"{lab} ({model})")
    ax.axhline(0.0, color="k", lw=0.7)
    ax.set_xscale("log")
    ticks = sorted({round(p["tokens"]) for p in points})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("prompt length (model tokens, log scale)")
    ax.set_ylabel("average accuracy - unmodified\n(paired 95% CI)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    save_figure(fig, path)
