"""``Decision.ended``: what one evolve call ended (an action's attempt, the job's hold),
with when it began, so a host can record it as a span whichever host began it."""

from __future__ import annotations

import copy
import pickle

from helpers.core import Job
from helpers.recipes import V100, V110, load_reference, pull, push

from sfc_fast.events import (
    Cancel,
    Completed,
    Event,
    Failed,
    Held,
    Hold,
    Release,
    Tick,
)


def seq(*steps_actions):
    steps = [{"Name": s, "Initial": i == 0} for i, (s, _) in enumerate(steps_actions)]
    trans = [{"Source": steps_actions[i][0], "Target": steps_actions[i + 1][0],
              "Condition": "always"} for i in range(len(steps_actions) - 1)]
    return {"Steps": steps, "Transitions": trans,
            "Actions": [a for _, al in steps_actions for a in al]}


def test_an_answer_ends_its_attempt_with_when_it_was_sent():
    j = Job(seq(("A", [push("m", "A")]), ("B", [push("n", "B")])), V100, now=1_000)
    assert j.last.ended == []
    d = j.apply(Completed("J:m#1", {"ok": True}), at=1_250)
    assert d.ended == [("m", "J:m#1", "com.example.m.v1", 1, 1, 1_000, "completed")]
    assert [c.command_id for c in d.commands] == ["J:n#2"]       # commands unchanged
    assert d.work == [("dispatch:n", "n", "J:n#2")]
    d = j.apply(Failed("J:n#2", "jammed"), at=1_400)
    assert d.ended == [("n", "J:n#2", "com.example.n.v1", 1, 1, 1_250, "failed")]
    assert d.job == ("Abort",)


def test_a_timeout_ends_the_attempt_and_the_retry_begins_a_new_one():
    j = Job(seq(("A", [push("m", "A", timeout=2, Retries=1)])), V110, now=0)
    d = j.apply(Tick(), at=2_000)
    assert d.ended == [("m", "J:m#1", "com.example.m.v1", 1, 1, 0, "timeout")]
    assert [(c.command_id, c.attempt) for c in d.commands] == [("J:m#2", 2)]
    d = j.apply(Tick(), at=4_000)
    assert d.ended == [("m", "J:m#2", "com.example.m.v1", 2, 1, 2_000, "timeout")]
    assert d.status == "aborted" and d.commands == []


def test_an_unsent_command_sent_again_ends_nothing():
    j = Job(seq(("A", [push("m", "A", timeout=2, Retries=1)])), V110, now=0)
    d = j.apply(Tick(["J:m#1"]), at=2_000)
    assert d.ended == [] and [c.command_id for c in d.commands] == ["J:m#1"]


def test_a_pull_wait_ends_without_a_command_id():
    j = Job(seq(("A", [pull("ev", "A")]), ("B", [])), V100, now=500)
    d = j.apply(Event("com.example.ev.v1", data={"v": 1}), at=900)
    assert d.ended == [("ev", None, "com.example.ev.v1", 1, 1, 500, "completed")]


def test_a_cancel_ends_every_open_attempt():
    j = Job(seq(("A", [push("m", "A"), pull("ev", "A")])), V100, now=100)
    d = j.apply(Cancel("operator"), at=300)
    assert sorted(d.ended) == [("ev", None, "com.example.ev.v1", 1, 1, 100, "cancelled"),
                               ("m", "J:m#1", "com.example.m.v1", 1, 1, 100, "cancelled")]
    assert d.job == ()


def _held_work():
    return seq(("A", [push("w", "A", HoldTypeId="w.hold.v1", RestartTypeId="w.restart.v1")]))


def test_a_released_hold_ends_the_hold_and_the_held_attempt():
    j = Job(_held_work(), V110, now=0)
    d = j.apply(Hold(), at=1_000)
    assert d.ended == []                                # a hold command opens no attempt
    j.apply(Held("J:w#1:hold"), at=1_100)
    d = j.apply(Release(), at=5_000)
    assert d.ended == [(None, None, "", 0, 0, 1_000, "released"),
                       ("w", "J:w#1", "com.example.w.v1", 1, 1, 0, "restarted")]
    (restart,) = d.commands
    assert restart.restart and restart.command_id == "J:w#2"
    d = j.apply(Completed("J:w#2"), at=6_000)
    # the restart's own attempt, typed as the restart command
    assert d.ended == [("w", "J:w#2", "w.restart.v1", 1, 1, 5_000, "completed")]


def test_a_job_stopped_while_held_ends_its_hold_cancelled():
    j = Job(_held_work(), V110, now=0)
    j.apply(Hold(), at=1_000)
    d = j.apply(Cancel("stop", stop=True), at=2_000)
    assert (None, None, "", 0, 0, 1_000, "cancelled") in d.ended
    assert ("w", "J:w#1", "com.example.w.v1", 1, 1, 0, "cancelled") in d.ended


def test_each_round_of_a_loop_is_an_attempt_of_its_own():
    wm = load_reference("tighten_rework.json")
    j = Job(wm["data"], wm["dataschema"], now=0)
    rounds = []
    t = 0
    for _ in range(6):
        cmds = j.last.commands
        if not cmds:
            break
        t += 10
        d = j.apply(Completed(cmds[0].command_id, {"torque": 50}), at=t)
        rounds += [(e[0], e[4]) for e in d.ended]
    assert rounds[:5] == [("load_part", 1), ("tighten", 1), ("loosen", 1), ("tighten", 2),
                          ("loosen", 2)]


def test_ended_survives_pickle_and_copy():
    j = Job(seq(("A", [push("m", "A", timeout=2)])), V100, now=0)
    d = j.apply(Tick(), at=2_000)       # no command: job and scope are read from the state
    assert d.ended and d.commands == []
    for clone in (pickle.loads(pickle.dumps(d)), copy.copy(d)):
        assert clone.ended == d.ended and clone.work == d.work
