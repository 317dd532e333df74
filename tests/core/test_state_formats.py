"""State format 2: documents of format 1 are still read (and written anew as format 2),
the archive of settled records is split off and joined back, and evolve's cost follows
the live part."""

from __future__ import annotations

import base64
import importlib.util
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.recipes import V110, linear, pull, push

from sfc_fast import (
    Graph,
    StateFormatError,
    action_results,
    compile_recipe,
    events,
    evolve,
    evolve_live,
    job_index,
    join_state,
    state_to_json,
)
from sfc_fast.events import Completed, Start, Tick
from sfc_fast.state import check_state

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DATA = json.loads((DATA_DIR / "states_v1.json").read_text())
GRAPHS = {k: Graph.from_bytes(base64.b64decode(v)) for k, v in DATA["graphs"].items()}
CASES = DATA["cases"]


def _event(desc: list[Any]) -> Any:
    kind, *args = desc
    if kind == "Event":
        return events.Event(args[0], data=args[1])
    return getattr(events, kind)(*args)


def _same_view(got: dict[str, Any], want: dict[str, Any]) -> None:
    got = dict(got)
    want = dict(want)
    assert got.pop("format") == "2.0" and want.pop("format") == "1.0"
    got.pop("archived_missing", None)
    assert got == want


def test_the_fixtures_are_format_1_and_cover_the_recipes():
    assert DATA["format"] == "1.0" and len(CASES) > 100
    assert {c["recipe"] for c in CASES} == set(GRAPHS)
    for c in CASES:
        assert base64.b64decode(c["state"])[3] == 1


@pytest.mark.parametrize("fn", [evolve, evolve_live])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_a_format_1_state_is_read_and_the_next_write_is_format_2(i: int, fn: Any):
    c = CASES[i]
    g = GRAPHS[c["recipe"]]
    old = base64.b64decode(c["state"])
    check_state(g, old)
    assert state_to_json(g, old) == c["view"]
    d = fn(g, old, _event(c["event"]), c["now"])
    assert d.applied == c["applied"]
    assert (d.status, d.reason, d.next_deadline) == (c["status"], c["reason"],
                                                      c["next_deadline"])
    assert [list(w) for w in d.work] == c["work"]
    assert [x.to_dict() for x in d.commands] == c["commands"]
    assert [list(d.waits_added), list(d.waits_removed)] == c["waits"]
    if not d.applied:
        assert d.state is old and d.archived == b""
        return
    assert d.state[3] == 2
    whole = join_state(d.state, d.archived)
    if fn is evolve:
        assert d.archived == b""
    _same_view(state_to_json(g, whole), c["after"])


def _run(graph: Graph, steps: int, split: bool) -> tuple[bytes, bytes, list[Any]]:
    fn = evolve_live if split else evolve
    d = fn(graph, None, Start("J", "s", {"p": 1}), 1_000)
    archive = d.archived
    decisions = [d]
    for k in range(steps):
        d = fn(graph, d.state, Completed(d.commands[0].command_id, {"ok": True, "k": k}),
               2_000 + k)
        archive += d.archived
        decisions.append(d)
    return d.state, archive, decisions


def test_live_part_and_archive_join_to_the_whole_document():
    g = compile_recipe(linear(12), V110)
    whole, none, d1 = _run(g, 7, split=False)
    live, archive, d2 = _run(g, 7, split=True)
    assert none == b""                              # one document archives nothing
    assert len(live) < 120 < len(whole)            # 7 settled steps are not in the live part
    assert state_to_json(g, live)["archived_missing"] == 14     # 7 actions, 7 step rounds
    joined = join_state(live, archive)
    view = state_to_json(g, joined)
    assert "archived_missing" not in view
    assert view == state_to_json(g, whole)
    # a joined document evolves on as one document: its tail is copied along
    d = evolve(g, joined, Completed(d2[-1].commands[0].command_id), 9_000)
    assert d.state.endswith(archive) and d.archived == b""
    assert view["actions"]["a0"]["result"] == {"ok": True, "k": 0}
    assert view["step_rounds"] == {f"S{i}": 1 for i in range(8)}
    assert [(a.work, a.next_deadline) for a in d1] == [(b.work, b.next_deadline) for b in d2]
    assert job_index(g, live) == job_index(g, whole)


