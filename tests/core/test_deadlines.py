"""sfc_fast.DeadlineIndex (docs/design.md#deadline-index): unit tests and a model-based
property test."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfc_fast.deadlines import DeadlineIndex


class Model:
    """The reference: a dict and a sort. Ties go to the earlier set() that gave the
    deadline; setting the same deadline again keeps the place."""

    def __init__(self) -> None:
        self.d: dict[str, tuple[int, int]] = {}
        self.stamp = 0

    def set(self, job: str, deadline: int) -> None:
        if job in self.d and self.d[job][0] == deadline:
            return
        self.d[job] = (deadline, self.stamp)
        self.stamp += 1

    def remove(self, job: str) -> bool:
        return self.d.pop(job, None) is not None

    def order(self) -> list[tuple[str, int]]:
        return [(j, dl) for j, (dl, _) in sorted(self.d.items(), key=lambda kv: kv[1])]

    def pop_due(self, now: int, limit: int | None = None) -> list[tuple[str, int]]:
        due = [(j, dl) for j, dl in self.order() if dl <= now]
        if limit is not None:
            due = due[:limit]
        for j, _ in due:
            del self.d[j]
        return due

    def peek(self) -> tuple[str, int] | None:
        o = self.order()
        return o[0] if o else None


def test_empty() -> None:
    d = DeadlineIndex()
    assert len(d) == 0 and not d
    assert d.peek() is None
    assert d.pop_due(10**12) == []
    assert d.get("a") is None and "a" not in d
    assert d.remove("a") is False
    assert repr(d) == "<DeadlineIndex empty>"


def test_set_get_peek_and_move() -> None:
    d = DeadlineIndex()
    d.set("a", 50)
    d.set("b", 20)
    d.set("c", 30)
    assert len(d) == 3 and "b" in d
    assert d.peek() == ("b", 20)
    assert d.get("a") == 50
    d.set("a", 10)                      # move earlier
    assert d.peek() == ("a", 10)
    d.set("a", 99)                      # move later
    assert d.peek() == ("b", 20) and d.get("a") == 99 and len(d) == 3
    assert "'b' at 20" in repr(d)


def test_pop_due_earliest_first_with_limit() -> None:
    d = DeadlineIndex()
    for i, dl in enumerate([7, 3, 9, 1, 5]):
        d.set(f"j{i}", dl)
    assert d.pop_due(0) == []
    assert d.pop_due(5, limit=2) == [("j3", 1), ("j1", 3)]
    assert d.pop_due(5, limit=0) == []
    assert d.pop_due(5) == [("j4", 5)]
    assert d.pop_due(100) == [("j0", 7), ("j2", 9)]
    assert len(d) == 0 and "j0" not in d and d.get("j0") is None


def test_ties_in_set_order_and_same_deadline_keeps_place() -> None:
    d = DeadlineIndex()
    for j in ["c", "a", "b"]:
        d.set(j, 5)
    d.set("c", 5)                       # unchanged deadline: keeps its place
    assert d.pop_due(5) == [("c", 5), ("a", 5), ("b", 5)]
    for j in ["c", "a", "b"]:
        d.set(j, 5)
    d.set("c", 6)
    d.set("c", 5)                       # moved away and back: now the latest
    assert [j for j, _ in d.pop_due(5)] == ["a", "b", "c"]


def test_remove() -> None:
    d = DeadlineIndex()
    for i in range(100):
        d.set(f"j{i}", (i * 37) % 100)
    for i in range(0, 100, 3):
        assert d.remove(f"j{i}") is True
    assert d.remove("j0") is False
    got = d.pop_due(1000)
    want = sorted(((f"j{i}", (i * 37) % 100) for i in range(100) if i % 3), key=lambda x: x[1])
    assert got == want


def test_popped_job_can_be_set_and_removed_again() -> None:
    d = DeadlineIndex()
    d.set("a", 1)
    d.set("b", 2)
    assert d.pop_due(1) == [("a", 1)]
    assert "a" not in d and d.get("a") is None and d.remove("a") is False
    d.set("c", 0)                       # takes the slot "a" had
    assert "a" not in d and d.get("c") == 0
    d.set("a", 5)
    assert d.get("a") == 5 and len(d) == 3
    assert d.pop_due(10) == [("c", 0), ("b", 2), ("a", 5)]


def test_equal_but_distinct_str_objects() -> None:
    d = DeadlineIndex()
    k1 = "".join(["jo", "b-1"])
    k2 = "".join(["job", "-1"])
    assert k1 == k2 and k1 is not k2
    d.set(k1, 5)
    assert k2 in d and d.get(k2) == 5
    d.set(k2, 3)
    assert len(d) == 1 and d.peek() == ("job-1", 3)
    assert d.remove(k2) is True and len(d) == 0


def test_clear() -> None:
    d = DeadlineIndex()
    for i in range(1000):
        d.set(str(i), i)
    d.pop_due(10)
    d.clear()
    assert len(d) == 0 and d.peek() is None and "500" not in d
    d.set("x", 1)
    assert d.pop_due(1) == [("x", 1)]


def test_argument_types() -> None:
    d = DeadlineIndex()
    with pytest.raises(TypeError):
        d.set(1, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        d.set(None, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        d.set("a", 1.5)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        d.set("a", 2**63)
    with pytest.raises(ValueError):
        d.pop_due(0, limit=-1)
    d.set("a", -(2**63))
    d.set("b", 2**63 - 1)
    assert d.pop_due(-(2**63)) == [("a", -(2**63))]
    assert d.pop_due(2**63 - 1) == [("b", 2**63 - 1)]
    assert 1 not in d and d.get(1) is None and [] not in d


def test_many_jobs_bulk_pop_and_stale_entries() -> None:
    """Large pops restore the heap; many popped-and-forgotten jobs (which leave stale
    dict entries until a rebuild) never come back."""
    rng = random.Random(7)
    d, m = DeadlineIndex(), Model()
    for i in range(20_000):
        j, dl = f"job-{i}", rng.randrange(100_000)
        d.set(j, dl)
        m.set(j, dl)
    for now in (5_000, 5_000, 60_000, 60_500, 99_999):
        assert d.pop_due(now, limit=3_000) == m.pop_due(now, 3_000)
        assert d.pop_due(now) == m.pop_due(now)
        assert len(d) == len(m.d) and d.peek() == m.peek()
        for i in rng.sample(range(20_000), 500):
            j = f"job-{i}"
            assert (j in d) == (j in m.d) and d.get(j) == m.d.get(j, (None,))[0]
        for i in rng.sample(range(30_000), 200):
            j, dl = f"job-{i}", rng.randrange(100_000)
            d.set(j, dl)
            m.set(j, dl)
    assert d.pop_due(10**6) == m.pop_due(10**6, None)


JOBS = [f"j{i}" for i in range(12)]
ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(JOBS), st.integers(-3, 12)),
    st.tuples(st.just("remove"), st.sampled_from(JOBS)),
    st.tuples(st.just("pop"), st.integers(-5, 15), st.none() | st.integers(0, 4)),
    st.tuples(st.just("peek")),
    st.tuples(st.just("get"), st.sampled_from(JOBS)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=80))
def test_matches_reference_model(seq) -> None:
    d, m = DeadlineIndex(), Model()
    for op in seq:
        if op[0] == "set":
            d.set(op[1], op[2])
            m.set(op[1], op[2])
        elif op[0] == "remove":
            assert d.remove(op[1]) == m.remove(op[1])
        elif op[0] == "pop":
            assert d.pop_due(op[1], op[2]) == m.pop_due(op[1], op[2])
        elif op[0] == "peek":
            assert d.peek() == m.peek()
        elif op[0] == "get":
            assert d.get(op[1]) == m.d.get(op[1], (None,))[0]
            assert (op[1] in d) == (op[1] in m.d)
        else:
            d.clear()
            m.d.clear()
        assert len(d) == len(m.d)
    assert d.pop_due(100) == m.pop_due(100, None)
