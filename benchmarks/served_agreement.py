"""How far a served sweep is from the in-process one: verdict agreement, and for every row where they differ its
fp32 margin (min over answer steps of gold logit - best other logit, one unpadded fp32 forward; > 0: the gold answer
is greedy), as benchmarks/prefix_agreement.py does for prefix sharing. A row that differs with |margin| below
~0.5 logits is a near tie that bf16 rounding decides (on either side).

    python benchmarks/served_agreement.py SERVED_DIR LOCAL_DIR [SERVED_DIR LOCAL_DIR ...]

Each pair: two finished sweep folders with the same task, examples and positions (one through a served backend,
one in process); the model is the in-process run's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from posbias import get_task, load_model
from posbias.measure import Scorer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefix_agreement import margin  # noqa: E402 - a sibling script, importable once its folder is on the path


def rows_of(folder: Path) -> dict:
    return {(r["example_id"], json.dumps(r["position"])): r
            for r in map(json.loads, (folder / "examples.jsonl").read_text().splitlines())}


def main() -> None:
    torch.set_num_threads(2)
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    fp32 = {}
    for served_dir, local_dir in map(lambda p: (Path(p[0]), Path(p[1])), pairs):
        run = json.loads((local_dir / "sweep.json").read_text())
        cfg = run["config"]
        served, local = rows_of(served_dir), rows_of(local_dir)
        assert served.keys() == local.keys(), "the two sweeps hold different rows"
        name = cfg["model"]
        if name not in fp32:
            fp32[name] = load_model(name, "fp32", progress=False)
        task = get_task(cfg["task"], **cfg["task_options"])
        scorer = Scorer(fp32[name], task, cfg["engine"], chat=cfg["chat_used"])
        rows = {(r.key[0], json.dumps(r.key[1])): r
                for r in scorer.rows(task.examples(cfg["n"], cfg["seed"], cfg["skip"]), task.placements(cfg["positions"]))}
        flips = [k for k in local if bool(local[k]["correct"]) != bool(served[k]["correct"])]
        ms = sorted(round(margin(fp32[name].model, rows[k]), 3) for k in flips)
        acc = [sum(bool(d[k]["correct"]) for k in d) / len(d) for d in (served, local)]
        same_pred = sum(served[k]["prediction"] == local[k]["prediction"] for k in local) / len(local)
        print(f"{served_dir} vs {local_dir} ({cfg['engine']}, {len(local)} rows): accuracy served {acc[0]:.3f} / "
              f"in process {acc[1]:.3f}; verdict agreement {1 - len(flips) / len(local):.1%} ({len(flips)} differ), "
              f"same prediction {same_pred:.1%}; fp32 margins of the rows that differ: {ms}")


if __name__ == "__main__":
    main()
