"""One renderer per run kind: a run folder's result (as the run wrote it) -> the body of its section.

A renderer reads the result file and the files beside it and lays them out; it never recomputes a
number (the one figure drawn here, the distillation's training curve, plots the logged rows as they
are). `renderer_for(kind)` falls back to `generic` (summary numbers, tables of rows, every PNG), so a
new kind shows up before it has a renderer of its own.
"""

from __future__ import annotations

import io
import json
from typing import Callable

from ..core.metrics import format_effect
from ..core.order import format_no_gold
from ..core.stats import format_p
from .blocks import Raw, details, esc, figure, figures, fmt, key_values, para, pos_label, rows_table, table
from .flip_blocks import flips_block, order_table
from .longctx_blocks import long_blocks
from .provenance import Run

Renderer = Callable[[Run], str]
RENDERERS: dict[str, Renderer] = {}


def renderer(*kinds: str) -> Callable[[Renderer], Renderer]:
    """Register a function as the section renderer of `kinds` (run.json's "kind"; "synth" = every synth grid)."""

    def register(fn: Renderer) -> Renderer:
        for k in kinds:
            RENDERERS[k] = fn
        return fn

    return register


def renderer_for(kind: str) -> Renderer:
    if kind.startswith("synth ") and kind.endswith(" grid"):
        return RENDERERS["synth"]
    return RENDERERS.get(kind, generic)


# ----------------------------------------------------------------------------- generic


@renderer("generic")
def generic(run: Run) -> str:
    """Kinds without a renderer: the scalar numbers, every list of rows as a table, every PNG."""
    r = run.result
    parts = [key_values({k: v for k, v in r.items() if k not in ("config", "versions", "model", "model_info")}, "summary")]
    for k, v in r.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            parts.append(rows_table(v, k))
    parts.append(figures(run.path))
    return "".join(parts)


# ----------------------------------------------------------------------------- sweep, comparison


def curve_table(per_position: list[dict], measure: str = "accuracy") -> Raw:
    """Accuracy per position (or what the run measured: `summary.measure`) with its 95% CI (Clopper-Pearson), n, and the further
    metrics a task adds."""
    base = ("position", "n", "correct", "accuracy", "ci_low", "ci_high")
    extra = [k for k in per_position[0] if k not in base]
    rows = [[pos_label(p["position"]), p["accuracy"], f"[{fmt(p['ci_low'])}, {fmt(p['ci_high'])}]", p["n"],
             p.get("correct")] + [p.get(k) for k in extra] for p in per_position]
    return table(["position", measure, "95% CI", "n", "correct", *extra], rows)


def summary_line(s: dict) -> Raw:
    """average (and the chance level) | best | worst | gap [CI] | std, as the sweep prints it (and per-mode averages
    for two hops); a judge file without "preferred": no chance, best or worst (core.order.format_no_gold)."""
    effect = format_effect(s)
    if s.get("measure", "accuracy") != "accuracy":
        return Raw(f'<p class="summary">{esc(" ".join([*format_no_gold(s), effect]))}</p>')
    gap_ci = s.get("gap_ci") or [None, None]
    chance = f" (chance {fmt(s['chance'])})" if s.get("chance") else ""
    text = (f"average {fmt(s.get('average'))}{chance} | best {fmt(s.get('best'))} "
            f"(pos {pos_label(s.get('best_position'))}) | "
            f"worst {fmt(s.get('worst'))} (pos {pos_label(s.get('worst_position'))}) | gap {fmt(s.get('gap'))} "
            f"[{fmt(gap_ci[0])}, {fmt(gap_ci[1])}] (95% interval for the largest true slot difference) | std {fmt(s.get('std'))}"
            + (f" | {effect}" if effect else ""))
    if "modes" in s:
        text += " | modes: " + ", ".join(f"{m} {fmt(v)}" for m, v in s["modes"].items()) + f" | mode gap {fmt(s.get('mode_gap'))}"
    return Raw(f'<p class="summary">{esc(text)}</p>')


