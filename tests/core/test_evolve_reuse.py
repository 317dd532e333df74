"""Evolve reuses its working memory between calls and builds Decision views on demand.

These tests pin what that must not change: a Decision stays right after later calls (on
any job or graph), its views are built once, texts that are not ASCII go through, and a
call that fails leaves the next one unharmed.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from helpers.recipes import V110, linear, push

from sfc_fast import compile_recipe
from sfc_fast.events import Completed, Failed, Start, Tick
from sfc_fast.evolve import evolve, open_command, sent_markers
from sfc_fast.state import StateFormatError, state_to_json

NOW = 1_000


def test_a_decision_keeps_its_commands_after_later_calls_on_other_jobs_and_graphs():
    """Decision views are built from the decision's own data, never from reused state."""
    g1 = compile_recipe(linear(3), V110)
    g2 = compile_recipe(linear(2), V110)
    d1 = evolve(g1, None, Start("first", "scope-a"), NOW)
    d2 = evolve(g2, None, Start("second", "scope-b"), NOW)
    d3 = evolve(g1, d1.state, Completed("first:a0#1"), NOW + 1)
    d4 = evolve(g1, None, Start("third", "scope-c"), NOW)
    assert [(c.command_id, c.job, c.scope) for c in d3.commands] == [
        ("first:a1#2", "first", "scope-a")]
    assert [(c.command_id, c.job, c.scope) for c in d1.commands] == [
        ("first:a0#1", "first", "scope-a")]
    assert d2.commands[0].command_id == "second:a0#1"
    assert d4.work == [("job", "Run", ""), ("dispatch:a0", "a0", "third:a0#1")]
    assert state_to_json(g1, d3.state)["job"] == "first"


def test_decision_views_are_built_once():
    """work, commands and job return the same objects on every read."""
    g = compile_recipe(linear(2), V110)
    d = evolve(g, None, Start("J", "s1"), NOW)
    assert d.commands is d.commands
    assert d.work is d.work
    assert d.job is d.job == ("Run",)
    assert d.work[1][2] == d.commands[0].command_id
    absorbed = evolve(g, d.state, Completed("J:a0#9"), NOW)
    assert not absorbed.applied
    assert absorbed.work == [] and absorbed.commands == [] and absorbed.job == ()


def test_decision_and_command_fields_are_read_only():
    """The object fields are member descriptors (fast loads); they stay read-only and
    read what the call decided, on a fresh and on a reused Decision."""
    g = compile_recipe(linear(2), V110)
    for _ in range(3):      # the freelists hand back used objects: same answers
        d = evolve(g, None, Start("J", "s1"), NOW)
        c = d.commands[0]
        assert (d.applied, d.status, d.reason, d.waits_added, d.waits_removed) == (
            True, "running", None, (), ())
        assert type(d.state) is bytes and c.command_id == "J:a0#1"
        for obj, name in [(d, "state"), (d, "status"), (d, "reason"), (d, "waits_added"),
                          (d, "waits_removed"), (d, "applied"), (c, "command_id")]:
            try:
                setattr(obj, name, "x")
            except AttributeError:
                pass
            else:
                raise AssertionError(f"{type(obj).__name__}.{name} can be set")
    ended = evolve(g, d.state, Failed("J:a0#1", "jammed"), NOW)
    assert ended.status == "aborted" and "jammed" in ended.reason


@pytest.mark.parametrize("n", [4, 10])   # 10: more than a call notes one by one
def test_results_read_by_one_call_are_not_seen_by_the_next(n: int):
    """A call keeps the results it parses in slots reused by later calls; they are
    cleared when it ends, also when it read more of them than it counts one by one."""
    recipe = {
        "Steps": [{"Name": "S0", "Initial": True}, {"Name": "ALL_ONE"}, {"Name": "OTHER"}],
        "Transitions": [
            {"Source": "S0", "Target": "ALL_ONE", "Priority": 1,
             # not the last action's result: the call that reads these got that one
             # fresh, the others it reads from the state
             "Condition": " and ".join(f"a{i}.v == 1" for i in range(n - 1))},
            {"Source": "S0", "Target": "OTHER", "Priority": 2, "Condition": "always"}],
        "Actions": [push(f"a{i}", "S0") for i in range(n)]
        + [push("x", "ALL_ONE"), push("y", "OTHER")]}
    g = compile_recipe(recipe, V110)

    def start(job: str) -> tuple[bytes, list[str]]:
        d = evolve(g, None, Start(job, "s"), NOW)
        return d.state, [c.command_id for c in d.commands]

    def complete(state: bytes, cids: list[str], v: int) -> bytes:
        for cid in cids:
            state = evolve(g, state, Completed(cid, {"v": v}), NOW).state
        return state

    def step(state: bytes) -> str:
        return state_to_json(g, state)["active_steps"][0]

    for _ in range(3):
        # B answers all but one; then all of A's answers, whose last call reads every
        # result (v == 1); then B's last answer, whose call reads B's own (v == 2)
        b, b_ids = start("B")
        b = complete(b, b_ids[:-1], 2)
        a, a_ids = start("A")
        a = complete(a, a_ids, 1)
        b = complete(b, b_ids[-1:], 2)
        assert step(a) == "ALL_ONE"
        assert step(b) == "OTHER"


