"""A sweep's rows scored across processes (issue 17): `accelerate launch -m posbias.cli sweep|compare|grid ...`.

Under a launcher with WORLD_SIZE > 1 (runs.num_processes), every process loads the model and builds every row;
the rows are then split BY EXAMPLE, so all placements of one example stay on one process and prefix sharing keeps
its spine. The split runs in rounds:

    todo      the examples with a row not yet in examples.jsonl, in example order
    round k   the next P x ROUND of them, cut into P contiguous blocks (rank r takes block r; the last blocks
              are shorter or empty at the end); each rank scores its block (Scorer.score), then every rank
              gathers every rank's rows (accelerate gather_object) and rank 0 alone appends them to
              examples.jsonl, in the order a single process would have returned them (`Scorer.order`)

A kill loses at most the round in flight (rows scored but not yet gathered); `--resume` reads examples.jsonl on
rank 0, broadcasts those rows to every rank, and the rounds are cut from what is left. The numbers do not depend
on the number of processes: every rank ends with all rows, sorted as the one-process run sorts them, so
per_position_stats (bootstrap included) gives the same sweep.json; only float noise of other batch paddings can
differ (logprobs in the last digits). One process never comes here, and never imports accelerate.
"""

from __future__ import annotations

from typing import Callable

from ..methods import Method
from ..runs import JsonlLog, is_main_process, num_processes, process_index
from ..tasks import placement_key
from .encode import Encoded
from .scorer import Scorer

ROUND = 8  # examples per process per round: a kill loses at most this many per process


def blocks(items: list, parts: int) -> list[list]:
    """`items` cut into `parts` contiguous blocks of near-equal size, the longer ones first (as accelerate's
    split_between_processes cuts a list)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for r in range(parts):
        end = start + size + (1 if r < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def rounds(examples: list[str], parts: int, per: int = ROUND) -> list[list[list[str]]]:
    """The rounds of a split: each round P x `per` examples (fewer in the last), in P contiguous blocks."""
    step = parts * per
    return [blocks(examples[i:i + step], parts) for i in range(0, len(examples), step)]


def start_processes() -> None:
    """Join the launcher's process group (accelerate PartialState, from RANK / WORLD_SIZE / MASTER_ADDR) before the
    model loads, so each rank's `cuda` is its own GPU (local rank); without CUDA the group is gloo on the CPU
    (accelerate's default, no GPU, would treat the ranks as unrelated single processes). One process: nothing."""
    if num_processes() == 1:
        return
    import torch
    from accelerate import PartialState

    PartialState(cpu=not torch.cuda.is_available())


def broadcast_rows(rows: list[dict]) -> list[dict]:
    """Rank 0's rows (what examples.jsonl already holds) on every rank."""
    from accelerate.utils import broadcast_object_list

    start_processes()  # already started (run_sweep): the same state
    box = [rows if is_main_process() else None]
    broadcast_object_list(box, from_process=0)
    return box[0]


def score_split(scorer: Scorer, rows: list[Encoded], method: Method, done: set, log: JsonlLog | None,
                tick: Callable[[int], None]) -> list[dict]:
    """The rows not in `done`, scored across processes in rounds (module docstring); every rank returns all of
    them, in the order one process returns them. Rank 0 appends each round to `log`; tick(n) after each round."""
    from accelerate.utils import gather_object

    rank, parts = process_index(), num_processes()
    order = {rows[i].key: k for k, i in enumerate(scorer.order(rows, method))}
    by_ex: dict[str, list[Encoded]] = {}
    for r in rows:
        by_ex.setdefault(r.key[0], []).append(r)
    todo = [e for e, rs in by_ex.items() if any(r.key not in done for r in rs)]

    def rank_of(d: dict) -> int:
        return order[(d["example_id"], placement_key(d["position"]))]

    out: list[dict] = []
    for part in rounds(todo, parts):
        mine = [r for e in part[rank] for r in by_ex[e]]
        local = scorer.score(mine, method, done) if mine else []
        got = sorted(gather_object(local), key=rank_of)
        if log is not None and is_main_process():
            log.append(got)
        tick(len(got))
        out.extend(got)
    return sorted(out, key=rank_of)
