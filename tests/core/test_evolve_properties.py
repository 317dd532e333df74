"""Invariants of evolve over generated recipes and random event sequences (hypothesis)."""

from __future__ import annotations

import contextlib
from typing import Any

from helpers.recipes import V110
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfc_fast import compile_recipe
from sfc_fast.events import (
    Cancel,
    Completed,
    Event,
    Failed,
    Held,
    Hold,
    NotHeld,
    Release,
    Resume,
    Shift,
    Start,
    Tick,
)
from sfc_fast.evolve import evolve, job_index
from sfc_fast.state import StateFormatError, state_to_json

QUALS = ["N", "N", "N", "P", "P1", "P0", "S", "L", "D"]
TERMINAL = ("completed", "aborted", "stopped")


@st.composite
def recipes(draw) -> dict[str, Any]:
    """A random sequence with an optional branch, loops back and varied actions."""
    n = draw(st.integers(2, 6))
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)]
    acts: list[dict[str, Any]] = []
    trans: list[dict[str, Any]] = []
    branches: list[dict[str, Any]] = []
    names = 0
    for i in range(n):
        for _ in range(draw(st.integers(0, 2))):
            q = draw(st.sampled_from(QUALS))
            a: dict[str, Any] = {"Name": f"a{names}", "Step": f"S{i}", "Qualifier": q,
                                 "TimeoutSeconds": draw(st.integers(1, 5))}
            names += 1
            if draw(st.booleans()) or q in ("P0",):
                a["Interaction"] = "push_command"
                a["TypeId"] = f"t.a{names - 1}"
                if draw(st.booleans()):
                    a["Retries"] = draw(st.integers(0, 2))
                if draw(st.booleans()):
                    a["HoldTypeId"] = "t.hold"
                    if draw(st.booleans()):
                        a["RestartTypeId"] = "t.restart"
            else:
                a["Interaction"] = "pull_event"
                a["TypeId"] = draw(st.sampled_from(["e.x", "e.y"]))
            if q in ("L", "D"):
                a["DurationSeconds"] = draw(st.integers(1, 4))
            acts.append(a)
    with_branch = n >= 4 and draw(st.booleans())
    if with_branch:
        kind = draw(st.sampled_from(["selection", "simultaneous"]))
        branches.append({"Name": "B", "Type": kind, "Branches": [["S1"], ["S2"]]})
        trans.append({"Source": "S0", "Target": "B", "Condition": "always"})
        if kind == "selection":
            trans.append({"Source": "B", "Target": "S1", "Condition": "job.k == 1"})
        trans.append({"Source": "B", "Target": "S3", "Condition": "always"})
        start = 3
    else:
        start = 0
    for i in range(start, n - 1):
        trans.append({"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": "always"})
        if i > start and draw(st.booleans()):
            # a loop back, bounded by the round counter
            back = draw(st.integers(start, i))
            trans.append({"Source": f"S{i}", "Target": f"S{back}", "Priority": -1,
                          "Condition": f"S{i}_r < 3".replace(f"S{i}_r", f"job.r{i}")})
    return {"Steps": steps, "Transitions": trans, "Actions": acts, "Branches": branches}


def events_for(state_view: dict[str, Any]) -> st.SearchStrategy:
    """Events that hit the job's open work, plus noise."""
    cmds = [v["command_id"] for v in state_view["actions"].values() if v["command_id"]]
    ids = st.sampled_from(cmds + [c + ":hold" for c in cmds] + ["J:zz#1", "garbage"])
    results = st.one_of(st.none(), st.dictionaries(st.sampled_from(["ok", "v"]),
                                                   st.integers(-2, 2), max_size=2))
    return st.one_of(
        st.builds(Completed, ids, results),
        st.builds(Failed, ids, st.just("x")),
        st.builds(Held, ids),
        st.builds(NotHeld, ids),
        st.builds(Event, st.sampled_from(["e.x", "e.y", "e.z"]), st.none(), st.none(),
                  st.none()),
        st.builds(Tick, st.sets(st.sampled_from(cmds or ["J:a0#1"]), max_size=1)),
        st.just(Hold()), st.just(Release()), st.just(Resume()),
        st.builds(Shift, st.integers(0, 3_000)),
        st.builds(Cancel, st.just("c"), st.booleans()),
        st.builds(Start, st.just("J"), st.just("s")),
    )


