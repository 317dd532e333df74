"""The embedded Runner: reference recipes run to the end with scripted answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from helpers.recipes import load_reference

from sfc_fast import Runner, compile_recipe, job_of_command

DOCS = Path(__file__).resolve().parents[2] / "docs"


class Clock:
    def __init__(self, t: int = 1_000) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def make(name: str) -> Any:
    wm = load_reference(name)
    return compile_recipe(wm["data"], wm["dataschema"])


def test_job_of_command():
    assert job_of_command("a:b:c:act#3") == "a:b:c"
    assert job_of_command("J:act#3:hold") == "J"
    assert job_of_command("nonsense") == ""
    assert job_of_command("#1") == ""
    # edges of the in-place scan: empty parts, non-ASCII text, a bare ":hold"
    for cid, job in [("x#1", ""), ("", ""), (":hold", ""), (":a#1", ""), ("j:#1", "j"),
                     ("j:a#", "j"), ("jöb-ü:äct#3:hold", "jöb-ü"), ("j😀b:a#12", "j😀b"),
                     ("a:b#1:hold:hold", "a")]:
        assert job_of_command(cid) == job, cid


def test_axle_recipe_runs_to_completion_with_scripted_answers():
    g = make("axle_fit_qa.json")
    clock = Clock()
    out: list = []
    ended: dict[str, Any] = {}
    r = Runner(out.append, clock=clock, on_end=lambda j, d: ended.setdefault(j, d.status))
    for i in range(20):
        r.start(f"J{i}", g, "st1", {"torque_ok": False})
    # the station answers pushes; the camera and torque events arrive for every job
    while out:
        c = out.pop(0)
        clock.t += 7
        assert r.complete(c.command_id).applied
    for _ in range(20):
        assert r.event("com.example.station.qa_result.v1", data={"pass": True}).applied
    assert r.event("com.example.station.qa_result.v1") is None     # nobody waits now
    for _ in range(20):
        r.event("com.example.station.torque_result.v1", data={"torque_ok": True})
    assert ended == {f"J{i}": "completed" for i in range(20)}
    assert r.next_deadline() is None


def test_rework_loop_runs_to_completion_and_aborts_on_timeout():
    g = make("tighten_rework.json")
    clock = Clock()
    out: list = []
    ended: dict[str, Any] = {}
    r = Runner(out.append, clock=clock, on_end=lambda j, d: ended.setdefault(j, d.reason))
    r.start("ok", g, "st1")
    torques = iter([60, 70, 85])
    while out:
        c = out.pop(0)
        res = {"torque": next(torques)} if c.action == "tighten" else None
        r.complete(c.command_id, res)
    assert ended == {"ok": None}
    assert r.inspect("ok")["step_rounds"] == {"Load": 1, "Tighten": 3, "Rework": 2,
                                             "Unload": 1}
    # a job whose unload is never answered: tick past the deadline
    r.start("late", g, "st1")
    r.complete(out.pop(0).command_id)                       # load
    first = out.pop(0)                                      # tighten, retries 1
    r.complete(first.command_id, {"torque": 85})
    unload = out.pop(0)
    assert unload.action == "unload_part"
    clock.t = unload.deadline_ms
    assert r.tick() == 1
    assert "unload_part" in ended["late"] and "timed out" in ended["late"]
    assert r.status("late") == "aborted"


def test_tighten_retry_goes_out_with_a_new_id_and_late_answer_is_absorbed():
    g = make("tighten_rework.json")
    clock = Clock()
    out: list = []
    r = Runner(out.append, clock=clock)
    r.start("J", g)
    r.complete(out.pop(0).command_id)
    t1 = out.pop(0)
    clock.t = t1.deadline_ms
    r.tick()
    t2 = out.pop(0)
    assert (t2.action, t2.attempt) == ("tighten", 2) and t2.command_id != t1.command_id
    assert not r.complete(t1.command_id, {"torque": 85}).applied
    assert r.complete(t2.command_id, {"torque": 85}).applied
    assert r.absorbed >= 1


def test_hold_and_release_through_the_runner():
    g = make("tighten_rework.json")
    clock = Clock()
    out: list = []
    r = Runner(out.append, clock=clock)
    r.start("J", g)
    load = out.pop(0)
    r.hold("J")
    assert r.status("J") == "held"
    clock.t += 100_000
    assert r.tick() == 0                        # no deadline while held
    r.complete(load.command_id)
    assert out == []
    r.release("J")
    assert [c.action for c in out] == ["tighten"]


def test_embedding_doc_example_runs():
    """docs/embedding.md's first example is runnable as written."""
    text = (DOCS / "embedding.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    exec(compile(code, "embedding.md", "exec"), {})


def test_memory_per_running_job_is_small():
    """Runner memory per running job (state bytes, indexes) stays under 1 KB."""
    import tracemalloc

    g = make("tighten_rework.json")
    r = Runner(lambda c: None, clock=Clock())
    n = 5_000
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        r.start(f"job-{i:06d}", g, "scope-1", {"serial": i})
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert used / n < 1024, used / n
