"""One test per execution rule of docs/execution.md, the core's part of hold, equipment
hold and the outage rule included (their reasons: docs/design.md, sections 3 and 12-14).

Each docstring names the rule it shows.
"""

from __future__ import annotations

import pytest
from helpers.core import Job, dispatched
from helpers.recipes import V100, V110, linear, load_reference, pull, push

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
from sfc_fast.evolve import evolve, job_index, open_command
from sfc_fast.state import StateFormatError, state_to_json


def seq(*steps_actions, transitions=None, branches=None):
    steps = [{"Name": s, "Initial": i == 0} for i, (s, _) in enumerate(steps_actions)]
    acts = [a for _, al in steps_actions for a in al]
    if transitions is None:
        transitions = [{"Source": steps_actions[i][0], "Target": steps_actions[i + 1][0],
                        "Condition": "always"} for i in range(len(steps_actions) - 1)]
    r = {"Steps": steps, "Transitions": transitions, "Actions": acts}
    if branches:
        r["Branches"] = branches
    return r


# ---------------------------------------------------------------- sequence, start


def test_start_activates_the_initial_step_and_arms_its_actions():
    """Start: the initial step is active; its actions are armed; the job order runs."""
    j = Job(linear(3), V100)
    d = j.last
    assert d.applied and d.status == "running"
    assert d.job == ("Run",)
    assert ("job", "Run", "") in d.work
    assert dispatched(d) == ["J:a0#1"]
    assert ("dispatch:a0", "a0", "J:a0#1") in d.work
    assert j.active() == ["S0"]
    assert d.next_deadline == 1_000 + 10_000


def test_sequence_runs_to_completion():
    """Sequence: a done step fires its transition; no outgoing transition ends the recipe."""
    j = Job(linear(3), V100)
    for i in range(3):
        d = j.apply(Completed(f"J:a{i}#{i + 1}"), at=2_000 + i)
    assert d.status == "completed"
    assert d.job == ("Complete",)
    assert d.next_deadline is None


def test_command_ids_count_up_over_the_whole_run():
    """Command ids are {job}:{action}#{n}, n counting up over the whole run of the job."""
    j = Job(linear(3), V100, job="line:7")
    ids = dispatched(j.last)
    ids += dispatched(j.apply(Completed("line:7:a0#1")))
    ids += dispatched(j.apply(Completed("line:7:a1#2")))
    assert ids == ["line:7:a0#1", "line:7:a1#2", "line:7:a2#3"]


def test_repeated_start_is_absorbed():
    """A repeated start of a running job is absorbed: nothing to write."""
    j = Job(linear(2), V100)
    before = j.state
    d = j.apply(Start("J", "s1"))
    assert not d.applied and d.work == [] and j.state == before


def test_start_of_an_ended_job_replaces_it_unless_same_order():
    """An ended state of a re-stored job id is replaced; the same order is a repeat."""
    g = compile_recipe(linear(1), V100)
    d = evolve(g, None, Start("J", "s", order="o1"), 1)
    d = evolve(g, d.state, Completed("J:a0#1"), 2)
    assert d.status == "completed"
    again = evolve(g, d.state, Start("J", "s", order="o1"), 3)
    assert not again.applied
    fresh = evolve(g, d.state, Start("J", "s", order="o2"), 4)
    assert fresh.applied and fresh.status == "running"
    # the new run numbers its commands after the ended run's: no id is given out twice
    assert dispatched(fresh) == ["J:a0#2"]
    assert state_to_json(g, fresh.state)["started_ms"] == 4


def test_a_re_stored_job_id_never_gives_out_a_command_id_again():
    """The ended run's command ids are not the new run's: a late answer to the old run
    is absorbed, the new run's own answer settles it. Without the ended state (another
    recipe's), ``commands_before`` carries the count."""
    g = compile_recipe(linear(2), V100)
    d = evolve(g, None, Start("J", "s", order="o1"), 1)
    assert dispatched(d) == ["J:a0#1"]
    d = evolve(g, d.state, Tick(), 10_000_000)              # timed out: the job aborts
    assert d.status == "aborted"
    ended = state_to_json(g, d.state)["commands_issued"]
    new = evolve(g, d.state, Start("J", "s", order="o2"), 10_000_001)
    assert dispatched(new) == [f"J:a0#{ended + 1}"]
    late = evolve(g, new.state, Completed("J:a0#1"), 10_000_002)
    assert not late.applied                                  # the old run's answer
    own = evolve(g, new.state, Completed(f"J:a0#{ended + 1}"), 10_000_003)
    assert own.applied and dispatched(own) == [f"J:a1#{ended + 2}"]
    other = evolve(g, None, Start("J", "s", commands_before=7), 5)
    assert dispatched(other) == ["J:a0#8"]
    assert Start("J", "s", commands_before=7) != Start("J", "s")
    for bad in (-1, 1 << 40, 1.5, "3", None):
        with pytest.raises(ValueError):
            Start("J", "s", commands_before=bad)


