"""What the synthetic experiments return: a grid (mean +- std over seeds per configuration) and a single run, each
with its record, tidy rows and the text the command line prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import ModelConfig
from .train import Run


@dataclass
class GridResult:
    """A synthetic grid: `record` is GRID.json; `rows` has one flat dict per run (configuration x seed): run, the grid
    coordinates (depth, mask, pe, residual, bias), seed, novel_accuracy, train_accuracy, icl_accuracy and learned
    (where measured), gap/PAIR per swap test, train_seconds; `format()` is what `posbias synth GRID` prints."""

    configs: list[dict]  # per configuration: factors, seeds, run names, summary (mean and std over seeds)
    figures: list[str]  # PNG names in the output folder
    record: dict = field(repr=False)  # the content of GRID.json
    rows: list[dict] = field(default_factory=list, repr=False)  # one per run

    def format(self) -> str:
        """One line per configuration: the swap-test gaps and novel accuracy, mean +- std over seeds."""
        return format_summary(self.record)


@dataclass
class RunResult:
    """One synthetic run: `record` is its JSON (config, metrics, history, seconds, versions); `rows` has one flat dict
    per learning-curve point: step, train_loss, train_acc, novel_acc, icl_acc, gap/PAIR per swap test; `format()` is
    what `posbias synth train` prints."""

    metrics: dict  # swap-test gaps, novel-class and training accuracy, accuracy by position, sinks
    history: list[dict]  # the learning curve
    record: dict = field(repr=False)  # the run's JSON (config, metrics, history, seconds, versions)

    @property
    def rows(self) -> list[dict]:
        return [{**{k: v for k, v in p.items() if k != "gaps"}, **{f"gap/{k}": g for k, g in p.get("gaps", {}).items()}}
                for p in self.history]

    def format(self) -> str:
        """The run's configuration and training time, its accuracies, each swap test, accuracy by answer item, sinks."""
        return format_run(self.record)


def run_rows(runs: list[Run], records: dict[str, dict]) -> list[dict]:
    """One flat row per run of a grid: its coordinates, seed and headline metrics."""
    out = []
    for r in runs:
        rec = records[r.name]
        m = rec["metrics"]
        extra = {k: m[k] for k in ("icl_accuracy", "learned") if k in m}
        out.append({"run": r.name, **r.factors, "seed": r.cfg.seed, "novel_accuracy": m["novel_accuracy"],
                    "train_accuracy": m["train_accuracy"], **extra,
                    **{f"gap/{k}": v["gap"] for k, v in m["swap"].items()}, "train_seconds": rec["seconds"]["train"]})
    return out


def format_summary(result: dict) -> str:
    """One line per configuration of GRID.json: the three gaps and novel accuracy, mean +- std over seeds."""
    lines = []
    for c in result["configs"]:
        f, s = c["factors"], c["summary"]
        gaps = "  ".join(f"{k[4:]} {s[k]['mean']:+.3f}±{s[k]['std']:.3f}" for k in s if k.startswith("gap/"))
        lines.append(f"L{f['depth']} {f['mask']:>8} {f['pe']:>5} {'res' if f['residual'] else 'nores':>5} "
                     f"{f['bias']:>10} | {gaps} | novel {s['novel_accuracy']['mean']:.3f}{_learned_text(s)}")
    return "\n".join(lines)


def _learned_text(s: dict) -> str:
    if "learned" not in s:
        return ""
    lr = s["learned"]
    return f" | in-context {s['icl_accuracy']['mean']:.3f}, learned {lr['seeds']}/{lr['of']}"


def format_run(rec: dict) -> str:
    """The metrics of one run's JSON as text lines."""
    cfg, m = rec["config"], rec["metrics"]
    lines = [f"{ModelConfig(**cfg['model']).label} bias={cfg['data']['bias']} seed={cfg['seed']} "
             f"iters={cfg['train']['iters']}: train {rec['seconds']['train']:.0f}s",
             f"novel-class accuracy {m['novel_accuracy']:.3f} | training-distribution accuracy {m['train_accuracy']:.3f}"]
    if "icl_accuracy" in m:
        lines.append(f"in-context accuracy {m['icl_accuracy']:.3f} (novel classes, training answer positions): "
                     f"{'learned' if m['learned'] else 'NOT learned'} in context (threshold {m['icl_threshold']})")
    lines += [f"{k:16s} acc[a,b] {v['acc_ab']:.3f}  acc[b,a] {v['acc_ba']:.3f}  gap {v['gap']:+.3f}"
              for k, v in m["swap"].items()]
    lines.append("accuracy by answer item: " + " ".join(f"{a:.3f}" for a in m["accuracy_by_position"]))
    lines.append("sink metric per token:   " + " ".join(f"{a:.2f}" for a in m["sinks"]["per_token"]))
    return "\n".join(lines)
