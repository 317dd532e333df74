"""The plain-Python baseline (benchmarks/py_evolve.py) agrees with the compiled core.

The ratio in benchmarks/evolve_ratio.py is only honest if both run the same rules: every
event here goes through ``sfc_fast.evolve`` and ``py_evolve`` and each step is compared
(applied or absorbed, status, reason, work entries, dispatched commands with their ids,
types, flags and deadlines, next deadline). Scripted runs of the reference recipes
first, then seeded random event sequences over recipes that use every rule.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers.paths import benchmarks_on_path
from helpers.recipes import V100, V110, generated, linear, load_reference, pull, push

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
from sfc_fast.evolve import Decision, evolve
from sfc_fast.state import state_to_json

benchmarks_on_path()
from py_evolve import load_recipe, py_evolve, status_of  # noqa: E402

TERMINAL = ("completed", "aborted", "stopped")


def _cmd(c: Any) -> tuple:
    if isinstance(c, dict):
        return (c["command_id"], c["action"], c["type_id"], c["parameters"], c["deadline_ms"],
                c["hold"], c["restart"], c["job"], c["scope"], c["attempt"])
    return (c.command_id, c.action, c.type_id, c.parameters, c.deadline_ms, c.hold,
            c.restart, c.job, c.scope, c.attempt)


class Both:
    """One job run through the compiled core and the Python baseline side by side."""

    def __init__(self, doc: dict[str, Any], job: str = "J", scope: str = "s1",
                 params: dict[str, Any] | None = None, now: int = 1_000,
                 schema: str | None = None) -> None:
        data = doc.get("data", doc)
        self.graph = compile_recipe(data, schema or doc["dataschema"])
        self.model = load_recipe(data)
        self.now = now
        self.c_state: bytes | None = None
        self.p_state: bytes | None = None
        self.steps = 0
        self.last = self.apply(Start(job, scope, params))

    def apply(self, event: Any, at: int | None = None) -> Decision:
        if at is not None:
            self.now = at
        self.steps += 1
        where = f"step {self.steps}: {event!r} at {self.now}"
        d = evolve(self.graph, self.c_state, event, self.now)
        applied, p_state, work, commands, next_deadline = py_evolve(
            self.model, self.p_state, event, self.now)
        assert applied == d.applied, where
        if d.applied:
            self.c_state = d.state
            self.p_state = p_state
        else:
            assert p_state is self.p_state, where
        status, reason = status_of(self.p_state)
        assert status == d.status, where
        assert reason == d.reason, where
        assert [_cmd(c) for c in commands] == [_cmd(c) for c in d.commands], where
        assert work == d.work, where
        assert next_deadline == d.next_deadline, where
        self.last = d
        return d

    @property
    def status(self) -> str:
        return self.last.status

    def ids(self) -> list[str]:
        return [c.command_id for c in self.last.commands]


# ---------------------------------------------------------------- scripted runs


def test_tighten_rework_runs_to_completion_through_a_rework_loop():
    b = Both(load_reference("tighten_rework.json"))
    assert b.ids() == ["J:load_part#1"]
    b.apply(Completed("J:load_part#1"), at=2_000)
    assert b.ids() == ["J:tighten#2"]
    b.apply(Completed("J:tighten#2", {"torque": 70}), at=3_000)       # too low: rework
    assert b.ids() == ["J:loosen#3"]
    b.apply(Completed("J:loosen#3"), at=4_000)
    assert b.ids() == ["J:tighten#4"]
    assert not b.apply(Completed("J:tighten#2", {"torque": 85})).applied   # late
    b.apply(Tick(), at=34_000)                                      # retry (Retries 1)
    assert b.ids() == ["J:tighten#5"]
    b.apply(Completed("J:tighten#5", {"torque": 86}), at=35_000)
    assert b.ids() == ["J:unload_part#6"]
    d = b.apply(Completed("J:unload_part#6"), at=36_000)
    assert d.status == "completed" and d.next_deadline is None
    assert not b.apply(Completed("J:unload_part#6")).applied


def test_tighten_rework_aborts_when_the_loop_limit_is_reached():
    b = Both(load_reference("tighten_rework.json"))
    b.apply(Completed("J:load_part#1"))
    n = 2
    for _ in range(2):
        b.apply(Completed(f"J:tighten#{n}", {"torque": 10}))
        b.apply(Completed(f"J:loosen#{n + 1}"))
        n += 2
    d = b.apply(Completed(f"J:tighten#{n}", {"torque": 10}))
    assert d.status == "aborted" and "'Tighten'" in d.reason


def test_axle_fit_qa_runs_to_completion():
    b = Both(load_reference("axle_fit_qa.json"), params={"torque_ok": False})
    assert b.ids() == ["J:position_axle#1"]
    b.apply(Completed("J:position_axle#1"), at=2_000)
    assert not b.apply(Event("com.example.station.other.v1")).applied
    b.apply(Event("com.example.station.qa_result.v1", data={"pass": True}), at=3_000)
    b.apply(Completed("J:tighten#2", {"torque": 85}), at=4_000)
    d = b.apply(Event("com.example.station.torque_result.v1", data={"torque_ok": True}),
                at=5_000)
    assert d.status == "completed"


def test_axle_fit_qa_bare_name_falls_back_to_the_job_parameter():
    b = Both(load_reference("axle_fit_qa.json"), params={"torque_ok": False})
    b.apply(Completed("J:position_axle#1"))
    b.apply(Completed("J:tighten#2"))
    b.apply(Event("com.example.station.qa_result.v1"))
    d = b.apply(Event("com.example.station.torque_result.v1", data={"other": 1}))
    assert d.status == "aborted"


def test_hold_and_release_move_deadlines_and_reissue():
    b = Both(linear(3), schema=V100)
    b.apply(Hold(), at=2_000)
    assert b.status == "held" and b.last.next_deadline is None
    assert not b.apply(Tick(), at=50_000).applied
    assert not b.apply(Resume(), at=50_000).applied
    b.apply(Completed("J:a0#1", {"r": 1}), at=51_000)       # recorded while held
    d = b.apply(Release(), at=60_000)
    assert b.ids() == ["J:a1#2"] and d.status == "running"
    b.apply(Hold(), at=61_000)
    b.apply(Shift(5_000), at=70_000)           # an outage of 5 s inside the hold
    d = b.apply(Release(), at=80_000)
    assert b.ids() == ["J:a1#2"] and d.next_deadline == 70_000 + 5_000 + (80_000 - 61_000 - 5_000)
    b.apply(Failed("J:a1#2", "jammed"), at=81_000)
    assert b.status == "aborted" and "jammed" in b.last.reason


def test_equipment_hold_restart_and_match():
    b = Both(load_reference("paint_hold_restart.json"))
    b.apply(Completed("J:prime#1"), at=2_000)
    assert b.ids() == ["J:paint#2"]
    b.apply(Hold(), at=3_000)
    assert b.ids() == ["J:paint#2:hold"] and b.last.next_deadline == 13_000
    b.apply(Held("J:paint#2:hold"), at=4_000)
    b.apply(Release(), at=5_000)
    assert b.ids() == ["J:paint#3"] and b.last.commands[0].restart
    b.apply(Resume(), at=5_500)
    assert not b.apply(Event("com.example.booth.ready.v1", correlation_id="K")).applied
    b.apply(Event("com.example.booth.ready.v1", correlation_id="J"), at=6_000)
    b.apply(Completed("J:paint#3"), at=7_000)
    assert b.ids() == ["J:cure#4"]
    assert b.apply(Completed("J:cure#4"), at=8_000).status == "completed"


def test_hold_not_answered_then_not_held():
    b = Both(load_reference("paint_hold_restart.json"))
    b.apply(Completed("J:prime#1"), at=2_000)
    b.apply(Hold(), at=3_000)
    b.apply(Tick(), at=13_000)                 # the hold expires while held
    b.apply(Release(), at=14_000)
    assert b.ids() == ["J:paint#2"]
    b.apply(Hold(), at=15_000)
    b.apply(Release(), at=16_000)              # release before the answer
    b.apply(NotHeld("J:paint#2:hold"), at=17_000)
    assert b.ids() == ["J:paint#2"]


def test_timeout_aborts():
    b = Both(load_reference("tighten_rework.json"))
    assert not b.apply(Tick(), at=20_999).applied
    d = b.apply(Tick(), at=21_000)
    assert d.status == "aborted" and "timed out" in d.reason
    a = Both(load_reference("axle_fit_qa.json"))
    a.apply(Completed("J:position_axle#1"), at=2_000)
    assert not a.apply(Tick(), at=45_999).applied
    d = a.apply(Tick(), at=46_000)            # the camera QA wait (45 s) times out
    assert d.status == "aborted" and "qa_result" in d.reason


def test_unsent_command_and_cancel():
    b = Both(linear(2), schema=V100)
    b.apply(Tick(unsent=("J:a0#1",)), at=11_000)
    assert b.ids() == ["J:a0#1"]
    d = b.apply(Cancel("operator", stop=True), at=12_000)
    assert d.status == "stopped"
    assert not b.apply(Completed("J:a0#1")).applied


# ---------------------------------------------------------------- random sequences


def everything() -> dict[str, Any]:
    """Every qualifier, a selection branch with conditions, a loop, pulls with Match."""
    steps = [{"Name": n, "Initial": n == "A"} for n in ("A", "B", "X1", "X2", "Y1", "C", "D")]
    return {
        "Steps": steps,
        "Branches": [{"Name": "Sel", "Type": "selection", "Branches": [["X1", "X2"], ["Y1"]]}],
        "Transitions": [
            {"Source": "A", "Target": "B", "Condition": "always"},
            {"Source": "B", "Target": "Sel", "Condition": "not (l._outcome == 'failed')"},
            {"Source": "Sel", "Target": "X1",
             "Condition": "w.torque >= 80 or job.force == true"},
            {"Source": "Sel", "Target": "Y1", "Condition": "always", "Priority": 1},
            {"Source": "Sel", "Target": "C", "Condition": "always"},
            {"Source": "C", "Target": "A", "Condition": "w._round < 2 and c.again in [true]"},
            {"Source": "C", "Target": "D", "Condition": "true", "Priority": 1},
        ],
        "Actions": [
            push("w", "A", Retries=1, HoldTypeId="w.hold.v1", RestartTypeId="w.restart.v1",
                 HoldTimeoutSeconds=3, Parameters={"p": 1}),
            push("m", "A", "P"),
            pull("ev", "A", "S", Match={"Subject": "{scope}/{action}"}),
            push("z", "A", "P0"),
            push("l", "B", "L", timeout=10, DurationSeconds=3),
            push("d", "B", "D", DurationSeconds=2.5),
            push("lamp", "B", "S", HoldTypeId="lamp.hold.v1"),
            push("p1", "B", "P1"),
            push("x1", "X1"),
            pull("x2", "X2", Match={"CorrelationId": "{job}"}),
            push("y1", "Y1", Retries=2),
            push("lamp", "C", "R"),
            push("c", "C"),
            pull("fin", "D", timeout=30),
        ],
    }


RESULTS = [None, {"torque": 70}, {"torque": 85}, {"torque": 95.5}, {"ok": True},
           {"ok": False}, {"again": True}, {"torque_ok": True}, {"torque_ok": False},
           {"torque": 85, "again": False, "nested": {"v": [1, "a"]}}]


def _random_event(rng: random.Random, b: Both, pull_types: list[str], hostile: float) -> Any:
    """A random event; ``hostile`` (0..1) scales failures, cancels and deadline jumps."""
    view = state_to_json(b.graph, b.c_state)
    acts = view["actions"].values()
    open_ids = [a["command_id"] for a in acts if a["phase"] == "open" and a["command_id"]]
    hold_ids = [a["hold_command_id"] for a in acts if a.get("hold_command_id")]
    counter = view["commands_issued"]
    names = list(b.graph.actions)
    r = rng.random()
    if r < 0.02 * hostile:
        return Cancel(rng.choice(["", "operator"]), stop=rng.random() < 0.5)
    if r < 0.06 * hostile and open_ids:
        return Failed(rng.choice(open_ids), rng.choice(["", "jammed"]))
    r = rng.random()
    if r < 0.45 and open_ids:
        return Completed(rng.choice(open_ids), rng.choice(RESULTS))
    if r < 0.50:
        return Completed(f"J:{rng.choice(names)}#{rng.randint(1, counter + 1)}",
                         rng.choice(RESULTS))
    if r < 0.58 and (hold_ids or open_ids):
        cid = rng.choice(hold_ids or open_ids)
        return rng.choice([Held, NotHeld])(cid) if rng.random() < 0.8 else Completed(cid)
    if r < 0.72 and pull_types:
        return Event(rng.choice(pull_types), subject=rng.choice([None, "s1/ev", "s2/ev"]),
                     correlation_id=rng.choice([None, "J", "K"]), data=rng.choice(RESULTS))
    if r < 0.84:
        return Tick(unsent=tuple(rng.sample(open_ids, 1)) if open_ids and rng.random() < 0.2
                    else ())
    if r < 0.89:
        return Hold()
    if r < 0.95:
        return Release()
    if r < 0.97:
        return Resume()
    return Shift(rng.choice([0, 1, 2_000]))


def _cases() -> list[tuple[str, dict[str, Any], str, dict[str, Any] | None]]:
    out = []
    for name in ("tighten_rework.json", "axle_fit_qa.json", "paint_hold_restart.json"):
        doc = load_reference(name)
        out.append((name, doc["data"], doc["dataschema"], {"torque_ok": True}))
    out.append(("everything", everything(), V110, {"force": False}))
    out.append(("everything-forced", everything(), V110, {"force": True}))
    out.append(("generated", generated(12, branch_every=5), V100, {"mode": "run"}))
    return out


def run_random(data: dict[str, Any], schema: str, params: dict[str, Any] | None,
               seed: int, length: int = 120) -> Both:
    """One seeded random sequence through both implementations (checked at each step)."""
    pull_types = sorted({a["TypeId"] for a in data["Actions"]
                         if a["Interaction"] == "pull_event"})
    rng = random.Random(seed)
    hostile = rng.choice([0.0, 0.1, 0.5, 1.0])
    b = Both(data, schema=schema, params=params, now=1_000)
    for _ in range(length):
        if b.status in TERMINAL:
            break
        ev = _random_event(rng, b, pull_types, hostile)
        nd = b.last.next_deadline
        at = b.now + rng.choice([0, 1, 1, 700, 700, 2_600, 9_000])
        if isinstance(ev, Tick) and nd is not None and rng.random() < 0.2 + 0.6 * hostile:
            at = nd
        b.apply(ev, at=max(at, b.now))
    return b


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_random_event_sequences_agree(case):
    _, data, schema, params = case
    ends = {run_random(data, schema, params, seed).status for seed in range(60)}
    assert "completed" in ends   # the sequences do reach the end, not only wander