def test_events_before_start_are_absorbed():
    """Without a state only Start applies; anything else is absorbed, never raised."""
    g = compile_recipe(linear(1), V100)
    d = evolve(g, None, Tick(), 5)
    assert not d.applied and d.state is None and d.status == "none"


# ---------------------------------------------------------------- answers


def test_completed_result_fields_are_kept_for_conditions():
    """A completed answer settles its action and keeps its result fields for conditions."""
    r = seq(("A", [push("m", "A")]), ("Good", []), ("Bad", []),
            transitions=[{"Source": "A", "Target": "Good", "Condition": "m.torque >= 80"},
                         {"Source": "A", "Target": "Bad", "Condition": "always",
                          "Priority": 5}])
    j = Job(r, V100)
    j.apply(Completed("J:m#1", {"torque": 85}))
    assert j.status == "completed"
    assert j.view()["step_rounds"] == {"A": 1, "Good": 1}
    assert j.view()["actions"]["m"]["result"] == {"torque": 85}


def test_transitions_are_tried_by_priority_then_document_order():
    """Outgoing transitions are tried by Priority (lower first), then document order."""
    r = seq(("A", []), ("X", []), ("Y", []), ("Z", []),
            transitions=[{"Source": "A", "Target": "X", "Condition": "always", "Priority": 2},
                         {"Source": "A", "Target": "Y", "Condition": "always", "Priority": 1},
                         {"Source": "A", "Target": "Z", "Condition": "always", "Priority": 1}])
    j = Job(r, V100)
    assert j.status == "completed"
    assert j.view()["step_rounds"] == {"A": 1, "Y": 1}


def test_no_true_transition_aborts_naming_the_step():
    """None true: the job is aborted with a reason naming the step."""
    r = seq(("A", [push("m", "A")]), ("B", []),
            transitions=[{"Source": "A", "Target": "B", "Condition": "m.ok == true"}])
    j = Job(r, V100)
    d = j.apply(Completed("J:m#1", {"ok": False}))
    assert d.status == "aborted" and "'A'" in d.reason
    assert d.job == ("Abort",)


def test_late_and_duplicate_answers_are_absorbed():
    """An answer whose command id is not the open one is absorbed (late or duplicate)."""
    j = Job(linear(2), V100)
    j.apply(Completed("J:a0#1"))
    before = j.state
    for cid in ("J:a0#1", "J:a1#7", "J:nope#2", "K:a1#2", "garbage", "J:a1#x", ":#"):
        d = j.apply(Completed(cid))
        assert not d.applied and d.work == [] and j.state == before, cid


def test_failed_action_aborts_the_job_with_a_reason():
    """A failed action aborts the job with a reason; no new command goes out."""
    j = Job(linear(2), V100)
    d = j.apply(Failed("J:a0#1", "spindle jammed"))
    assert d.status == "aborted"
    assert "a0" in d.reason and "spindle jammed" in d.reason
    assert d.commands == []
    assert not j.apply(Completed("J:a0#1")).applied


def test_timeout_without_retries_aborts():
    """A deadline that passes with no retries left aborts the job with a reason."""
    j = Job(linear(2), V100)
    assert not j.apply(Tick(), at=10_999).applied
    d = j.apply(Tick(), at=11_000)
    assert d.status == "aborted" and "timed out" in d.reason
    assert j.view()["actions"]["a0"]["outcome"] == "timeout"


def test_retries_dispatch_again_with_a_new_command_id():
    """Retries: after a timeout with retries left the action is dispatched with a new id."""
    r = seq(("A", [push("m", "A", Retries=2)]))
    j = Job(r, V110)
    d = j.apply(Tick(), at=11_000)
    assert dispatched(d) == ["J:m#2"] and d.next_deadline == 21_000
    d = j.apply(Tick(), at=21_000)
    assert dispatched(d) == ["J:m#3"]
    assert not j.apply(Completed("J:m#2")).applied        # the earlier attempt is late
    d = j.apply(Tick(), at=31_000)
    assert d.status == "aborted" and "attempt 3" in d.reason


