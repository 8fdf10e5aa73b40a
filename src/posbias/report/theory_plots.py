"""Figures of the executable-theory run (`analysis.theory`), drawn from its plain-JSON numbers.

Every function takes sections of the ``theory.json`` dict and a PNG path; nothing is
recomputed here, so a report can redraw the figures from a saved ``theory.json``.
Conventions: P^(t) has t+1 layers; tokens are 0-indexed; distance x = i - j.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from .plots import save_figure, subplots

DPI = 120
HEAT_VMIN = 1e-8  # heatmap colour floor: smaller positive mass is drawn at the floor colour
FIGURES = {  # file name -> what it shows
    "rollout_heatmaps.png": "rollout P^(t) per mask and depth (log colour; grey = exactly 0)",
    "first_token_mass.png": "first-token mass min_i / mean_i P^(t)[i, 0] against depth, per mask",
    "prefix_mass.png": "prefix mask: total prefix mass and per-prefix-token shares against depth",
    "distance_decay.png": "decay mask: P^(t)(z_i = i - x) against distance x, with x* = t / (e^m - 1)",
    "distance_rope.png": "RoPE (d = 2): P^(t)(z_i = i - x) against distance x, with x* and envelopes",
}


def _depth_colors(n: int):
    return colormaps["viridis"](np.linspace(0.0, 0.85, n))


def _mask_colors(n: int):
    return colormaps["tab10"](np.arange(n) % 10)


# ---------------------------------------------------------------- (a) rollout heatmaps


def plot_rollout_heatmaps(rollouts: dict, masks: list[dict], path: Path) -> None:
    """Grid: one row per mask, one column per depth t; log colour, exact zeros (off the walk support) grey."""
    depths, n_rows = rollouts["depths"], len(masks)
    fig, axes = subplots(n_rows, len(depths), figsize=(2.3 * len(depths) + 1.2, 2.2 * n_rows + 0.8),
                             squeeze=False, layout="constrained", sharex=True, sharey=True)
    cmap = colormaps["magma"].with_extremes(bad="#d9d9d9")
    norm = LogNorm(vmin=HEAT_VMIN, vmax=1.0)
    im = None
    for r, m in enumerate(masks):
        for c, t in enumerate(depths):
            ax, p = axes[r, c], np.asarray(rollouts["P"][m["name"]][c])
            im = ax.imshow(np.ma.masked_less_equal(p, 0.0), cmap=cmap, norm=norm, interpolation="nearest")
            ax.set_title(f"{m['label']}, t={t} ({t + 1} layer{'s' if t else ''})", fontsize=8)
            ax.tick_params(labelsize=7)
            if c == 0:
                ax.set_ylabel("query i", fontsize=8)
            if r == n_rows - 1:
                ax.set_xlabel("key j", fontsize=8)
            ax.label_outer()  # one shared scale: tick labels on the outer panels only (and a faster layout)
    fig.colorbar(im, ax=axes, shrink=0.5, extend="min", label="P^(t)[i, j] = P(z_i = j)  (log scale)")
    fig.suptitle("Attention rollout P^(t) = A^(t)...A^(0) on a random bounded SAN (grey: exactly 0)", fontsize=10)
    save_figure(fig, path, dpi=DPI, tight=False)


# ---------------------------------------------------------------- (c) first-token and prefix mass


def _first_token_legend(masks: list[dict], k: int) -> list:
    handles = [Line2D([], [], color=c, lw=2, label=m["label"]) for m, c in zip(masks, _mask_colors(len(masks)))]
    return handles + [Line2D([], [], color="grey", ls="-", marker="o", ms=3, label="min_i P^(t)[i, 0]"),
                      Line2D([], [], color="grey", ls="--", label="mean_i P^(t)[i, 0]"),
                      Line2D([], [], color="black", ls=":", lw=2, label=f"prefix K={k}: total prefix mass, min_i")]


def plot_first_token_mass(first_token: dict, masks: list[dict], prefix: dict, path: Path) -> None:
    """Left: min_i (solid) and mean_i (dashed) P^(t)[i, 0]; right: 1 - min_i P^(t)[i, 0] on a log scale.
    The prefix mask's total prefix mass (dotted black) is drawn beside its first-token mass."""
    t = first_token["t"]
    fig, (ax, ax_log) = subplots(1, 2, figsize=(12, 5.0), layout="constrained")
    for m, color in zip(masks, _mask_colors(len(masks))):
        lo, mean = first_token["min"][m["name"]], first_token["mean"][m["name"]]
        ax.plot(t, lo, "-o", ms=3, color=color)
        ax.plot(t, mean, "--", color=color)
        ax_log.semilogy(t, np.clip(1 - np.asarray(lo), 1e-16, None), "-o", ms=3, color=color)
    ax.plot(t, prefix["mass_min"], ":", color="black", lw=2)
    ax_log.semilogy(t, np.clip(1 - np.asarray(prefix["mass_min"]), 1e-16, None), ":", color="black", lw=2)
    ax.set(xlabel="depth t  (P^(t) has t+1 layers)", ylabel="P^(t)(z_i = 0)", ylim=(-0.02, 1.02),
           title="First-token mass against depth (Thm 4.1-4.3)")
    ax_log.set(xlabel="depth t  (P^(t) has t+1 layers)", ylabel="1 - min_i mass  (log)",
               title="Deficit 1 - min_i P^(t)(z_i = 0)  (straight = exponential)")
    for a in (ax, ax_log):
        a.grid(alpha=0.3, which="both")
    fig.legend(handles=_first_token_legend(masks, prefix["k"]), loc="outside lower center", ncol=5, fontsize=8)
    save_figure(fig, path, dpi=DPI, tight=False)