def test_a_loop_keeps_its_steps_live_and_reads_its_rounds():
    """Steps on a cycle are entered again: their rounds and records stay live, so a
    condition on ``_round`` counts right with the archive kept apart."""
    r = {"Steps": [{"Name": "A", "Initial": True}, {"Name": "B"}, {"Name": "C"}],
         "Actions": [push("a", "A"), push("b", "B"), push("c", "C")],
         "Transitions": [{"Source": "A", "Target": "B", "Condition": "always"},
                         {"Source": "B", "Target": "A", "Condition": "b._round < 3",
                          "Priority": 1},
                         {"Source": "B", "Target": "C", "Condition": "always", "Priority": 2}]}
    g = compile_recipe(r, V110)
    live, archive, ds = _run(g, 6, split=True)
    assert [c.action for c in ds[-1].commands] == ["c"]
    assert archive == b""                           # A and B loop: nothing archived yet
    d = evolve_live(g, live, Completed(ds[-1].commands[0].command_id), 9_000)
    assert d.status == "completed"
    view = state_to_json(g, join_state(d.state, archive + d.archived))
    assert view["step_rounds"] == {"A": 3, "B": 3, "C": 1}


def test_a_condition_on_an_earlier_step_reads_a_live_record():
    """An action read by a condition of another step's transition is never archived."""
    r = {"Steps": [{"Name": f"S{i}", "Initial": i == 0} for i in range(4)],
         "Actions": [push(f"a{i}", f"S{i}") for i in range(4)],
         "Transitions": [{"Source": "S0", "Target": "S1", "Condition": "always"},
                         {"Source": "S1", "Target": "S2", "Condition": "always"},
                         {"Source": "S2", "Target": "S3", "Condition": "a0.ok == true"}]}
    g = compile_recipe(r, V110)
    live, _, ds = _run(g, 3, split=True)
    assert [c.action for c in ds[-1].commands] == ["a3"]
    assert state_to_json(g, live)["actions"]["a0"]["result"] == {"ok": True, "k": 0}
    assert "a1" not in state_to_json(g, live)["actions"]


def test_archive_garbage_is_refused_by_every_reader():
    g = compile_recipe(linear(6), V110)
    whole, _, _ = _run(g, 3, split=False)
    for bad in (whole[:-1], whole + b"\x00", whole + b"\x02\x03"):
        with pytest.raises(StateFormatError):
            check_state(g, bad)
        with pytest.raises(StateFormatError):
            evolve(g, bad, Tick(), 10**6)
    with pytest.raises(StateFormatError):
        join_state(base64.b64decode(CASES[0]["state"]), b"\x00")