def test_unsent_command_is_dispatched_again_at_its_deadline():
    """A command that never went out is dispatched again at its deadline, not failed."""
    j = Job(linear(1), V100)
    d = j.apply(Tick(unsent=("J:a0#1",)), at=11_000)
    assert d.status == "running"
    assert dispatched(d) == ["J:a0#1"]
    assert d.next_deadline == 21_000
    assert j.view()["actions"]["a0"]["attempt"] == 1


def test_tick_with_nothing_due_is_absorbed_and_reports_the_next_deadline():
    """A tick that finds nothing writes nothing; the decision still names the deadline."""
    j = Job(linear(1), V100)
    d = j.apply(Tick(), at=5_000)
    assert not d.applied and d.next_deadline == 11_000


# ---------------------------------------------------------------- loops and rounds


def test_rework_loop_rearms_with_new_round_and_new_ids():
    """Loops: re-entry re-arms the step's actions with a new round and new command ids;
    a late answer to the earlier pass is absorbed."""
    wm = load_reference("tighten_rework.json")
    j = Job(wm["data"], wm["dataschema"])
    j.apply(Completed("J:load_part#1"))
    j.apply(Completed("J:tighten#2", {"torque": 70}))
    assert j.active() == ["Rework"]
    d = j.apply(Completed("J:loosen#3"))
    assert dispatched(d) == ["J:tighten#4"]
    assert j.view()["actions"]["tighten"]["round"] == 2
    assert not j.apply(Completed("J:tighten#2", {"torque": 85})).applied
    j.apply(Completed("J:tighten#4", {"torque": 86}))
    assert j.active() == ["Unload"]


def test_round_reserved_name_limits_a_loop():
    """action._round is the pass count of its step: the rework loop stops at round 3."""
    wm = load_reference("tighten_rework.json")
    j = Job(wm["data"], wm["dataschema"])
    j.apply(Completed("J:load_part#1"))
    n = 2
    for _ in range(2):
        j.apply(Completed(f"J:tighten#{n}", {"torque": 10}))
        j.apply(Completed(f"J:loosen#{n + 1}"))
        n += 2
    d = j.apply(Completed(f"J:tighten#{n}", {"torque": 10}))
    assert d.status == "aborted" and "'Tighten'" in d.reason


def test_outcome_reserved_name():
    """action._outcome is how the action's latest attempt ended."""
    r = seq(("A", [push("m", "A", "P")]), ("B", [push("n", "B")]), ("C", []),
            transitions=[{"Source": "A", "Target": "B", "Condition": "always"},
                         {"Source": "B", "Target": "C", "Condition": "m._outcome == 'completed'"}])
    j = Job(r, V100)
    j.apply(Completed("J:m#1"))
    j.apply(Completed("J:n#2"))
    assert j.status == "completed"


def test_bare_names_read_the_source_step_results_then_job_parameters():
    """A bare name is looked up in the source step's results, newest first, then params."""
    wm = load_reference("axle_fit_qa.json")
    j = Job(wm["data"], wm["dataschema"], params={"torque_ok": False})
    j.apply(Completed("J:position_axle#1"))
    j.apply(Completed("J:tighten#2"))
    j.apply(Event("com.example.station.qa_result.v1", data={"pass": True}))
    assert j.active() == ["VerifyTorque"]
    d = j.apply(Event("com.example.station.torque_result.v1", data={"torque_ok": True}))
    assert d.status == "completed"
    # with no such result field, the job parameter decides
    j2 = Job(wm["data"], wm["dataschema"], params={"torque_ok": False})
    j2.apply(Completed("J:position_axle#1"))
    j2.apply(Completed("J:tighten#2"))
    j2.apply(Event("com.example.station.qa_result.v1"))
    d = j2.apply(Event("com.example.station.torque_result.v1", data={"other": 1}))
    assert d.status == "aborted"


def test_job_parameters_in_conditions():
    """job.param reads job parameters; a missing value is null and compares false."""
    r = seq(("A", []), ("X", []), ("Y", []),
            transitions=[{"Source": "A", "Target": "X", "Condition": "job.limits.max > 5"},
                         {"Source": "A", "Target": "Y", "Condition": "job.nothing == null",
                          "Priority": 1}])
    assert Job(r, V100, params={"limits": {"max": 9}}).view()["step_rounds"].get("X") == 1
    assert Job(r, V100, params={}).view()["step_rounds"].get("Y") == 1