def plot_prefix_mass(prefix: dict, path: Path) -> None:
    """Left: total prefix mass and per-token mass; right: per-token share of the prefix mass."""
    k = prefix["k"]
    t = list(range(len(prefix["mass_min"])))
    tok_mean, tok_min, share = (np.asarray(prefix[key]) for key in ("token_mean", "token_min", "share_mean"))
    fig, (ax, ax_share) = subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    ax.plot(t, prefix["mass_min"], "-o", ms=3, color="black", label="total prefix mass, min_i")
    ax.plot(t, prefix["mass_mean"], "--", color="black", label="total prefix mass, mean_i")
    for j, color in zip(range(k), _mask_colors(k)):
        ax.plot(t, tok_mean[:, j], "-", color=color, label=f"token {j}: mean_i P[i, {j}]")
        ax.plot(t, tok_min[:, j], ":", color=color, label=f"token {j}: min_i P[i, {j}]")
        ax_share.plot(t, share[:, j], "-o", ms=3, color=color, label=f"token {j}")
    ax_share.axhline(1 / k, color="grey", ls="--", lw=1, label=f"1/K = {1 / k:.3g}")
    ax.set(xlabel="depth t  (P^(t) has t+1 layers)", ylabel="P^(t)(z_i in prefix), P^(t)(z_i = k)", ylim=(-0.02, 1.02),
           title=f"Prefix mask K={k}: mass flows to all prefix tokens (Thm 4.3)")
    ax_share.set(xlabel="depth t", ylabel="mean_i P^(t)[i, k] / prefix mass S_i^(t)", ylim=(0, None),
                 title="Share of each prefix token (stays >= kappa > 0)")
    for a in (ax, ax_share):
        a.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center right")
    ax_share.legend(fontsize=7, loc="lower right")
    save_figure(fig, path, dpi=DPI, tight=False)


# ---------------------------------------------------------------- (b) distance profiles


