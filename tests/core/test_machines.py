"""The table-driven machines: seed diagrams, every transition permitted and refused."""

from __future__ import annotations

import hashlib
import pickle
import re
from array import array
from pathlib import Path

import pytest

from sfc_fast.machines import (
    ENGINE,
    JOB_ORDER,
    MISSION,
    TASK,
    InvalidTransition,
    Machine,
)

# A verbatim copy of the team's ScriptEngine document (the "seed" of these tests' names):
# its three Mermaid diagrams are the machines' rule. The checksum pins the copy to the
# document as written, so the machines are checked against it, not against an edit.
SEED = Path(__file__).resolve().parents[1] / "data" / "scriptengine_state_machines.txt"
SEED_SHA256 = "5881df549846743b408d1936a02c9aa7dc225ae7d3aaea7c6bdc1e44073bc157"

_ARROW = re.compile(r"^(\[\*\]|[A-Za-z_][\w]*)\s*-->\s*(\[\*\]|[A-Za-z_][\w]*)\s*(?::\s*(.*))?$")


class Diagram:
    """What a stateDiagram-v2 says: initial states, final states, transitions."""

    def __init__(self) -> None:
        self.initial: set[str] = set()
        self.final: set[str] = set()
        self.transitions: set[tuple[str, str, str]] = set()
        self.count = 0  # transition lines, to catch duplicates


def parse_state_diagram(text: str) -> Diagram:
    """Parse the arrows of a Mermaid stateDiagram-v2; notes, blocks and labels skipped.

    Composite blocks (``state X {``) are flattened; an ``[*] -->`` inside a block is
    the block's initial sub-state, not the machine's, so it is skipped.
    """
    d = Diagram()
    depth = 0
    in_note = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line == "|" or line == "stateDiagram-v2":
            continue
        if in_note:
            in_note = line != "end note"
            continue
        if line.startswith("note "):
            in_note = True
            continue
        if line.startswith("state ") and line.endswith("{"):
            depth += 1
            continue
        if line == "}":
            depth -= 1
            continue
        m = _ARROW.match(line)
        if m is None:
            assert re.match(r"^\w+ : ", line), f"unparsed diagram line: {line!r}"
            continue
        src, dst, label = m.group(1), m.group(2), m.group(3)
        if src == "[*]":
            if depth == 0:
                d.initial.add(dst)
            continue
        if dst == "[*]":
            d.final.add(src)
            continue
        assert label, f"a transition without a trigger: {line!r}"
        trigger = label.split("<br/>")[0].strip()
        d.transitions.add((src, trigger, dst))
        d.count += 1
    assert depth == 0 and not in_note
    return d


def seed_diagrams() -> dict[str, Diagram]:
    """The state diagrams of the seed, in document order: Task, Mission, Engine."""
    text = SEED.read_text(encoding="utf-8")
    blocks = re.findall(r"```mermaid\n(.*?)```", text, flags=re.S)
    states = [b for b in blocks if "stateDiagram-v2" in b]
    assert len(states) == 3, "the seed has three state diagrams"
    return dict(zip(("Task", "Mission", "Engine"), map(parse_state_diagram, states),
                    strict=True))


SEEDED = {"Task": TASK, "Mission": MISSION, "Engine": ENGINE}