def test_a_recipe_that_loops_without_waiting_is_aborted():
    """A cycle of steps with nothing to wait for and true conditions aborts, never hangs."""
    r = seq(("A", []), ("B", []),
            transitions=[{"Source": "A", "Target": "B", "Condition": "always"},
                         {"Source": "B", "Target": "A", "Condition": "always"}])
    j = Job(r, V100)
    assert j.status == "aborted" and "loops" in j.last.reason


# ---------------------------------------------------------------- qualifiers


def test_qualifier_n_holds_the_step():
    """N starts on entry and holds the step until settled."""
    r = seq(("A", [push("m", "A", "N")]), ("B", []))
    j = Job(r, V100)
    assert j.active() == ["A"]
    j.apply(Completed("J:m#1"))
    assert j.status == "completed"


@pytest.mark.parametrize("q", ["P", "P1"])
def test_qualifiers_p_and_p1_start_on_entry_and_do_not_hold(q):
    """P, P1 start on step entry and do not hold the step; their answers are recorded."""
    r = seq(("A", [push("m", "A", q)]), ("B", [push("n", "B")]))
    j = Job(r, V100)
    assert dispatched(j.last) == ["J:m#1", "J:n#2"]
    assert j.active() == ["B"]
    j.apply(Completed("J:m#1", {"x": 1}))
    assert j.view()["actions"]["m"]["result"] == {"x": 1}
    d = j.apply(Completed("J:n#2"))
    assert d.status == "completed"


def test_qualifier_p0_starts_on_step_exit():
    """P0 starts when its step is left."""
    r = seq(("A", [push("w", "A"), push("z", "A", "P0")]), ("B", [push("n", "B")]))
    j = Job(r, V100)
    assert dispatched(j.last) == ["J:w#1"]
    d = j.apply(Completed("J:w#1"))
    assert dispatched(d) == ["J:z#2", "J:n#3"]


def test_open_pulses_are_withdrawn_when_the_recipe_ends():
    """P/P1/P0 do not hold the job: an open one is settled as cancelled at the end."""
    r = seq(("A", [push("m", "A", "P")]), ("B", [push("n", "B")]))
    j = Job(r, V100)
    d = j.apply(Completed("J:n#2"))
    assert d.status == "completed"
    assert j.view()["actions"]["m"]["outcome"] == "cancelled"


def test_qualifier_s_outlives_its_step_until_reset():
    """S outlives its step until an R of the same name in a later step resets it."""
    r = seq(("A", [push("lamp", "A", "S")]), ("B", [push("n", "B")]),
            ("C", [push("lamp", "C", "R")]))
    j = Job(r, V100)
    assert j.active() == ["B"]
    j.apply(Completed("J:n#2"))
    assert j.status == "completed"
    assert j.view()["actions"]["lamp"]["outcome"] == "cancelled"
    assert not j.apply(Completed("J:lamp#1")).applied


def test_open_s_action_keeps_the_job_from_completing():
    """The job cannot complete while an S action is open."""
    r = seq(("A", [push("lamp", "A", "S")]), ("B", [push("n", "B")]))
    j = Job(r, V100)
    d = j.apply(Completed("J:n#2"))
    assert d.status == "running" and j.active() == []
    assert j.view()["ending"]
    d = j.apply(Completed("J:lamp#1"))
    assert d.status == "completed" and d.job == ("Complete",)


def test_qualifier_l_ends_at_its_duration():
    """L starts on entry and holds the step until completed or its duration is reached."""
    r = seq(("A", [push("m", "A", "L", timeout=30, DurationSeconds=5)]), ("B", []))
    j = Job(r, V110)
    assert j.last.next_deadline == 6_000
    d = j.apply(Tick(), at=6_000)
    assert d.status == "completed"
    assert j.view()["actions"]["m"]["outcome"] == "limited"
    # completed before its duration: settled as completed
    j2 = Job(r, V110)
    assert j2.apply(Completed("J:m#1"), at=2_000).status == "completed"


