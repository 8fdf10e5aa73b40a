"""Figures of the synthetic experiments (posbias.synth.experiments): swap-test gaps as grouped
bars with std error bars (Fig. 2-6 of Wu et al. 2025), accuracy by answer position, the
attention-sink metric per token (Fig. 8) and learning curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .plots import save_figure, subplots

PAIR_LABELS = {"first_vs_middle": "first vs middle", "first_vs_last": "first vs last",
               "middle_vs_last": "middle vs last"}


def _find(configs: list[dict], **factors) -> dict | None:
    for c in configs:
        if all(c["factors"].get(k) == v for k, v in factors.items()):
            return c["summary"]
    return None


def _levels(configs: list[dict], key: str) -> list:
    seen = []
    for c in configs:
        if c["factors"][key] not in seen:
            seen.append(c["factors"][key])
    return seen


def learned(summary: dict) -> bool | None:
    """Did every seed of this configuration learn in context? None: not recorded (older runs)."""
    lr = summary.get("learned")
    return None if lr is None else bool(lr["all"])


def _gap_bars(ax, series: list[tuple[str, dict | None]]) -> None:
    """Grouped bars: one group per pair, one bar per (label, summary) in `series`; configurations whose
    networks did not all learn in context are drawn faded and hatched, labelled "(not ICL)"."""
    pairs = list(PAIR_LABELS)
    width = 0.8 / max(len(series), 1)
    for k, (label, s) in enumerate(series):
        if s is None:
            continue
        x = np.arange(len(pairs)) + (k - (len(series) - 1) / 2) * width
        weak = learned(s) is False
        ax.bar(x, [s[f"gap/{p}"]["mean"] for p in pairs], width, yerr=[s[f"gap/{p}"]["std"] for p in pairs],
               label=label + (" (not ICL)" if weak else ""), capsize=2, color=f"C{k}",
               alpha=0.35 if weak else 1.0, hatch="//" if weak else None, edgecolor=f"C{k}")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels([PAIR_LABELS[p] for p in pairs], fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _panels(n_rows: int, n_cols: int, height: float):
    """A grid of panels sharing the y axis: (fig, axes[row][col])."""
    return subplots(n_rows, n_cols, figsize=(3.3 * n_cols, height * n_rows), dpi=110, squeeze=False, sharey=True)


def _grid_figure(configs, rows: tuple[str, list], cols: tuple[str, list], series: tuple[str, list], fmt, title):
    (rk, rv), (ck, cv), (sk, sv) = rows, cols, series
    fig, axes = _panels(len(rv), len(cv), 2.6)
    for i, r in enumerate(rv):
        for j, c in enumerate(cv):
            ax = axes[i][j]
            _gap_bars(ax, [(fmt(sk, s), _find(configs, **{rk: r, ck: c, sk: s})) for s in sv])
            ax.set_title(f"{fmt(rk, r)} | {fmt(ck, c)}", fontsize=8)
            if j == 0:
                ax.set_ylabel("acc[a,b] - acc[b,a]", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return fig


def _fmt(key: str, v) -> str:
    if key == "residual":
        return "residual" if v else "no residual"
    return {"depth": f"{v} layers", "pe": f"PE {v}", "mask": f"mask {v}", "bias": f"data bias {v}"}.get(key, str(v))


def plot_positions(configs, rows, cols, series, path: Path) -> str:
    (rk, rv), (ck, cv), (sk, sv) = rows, cols, series
    fig, axes = _panels(len(rv), len(cv), 2.4)
    for i, r in enumerate(rv):
        for j, c in enumerate(cv):
            ax = axes[i][j]
            for s in sv:
                summ = _find(configs, **{rk: r, ck: c, sk: s})
                if summ is None:
                    continue
                m, e = np.array(summ["accuracy_by_position"]["mean"]), np.array(summ["accuracy_by_position"]["std"])
                x = np.arange(1, len(m) + 1)
                weak = learned(summ) is False
                ax.plot(x, m, marker="o", ms=3, ls="--" if weak else "-", alpha=0.5 if weak else 1.0,
                        label=_fmt(sk, s) + (" (not ICL)" if weak else ""))
                ax.fill_between(x, m - e, m + e, alpha=0.2)
            ax.set_title(f"{_fmt(rk, r)} | {_fmt(ck, c)}", fontsize=8)
            ax.set_xlabel("answer item (1 = first)", fontsize=7)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    axes[0][0].set_ylabel("accuracy (identical twin elsewhere)", fontsize=7)
    return save_figure(fig, path)


def plot_sinks(configs, path: Path) -> str:
    families = {"causal": [], "window": [], "prefix": []}
    for c in configs:
        m = c["factors"]["mask"]
        families["window" if m.startswith("window") else "prefix" if m.startswith("prefix") else "causal"].append(c)
    fams = [(k, v) for k, v in families.items() if v]
    fig, axes = subplots(1, len(fams), figsize=(4.2 * len(fams), 2.8), dpi=110, squeeze=False, sharey=True)
    for ax, (name, cs) in zip(axes[0], fams):
        width = 0.8 / len(cs)
        for k, c in enumerate(cs):
            s = c["summary"]["sink"]
            x = np.arange(1, len(s["mean"]) + 1) + (k - (len(cs) - 1) / 2) * width
            ax.bar(x, s["mean"], width, yerr=s["std"], label=c["factors"]["mask"], capsize=1)
        ax.set_xticks(range(1, len(cs[0]["summary"]["sink"]["mean"]) + 1))
        ax.tick_params(labelsize=6)
        ax.set_title(f"attention sinks: {name}", fontsize=8)
        ax.set_xlabel("token (1 = x_1, 2 = y_1, ..., last = query)", fontsize=7)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("sink metric (tau = 0.2)", fontsize=8)
    return save_figure(fig, path)


def plot_curves(configs, path: Path) -> str:
    fig, axes = subplots(1, 2, figsize=(10, 3.4), dpi=110)
    styles = ["-", "--", ":", "-."]  # colours cycle every 10 lines; the line style changes with them
    for i, c in enumerate(configs):
        cur = c["summary"].get("curve")
        if not cur:
            continue
        f = c["factors"]
        label = f"L{f['depth']} {f['mask']} {f['pe']} {'res' if f['residual'] else 'nores'} {f['bias']}"
        ls = styles[(i // 10) % len(styles)]
        acc = cur.get("icl_acc", cur["novel_acc"])
        axes[0].plot(cur["step"], acc["mean"], lw=1, ls=ls, label=label)
        axes[1].plot(cur["step"], cur["gap/first_vs_last"]["mean"], lw=1, ls=ls)
    axes[0].set_ylabel("in-context accuracy (novel classes)", fontsize=8)
    thr = [c["summary"]["learned"]["threshold"] for c in configs if "learned" in c["summary"]]
    if thr:
        axes[0].axhline(thr[0], color="grey", lw=0.6, ls=":")  # the "learned in context" threshold
    axes[1].set_ylabel("gap first vs last", fontsize=8)
    for ax in axes:
        ax.set_xlabel("training step", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=5, ncol=2)
    return save_figure(fig, path)


def plot_grid(grid: str, result: dict, out: str | Path) -> list[str]:
    """Write the grid's figures into `out`; return their file names."""
    out, cs = Path(out), result["configs"]
    names = []
    if grid == "depth":
        fig = _grid_figure(cs, ("residual", _levels(cs, "residual")), ("pe", _levels(cs, "pe")),
                           ("depth", _levels(cs, "depth")), _fmt, "unbiased data, causal mask (Fig. 2, 4, 5)")
        names.append(save_figure(fig, out / "depth.png"))
    elif grid == "bias":
        rows, cols, ser = ("bias", _levels(cs, "bias")), ("pe", _levels(cs, "pe")), ("mask", _levels(cs, "mask"))
        fig = _grid_figure(cs, rows, cols, ser, _fmt, "biased training data, 2 layers with residuals (Fig. 3, 6)")
        names.append(save_figure(fig, out / "bias.png"))
        names.append(plot_positions(cs, rows, cols, ser, out / "bias_positions.png"))
    else:
        names.append(plot_sinks(cs, out / "sinks.png"))
    names.append(plot_curves(cs, out / f"{grid}_curves.png"))
    return names
