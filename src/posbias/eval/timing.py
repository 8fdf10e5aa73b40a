"""timing.json: a sweep's scoring seconds, rows and backend counters, this invocation's beside the totals over every
invocation of the run folder (a resume adds to them), with the CPU the figures came from."""

from __future__ import annotations

import time

from ..backends import Backend
from ..errors import PosbiasError
from ..models.dtype import cpu_kind
from ..runs import RunFolder, is_main_process, read_json, write_json_atomic


class Timing:
    """timing.json: this invocation's scoring seconds, rows and backend counters ("this_run") beside their totals over
    every invocation (resume: added to the folder's); saved every EVERY seconds of scoring, on a failure, at the end."""

    EVERY = 5.0

    def __init__(self, folder: RunFolder | None, backend: Backend, resuming: bool):
        self.path = folder.file("timing.json") if folder is not None and is_main_process() else None
        self.prev = _previous_totals(self.path) if resuming and self.path is not None else {}
        self.backend, self.rows, self.seconds, self.t0 = backend, 0, None, time.perf_counter()
        self.saved = self.t0

    def tick(self, n: int) -> None:
        self.rows += n
        if time.perf_counter() - self.saved > self.EVERY:
            self.save()

    def stop(self, rows: int) -> None:
        self.rows, self.seconds = rows, time.perf_counter() - self.t0

    def record(self) -> dict:
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.t0
        this = {"seconds": seconds, "rows": self.rows, **self.backend.counters()}
        totals = {k: self.prev.get(k, 0) + this.get(k, 0) for k in {**this, **self.prev} if k != "invocations"}
        return {**totals, "invocations": int(self.prev.get("invocations", 0)) + 1, "this_run": this,
                "seconds_this_run": seconds, "rows_this_run": self.rows, "cpu": cpu_kind().describe()}

    def backend_record(self) -> dict:  # record["backend"]'s counters: the totals, and this invocation's own
        rec, names = self.record(), list(self.backend.counters())
        if not names:  # a backend that counts nothing (in process): no counters to record
            return {}
        return {"counters": {k: rec[k] for k in names}, "this_run": {k: rec["this_run"][k] for k in names}}

    def save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self.record(), indent=2)
            self.saved = time.perf_counter()


def _previous_totals(path) -> dict:
    """The totals a folder's timing.json holds (an older one, of one invocation: its figures); {} if none."""
    try:
        old = read_json(path, "timing record") if path.is_file() else {}
    except PosbiasError:  # unreadable: counting starts again
        return {}
    totals = {k: v for k, v in old.items() if type(v) in (int, float) and not k.endswith("_this_run")}
    if "seconds" not in old:  # written before totals were kept
        totals.update(seconds=old.get("seconds_this_run", 0), rows=old.get("rows_this_run", 0), invocations=1)
    return totals