def test_qualifier_d_starts_after_its_duration():
    """D starts DurationSeconds after step entry and then holds the step."""
    r = seq(("A", [push("m", "A", "D", DurationSeconds=2.5)]), ("B", []))
    j = Job(r, V110)
    assert dispatched(j.last) == [] and j.last.next_deadline == 3_500
    assert not j.apply(Tick(), at=3_499).applied
    d = j.apply(Tick(), at=3_500)
    assert dispatched(d) == ["J:m#1"] and d.next_deadline == 13_500
    assert j.apply(Completed("J:m#1")).status == "completed"


# ---------------------------------------------------------------- branches


def test_simultaneous_branch_converges_when_all_paths_are_done():
    """Simultaneous: every path starts; the branch converges when all paths are done."""
    wm = load_reference("axle_fit_qa.json")
    j = Job(wm["data"], wm["dataschema"])
    assert sorted(dispatched(j.last)) == ["J:position_axle#1"]
    assert j.active() == ["Positioning", "QaCheck"]
    assert j.last.waits_added == ("com.example.station.qa_result.v1",)
    j.apply(Completed("J:position_axle#1"))
    assert j.active() == ["QaCheck", "TightenBolts"]
    d = j.apply(Event("com.example.station.qa_result.v1", data={"ok": True}))
    assert d.waits_removed == ("com.example.station.qa_result.v1",)
    assert j.active() == ["TightenBolts"]
    d = j.apply(Completed("J:tighten#2"))
    assert j.active() == ["VerifyTorque"]
    assert d.waits_added == ("com.example.station.torque_result.v1",)


def test_selection_branch_runs_one_path_chosen_by_its_entry_conditions():
    """Selection: entering tries its entry transitions by priority; one path runs."""
    r = {"Steps": [{"Name": "A", "Initial": True}, {"Name": "X"}, {"Name": "Y"},
                   {"Name": "E"}],
         "Branches": [{"Name": "Sel", "Type": "selection", "Branches": [["X"], ["Y"]]}],
         "Transitions": [{"Source": "A", "Target": "Sel", "Condition": "always"},
                         {"Source": "Sel", "Target": "X", "Condition": "job.kind == 'x'"},
                         {"Source": "Sel", "Target": "Y", "Condition": "job.kind == 'y'"},
                         {"Source": "Sel", "Target": "E", "Condition": "always"}],
         "Actions": [push("ax", "X"), push("ay", "Y"), push("ae", "E")]}
    j = Job(r, V100, params={"kind": "y"})
    assert dispatched(j.last) == ["J:ay#1"] and j.active() == ["Y"]
    d = j.apply(Completed("J:ay#1"))
    assert dispatched(d) == ["J:ae#2"]
    j2 = Job(r, V100, params={"kind": "z"})
    assert j2.status == "aborted" and "Sel" in j2.last.reason


def test_loop_inside_a_path_and_path_end_transition():
    """A path step may loop inside its path; a transition to its own branch ends the path."""
    r = {"Steps": [{"Name": "A", "Initial": True}, {"Name": "P1"}, {"Name": "Chk"},
                   {"Name": "Q1"}, {"Name": "End"}],
         "Branches": [{"Name": "Par", "Type": "simultaneous",
                       "Branches": [["P1", "Chk"], ["Q1"]]}],
         "Transitions": [{"Source": "A", "Target": "Par", "Condition": "always"},
                         {"Source": "Chk", "Target": "Par", "Condition": "check.ok == true"},
                         {"Source": "Chk", "Target": "P1", "Condition": "always",
                          "Priority": 1},
                         {"Source": "Par", "Target": "End", "Condition": "always"}],
         "Actions": [push("p", "P1"), push("check", "Chk"), push("q", "Q1")]}
    j = Job(r, V100)
    j.apply(Completed("J:p#1"))
    j.apply(Completed("J:check#3", {"ok": False}))
    assert sorted(j.active()) == ["P1", "Q1"]
    j.apply(Completed("J:p#4"))
    j.apply(Completed("J:check#5", {"ok": True}))
    assert j.active() == ["Q1"]
    d = j.apply(Completed("J:q#2"))
    assert d.status == "completed"


# ---------------------------------------------------------------- pull waits