def test_texts_that_are_not_ascii_go_through():
    """Job, scope and action names are any Unicode text; ids are built from them."""
    recipe = {"Steps": [{"Name": "Stufe", "Initial": True}, {"Name": "Zwei"}],
              "Transitions": [{"Source": "Stufe", "Target": "Zwei", "Condition": "always"}],
              "Actions": [push("prüfen", "Stufe"), push("über", "Zwei")]}
    g = compile_recipe(recipe, V110)
    d = evolve(g, None, Start("Auftrag-Ä1", "Halle-Ö"), NOW)
    assert d.commands[0].command_id == "Auftrag-Ä1:prüfen#1"
    d = evolve(g, d.state, Completed("Auftrag-Ä1:prüfen#1", {"ok": "ja ✓"}), NOW + 1)
    c = d.commands[0]
    assert (c.command_id, c.action, c.job, c.scope) == (
        "Auftrag-Ä1:über#2", "über", "Auftrag-Ä1", "Halle-Ö")
    assert open_command(g, d.state, "über").command_id == "Auftrag-Ä1:über#2"
    assert sent_markers(g, d.state)[1] == (("sent:über", "Auftrag-Ä1:über#2"),)
    view = state_to_json(g, d.state)
    assert view["actions"]["prüfen"]["result"] == {"ok": "ja ✓"}
    d = evolve(g, d.state, Failed("Auftrag-Ä1:über#2", "kaputt ✗"), NOW + 2)
    assert d.status == "aborted" and d.reason == "action 'über' failed: kaputt ✗"
    assert state_to_json(g, d.state)["reason"] == "action 'über' failed: kaputt ✗"


def test_odd_command_ids_are_absorbed():
    """An answer whose id is not one this job's core made is absorbed, never an error."""
    g = compile_recipe(linear(2), V110)
    st = evolve(g, None, Start("J", "s1"), NOW).state
    for cid in ("J:a0#1\ud800", "\ud800", "J:a0#", "J:#1", "J:a0#01x", "K:a0#1", "J:a9#1",
                "J:a0#1234567890123456", "J:a0#1:hol", ":a0#1", "J", ""):
        d = evolve(g, st, Completed(cid), NOW)
        assert not d.applied, cid
        assert d.state is st
    assert evolve(g, st, Completed("J:a0#1"), NOW).applied


def test_a_failed_call_leaves_the_next_one_unharmed():
    """A refused state document in the middle of work changes nothing for later calls."""
    g = compile_recipe(linear(3), V110)
    st = evolve(g, None, Start("J", "s1"), NOW).state
    for bad in (st[:-1], st[:20], b"SFS" + bytes(40), st + b"\x00"):
        try:
            evolve(g, bad, Tick(), NOW)
        except StateFormatError:
            pass
        else:
            raise AssertionError(bad)
    d = evolve(g, st, Completed("J:a0#1"), NOW + 1)
    assert [c.command_id for c in d.commands] == ["J:a1#2"]
    assert d.next_deadline == NOW + 1 + 10_000


def test_decisions_and_commands_pickle_and_copy_with_every_field():
    """A Decision and its Commands survive pickle and copy (their fields are views)."""
    g = compile_recipe(linear(2), V110)
    d = evolve(g, None, Start("J", "s1", {"lot": 7}), NOW)
    for clone in (pickle.loads(pickle.dumps(d)), copy.copy(d)):
        assert (clone.applied, clone.state, clone.status, clone.reason, clone.work,
                clone.job, clone.next_deadline, clone.waits_added, clone.waits_removed) == (
            d.applied, d.state, d.status, d.reason, d.work, d.job, d.next_deadline,
            d.waits_added, d.waits_removed)
        assert [c.to_dict() for c in clone.commands] == [c.to_dict() for c in d.commands]
    c = d.commands[0]
    assert pickle.loads(pickle.dumps(c)).to_dict() == c.to_dict() == copy.copy(c).to_dict()
    done = evolve(g, evolve(g, d.state, Completed("J:a0#1"), NOW).state,
                  Completed("J:a1#2"), NOW)
    assert done.status == "completed"
    assert pickle.loads(pickle.dumps(done)).work == done.work == [("job", "Complete", "")]


def test_a_large_result_goes_through_and_later_calls_stay_small():
    """A result of 200 KB is kept whole; other jobs' documents stay as small as without it."""
    g = compile_recipe(linear(3), V110)
    st = evolve(g, None, Start("J", "s1"), NOW).state
    small = len(st)
    big = {"blob": "x" * 200_000, "n": 1}
    st = evolve(g, st, Completed("J:a0#1", big), NOW).state
    assert state_to_json(g, st)["actions"]["a0"]["result"] == big
    other = evolve(g, None, Start("K", "s1"), NOW).state
    assert len(other) == small
    d = evolve(g, st, Completed("J:a1#2"), NOW)
    assert state_to_json(g, d.state)["actions"]["a0"]["result"] == big