# OPC UA ISA95JOBCONTROL v2, ISA95JobOrderStateMachineType: what docs/engine.md says.
JOB_ORDER_TOP = {
    ("InitialState", "Store", "NotAllowedToStart"),
    ("InitialState", "StoreAndStart", "AllowedToStart"),
    ("NotAllowedToStart", "Update", "NotAllowedToStart"),
    ("NotAllowedToStart", "Start", "AllowedToStart"),
    ("NotAllowedToStart", "Abort", "Aborted"),
    ("NotAllowedToStart", "Cancel", "EndState"),
    ("AllowedToStart", "Update", "AllowedToStart"),
    ("AllowedToStart", "RevokeStart", "NotAllowedToStart"),
    ("AllowedToStart", "Run", "Running"),
    ("AllowedToStart", "Abort", "Aborted"),
    ("AllowedToStart", "Cancel", "EndState"),
    ("Running", "Pause", "Interrupted"),
    ("Running", "Stop", "Ended"),
    ("Running", "Abort", "Aborted"),
    ("Interrupted", "Resume", "Running"),
    ("Interrupted", "Stop", "Ended"),
    ("Interrupted", "Abort", "Aborted"),
    ("Ended", "Clear", "EndState"),
    ("Aborted", "Clear", "EndState"),
}
JOB_ORDER_SUB = {
    (f"{p}_{a}", f"From{a}To{b}", f"{p}_{b}")
    for p in ("NotAllowedToStart", "AllowedToStart")
    for a, b in (("Waiting", "Ready"), ("Ready", "Waiting"), ("Ready", "Loaded"),
                 ("Loaded", "Ready"), ("Loaded", "Waiting"))
} | {
    ("Interrupted_Held", "FromHeldToSuspended", "Interrupted_Suspended"),
    ("Interrupted_Suspended", "FromSuspendedToHeld", "Interrupted_Held"),
    ("Ended_Completed", "FromCompletedToClosed", "Ended_Closed"),
}
JOB_ORDER_NUMBERS = {
    "InitialState": ((("InitialState", 0),)),
    "NotAllowedToStart_Waiting": (("NotAllowedToStart", 1), ("Waiting", 1)),
    "NotAllowedToStart_Ready": (("NotAllowedToStart", 1), ("Ready", 2)),
    "NotAllowedToStart_Loaded": (("NotAllowedToStart", 1), ("Loaded", 3)),
    "AllowedToStart_Waiting": (("AllowedToStart", 2), ("Waiting", 1)),
    "AllowedToStart_Ready": (("AllowedToStart", 2), ("Ready", 2)),
    "AllowedToStart_Loaded": (("AllowedToStart", 2), ("Loaded", 3)),
    "Running": (("Running", 3),),
    "Interrupted_Held": (("Interrupted", 4), ("Held", 1)),
    "Interrupted_Suspended": (("Interrupted", 4), ("Suspended", 2)),
    "Ended_Completed": (("Ended", 5), ("Completed", 1)),
    "Ended_Closed": (("Ended", 5), ("Closed", 2)),
    "Aborted": (("Aborted", 6),),
    "EndState": (("EndState", 7),),
}


# ---- the seed's diagrams --------------------------------------------------------------


def test_the_seed_copy_is_the_document_as_written() -> None:
    assert hashlib.sha256(SEED.read_bytes()).hexdigest() == SEED_SHA256


@pytest.mark.parametrize("name", list(SEEDED))
def test_machine_has_exactly_the_seed_transitions(name: str) -> None:
    seed = seed_diagrams()[name]
    m = SEEDED[name]
    assert seed.transitions, "the seed diagram parsed to nothing"
    assert set(m.transitions()) == seed.transitions
    assert len(m.transitions()) == seed.count  # no transition declared twice
    assert {m.initial_name} == seed.initial
    assert set(m.final_states()) == seed.final
    # every state the seed names exists, and no other
    named = {s for t in seed.transitions for s in (t[0], t[2])} | seed.initial
    assert set(m.states) == named


@pytest.mark.parametrize("name", list(SEEDED))
def test_printed_diagram_has_exactly_the_seed_transitions(name: str) -> None:
    seed = seed_diagrams()[name]
    printed = parse_state_diagram(SEEDED[name].to_mermaid())
    assert printed.transitions == seed.transitions
    assert printed.count == seed.count
    assert printed.initial == seed.initial
    assert printed.final == seed.final


def test_engine_diagram_keeps_the_stopping_guard() -> None:
    assert ("Stopping --> Ready: StoppingCompleted<br/>(All Tasks Stopped<br/>"
            "AND All Missions not Running)") in ENGINE.to_mermaid()


# ---- every transition of every machine, permitted and refused ------------------------


def _expected_flat(m: Machine) -> dict[tuple[str, str], str]:
    return {(s, t): d for s, t, d in m.transitions()}


@pytest.mark.parametrize("m", [TASK, MISSION, ENGINE], ids=lambda m: m.name)
def test_every_pair_of_state_and_trigger(m: Machine) -> None:
    table = {(s, t): d for s, t, d in seed_diagrams()[m.name].transitions}
    permitted_count = refused_count = 0
    for state in m.states:
        for trigger in m.triggers:
            want = table.get((state, trigger))
            sid, tid = m.state_id(state), m.trigger_id(trigger)
            if want is None:
                with pytest.raises(InvalidTransition) as e:
                    m.fire(state, trigger)
                assert e.value.state == state and e.value.trigger == trigger
                assert state in str(e.value) and trigger in str(e.value)
                with pytest.raises(InvalidTransition):
                    m.fire(sid, tid)
                assert not m.can_fire(state, trigger)
                refused_count += 1
            else:
                assert m.fire(state, trigger) == want
                assert m.fire(sid, tid) == m.state_id(want)
                assert m.can_fire(sid, trigger)
                permitted_count += 1
        assert set(m.permitted(state)) == {t for (s, t) in table if s == state}
    assert permitted_count == len(table)
    assert refused_count == len(m.states) * len(m.triggers) - len(table)