def test_pull_wait_is_state_not_a_command():
    """A pull action becomes a wait: no entry, no command; the waits index gains its type."""
    r = seq(("A", [pull("ev", "A")]), ("B", []))
    j = Job(r, V100)
    assert j.last.commands == [] and all(not w[0].startswith("dispatch") for w in j.last.work)
    assert j.last.waits_added == ("com.example.ev.v1",)
    assert not j.apply(Event("com.example.other.v1")).applied
    d = j.apply(Event("com.example.ev.v1", data={"v": 1}))
    assert d.status == "completed" and d.waits_removed == ("com.example.ev.v1",)


def test_pull_wait_times_out():
    """A pull wait whose deadline passes aborts the job."""
    j = Job(seq(("A", [pull("ev", "A", timeout=3)])), V100)
    d = j.apply(Tick(), at=4_000)
    assert d.status == "aborted" and "com.example.ev.v1" in d.reason
    assert j.view()["actions"]["ev"]["outcome"] == "timeout"


def test_the_latest_answer_replaces_an_earlier_rounds_result():
    """action.field is the action's latest answer: an answer without fields clears the
    result of an earlier round."""
    r = seq(("A", [push("m", "A")]), ("B", [push("n", "B")]), ("C", []),
            transitions=[{"Source": "A", "Target": "C",
                          "Condition": "m.torque == null or m.torque >= 80"},
                         {"Source": "A", "Target": "B", "Condition": "always", "Priority": 1},
                         {"Source": "B", "Target": "A", "Condition": "always"}])
    j = Job(r, V100)
    j.apply(Completed("J:m#1", {"torque": 70}))
    j.apply(Completed("J:n#2"))
    assert j.view()["actions"]["m"]["result"] == {"torque": 70}     # kept while open
    d = j.apply(Completed("J:m#3"))
    assert d.status == "completed"


def test_match_placeholders_select_the_event():
    """Match: Subject/CorrelationId with {job}, {scope}, {action} placeholders."""
    r = seq(("A", [pull("ev", "A", Match={"Subject": "{scope}/{action}",
                                          "CorrelationId": "{job}"})]))
    j = Job(r, V110, job="J9", scope="cell3")
    t = "com.example.ev.v1"
    assert not j.apply(Event(t, subject="cell3/ev", correlation_id="J8")).applied
    assert not j.apply(Event(t, subject="cell4/ev", correlation_id="J9")).applied
    assert not j.apply(Event(t, correlation_id="J9")).applied
    assert j.apply(Event(t, subject="cell3/ev", correlation_id="J9")).status == "completed"


def test_oldest_wait_goes_first():
    """A pull event settles the oldest matching wait first."""
    r = seq(("A", [pull("first", "A", "S", TypeId="t.v1"), push("go", "A")]),
            ("B", [pull("second", "B", TypeId="t.v1")]))
    j = Job(r, V100)
    j.apply(Completed("J:go#1"), at=5_000)
    j.apply(Event("t.v1", data={"n": 1}), at=6_000)
    v = j.view()["actions"]
    assert v["first"]["result"] == {"n": 1} and v["second"]["phase"] == "open"


# ---------------------------------------------------------------- cancel


@pytest.mark.parametrize("stop", [False, True])
def test_cancel_ends_at_once_and_absorbs_later_answers(stop):
    """Cancel (Abort or Stop): the recipe ends at once, open actions are cancelled,
    later answers are absorbed, no new command goes out."""
    j = Job(linear(2), V100)
    d = j.apply(Cancel("operator", stop=stop))
    assert d.status == ("stopped" if stop else "aborted") and d.reason == "operator"
    assert d.commands == [] and d.job == ()
    assert j.view()["actions"]["a0"]["outcome"] == "cancelled"
    assert not j.apply(Completed("J:a0#1")).applied
    assert not j.apply(Tick(), at=100_000).applied


# ---------------------------------------------------------------- hold and release


def test_hold_stops_at_the_step_boundary_and_records_answers():
    """Hold: answers for work that began before the hold are recorded; the step stays
    active until the release; nothing is dispatched while held."""
    j = Job(linear(2), V100)
    d = j.apply(Hold(), at=2_000)
    assert d.status == "held" and d.next_deadline is None
    d = j.apply(Completed("J:a0#1", {"r": 1}), at=3_000)
    assert d.applied and d.commands == [] and j.active() == ["S0"]
    d = j.apply(Release(), at=4_000)
    assert d.status == "running" and dispatched(d) == ["J:a1#2"]