def open_deadlines(view: dict[str, Any]) -> dict[str, int]:
    return {k: v["deadline_ms"] for k, v in view["actions"].items()
            if v["phase"] in ("open", "delayed") and v["deadline_ms"] is not None}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_invariants_over_random_runs(data) -> None:
    recipe = data.draw(recipes())
    g = compile_recipe(recipe, V110)
    now = 1_000
    params = {f"r{i}": data.draw(st.integers(0, 4)) for i in range(8)} | {"k": 1}
    d = evolve(g, None, Start("J", "s", params), now)
    assert d.applied
    state = d.state
    # command id -> (action, attempt): a command id never names two attempts
    seen: dict[str, tuple[str, int]] = {}

    def record(dec) -> None:
        for c in dec.commands:
            if c.hold:
                continue
            key = (c.action, c.attempt)
            prev = seen.setdefault(c.command_id, key)
            assert prev == key, (c.command_id, prev, key)

    record(d)
    for _ in range(data.draw(st.integers(1, 25))):
        before_view = state_to_json(g, state)
        ev = data.draw(events_for(before_view))
        now += data.draw(st.integers(0, 4_000))
        dec = evolve(g, state, ev, now)      # never raises on any event in any state
        if not dec.applied:
            # absorbed: nothing to write, nothing to do
            assert dec.work == [] and dec.commands == [] and dec.job == ()
            continue
        record(dec)
        after = state_to_json(g, dec.state)
        if before_view["status"] in TERMINAL:
            # a terminal job stays terminal (only a new Start replaces it)
            assert isinstance(ev, Start)
        if isinstance(ev, Shift) and before_view["status"] not in TERMINAL:
            b, a = open_deadlines(before_view), open_deadlines(after)
            assert a == {k: v + ev.gap_ms for k, v in b.items()}
        # at most one open attempt per action: one command id per open action
        opened = [v["command_id"] for v in after["actions"].values()
                  if v["phase"] == "open" and v["command_id"]]
        assert len(opened) == len(set(opened))
        # the waits index changes are exactly the difference of the waited-for types
        w0, w1 = set(job_index(g, state)[2]), set(job_index(g, dec.state)[2])
        assert set(dec.waits_added) == w1 - w0 and set(dec.waits_removed) == w0 - w1
        # the codec round-trips: decoding what we wrote gives the same view
        assert state_to_json(g, dec.state) == after
        state = dec.state


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_hold_then_release_reissues_exactly_the_open_push_attempts(data) -> None:
    recipe = data.draw(recipes())
    for a in recipe["Actions"]:
        for k in ("HoldTypeId", "RestartTypeId"):
            a.pop(k, None)
    g = compile_recipe(recipe, V110)
    d = evolve(g, None, Start("J", "s", {"k": 1}), 1_000)
    state = d.state
    if d.status != "running":
        return
    view = state_to_json(g, state)
    open_push = sorted(v["command_id"] for v in view["actions"].values()
                       if v["phase"] == "open" and v["command_id"])
    h = evolve(g, state, Hold(), 2_000)
    r = evolve(g, h.state, Release(), 3_000)
    sent = sorted(c.command_id for c in r.commands if not c.hold)
    assert sent == open_push


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_state_is_refused_never_crashes(blob: bytes) -> None:
    g = compile_recipe({"Steps": [{"Name": "A", "Initial": True}], "Transitions": [],
                        "Actions": []}, V110)
    with contextlib.suppress(StateFormatError):
        evolve(g, blob, Tick(), 1)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_real_states_are_refused_or_read(data) -> None:
    from helpers.recipes import load_reference

    wm = load_reference("axle_fit_qa.json")
    g = compile_recipe(wm["data"], wm["dataschema"])
    d = evolve(g, None, Start("J", "s", {"x": 1}), 5)
    blob = bytearray(d.state)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(StateFormatError):
        evolve(g, bytes(blob), Tick(), 10**6)