def test_evolve_live_cost_is_flat_in_recipe_size():
    """One completion in the middle of a chain: 10,000 steps cost about as much as 10
    (loose bound: this is a smoke test; benchmarks/report_cost.py gives the figures)."""
    def per_call(n: int) -> float:
        g = compile_recipe(linear(n), V110)
        live, _, ds = _run(g, n // 2, split=True)
        ev = Completed(ds[-1].commands[0].command_id, {"ok": True})
        best = 1.0
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                evolve_live(g, live, ev, 10**6)
            best = min(best, (time.perf_counter() - t0) / 2000)
        return best

    small, big = per_call(10), per_call(10_000)
    assert big < 3 * small, (small, big)


def _maker() -> Any:
    """tests/data/make_states_v1.py as a module: its recipes and random events."""
    spec = importlib.util.spec_from_file_location("make_states_v1", DATA_DIR / "make_states_v1.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MAKER = _maker()
RECIPES = {name: (recipe, schema) for name, recipe, schema in MAKER.recipes()}
# bare names on a step's and on a branch's exit, a reference to another step's action,
# an S reset by an R of a later step
RECIPES["bare_names"] = ({
    "Steps": [{"Name": n, "Initial": n == "A"} for n in ("A", "P1", "P2", "D", "E")],
    "Actions": [push("s", "A", "S"), push("a", "A"), push("p1", "P1"), pull("p2", "P2"),
                push("d", "D"), push("s", "D", "R"), push("e", "E")],
    "Branches": [{"Name": "B", "Type": "simultaneous", "Branches": [["P1"], ["P2"]]}],
    "Transitions": [{"Source": "A", "Target": "B", "Condition": "ok != false"},
                    {"Source": "B", "Target": "D", "Condition": "torque != 1"},
                    {"Source": "D", "Target": "E",
                     "Condition": "s._outcome != 'failed' and a.n != 5"}]}, V110)


def _decided(d: Any) -> tuple[Any, ...]:
    return (d.applied, d.status, d.reason, d.work, [c.to_dict() for c in d.commands],
            d.next_deadline, d.waits_added, d.waits_removed)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_evolve_live_decides_as_the_whole_document(name: str):
    """The archive is never read: evolving the live part alone decides exactly as
    evolving the whole document, over random runs of loops, branches, stored and
    delayed actions, pull waits, holds, failures and shifts; and the live part with its
    archive is the same state."""
    recipe, schema = RECIPES[name]
    g = compile_recipe(recipe, schema)
    types = {a["Name"]: a.get("TypeId", "") for a in recipe["Actions"]}
    archived = 0
    for seed in range(40):
        rng = random.Random(f"live/{name}/{seed}")
        now = 1_000_000
        start = Start("J-1", "scope-a", {"mode": "run"}, "order-1")
        d1, d2 = evolve(g, None, start, now), evolve_live(g, None, start, now)
        whole, live, archive = d1.state, d2.state, d2.archived
        for _ in range(100):
            now += rng.choice([10, 500, 3_000, 20_000])
            ev = MAKER.next_event(rng, g, whole, types)
            d1, d2 = evolve(g, whole, ev, now), evolve_live(g, live, ev, now)
            assert _decided(d1) == _decided(d2), (seed, ev)
            if d1.applied:
                whole, live, archive = d1.state, d2.state, archive + d2.archived
                archived += len(d2.archived) > 0
            assert state_to_json(g, join_state(live, archive)) == state_to_json(g, whole)
            if d1.status not in ("running", "held"):
                break
    # the runs did archive records (all steps of loop_with_stored are on its cycle)
    assert (archived == 0) == (name == "loop_with_stored")


def _view_results(view: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(name, a["result"]) for name, a in view["actions"].items()
            if a["result"] is not None]


@pytest.mark.parametrize("i", range(0, len(CASES), 7))
def test_action_results_are_the_readable_view_s_results(i: int):
    """``action_results`` (a job response's source) lists what the readable view does:
    the job, its start and every stored result, in action order, archive included."""
    c = CASES[i]
    g = GRAPHS[c["recipe"]]
    old = base64.b64decode(c["state"])
    d = evolve_live(g, old, _event(c["event"]), c["now"])
    for doc in (old, join_state(d.state, d.archived) if d.applied else old):
        view = state_to_json(g, doc)
        job, started, results = action_results(g, doc)
        assert (job, started) == (view["job"], view["started_ms"])
        assert [(n, json.loads(r)) for n, r in results] == _view_results(view)


def test_a_job_response_lists_every_result_of_live_and_archived_actions():
    from sfc_host.execution.settle import job_response
    g = compile_recipe(linear(12), V110)
    live, archive, _ = _run(g, 12, split=True)
    whole = join_state(live, archive)
    assert len(_view_results(state_to_json(g, live))) < 12    # most are archived
    got = json.loads(job_response(g, whole, 90_000))
    assert got["JobOrderID"] == "J" and got["JobResponseID"] == "J-response"
    # every field of every result, in action order and each result's stored order
    assert got["JobResponseData"] == [{"ID": f"a{k}.{f}", "Value": v} for k in range(12)
                                      for f, v in (("k", k), ("ok", True))]
    assert got["JobResponseData"] == [{"ID": f"{n}.{f}", "Value": v}
                                      for n, r in _view_results(state_to_json(g, whole))
                                      for f, v in r.items()]
    assert got["StartTime"] == "1970-01-01T00:00:01.000Z"
    assert got["EndTime"] == "1970-01-01T00:01:30.000Z"
    aborted = json.loads(job_response(g, whole, 90_000, "aborted", "jammed"))
    assert aborted["Description"] == {"Locale": "en", "Text": "jammed"}