@renderer("sweep")
def sweep(run: Run) -> str:
    r = run.result
    cfg, method = r.get("config", {}), r.get("method") or {}
    what = (f"task {cfg.get('task', r.get('task', {}).get('name', '?'))}, model {cfg.get('model', '?')}, "
            f"method {method.get('label') or method.get('name') or cfg.get('method', '?')}, engine {cfg.get('engine', '?')}, "
            f"n = {cfg.get('n', '?')} examples per position")
    order = [order_table([("this run", r["summary"])]), flips_block(run.path, r["summary"])] if "order" in r["summary"] else []
    measure = r["summary"].get("measure", "accuracy")
    return "".join([para(what), summary_line(r["summary"]), curve_table(r["per_position"], measure), *order,
                    figures(run.path, ("curve.png", "heatmap.png", "order.png"))])


@renderer("comparison")
def comparison(run: Run) -> str:
    """The compare table: accuracy per position, average, gap [CI], and the paired difference vs the first entry."""
    entries = run.result["methods"]
    positions = [p["position"] for p in entries[0]["per_position"]]
    first = entries[0]["label"]
    rows = []
    for e in entries:
        s, v = e["summary"], e.get("vs_first")
        accs = [Raw(f"{esc(fmt(p['accuracy']))}<br><small>[{esc(fmt(p['ci_low']))}, {esc(fmt(p['ci_high']))}]</small>")
                for p in e["per_position"]]
        diff = f"{v['difference']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]" if v else "-"
        col = e.get("collapse") or {}
        flag = "; ".join(col.get("reasons", [])) or ("at chance" if col.get("at_chance") else "-" if col else "")
        t = s.get("position_test")
        pval = format_p(t["p"]) if t else "-"
        rows.append([e["label"], *accs, s["average"], s["gap"], f"[{fmt(s['gap_ci'][0])}, {fmt(s['gap_ci'][1])}]", pval,
                     diff, flag])
    head = ["entry", *(f"pos {pos_label(p)}" for p in positions), "average", "gap", "gap 95% CI", "position test",
            f"average - {first} (paired 95% CI)", "collapsed"]
    s0 = entries[0]["summary"]
    chance = f" Chance: {fmt((entries[0].get('collapse') or {}).get('chance', s0.get('chance')))}." \
        if (entries[0].get("collapse") or {}).get("chance", s0.get("chance")) else ""
    measure = s0.get("measure", "accuracy")
    parts = [para(f"{len(entries)} entries on the same examples; {measure} per position with its 95% CI (Clopper-Pearson); "
                  f"differences paired over examples (Agresti-Min 95% intervals).{chance}"), table(head, rows)]
    if "modes" in entries[0]["summary"]:
        modes = list(entries[0]["summary"]["modes"])
        parts.append(table(["entry", *modes, "mode gap"],
                           [[e["label"], *(e["summary"]["modes"][m] for m in modes), e["summary"]["mode_gap"]] for e in entries],
                           "average per two-hop mode"))
    if "order" in entries[0]["summary"]:
        parts.append(order_table([(e["label"], e["summary"]) for e in entries]))
    parts.append(figures(run.path, ("compare.png",)))
    for e in entries:
        body = curve_table(e["per_position"]) + key_values(e.get("method_config") or {}, "method")
        parts.append(details(f"{e['label']}: per position (sweep folder {e.get('dir', '?')}/)", body))
    return "".join(parts)


# ----------------------------------------------------------------------------- search, distillation


def _search_history(run: Run) -> list[dict]:
    """The fitness history: the result's, else the per-generation log files the search wrote."""
    if run.result.get("history"):
        return run.result["history"]
    logs = sorted((run.path / "log").glob("generation_*.json"))
    return [json.loads(p.read_text(encoding="utf-8")) for p in logs]