def test_no_expiry_while_held_and_deadlines_move_by_the_hold():
    """No deadline expires while held; the release moves open deadlines by the hold's
    length and re-issues every open push attempt with its command id."""
    j = Job(linear(1), V100)
    j.apply(Hold(), at=5_000)
    assert not j.apply(Tick(), at=50_000).applied
    assert not j.apply(Resume(), at=50_000).applied
    d = j.apply(Release(), at=65_000)
    assert dispatched(d) == ["J:a0#1"]
    assert d.next_deadline == 11_000 + 60_000
    assert d.commands[0].deadline_ms == 71_000


def test_failure_while_held_is_routed_on_release():
    """A failure recorded while held aborts the job on release."""
    j = Job(linear(2), V100)
    j.apply(Hold())
    d = j.apply(Failed("J:a0#1", "bad part"))
    assert d.status == "held"
    d = j.apply(Release())
    assert d.status == "aborted" and "bad part" in d.reason


def test_hold_twice_and_release_when_not_held_are_absorbed():
    """Hold of a held job and Release of a running one are absorbed."""
    j = Job(linear(1), V100)
    assert not j.apply(Release()).applied
    j.apply(Hold())
    assert not j.apply(Hold()).applied


# ---------------------------------------------------------------- equipment hold (§3.9)


def hold_recipe():
    return seq(("A", [push("w", "A", HoldTypeId="w.hold.v1", RestartTypeId="w.restart.v1",
                           HoldTimeoutSeconds=5)]), ("B", []))


def test_hold_sends_a_hold_command_for_running_work():
    """On hold, running push work with a HoldTypeId gets a hold command {id}:hold."""
    j = Job(hold_recipe(), V110)
    d = j.apply(Hold(), at=2_000)
    assert dispatched(d) == ["J:w#1:hold"]
    assert d.commands[0].hold and d.commands[0].type_id == "w.hold.v1"
    assert d.next_deadline == 7_000           # a held job's next deadline: its hold's


def test_held_work_goes_on_only_through_a_restart():
    """held: only a restart gets the work going again; the restart clears the hold id."""
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    d = j.apply(Held("J:w#1:hold"), at=3_000)
    assert d.applied and d.commands == []
    assert j.view()["actions"]["w"]["deadline_ms"] is None
    d = j.apply(Release(), at=4_000)
    assert dispatched(d) == ["J:w#2"] and d.commands[0].restart
    assert d.commands[0].type_id == "w.restart.v1"
    assert not j.apply(Held("J:w#1:hold")).applied         # repeated answer absorbed
    assert not j.apply(Completed("J:w#1")).applied          # the held attempt is late
    assert j.apply(Completed("J:w#2")).status == "completed"


def test_not_held_work_is_issued_again_on_release():
    """not held: the release issues the work again with its command id."""
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    j.apply(NotHeld("J:w#1:hold"), at=2_500)
    d = j.apply(Release(), at=4_000)
    assert dispatched(d) == ["J:w#1"] and not d.commands[0].restart


def test_hold_deadline_expires_while_held():
    """A hold command still expires while held: a tick then expires only hold deadlines."""
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    d = j.apply(Tick(), at=7_000)
    assert d.applied and d.status == "held"
    assert j.view()["actions"]["w"]["hold"] == "not_held"
    d = j.apply(Release(), at=8_000)
    assert dispatched(d) == ["J:w#1"]


def test_late_held_still_counts():
    """A held answer after the hold's deadline still counts: a restart is needed."""
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    j.apply(Tick(), at=7_000)
    assert j.apply(Held("J:w#1:hold"), at=8_000).applied
    d = j.apply(Release(), at=9_000)
    assert d.commands[0].restart


def test_release_before_the_answer_lets_the_answer_decide():
    """Release before the answer: the work is not issued again at once; held then
    restarts, not held issues the work again."""
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    d = j.apply(Release(), at=3_000)
    assert d.commands == []
    d = j.apply(Held("J:w#1:hold"), at=3_500)
    assert [c.restart for c in d.commands] == [True]
    j2 = Job(hold_recipe(), V110)
    j2.apply(Hold(), at=2_000)
    j2.apply(Release(), at=3_000)
    d = j2.apply(NotHeld("J:w#1:hold"), at=3_500)
    assert dispatched(d) == ["J:w#1"]


