"""DeadlineIndex (pytest-benchmark).

    python -m pytest benchmarks/bench_deadlines.py --benchmark-only

Measured: pop_due of 100,000 due among 1,000,000 entries; set throughput.
"""

from __future__ import annotations

import random

import pytest

from sfc_fast.deadlines import DeadlineIndex

N = 1_000_000
DUE = 100_000
STEP = 10   # deadlines are 0, 10, 20, ... in a shuffled order: exactly DUE are <= NOW
NOW = DUE * STEP - 1


@pytest.fixture(scope="module")
def jobs() -> list[tuple[str, int]]:
    rng = random.Random(3)
    deadlines = [i * STEP for i in range(N)]
    rng.shuffle(deadlines)
    return [(f"job-{i}", dl) for i, dl in enumerate(deadlines)]


@pytest.fixture(scope="module")
def full(jobs) -> DeadlineIndex:
    d = DeadlineIndex()
    for j, dl in jobs:
        d.set(j, dl)
    return d


def test_pop_due_100k_of_1m(benchmark, full: DeadlineIndex) -> None:
    popped: list[tuple[str, int]] = []

    def setup():
        # Put back what the last round popped (untimed), so every round starts full.
        for j, dl in popped:
            full.set(j, dl)
        popped.clear()

    def run():
        popped.extend(full.pop_due(NOW))

    benchmark.pedantic(run, setup=setup, rounds=15, warmup_rounds=1)
    assert len(popped) == DUE and len(full) == N - DUE
    assert popped[0][1] == 0 and popped[-1][1] == NOW - STEP + 1
    setup()     # the index is shared with the next tests


def test_pop_due_10_of_1m(benchmark, full: DeadlineIndex) -> None:
    """A sweep that finds little due: the common case between bursts."""
    popped: list[tuple[str, int]] = []

    def setup():
        for j, dl in popped:
            full.set(j, dl)
        popped.clear()

    def run():
        popped.extend(full.pop_due(10 * STEP - 1))

    benchmark.pedantic(run, setup=setup, rounds=200, warmup_rounds=1)
    assert len(popped) == 10
    setup()


def test_set_move_100k_in_1m(benchmark, full: DeadlineIndex, jobs) -> None:
    """set() throughput on a full index: 100,000 jobs get a new deadline."""
    sample = random.Random(5).sample(jobs, DUE)
    flip = [0]

    def run():
        off = 5 if flip[0] else 0   # alternate, so every round moves every job
        flip[0] ^= 1
        for j, dl in sample:
            full.set(j, dl + off)

    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    assert len(full) == N


def test_set_insert_100k(benchmark, jobs) -> None:
    """set() throughput into an empty index."""
    sample = jobs[:DUE]

    def run():
        d = DeadlineIndex()
        for j, dl in sample:
            d.set(j, dl)
        return d

    d = benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    assert len(d) == DUE
