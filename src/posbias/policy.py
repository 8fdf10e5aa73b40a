"""A slot policy: where one model reads best, measured, as a small JSON file a RAG pipeline can apply.

`posbias sweep` measures a model's accuracy with the gold item at every slot; the policy is that curve turned into a
ranking of the slots (best first), with each slot's accuracy and 95% interval and how it was measured. Placing a
retriever's best-ranked item into the best slot, its second into the second best and so on is `reorder:curve`
(methods/curve.py) inside posbias, and the LangChain / LlamaIndex reorderers outside it (integrations/).

    {"posbias_policy": 1, "model": "smollm2-135m", "task": {...task.config()}, "n_slots": 10,
     "ranking": [0, 9, 1, ...],                       slots, best first (ties: the lower slot first)
     "slots": [{"slot": 0, "accuracy": 1.0, "ci": [0.886, 1.0], "n": 30}, ...],   in slot order
     "measured": {"run": ".../sweep.json", "engine": ..., "n": 30, "seed": 0, "skip": 1000, "chat_used": true,
                  "template": {...}, "posbias": "0.x", "sha256": "..."},
     "fitted_on": {"task": "kv-lookup", "seed": 0, "skip": 1000, "n": 30},   the examples a comparison must avoid
     "curve": {"average": ..., "gap": ..., "gap_ci": [...], "shape": ..., "position_test": {"name", "statistic", "p",
               "n", "permutations"}, "separable": true}}   separable: the test's p < ALPHA (null: no test recorded)

read_policy accepts a policy file, a finished sweep folder, its sweep.json or its run.json (read as the folder), and
refuses, in one line, a folder that holds no finished sweep (naming what it holds and the command that works: a
comparison's entry folder, or the command that finishes an unfinished run), and, naming the file and the field, a
field the code reads that is missing or of another type (`slots`, `measured`, `fitted_on` and `curve` may be left
out); check_policy refuses, in one line, a policy from another model, task shape or slot count.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path
from typing import Any, NoReturn, Sequence, TypeVar

from .core.stats import ALPHA
from .errors import PosbiasError
from .policy_schema import VERSION, is_number, is_pair, is_whole, validate_policy
from .runs import MARKER, folder_kind, kind_name

T = TypeVar("T")


def slot_ranking(accuracy: Sequence[float]) -> list[int]:
    """The slots from the best-read to the worst (ties: the lower slot first)."""
    return sorted(range(len(accuracy)), key=lambda s: (-accuracy[s], s))


def arrangement(ranking: Sequence[int]) -> list[int]:
    """order[s] = the rank (0: the retriever's best) of the item that goes to slot s: the r-th best item goes to the
    r-th best slot."""
    order = [0] * len(ranking)
    for r, s in enumerate(ranking):
        order[s] = r
    return order


def apply_ranking(best_first: Sequence[T], ranking: Sequence[int]) -> list[T]:
    """The items (the retriever's order, best first) as the policy places them, slot 0 first."""
    if len(best_first) != len(ranking):
        raise PosbiasError(f"the policy ranks {len(ranking)} slots, and {len(best_first)} items came",
                           f"retrieve {len(ranking)} items, or measure a policy for {len(best_first)}")
    return [best_first[r] for r in arrangement(ranking)]


def resampled_ranking(policy: dict, m: int) -> list[int]:
    """The policy's curve mapped to m slots by relative depth, ranked: slot j of m takes the place in the policy's
    ranking of measured slot round(j*(n-1)/(m-1)) (Python's round: a half goes to the even slot; m=1: slot 0). Slots
    that take the same measured slot are ordered as the curve ranks their exact depths, x = j*(n-1)/(m-1): by the
    accuracy interpolated there between the two nearest measured slots (on a rising curve the deeper one first), then
    the lower slot. A caveat: a curve measured on n items says nothing sure about m; this assumes the shape scales
    with depth."""
    n = int(policy["n_slots"])
    acc = {int(s["slot"]): float(s["accuracy"]) for s in policy.get("slots") or []}
    if sorted(acc) != list(range(n)):
        raise PosbiasError(f"the policy has no accuracy for each of its {n} slots, so it cannot be resampled",
                           "export the policy again (posbias policy export RUN)")
    if m < 0:
        raise PosbiasError(f"cannot rank {m} slots", "pass the number of retrieved items, 0 or more")
    depth = [0.0] if m == 1 else [j * (n - 1) / (m - 1) for j in range(m)]
    place = {s: r for r, s in enumerate(policy["ranking"])}

    def curve_at(x: float) -> float:  # the accuracy at depth x, linear between the measured slots
        lo = min(int(x), n - 1)
        return acc[lo] + (x - lo) * (acc[min(lo + 1, n - 1)] - acc[lo])

    return sorted(range(m), key=lambda j: (place[round(depth[j])], -curve_at(depth[j]), j))


def policy_from_sweep(record: dict, source: str = "") -> dict:
    """The policy of a finished sweep's record (sweep.json): the unmodified model, one gold item, every slot."""
    cfg, task = record.get("config") or {}, record.get("task") or {}
    where = source or "the sweep"
    if (record.get("method") or {}).get("name", "none") != "none":
        raise PosbiasError(f"{where} measured the model under method {record['method'].get('name')}; a policy is the "
                           "unmodified model's curve", "sweep the model without a method and export that")
    per = record.get("per_position") or []
    # what a slot means (Task.kind); a record written before sweeps recorded it: an order task's config has "labels"
    kind = record.get("task_kind") or ("order" if "labels" in task else
                                       "two-hop" if any(not isinstance(p.get("position"), int) for p in per) else "one-gold")
    if kind == "order":  # judge or multiple choice (tasks/order.py)
        raise PosbiasError(f"{where} is an order task ({task.get('name')}): its slots are the candidates' order",
                           "use swap or pride on an order task; a policy places retrieved items")
    n = int(task.get("n_slots", 0))
    if kind == "depth" or (kind == "one-gold" and task.get("name") == "niah"):  # niah: recorded one-gold before "depth"
        raise PosbiasError(f"{where} is a needle task ({task.get('name')}): its {n} slots are depths in one text, not "
                           "places of retrieved items", "a policy places retrieved items: sweep a task that lists them "
                           "(kv-lookup, nq, jsonl:PATH)")
    if kind == "two-hop":
        raise PosbiasError(f"{where} places two items (a two-hop task); a policy ranks the slots of one gold item",
                           "sweep a one-gold task (kv-lookup, nq, jsonl:PATH)")
    got = sorted(p["position"] for p in per)
    if not n or got != list(range(n)):
        raise PosbiasError(f"{where} measured slots {','.join(map(str, got))} of {n}; a policy needs every slot",
                           f"sweep all {n} slots: posbias sweep ... --positions all (the default)")
    per = sorted(per, key=lambda p: p["position"])
    acc = [float(p["accuracy"]) for p in per]
    return {"posbias_policy": VERSION, "model": (record.get("model") or {}).get("name", cfg.get("model")), "task": task,
            "n_slots": n, "ranking": slot_ranking(acc),
            "slots": [{"slot": p["position"], "accuracy": p["accuracy"], "ci": [p["ci_low"], p["ci_high"]], "n": p["n"]}
                      for p in per],
            "measured": {"run": source, "engine": cfg.get("engine"), "n": cfg.get("n"), "seed": cfg.get("seed"),
                         "skip": cfg.get("skip"), "chat_used": cfg.get("chat_used"), "template": cfg.get("template"),
                         "posbias": (record.get("versions") or {}).get("posbias")},
            "fitted_on": _split(task.get("name"), cfg),
            "curve": _curve_summary(record.get("summary") or {})}


def _split(task: str | None, cfg: dict) -> dict | None:
    """The examples the sweep scored (what a comparison must not evaluate); None where its record does not say."""
    split = {"task": task, "seed": cfg.get("seed"), "skip": cfg.get("skip"), "n": cfg.get("n")}
    return split if None not in split.values() else None


def _curve_summary(summary: dict) -> dict:
    """The sweep's curve as the policy keeps it: average, gap (best - worst slot) and its interval and the shape, for
    display, and the position-effect test (a within-example permutation test of any difference between slots,
    core/metrics.py) that decides whether the ranking rests on more than noise: `separable` is its p < ALPHA. A sweep
    written before the test existed has none: `separable` is None (ranking_note says how to get it)."""
    test = summary.get("position_test") or None
    return {"average": summary.get("average"), "gap": summary.get("gap"), "gap_ci": summary.get("gap_ci"),
            "shape": summary.get("shape"), "position_test": test,
            "separable": None if test is None else bool(test["p"] < ALPHA)}


def ranking_note(policy: dict) -> str | None:
    """A warning when the position-effect test finds no difference between the slots (p >= ALPHA: the ranking is
    noise); a note when the curve carries no test (a sweep or policy of an older posbias); else None. A policy with no
    curve at all (written by hand) gets none. The gap interval is shown, never decided with."""
    c = policy.get("curve")
    if not c:
        return None
    test, run = c.get("position_test"), (policy.get("measured") or {}).get("run") or "the sweep"
    if not test:
        return (f"note: {run} has no position-effect test (written by an older posbias), so nothing says whether this "
                "ranking is more than noise: rerun the command that wrote it (its run.json's `command`: posbias sweep, "
                "or posbias compare for a comparison's entry) with --resume (its rows are kept and the summary is "
                "computed again), then export the policy again")
    if test["p"] < ALPHA:
        return None
    gap = "" if not (is_number(c.get("gap")) and is_pair(c.get("gap_ci"))) else \
        f"; gap {c['gap']:.3f} [{c['gap_ci'][0]:.3f}, {c['gap_ci'][1]:.3f}]"
    total = (policy.get("measured") or {}).get("n")
    varied = f"{test['n']} answer differently at some slot"
    over = f"n = {total} examples ({varied}" if is_whole(total) else f"the examples ({varied}"
    return (f"warning: no position effect: permutation test p = {test['p']:.3f} over {over}; level {ALPHA}{gap}): "
            "this ranking is noise; measure more examples, or a task the model does above the floor")


def read_policy(path: str | Path) -> dict:
    """A policy from a policy file, a finished sweep folder, its sweep.json or its run.json, checked; with the file's
    sha256."""
    p = Path(path)
    if p.name == MARKER and p.is_file():  # a run folder's marker: the folder it marks
        p = p.parent
    f = _sweep_in(p) if p.is_dir() else p
    if not f.is_file():
        raise PosbiasError(f"no policy or finished sweep at {p}",
                           "pass a policy file (posbias policy export RUN) or a finished sweep folder")
    try:
        rec = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PosbiasError(f"{f} is not JSON ({type(e).__name__})", "export the policy again") from None
    if not isinstance(rec, dict) or not ("posbias_policy" in rec or "per_position" in rec):
        if folder_kind(f.parent) == "comparison":
            _refuse_comparison(f.parent)
        raise PosbiasError(f"{f} is not a policy or a sweep record", f"pass its folder: posbias policy export {f.parent}"
                           if (f.parent / "sweep.json").is_file() else "pass a policy file or a finished sweep folder")
    try:
        pol = rec if "posbias_policy" in rec else policy_from_sweep(rec, str(f))
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a field of another type than a sweep writes
        raise PosbiasError(f"{f} is neither a policy nor a finished sweep record ({type(e).__name__}: {e})",
                           "pass a policy file (posbias policy export RUN) or a finished sweep folder") from None
    validate_policy(pol, f)
    if pol.get("curve") and not pol["curve"].get("position_test"):  # an older posbias judged by the gap interval
        pol = {**pol, "curve": {**pol["curve"], "separable": None}}
    return {**pol, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}


def _sweep_in(folder: Path) -> Path:
    """The folder's sweep.json, refused in one line where it holds none: a comparison (its entries are sweeps), an
    unfinished sweep (the command that finishes it), another kind of run, or no run."""
    if (folder / "sweep.json").is_file():
        return folder / "sweep.json"
    kind = folder_kind(folder)
    if kind == "comparison":
        _refuse_comparison(folder)
    if kind == "sweep":
        raise PosbiasError(f"{folder} holds no sweep.json: an unfinished sweep",
                           f"finish it ({_resume_command(folder)}), then export again")
    what = "not a posbias run folder" if kind is None else f"it holds {kind_name(kind)}, not a sweep"
    raise PosbiasError(f"{folder} holds no sweep.json: {what}", "pass a finished sweep folder (posbias sweep --out DIR)")


def _refuse_comparison(folder: Path) -> NoReturn:
    """A comparison is one sweep per entry: name the entries that measured the model unmodified (method none), the
    command that exports one, or, where they are unfinished, the command that finishes them."""
    plain = [d for d in sorted(folder.iterdir()) if d.is_dir() and _entry_method(d) == "none"]
    done = [d for d in plain if (d / "sweep.json").is_file()]
    what = f"{folder} is a comparison, not a sweep"
    if done:
        raise PosbiasError(f"{what}; its unmodified model's sweep is the entry {' or '.join(map(str, done))}",
                           " or ".join(f"posbias policy export {shlex.quote(str(d))}" for d in done))
    if plain:
        raise PosbiasError(f"{what}, and its unmodified model's entry {plain[0]} is unfinished",
                           f"finish it ({_resume_command(folder)}), then posbias policy export {shlex.quote(str(plain[0]))}")
    raise PosbiasError(f"{what}, and none of its entries measured the model unmodified (method none)",
                       "sweep the model without a method (posbias sweep --out DIR) and export that folder")


def _entry_method(folder: Path) -> str | None:
    """The method an entry folder's run.json records (its fingerprint's config), or None."""
    try:
        return json.loads((folder / MARKER).read_text())["fingerprint"]["config"]["method"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _resume_command(folder: Path) -> str:
    """How to finish the run in `folder`: the command its run.json records, rerun with --resume."""
    try:
        cmd = json.loads((folder / MARKER).read_text()).get("command")
        words = shlex.split(cmd) if isinstance(cmd, str) else []
    except (OSError, ValueError, AttributeError):
        words = []
    if words[:1] != ["posbias"]:  # started from Python (or recorded by an older posbias)
        return "rerun what started it with --resume, or resume=True"
    return "rerun " + shlex.join([w for w in words if w not in ("--overwrite", "--resume")] + ["--resume"])


def check_policy(policy: dict, model: str | None = None, task: dict | None = None, n_slots: int | None = None) -> None:
    """Refuse, in one line, a policy measured on another model, task shape or slot count."""
    where = policy.get("measured", {}).get("run") or "the policy"
    fix = "measure this model's curve on this task (posbias sweep) and use that"
    if model is not None and policy["model"] != model:
        raise PosbiasError(f"the curve in {where} belongs to model {policy['model']}, not {model}", fix)
    if n_slots is not None and policy["n_slots"] != n_slots:
        raise PosbiasError(f"the curve in {where} ranks {policy['n_slots']} slots, the task has {n_slots}", fix)
    if task is not None and policy["task"] != task:
        diff = sorted(k for k in {*task, *policy["task"]} if task.get(k) != policy["task"].get(k))
        raise PosbiasError(f"the curve in {where} was measured on another task shape (differs in {', '.join(diff)}: "
                           + "; ".join(f"{k} {policy['task'].get(k)!r} there, {task.get(k)!r} here" for k in diff) + ")",
                           fix)


def write_policy(policy: dict, path: str | Path) -> Path:
    """Write the policy as indented JSON (atomic: a temporary file, then renamed)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".partial")
    tmp.write_text(json.dumps({k: v for k, v in policy.items() if k != "sha256"}, indent=2) + "\n")
    tmp.replace(out)
    return out


def as_policy(policy: Any) -> dict:
    """A policy read from a path (read_policy checks it) or given as a dict (its version and ranking checked)."""
    if isinstance(policy, (str, os.PathLike)):
        return read_policy(policy)
    if not isinstance(policy, dict):
        raise PosbiasError(f"a policy is a path or a dict, not {type(policy).__name__}",
                           "pass a policy file (posbias policy export RUN) or read_policy(path)")
    validate_policy(policy, "the policy dict")
    return policy


def ranking_for(policy: dict, m: int, resample: bool, what: str = "documents") -> list[int]:
    """The slot ranking for m documents: the policy's own, or (resample) its curve mapped to m; else refused."""
    n = policy["n_slots"]
    if m == n:
        return list(policy["ranking"])
    if not resample:
        raise PosbiasError(f"the policy ranks {n} slots, and {m} {what} came",
                           f"retrieve {n} {what} (k={n}), or pass `resample=True` to map the curve by relative depth")
    return resampled_ranking(policy, m)