def test_resume_issues_a_restart_again_and_nothing_with_a_deadline():
    """Resume (recovery) re-issues a restart with its id; plain open work that has a
    deadline is not resent."""
    j = Job(linear(1), V100)
    assert not j.apply(Resume()).applied
    j = Job(hold_recipe(), V110)
    j.apply(Hold(), at=2_000)
    j.apply(Held("J:w#1:hold"))
    j.apply(Release(), at=4_000)
    d = j.apply(Resume(), at=4_500)
    assert dispatched(d) == ["J:w#2"] and d.commands[0].restart


# ---------------------------------------------------------------- outage


def test_shift_moves_every_open_deadline_by_the_gap():
    """Shift(gap): every open deadline moves by exactly the gap (outage rule)."""
    j = Job(linear(1), V100)
    d = j.apply(Shift(30_000), at=50_000)
    assert d.next_deadline == 41_000
    assert not j.apply(Tick(), at=40_000).applied
    assert j.apply(Shift(0)).applied is False


# ---------------------------------------------------------------- the state document


def test_state_document_is_compact():
    """The state document of a 10-action job between steps stays within 512 bytes."""
    j = Job(linear(10), V100, job="job-2026-000123", scope="line-4-cell-2",
            params={"variant": "A7", "serial": "SN-000000123"})
    for i in range(5):
        j.apply(Completed(f"job-2026-000123:a{i}#{i + 1}", {"torque": 85.5, "ok": True}))
    assert j.status == "running"
    assert len(j.state) <= 512, len(j.state)


def test_long_lists_of_the_state_document_round_trip():
    """Counts of 128 and more (entered steps, armed actions) take more than one byte
    in front of their list; such a document reads back to the same state."""
    n = 200
    recipe = {"Steps": [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)],
              "Transitions": [{"Source": f"S{i}", "Target": f"S{i + 1}",
                               "Condition": "always"} for i in range(n - 1)],
              "Actions": [push(f"a{i}", f"S{i}") for i in range(n)]
              + [push(f"s{i}", "S0", qualifier="S") for i in range(140)]}
    g = compile_recipe(recipe, V110)
    d = evolve(g, None, Start("J", "s"), 1_000)
    for i in range(150):
        cid = next(c.command_id for c in d.commands if c.action == f"a{i}")
        d = evolve(g, d.state, Completed(cid, {"i": i}), 1_000 + i)
    view = state_to_json(g, d.state)
    assert len(view["step_rounds"]) == 151                # S0 .. S150 entered
    assert len(view["actions"]) == 291                    # 140 stored + a0 .. a150
    shifted = evolve(g, d.state, Shift(5), 2_000)        # decode, change, encode again
    assert shifted.applied
    assert state_to_json(g, shifted.state)["step_rounds"] == view["step_rounds"]


def test_newer_major_and_garbage_are_refused_clearly():
    """A newer major version is refused with a clear error; garbage never crashes."""
    j = Job(linear(1), V100)
    newer = j.state[:3] + bytes([9]) + j.state[4:]
    with pytest.raises(StateFormatError, match="upgrade"):
        evolve(j.graph, newer, Tick(), 1)
    for bad in (b"", b"SFS", b"xxxx" * 10, j.state[:-1], j.state + b"\0"):
        with pytest.raises(StateFormatError):
            evolve(j.graph, bad, Tick(), 1)
    other = compile_recipe(linear(2), V100)
    with pytest.raises(StateFormatError, match="another recipe"):
        evolve(other, j.state, Tick(), 1)


def test_job_index_and_open_command():
    """job_index gives what the indexes hold; open_command what a dispatch entry sends."""
    j = Job(seq(("A", [push("m", "A"), pull("e", "A")])), V100)
    assert job_index(j.graph, j.state) == ("running", 11_000, ("com.example.e.v1",))
    c = open_command(j.graph, j.state, "m")
    assert c.command_id == "J:m#1" and c.deadline_ms == 11_000
    assert open_command(j.graph, j.state, "e") is None
    assert open_command(j.graph, j.state, "zzz") is None
    j.apply(Completed("J:m#1"))
    assert open_command(j.graph, j.state, "m") is None


def test_command_carries_parameters_and_context():
    """A command carries the action's parameters, type, deadline, job and scope."""
    r = seq(("A", [push("m", "A", Parameters={"program": 7})]))
    j = Job(r, V100, scope="cell")
    c = j.last.commands[0]
    assert (c.action, c.type_id, c.parameters, c.job, c.scope, c.attempt) == (
        "m", "com.example.m.v1", {"program": 7}, "J", "cell", 1)
    assert c.to_dict()["deadline_ms"] == 11_000
