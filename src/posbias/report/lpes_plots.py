"""The figure of an LPES search: per-layer factors with the control points, fitness by generation."""

from __future__ import annotations

from pathlib import Path


def plot_search(result: dict, path: str | Path) -> None:
    from .plots import plt, save_figure

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=120)
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