@renderer("search")
def search(run: Run) -> str:
    r = run.result
    base = r.get("baseline", {})
    regions = list(r.get("accuracy", {}))
    rows = [["searched factors", r.get("fitness"), *(r["accuracy"][k] for k in regions)],
            ["baseline (all 1.0)", base.get("fitness"), *(base.get("accuracy", {}).get(k) for k in regions)]]
    conv = r.get("converged_at")
    parts = [para(f"LPES search on {r.get('model', '?')}, task {r.get('task', '?')}, space {r.get('space', '?')}: "
                  f"{r.get('evaluations', '?')} evaluations, {r.get('n_layers', '?')} layers"
                  + (f"; best fitness first reached at generation {conv} (Table 7's convergence)." if conv is not None else ".")),
             table(["", "fitness", *(f"accuracy {k}" for k in regions)], rows, "search split"),
             table(["layer", *range(len(r.get("factors", [])))], [["factor", *r.get("factors", [])]], "per-layer factors"),
             figures(run.path, ("factors.png",))]
    history = [{k: h.get(k) for k in ("generation", "best_fitness", "mean_fitness", "evaluations", "cache_hits", "wall_s")}
               for h in _search_history(run)]
    parts.append(rows_table(history, "fitness history per generation"))
    split = r.get("search_split")
    if split:
        parts.append(key_values(split, "search split (examples a compare must not reuse)"))
    return "".join(parts)


