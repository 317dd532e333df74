"""DeadlineIndex against a plain-Python heapq index with lazy deletion, same process.

    python benchmarks/deadlines_ratio.py

Both get the same jobs and deadlines (1,000,000 entries, 100,000 of them due) and
give the same answers (checked); the table shows medians and the ratio.
"""

from __future__ import annotations

import heapq
import random
import statistics
import time

from sfc_fast.deadlines import DeadlineIndex

N = 1_000_000
DUE = 100_000
STEP = 10
NOW = DUE * STEP - 1
ROUNDS = 5


class PyDeadlineIndex:
    """The usual Python answer: heapq of [deadline, seq, job] plus a dict job ->
    entry; a moved or removed entry is marked dead and skipped when it surfaces."""

    def __init__(self) -> None:
        self._heap: list[list] = []
        self._entries: dict[str, list] = {}
        self._seq = 0

    def set(self, job: str, deadline_ms: int) -> None:
        old = self._entries.get(job)
        if old is not None:
            if old[0] == deadline_ms:
                return
            old[2] = None
        entry = [deadline_ms, self._seq, job]
        self._seq += 1
        self._entries[job] = entry
        heapq.heappush(self._heap, entry)

    def remove(self, job: str) -> bool:
        entry = self._entries.pop(job, None)
        if entry is None:
            return False
        entry[2] = None
        return True

    def pop_due(self, now_ms: int, limit: int | None = None) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms and (limit is None or len(out) < limit):
            deadline, _, job = heapq.heappop(heap)
            if job is not None:
                del self._entries[job]
                out.append((job, deadline))
        return out

    def __len__(self) -> int:
        return len(self._entries)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def workload(cls, jobs, moves):
    """Median seconds of: inserting N, popping DUE of N, moving DUE of N, removing DUE."""
    idx = cls()

    def insert():
        for j, dl in jobs:
            idx.set(j, dl)

    t_insert = timed(insert)
    popped: list = []
    t_pop = []
    for _ in range(ROUNDS):
        t_pop.append(timed(lambda: popped.append(idx.pop_due(NOW))))
        for j, dl in popped[-1]:
            idx.set(j, dl)
    t_move = []
    for r in range(ROUNDS):
        def move(off=(r + 1) * 3):
            for j, dl in moves:
                idx.set(j, dl + off)
        t_move.append(timed(move))
    t_remove = timed(lambda: [idx.remove(j) for j, _ in moves])
    assert len(idx) == N - DUE
    return {
        "set, insert 1,000,000": (t_insert, N),
        "pop_due 100,000 of 1,000,000": (statistics.median(t_pop), DUE),
        "set, move 100,000 of 1,000,000": (statistics.median(t_move), DUE),
        "remove 100,000": (t_remove, DUE),
    }, popped[0]


def main() -> None:
    rng = random.Random(3)
    deadlines = [i * STEP for i in range(N)]
    rng.shuffle(deadlines)
    jobs = [(f"job-{i}", dl) for i, dl in enumerate(deadlines)]
    moves = rng.sample(jobs, DUE)

    ours, first_ours = workload(DeadlineIndex, jobs, moves)
    theirs, first_theirs = workload(PyDeadlineIndex, jobs, moves)
    assert first_ours == first_theirs, "the two indexes disagree"

    print(f"{'operation':<34} {'sfc_fast':>12} {'heapq+dict':>12} {'ratio':>7}")
    for name, (t, n) in ours.items():
        tp = theirs[name][0]
        print(f"{name:<34} {t * 1e3:>9.1f} ms {tp * 1e3:>9.1f} ms {tp / t:>6.1f}x"
              f"   ({t / n * 1e9:.0f} vs {tp / n * 1e9:.0f} ns/op)")


if __name__ == "__main__":
    main()
