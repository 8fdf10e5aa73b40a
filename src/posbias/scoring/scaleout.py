"""A sweep's rows scored across processes: `accelerate launch -m posbias.cli sweep|compare|grid ...`.

Under a launcher with WORLD_SIZE > 1 (runs.num_processes), every process loads the model and builds every row;
the work is then split at the bounds of the one-process plan (`Scorer.units`): on the prefix-shared path its
groups of examples (contiguous blocks of examples, all placements of an example in one group, one spine prefill
per example), on the plain path its batches. A unit scored alone is planned into the very same batches, so every
row is computed from the same tensors as in a one-process run: the numbers are identical on any dtype, not only
up to float noise (given the same threads per process). The split runs in rounds:

    todo      the units with a row not yet in examples.jsonl, in plan order
    round k   the next P x PER_ROUND of them, cut into P contiguous blocks (rank r takes block r; at the end the
              last ranks may get none); each rank scores its block (Scorer.score), then every rank gathers every
              rank's rows (accelerate gather_object) and rank 0 alone appends them to examples.jsonl, in the order
              a single process returns them (`Scorer.order`)

A kill loses at most the round in flight (rows scored but not yet gathered); `--resume` reads examples.jsonl on
rank 0, broadcasts those rows to every rank, and the rounds are cut from what is left. Every rank ends with all
rows, sorted as the one-process run sorts them, so sweep.json (intervals and the seeded position test included) is the one-process file.
Parallelism is bounded by the units: a prefix-shared group holds up to `max_batch` examples (fewer when their
spines fill `batch_tokens`), so a sweep of few examples has few groups; lower `max_batch` for more. One process
never comes here, and never imports accelerate.
"""

from __future__ import annotations

from typing import Callable

from ..methods import Method
from ..runs import JsonlLog, is_main_process, num_processes, process_index
from ..tasks import placement_key
from .encode import Encoded
from .scorer import Scorer

PER_ROUND = 1  # units (a group of examples / a batch) per process per round: what a kill can lose per process


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


def rounds(units: list, parts: int, per: int = PER_ROUND) -> list[list[list]]:
    """The rounds of a split: each round P x `per` units (fewer in the last), in P contiguous blocks."""
    step = parts * per
    return [blocks(units[i:i + step], parts) for i in range(0, len(units), step)]


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
    """The rows not in `done`, scored across processes in rounds of plan units (module docstring); every rank
    returns all of them, in the order one process returns them. Rank 0 appends each round to `log`; tick(n) after
    each round."""
    from accelerate.utils import gather_object

    rank, parts = process_index(), num_processes()
    order = {rows[i].key: k for k, i in enumerate(scorer.runner.result_order(rows, method))}
    todo = [u for u in scorer.runner.units(rows, method) if any(rows[i].key not in done for i in u)]

    def rank_of(d: dict) -> int:
        return order[(d["example_id"], placement_key(d["position"]))]

    out: list[dict] = []
    for part in rounds(todo, parts):
        mine = sorted(i for u in part[rank] for i in u)  # row order, as the one-process plan saw them
        local = scorer.score([rows[i] for i in mine], method, done) if mine else []
        got = sorted(gather_object(local), key=rank_of)
        if log is not None and is_main_process():
            log.append(got)
        tick(len(got))
        out.extend(got)
    return sorted(out, key=rank_of)
