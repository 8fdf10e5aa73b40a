"""Where the test suite's wall time goes, from the timeline a run wrote (tests/conftest.py, POSBIAS_TEST_TIMELINE):

    POSBIAS_TEST_TIMELINE=/tmp/t.tsv make test        # or any pytest run, with or without workers
    python benchmarks/test_timeline.py /tmp/t.tsv

prints the run's span, each worker's busy seconds and idle gaps (done early, or between tests), the tests that
waited longest (wall minus the worker's own CPU: a server computing, a child process, a sleep), the modules by summed
test time, and the tests that ran in the last minutes (what a shorter suite must cut or move).
"""

from __future__ import annotations

import collections
import sys


def main(path: str, tail: float = 120.0) -> None:
    rows, cpu = [], {}
    for line in open(path):
        worker, start, end, nodeid, *used = line.rstrip("\n").split("\t")
        rows.append((worker, float(start), float(end), nodeid))
        cpu[nodeid] = float(used[0]) if used else None
    t0, t1 = min(r[1] for r in rows), max(r[2] for r in rows)
    print(f"{len(rows)} tests, span {t1 - t0:.0f} s")
    for worker in sorted({r[0] for r in rows}):
        mine = sorted(r for r in rows if r[0] == worker)
        busy = sum(r[2] - r[1] for r in mine)
        gaps = [(b[1] - a[2], a[3]) for a, b in zip(mine, mine[1:]) if b[1] - a[2] > 5]
        print(f"{worker}: busy {busy:.0f} s, first at +{mine[0][1] - t0:.0f} s, last ends +{mine[-1][2] - t0:.0f} s, "
              f"{len(gaps)} gaps over 5 s ({sum(g for g, _ in gaps):.0f} s)" + "".join(
                  f"\n    {g:.0f} s after {n}" for g, n in sorted(gaps, reverse=True)[:5]))
    modules = collections.Counter()
    for r in rows:
        modules[r[3].split("::")[0]] += r[2] - r[1]
    waits = sorted(((r[2] - r[1] - cpu[r[3]], r[3]) for r in rows if cpu.get(r[3]) is not None), reverse=True)
    if waits:  # wall minus the worker's own CPU: waiting on a server, a child process or a sleep
        print(f"worker waiting (wall - own CPU), in all {sum(w for w, _ in waits):.0f} s; the most:")
        for w, n in waits[:12]:
            print(f"  {w:7.1f} s  {n}")
    print("modules by summed time:")
    for m, s in modules.most_common(25):
        print(f"  {s:7.1f} s  {m}")
    print(f"running in the last {tail:.0f} s:")
    for r in sorted(rows, key=lambda r: r[1]):
        if r[2] > t1 - tail:
            print(f"  {r[0]} +{r[1] - t0:.0f}..+{r[2] - t0:.0f} s  {r[3]}")


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:]))