def training_curve(log: list[dict]) -> bytes | None:
    """The logged training rows (Trainer log history) as a PNG: every logged loss term against the step."""
    rows = [h for h in log if isinstance(h, dict) and "loss" in h and "step" in h]
    if not rows:
        return None
    from .plots import subplots

    keys = [k for k in rows[0] if k not in ("step", "epoch", "learning_rate", "grad_norm") and isinstance(rows[0][k], (int, float))]
    fig, ax = subplots(figsize=(6, 3.4), dpi=110)
    for k in keys:
        ax.plot([h["step"] for h in rows if k in h], [h[k] for h in rows if k in h], marker=".", label=k)
    ax.set_xlabel("step")
    ax.set_ylabel("logged value")
    ax.set_title("training log (train_log.json)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


@renderer("distillation")
def distillation(run: Run) -> str:
    r = run.result
    parts = [para(f"Pos2Distill on {(r.get('base_model') or {}).get('name', r.get('model', '?'))}; model written to "
                  f"{r.get('model_dir', '?')}"),
             key_values(r.get("train", {}), "training"), key_values(r.get("data", {}), "data"),
             key_values(r.get("anchor", {}) if isinstance(r.get("anchor"), dict) else {"anchor": r.get("anchor")}, "anchor")]
    log_file = run.path / "train_log.json"
    if log_file.is_file():
        png = training_curve(json.loads(log_file.read_text(encoding="utf-8")))
        if png:
            parts.append(Raw(f'<div class="figs">{figure(png, "training curve (train_log.json)")}</div>'))
    parts.append(figures(run.path))
    return "".join(parts)


# ----------------------------------------------------------------------------- grid, theory, synth, shifting


@renderer("grid")
def grid(run: Run) -> str:
    """Rows = depth, columns = context size (with its prompt tokens): accuracy [95% CI] (slot) per cell; per size the
    sweep's average and gap; lengths in tokens (niah) add references, ratios, shapes, effective length; the heatmap."""
    cells = run.result.get("cells") or []
    if not cells or not all({"size", "depth", "position", "accuracy", "ci_low", "ci_high"} <= set(c) for c in cells):
        return generic(run)
    sizes = sorted({c["size"] for c in cells})
    depths = sorted({c["depth"] for c in cells}, key=float)
    by = {(c["size"], c["depth"]): c for c in cells}
    tokens = {c["size"]: c.get("tokens_mean") for c in cells}
    unit = run.result.get("size_option") or "size"
    head = ["depth %", *(f"{sz} {unit}" + (f" (~{tokens[sz]:.0f} tok)" if tokens.get(sz) else "") for sz in sizes)]
    rows = [[fmt(d), *(_grid_cell(by.get((sz, d))) for sz in sizes)] for d in depths]
    summ = [[f"{x['size']} {unit}", round(x.get("tokens", {}).get("mean") or 0), x["summary"].get("average"),
             x["summary"].get("gap"),
             "[" + ", ".join(fmt(v) for v in x["summary"].get("gap_ci") or []) + "]"]
            for x in run.result.get("sizes") or [] if isinstance(x.get("summary"), dict)]
    return "".join([table(head, rows, "accuracy [95% CI] (slot) per depth and context size"),
                    table(["size", "prompt tokens (mean)", "average", "gap", "gap 95% CI"], summ, "per size") if summ else "",
                    long_blocks(run.result), figures(run.path, ("heatmap.png",))])


def _grid_cell(c: dict | None):
    if c is None:
        return "-"
    return Raw(f"{esc(fmt(c['accuracy']))} <small>[{esc(fmt(c['ci_low']))}, {esc(fmt(c['ci_high']))}] "
               f"({esc(pos_label(c['position']))})</small>")


@renderer("theory run")
def theory(run: Run) -> str:
    r = run.result
    parts = [rows_table(r.get("summary", []), "theorems: does each check hold?")]
    real = run.path / "real_rollout.json"
    if real.is_file():
        parts.append(key_values(json.loads(real.read_text(encoding="utf-8")), "real-model rollout (real_rollout.json)"))
    parts += [figures(run.path, tuple(r.get("figures") or ())), details("every check's numbers", key_values(r.get("checks", {})))]
    return "".join(parts)


def _synth_row(c: dict) -> list:
    """One grid configuration: factors, the three swap gaps (mean ± std), accuracies, the in-context verdict."""
    f, s = c.get("factors", {}), c.get("summary", {})

    def pm(k: str) -> str | None:
        return f"{s[k]['mean']:+.3f} ± {s[k]['std']:.3f}" if k in s else None

    lr = s.get("learned")
    return [f.get("depth"), f.get("mask"), f.get("pe"), f.get("residual"), f.get("bias"), len(c.get("seeds", [])),
            pm("gap/first_vs_middle"), pm("gap/first_vs_last"), pm("gap/middle_vs_last"),
            s.get("novel_accuracy", {}).get("mean"), s.get("icl_accuracy", {}).get("mean"),
            f"{lr['seeds']}/{lr['of']}" if lr else "not recorded"]


SYNTH_HEAD = ["depth", "mask", "PE", "residual", "data bias", "seeds", "first vs middle", "first vs last",
              "middle vs last", "novel acc", "in-context acc", "learned in context"]


@renderer("synth")
def synth(run: Run) -> str:
    r = run.result
    configs = r.get("configs", [])
    return "".join([para(f"synthetic grid {r.get('grid', '?')}: {r.get('n_runs', '?')} runs, "
                         f"{fmt(r.get('total_train_seconds'))} s of training; metrics are mean ± std over seeds. "
                         "A network learned in context when its accuracy on novel classes, answers placed as in "
                         "its training data, reaches 0.8; gaps of cells that did not learn are label-copying "
                         "preferences, not the bias of a model that solves the task."),
                    table(SYNTH_HEAD, [_synth_row(c) for c in configs], "one row per configuration"), figures(run.path),
                    details("template configuration", key_values(r.get("template", {})))])


@renderer("shifting analysis")
def shifting(run: Run) -> str:
    """Token shifting per placement: accuracy, divergence from the anchor response, single-token shifts among the
    errors, the anchor token in the top 10, perplexities (Pos2Distill Fig. 3a, 8, 9)."""
    r = run.result
    per = r.get("per_position") or []
    if not per or "ppl_anchor" not in per[0]:  # an older record (perplexities only)
        return "".join([key_values({k: v for k, v in r.items() if k not in ("per_position", "config", "model", "versions")},
                                   "summary"), rows_table(per, "per placement"), figures(run.path, ("shifting.png",))])

    def med(d: dict | None) -> float | None:
        return d["median"] if d else None

    rows = [[pos_label(p["position"]) if p is not r["all"] else "all", p["n"], p["accuracy"], p["diverged"],
             p.get("diverged_single_token"), p.get("diverged_anchor_in_top10"), p["errors"],
             p["errors_single_token"], p["errors_anchor_in_top10"], p["errors_anchor_rank_median"], med(p["ppl_anchor"]),
             med(p["ppl_gold"])] for p in [*per, r["all"]]]
    head = ["placement", "n", "accuracy", "leaves anchor", "of those: 1-token", "of those: in top 10", "errors",
            "errors: 1-token", "errors: in top 10",
            "errors: anchor rank (median)", "ppl anchor (median)", "ppl gold (median)"]
    note = (f"anchor placement {pos_label(r['anchor_placement'])} (accuracy {fmt(r['all']['anchor_accuracy'])}). Errors: anchor "
            "right, this placement wrong; 1-token: one corrected token recovers the anchor response.")
    return "".join([para(note), table(head, rows, "token shifting per placement"),
                    figures(run.path, ("divergence.png", "shifting.png"))])


@renderer("attention analysis")
def attention(run: Run) -> str:
    """Per scale: the middle-third share of item attention by layer band; per placement the accuracy, the gold
    item's mass and share of item mass by band, the first token's late mass and the rollout's gold share."""
    r = run.result
    out = []
    for sc in r.get("per_scale") or []:
        name = "unmodified" if sc.get("scale") is None else f"uniform scale {fmt(sc['scale'])}"
        share = ", ".join(f"{k} {fmt(v)}" for k, v in (sc.get("middle_share") or {}).items())
        out.append(para(f"{name}: middle-third share of the item attention (uniform {fmt(len(r.get('middle_slots') or []) / max(r['task']['n_slots'], 1))}) by layer band: {share}"))
        rows = []
        for p in sc.get("per_position") or []:
            b = p.get("bands") or {}
            rows.append([pos_label(p["position"]), p.get("n"), p.get("accuracy"),
                         *(b.get(k, {}).get("gold") for k in ("early", "middle", "late")),
                         b.get("late", {}).get("gold_share"), b.get("late", {}).get("first"), p.get("rollout_gold_share")])
        out.append(table(["placement", "n", "accuracy", "gold mass early", "middle", "late", "gold share of items (late)",
                          "first token (late)", "rollout gold share"], rows, f"{name}: attention per placement"))
    if not out:
        return generic(run)
    return "".join([*out, figures(run.path, ("attention_heatmap.png", "attention_gold.png", "attention_rollout.png"))])


@renderer("prior")
def prior(run: Run) -> str:
    """The positional attention prior: a content-free item's attention per slot (all layers and per band, relative to
    the mean) beside the accuracy with the gold at that slot (Found-in-the-Middle Sec. 3.2)."""
    r = run.result
    mean = sum(r["prior"]) / len(r["prior"]) or 1.0
    bands = list(r["bands"])
    rows = [[k, r["prior"][k] / mean, *(r["bands"][b][k] / (sum(r["bands"][b]) / len(r["prior"]) or 1.0) for b in bands),
             r["accuracy"][k]] for k in range(len(r["prior"]))]
    note = (f"{r.get('examples', '?')} examples (from skip {r.get('fitted_on', {}).get('skip', '?')}), the content-free "
            f"item {r.get('dummy', '')!r} in every slot; attention per token from the last prompt token, relative to "
            "its mean over the slots. `calib:FOLDER` subtracts it.")
    return "".join([para(note), table(["slot", "prior (all layers)", *bands, "accuracy"], rows, "positional prior"),
                    figures(run.path, ("prior.png",))])