def _profile_panel(ax, rows: list[dict]) -> None:
    """One parameter value: a curve per depth, x* (dashed line), the measured argmax (star), the
    scaled Theta shape (black dotted) where rows have one, and the [x_tight, x_loose] envelope
    bar at the bottom where rows have one."""
    n = len(rows[0]["profile"])
    for k, (r, color) in enumerate(zip(rows, _depth_colors(len(rows)))):
        prof = np.asarray(r["profile"])
        sink = " (first token)" if r["argmax"] == n - 1 else ""
        ax.semilogy(np.arange(n), prof, "-", color=color, lw=1.6,
                    label=f"t={r['t']}: x*={r['x_star']:.1f}, argmax={r['argmax']}{sink}")
        if "predicted" in r:
            ax.semilogy(np.arange(n), r["predicted"], ":", color="black", lw=1)
        ax.axvline(r["x_star"], color=color, ls="--", lw=1)
        ax.plot(r["argmax"], prof[r["argmax"]], "*", color=color, ms=10, mec="black", mew=0.5, clip_on=False)
        if "x_tight" in r:
            y = 0.03 + 0.04 * k
            ax.plot([r["x_tight"], r["x_loose"]], [y, y], "-|", color=color, lw=2.5, transform=ax.get_xaxis_transform())
    low = min(float(np.min(np.asarray(r["profile"])[np.asarray(r["profile"]) > 0])) for r in rows)
    ax.set_ylim(max(low, 1e-16) / 3, 3.0)
    ax.set_xlim(-1, n)
    ax.grid(alpha=0.3, which="major")


def _style_legend(rows: list[dict]) -> list:
    handles = [Line2D([], [], color="grey", ls="--", label="predicted critical distance x*"),
               Line2D([], [], color="grey", marker="*", ls="", ms=8, label="measured argmax")]
    if "predicted" in rows[0]:
        handles.append(Line2D([], [], color="black", ls=":", label="Theta shape C(t+x, x) e^(-xm), scaled to the curve"))
    if "x_tight" in rows[0]:
        handles.append(Line2D([], [], color="grey", marker="|", lw=2.5,
                              label="[x_tight, x_loose]: peaks of the one-hop and equal-hop path envelopes"))
    return handles


def plot_distance_profiles(rows: list[dict], param: str, path: Path, title: str) -> None:
    """One panel per value of `param` ("m" for the decay mask, "theta1" for RoPE): the last query
    row's P^(t)(z_{N-1} = N-1-x) against distance x, a curve per depth t; x = N-1 is the first token."""
    values = list(dict.fromkeys(r[param] for r in rows))
    fig, axes = subplots(1, len(values), figsize=(5.2 * len(values), 4.6), squeeze=False, layout="constrained")
    for ax, v in zip(axes[0], values):
        panel = [r for r in rows if r[param] == v]
        _profile_panel(ax, panel)
        sub = f"m = {v:g}" if param == "m" else f"theta1 = {v:.4f} rad (c = {panel[0]['c']:.2f})"
        ax.set_title(sub, fontsize=9)
        ax.set_xlabel("distance x = i - j  (x = N-1: first token)")
        ax.legend(fontsize=7, loc="upper right")
    axes[0, 0].set_ylabel("P^(t)(z_{N-1} = N-1-x)  (log)")
    fig.legend(handles=_style_legend(rows), loc="outside lower center", ncol=4, fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path, dpi=DPI, tight=False)


# ---------------------------------------------------------------- all figures


def plot_theory(data: dict, out_dir: Path) -> list[str]:
    """Draw every figure of a theory run into `out_dir`; return the file names (in FIGURES order)."""
    out_dir = Path(out_dir)
    plot_rollout_heatmaps(data["rollouts"], data["masks"], out_dir / "rollout_heatmaps.png")
    first_masks = [m for m in data["masks"] if m["name"] in data["first_token"]["min"]]
    plot_first_token_mass(data["first_token"], first_masks, data["prefix"], out_dir / "first_token_mass.png")
    plot_prefix_mass(data["prefix"], out_dir / "prefix_mass.png")
    plot_distance_profiles(data["decay"], "m", out_dir / "distance_decay.png",
                           "Causal + decay mask (Thm 4.5): the peak moves out with depth t, in with decay m; "
                           "x* = t / (e^m - 1)")
    plot_distance_profiles(data["rope"], "theta1", out_dir / "distance_rope.png",
                           "Causal + RoPE, d = 2 (Thm 4.7): x* = root of log(1 + t/x) = 2 c theta1^2 x, "
                           "c fitted per instance")
    return list(FIGURES)