def _reference_job_order(state: str, trigger: str) -> str | None:
    """The hierarchical rules of docs/engine.md, written out independently."""
    sub = {(s, t): d for s, t, d in JOB_ORDER_SUB}
    top = {(s, t): d for s, t, d in JOB_ORDER_TOP}
    initial_sub = {"NotAllowedToStart": "Ready", "AllowedToStart": "Ready",
                   "Interrupted": "Suspended", "Ended": "Completed"}
    children = {"NotAllowedToStart": ("Waiting", "Ready", "Loaded"),
                "AllowedToStart": ("Waiting", "Ready", "Loaded"),
                "Interrupted": ("Held", "Suspended"), "Ended": ("Completed", "Closed")}
    if state in initial_sub:  # a composite stands for its initial sub-state
        state = f"{state}_{initial_sub[state]}"
    parent, _, local = state.partition("_")
    target = sub.get((state, trigger)) or top.get((parent, trigger))
    if target is None:
        return None
    if target in children:
        keep = local if local in children[target] else initial_sub[target]
        target = f"{target}_{keep}"
    return target


def test_job_order_declares_the_opc_ua_table() -> None:
    assert set(JOB_ORDER.transitions()) == JOB_ORDER_TOP | JOB_ORDER_SUB
    assert len(JOB_ORDER.transitions()) == len(JOB_ORDER_TOP | JOB_ORDER_SUB)
    printed = parse_state_diagram(JOB_ORDER.to_mermaid())
    assert printed.transitions == JOB_ORDER_TOP | JOB_ORDER_SUB
    assert printed.initial == {"InitialState"}
    assert printed.final == {"EndState"}
    assert set(JOB_ORDER.triggers) >= {
        "Store", "StoreAndStart", "Start", "RevokeStart", "Update", "Run", "Pause",
        "Resume", "Stop", "Abort", "Cancel", "Clear"}


def test_job_order_every_pair_of_state_and_trigger() -> None:
    permitted = 0
    for state in JOB_ORDER.states:
        for trigger in JOB_ORDER.triggers:
            want = _reference_job_order(state, trigger)
            if want is None:
                with pytest.raises(InvalidTransition, match=f"{trigger} is not permitted"):
                    JOB_ORDER.fire(state, trigger)
            else:
                assert JOB_ORDER.fire(state, trigger) == want, (state, trigger)
                assert JOB_ORDER.is_leaf(want)
                permitted += 1
    assert permitted > 60


def test_job_order_state_numbers() -> None:
    leaves = [s for s in JOB_ORDER.states if JOB_ORDER.is_leaf(s)]
    assert set(leaves) == set(JOB_ORDER_NUMBERS)
    for state, path in JOB_ORDER_NUMBERS.items():
        assert JOB_ORDER.path(state) == path
    for top, n in (("NotAllowedToStart", 1), ("AllowedToStart", 2), ("Interrupted", 4),
                   ("Ended", 5)):
        assert JOB_ORDER.number_of(top) == n
        assert not JOB_ORDER.is_leaf(top)
    for leaf in leaves:
        top, _, sub = leaf.partition("_")
        assert JOB_ORDER.parent_of(leaf) == (top if sub else None)


def test_job_order_life_cycles() -> None:
    s = JOB_ORDER.initial_name
    assert s == "InitialState"
    for trigger, want in [("Store", "NotAllowedToStart_Ready"),
                          ("Update", "NotAllowedToStart_Ready"),
                          ("Start", "AllowedToStart_Ready"),
                          ("Run", "Running"),
                          ("Pause", "Interrupted_Suspended"),
                          ("Resume", "Running"),
                          ("Stop", "Ended_Completed"),
                          ("FromCompletedToClosed", "Ended_Closed"),
                          ("Clear", "EndState")]:
        s = JOB_ORDER.fire(s, trigger)
        assert s == want
    assert JOB_ORDER.is_final(s) and JOB_ORDER.permitted(s) == ()
    with pytest.raises(InvalidTransition, match="none, it is final"):
        JOB_ORDER.fire(s, "Clear")
    # readiness carries over Start / RevokeStart / Update; a held order can be stopped
    s = JOB_ORDER.fire("NotAllowedToStart_Waiting", "Start")
    assert s == "AllowedToStart_Waiting"
    assert JOB_ORDER.fire("AllowedToStart_Loaded", "RevokeStart") == "NotAllowedToStart_Loaded"
    assert JOB_ORDER.fire("AllowedToStart_Loaded", "Update") == "AllowedToStart_Loaded"
    assert JOB_ORDER.fire("Interrupted_Held", "Stop") == "Ended_Completed"
    assert JOB_ORDER.fire("Interrupted_Held", "Abort") == "Aborted"
    assert JOB_ORDER.is_in("Interrupted_Held", "Interrupted")
    assert not JOB_ORDER.is_in("Running", "Interrupted")
    # a composite name stands for its initial sub-state
    assert JOB_ORDER.fire("AllowedToStart", "Run") == "Running"
    assert JOB_ORDER.permitted("Interrupted") == JOB_ORDER.permitted("Interrupted_Suspended")
    # refused: the error names machine, state, trigger and what is permitted
    with pytest.raises(InvalidTransition) as e:
        JOB_ORDER.fire("Running", "Start")
    assert str(e.value) == ("JobOrder: Start is not permitted in state Running "
                            "(permitted: Abort, Pause, Stop)")
    assert e.value.permitted == ("Abort", "Pause", "Stop")
    assert pickle.loads(pickle.dumps(e.value)).permitted == e.value.permitted


# ---- the int edge ---------------------------------------------------------------------


def test_int_ids_round_trip_and_match_names() -> None:
    for m in (JOB_ORDER, TASK, MISSION, ENGINE):
        assert m.n_states == len(m.states) and m.n_triggers == len(m.triggers)
        for i, name in enumerate(m.states):
            assert m.state_id(name) == i and m.state_name(i) == name
        for i, name in enumerate(m.triggers):
            assert m.trigger_id(name) == i and m.trigger_name(i) == name
        assert isinstance(m.fire(m.initial, m.permitted(m.initial)[0]), int)


def test_fire_all_runs_a_cycle_in_c() -> None:
    cycle = ["Store", "Start", "Run", "Pause", "Resume", "Stop", "Clear"]
    ids = array("i", [JOB_ORDER.trigger_id(t) for t in cycle])
    end = JOB_ORDER.fire_all(JOB_ORDER.initial, ids)
    assert JOB_ORDER.state_name(end) == "EndState"
    assert JOB_ORDER.fire_all(JOB_ORDER.initial, array("i")) == JOB_ORDER.initial
    bad = array("i", [JOB_ORDER.trigger_id(t) for t in ("Store", "Run")])
    with pytest.raises(InvalidTransition) as e:
        JOB_ORDER.fire_all(JOB_ORDER.initial, bad)
    assert e.value.index == 1 and e.value.state == "NotAllowedToStart_Ready"


@pytest.mark.parametrize("state, trigger, exc", [
    ("Nowhere", "Start", ValueError),
    ("Idle", "Explode", ValueError),
    (999, 0, ValueError),
    (0, 999, ValueError),
    (-1, 0, ValueError),
    (True, 0, TypeError),
    (1.5, "Start", TypeError),
    (None, "Start", TypeError),
])
def test_bad_names_and_ids_are_refused_clearly(state, trigger, exc) -> None:
    with pytest.raises(exc) as e:
        TASK.fire(state, trigger)
    assert not isinstance(e.value, InvalidTransition)
    assert "Task" in str(e.value)


def test_invalid_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        Machine("M", ["A", "B"], [("A", "go", "B"), ("A", "go", "A")], initial="A")
    with pytest.raises(ValueError, match="unknown state 'C'"):
        Machine("M", ["A", "B"], [("A", "go", "C")], initial="A")
    with pytest.raises(ValueError, match="final state B has a transition"):
        Machine("M", ["A", "B"], [("A", "go", "B"), ("B", "back", "A")], initial="A",
                final=["B"])
    with pytest.raises(ValueError, match="state A declared twice"):
        Machine("M", ["A", "A"], [], initial="A")
    with pytest.raises(ValueError, match="initial sub-state 'Z'"):
        Machine("M", [{"name": "A", "children": ["x"], "initial": "Z"}], [], initial="A")
    with pytest.raises(ValueError, match="unknown state keys"):
        Machine("M", [{"name": "A", "colour": "red"}], [], initial="A")
    with pytest.raises(ValueError, match="at least one state"):
        Machine("M", [], [], initial="A")


def test_nearest_declaration_wins_and_a_composite_is_its_initial_sub_state() -> None:
    m = Machine("M",
                [{"name": "On", "children": ["Slow", "Fast"]}, "Off"],
                [("On", "toggle", "Off"), ("On_Fast", "toggle", "On_Slow"),
                 ("Off", "toggle", "On"), ("On_Slow", "up", "On_Fast")],
                initial="Off")
    assert m.fire("Off", "toggle") == "On_Slow"
    assert m.fire("On_Slow", "toggle") == "Off"
    assert m.fire("On_Fast", "toggle") == "On_Slow"   # the sub-state's own wins
    assert m.fire("On", "up") == "On_Fast"
    assert m.initial_name == "Off"
    assert "state On {" in m.to_mermaid()
