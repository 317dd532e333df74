"""The Engine manager: the seed's Engine machine and its relationships to Tasks and Missions.

Coroutines run with asyncio.run inside plain tests (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import itertools
import textwrap
from pathlib import Path

import pytest

from sfc_fast.machines import ENGINE, InvalidTransition
from sfc_host.engine import (
    Engine,
    EngineFault,
    EngineStateError,
    JobsNotConnected,
    ScriptAPIError,
    TaskDisposed,
    topic_matches,
)
from sfc_host.engine import manager as manager_mod


def write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


COUNTER = """\
    from sfc_host.engine import Variable, mission, task

    ticks = Variable("ticks", 0)

    @task(interval=0.02)
    async def tick(api):
        ticks.set(ticks.get() + 1)

    @task(interval=0.02, auto_start=False)
    def manual(api):
        pass

    @mission
    async def wait_forever(api):
        while True:
            await asyncio.sleep(0.01)
            yield

    @mission
    async def quick(api, n=2):
        for i in range(n):
            yield i

    import asyncio
"""


class Recorder:
    """Every engine state in order, as the on_change listener saw them."""

    def __init__(self, engine: Engine) -> None:
        self.states: list[str] = [engine.state]
        self.violations: list[str] = []
        engine.on_change(self)

    def __call__(self, engine: Engine) -> None:
        if engine.state != self.states[-1]:
            self.states.append(engine.state)
            if engine.state == "Ready" and self.states[-2] == "Stopping" \
                    and not engine.quiescent():
                self.violations.append(f"Ready while {engine.blockers()}")


def transitions_taken(states: list[str]) -> list[tuple[str, str]]:
    return list(itertools.pairwise(states))


def assert_machine_path(states: list[str]) -> None:
    """Every step between two recorded states is one transition of ENGINE."""
    allowed = {(s, d) for s, _, d in ENGINE.transitions()}
    for pair in transitions_taken(states):
        assert pair in allowed, pair


# ---- Initializing, Idle, editing ------------------------------------------------------


def test_a_new_engine_initializes_to_idle(tmp_path: Path) -> None:
    e = Engine(tmp_path / "scripts")
    assert e.state == "Idle"
    assert (tmp_path / "scripts").is_dir()
    e2 = Engine(tmp_path / "s2", initialize=False)
    assert e2.state == "Initializing"
    rec = Recorder(e2)
    asyncio.run(e2.reset())          # Initializing --Reset--> Resetting --> Idle
    assert rec.states == ["Initializing", "Resetting", "Idle"]
    with pytest.raises(InvalidTransition):
        e.initialize()


def test_scripts_are_edited_and_saved_only_in_idle(tmp_path: Path) -> None:
    e = Engine(tmp_path)

    async def main() -> None:
        e.save_script("a.py", "X = 1\n")
        assert e.list_scripts() == ["a.py"] and e.read_script("a.py") == "X = 1\n"
        assert await e.build() == []
        assert e.state == "Ready"
        with pytest.raises(EngineStateError, match="only while the engine is Idle; it is Ready"):
            e.save_script("a.py", "X = 2\n")
        with pytest.raises(EngineStateError, match="Idle"):
            e.delete_script("a.py")
        await e.start()
        with pytest.raises(EngineStateError, match="it is Running"):
            e.save_script("b.py", "")
        await e.stop()
        await e.reset()
        e.save_script("a.py", "X = 2\n")
        e.save_script("b.py", "Y = 1\n")
        e.delete_script("b.py")
        write(tmp_path, "bad.py", "x = (\n")
        assert await e.build()
        assert e.state == "BuildError"
        with pytest.raises(EngineStateError, match="it is BuildError"):
            e.save_script("bad.py", "x = 1\n")
        await e.reset()                  # BuildError --Reset--> Idle
        e.save_script("bad.py", "x = 1\n")

    asyncio.run(main())
    assert e.read_script("a.py") == "X = 2\n"
    assert e.list_scripts() == ["a.py", "bad.py"]
    with pytest.raises(ValueError, match="not a script name"):
        e.save_script("../evil.py", "")


# ---- Build ----------------------------------------------------------------------------


def test_build_extracts_tasks_missions_and_variables(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    write(tmp_path, "_helper.py", "raise RuntimeError('not a script: never executed')\n")
    e = Engine(tmp_path)
    assert asyncio.run(e.build()) == []
    assert e.state == "Ready"
    assert sorted(e.tasks) == ["manual", "tick"]
    assert {t.state for t in e.tasks.values()} == {"Idle"}
    assert e.tasks["tick"].interval == 0.02 and e.tasks["tick"].auto_start
    assert not e.tasks["manual"].auto_start
    assert sorted(e.missions) == ["quick", "wait_forever"]
    assert e.missions["quick"].parameters() == ["n"]
    assert e.vars.snapshot() == {"ticks": 0}


@pytest.mark.parametrize("name, source, line, fragment", [
    ("syntax.py", "x = 1\n\ndef f(:\n    pass\n", 3, "syntax error"),
    ("imports.py", "import os\nimport no_such_module_here\n", 2,
     "import error: No module named 'no_such_module_here'"),
    ("raises.py", "A = 1\nB = 2\nC = 1 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("deco.py", "from sfc_host.engine import mission\n\n@mission\nasync def m(api):\n"
                "    return 1\n", 3, "@mission needs an async generator"),
])
def test_a_broken_script_gives_build_error_with_file_and_line(
        tmp_path: Path, name: str, source: str, line: int, fragment: str) -> None:
    write(tmp_path, name, source)
    e = Engine(tmp_path)
    problems = asyncio.run(e.build())
    assert e.state == "BuildError"
    assert len(problems) == 1
    p = problems[0]
    assert (p.file, p.line) == (name, line)
    assert fragment in p.message
    assert str(p).startswith(f"{name}:{line}: ")
    assert e.tasks == {} and e.missions == {}


def test_every_problem_of_every_script_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "def broken(\n")
    write(tmp_path, "b.py", """\
        from sfc_host.engine import Variable, task

        v = Variable("shared", 1)

        @task(interval=1)
        def same(api):
            pass
    """)
    write(tmp_path, "c.py", """\
        from sfc_host.engine import Variable, task

        v = Variable("shared", 2)

        @task(interval=1)
        def same(api):
            pass
    """)
    e = Engine(tmp_path)
    problems = asyncio.run(e.build())
    where = sorted((p.file, p.line) for p in problems)
    assert where == [("a.py", 1), ("c.py", 3), ("c.py", 5)]
    text = " ".join(p.message for p in problems)
    assert "task 'same' is already declared at b.py:5" in text
    assert "variable 'shared' is declared elsewhere with initial value 1" in text


def test_build_only_from_idle_build_error_or_ready(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path, initialize=False)

    async def main() -> None:
        with pytest.raises(InvalidTransition, match="Build is not permitted in state "
                                                    "Initializing"):
            await e.build()
        e.initialize()
        assert await e.build() == []
        old = e.tasks["tick"]
        assert await e.build() == []            # Ready --Build--> Building (the diagram)
        assert old.disposed and e.tasks["tick"] is not old   # recreated from the build
        await e.start()
        with pytest.raises(InvalidTransition, match="Build is not permitted in state Running"):
            await e.build()
        await e.stop()
        write(tmp_path, "zz.py", "1/0\n")
        assert await e.build()
        assert e.state == "BuildError"
        (tmp_path / "zz.py").unlink()
        assert await e.build() == []             # BuildError --Build--> Building
        assert e.state == "Ready"

    asyncio.run(main())


# ---- Start, Stop: AutoStart and the Stopping -> Ready rule ----------------------------


def test_starting_auto_starts_tasks_and_stopping_stops_them(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path)
    rec = Recorder(e)

    async def main() -> None:
        await e.build()
        await e.start()
        assert e.state == "Running"
        assert e.tasks["tick"].state == "Running"       # AutoStart = true
        assert e.tasks["manual"].state == "Idle"        # AutoStart = false: by hand
        await e.tasks["manual"].start()
        assert e.tasks["manual"].state == "Running"
        await asyncio.sleep(0.1)
        assert e.vars["ticks"] > 0
        await e.tasks["tick"].disable()
        await e.stop()
        assert e.state == "Ready"
        assert {t.state for t in e.tasks.values()} == {"Stopped"}
        await e.start()                                 # Stopped --Start--> Running
        assert e.tasks["tick"].state == "Running"
        assert e.tasks["manual"].state == "Stopped"     # not auto-started
        await e.stop()

    asyncio.run(main())
    assert rec.states == ["Idle", "Building", "Ready", "Starting", "Running", "Stopping",
                          "Ready", "Starting", "Running", "Stopping", "Ready"]
    assert_machine_path(rec.states)
    assert rec.violations == []


def test_stopping_reaches_ready_only_when_tasks_stopped_and_no_mission_running(
        tmp_path: Path) -> None:
    write(tmp_path, "slow.py", """\
        import asyncio
        from sfc_host.engine import mission, task

        @task(interval=0.01)
        async def long_run(api):
            await asyncio.sleep(0.3)          # in flight when the engine stops

        @mission
        async def stubborn(api):
            try:
                while True:
                    await asyncio.sleep(0.01)
                    yield
            finally:
                await asyncio.sleep(0.3)      # cleanup that takes a while
    """)
    e = Engine(tmp_path, stop_timeout=5)
    rec = Recorder(e)
    seen_while_stopping: list[tuple[str, list[str]]] = []

    def watch(engine: Engine) -> None:
        if engine.state == "Stopping":
            seen_while_stopping.append(
                (engine.tasks["long_run"].state,
                 [m.state for m in engine.instances.values()]))
    e.on_change(watch)

    async def main() -> None:
        await e.build()
        await e.start()
        m = await e.start_mission("stubborn")
        idle = e.create_mission("stubborn")            # never started: stays Idle
        await asyncio.sleep(0.05)
        t0 = asyncio.get_running_loop().time()
        await e.stop()
        took = asyncio.get_running_loop().time() - t0
        assert took >= 0.28                            # it waited for the cleanup
        assert m.state == "Canceled" and idle.state == "Idle"
        assert e.tasks["long_run"].state == "Stopped"

    asyncio.run(main())
    assert rec.violations == []
    assert any(t != "Stopped" for t, _ in seen_while_stopping)
    assert any("Canceling" in ms for _, ms in seen_while_stopping)
    assert rec.states[-2:] == ["Stopping", "Ready"]


def test_a_stop_that_cannot_finish_goes_to_fault(tmp_path: Path) -> None:
    write(tmp_path, "deaf.py", """\
        import asyncio
        from sfc_host.engine import mission

        @mission
        async def deaf(api):
            yield
            for _ in range(20):  # swallows every cancellation for a second, no yield
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass
    """)
    e = Engine(tmp_path, stop_timeout=0.3)

    async def main() -> None:
        await e.build()
        await e.start()
        await e.start_mission("deaf")
        await asyncio.sleep(0.05)
        with pytest.raises(EngineFault, match="stop timed out: mission deaf-"):
            await e.stop()
        assert e.state == "Fault"
        assert e.permitted() == ("Reset",)
        with pytest.raises(InvalidTransition):
            await e.start()
        await e.reset()                         # Fault --Reset--> Resetting --> Idle
        assert e.state == "Idle" and e.instances == {} and e.fault_reason is None

    asyncio.run(main())


# ---- Reset disposes -------------------------------------------------------------------


def test_reset_disposes_every_task_and_mission(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path)
    rec = Recorder(e)

    async def main() -> None:
        await e.build()
        await e.start()
        running = [await e.start_mission("wait_forever") for _ in range(3)]
        idle = e.create_mission("quick")
        await e.task("tick").disable()
        tasks = list(e.tasks.values())
        await asyncio.sleep(0.05)
        await e.reset()                          # Running --Reset--> Resetting --> Idle
        assert e.state == "Idle"
        assert e.tasks == {} and e.instances == {} and e.missions == {}
        assert all(t.disposed for t in tasks)
        assert {t.state for t in tasks} == {"Stopped", "Idle"}
        assert [m.state for m in running] == ["Canceled"] * 3
        assert idle.state == "Idle"
        with pytest.raises(TaskDisposed):
            await tasks[0].start()
        saved = await e.store.list()
        assert sorted(r["id"] for r in saved) == sorted(m.id for m in running)
        assert e.vars.snapshot() == {}
        # Ready --Reset--> Idle directly, and disposes too
        await e.build()
        built = list(e.tasks.values())
        await e.reset()
        assert all(t.disposed for t in built)

    asyncio.run(main())
    assert rec.states == ["Idle", "Building", "Ready", "Starting", "Running", "Resetting",
                          "Idle", "Building", "Ready", "Idle"]
    assert_machine_path(rec.states)


# ---- Fault ----------------------------------------------------------------------------


def test_an_unexpected_engine_error_goes_to_fault(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    e = Engine(tmp_path)

    def boom(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(manager_mod, "build_scripts", boom)

    async def main() -> None:
        with pytest.raises(EngineFault, match="build failed: OSError: disk on fire"):
            await e.build()
        assert e.state == "Fault" and "disk on fire" in (e.fault_reason or "")
        for op in (e.build, e.start, e.stop):
            with pytest.raises(InvalidTransition, match="permitted: Reset"):
                await op()
        await e.reset()
        assert e.state == "Idle"

    asyncio.run(main())


def test_a_failing_critical_builtin_task_faults_the_engine(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path)
    calls: list[int] = []

    async def consumer() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("stream gone")

    e.add_builtin_task("consumer", consumer, interval=0)   # back to back, like a loop

    async def main() -> None:
        await e.build()
        assert e.tasks["consumer"].defn.builtin
        await e.start()
        for _ in range(100):
            if e.state == "Fault":
                break
            await asyncio.sleep(0.01)
        assert e.state == "Fault"
        assert e.fault_reason == "built-in task consumer failed: ConnectionError: stream gone"
        assert e.tasks["consumer"].state == "Error"
        await asyncio.sleep(0.05)
        assert e.tasks["tick"].state == "Stopped"          # nothing keeps running in Fault
        with pytest.raises(EngineStateError):
            await e.start_mission("quick")
        await e.reset()
        assert e.state == "Idle"
        await e.build()
        assert "consumer" in e.tasks                        # built-ins come with every build

    asyncio.run(main())
    assert len(calls) == 3


# ---- Missions and the engine ----------------------------------------------------------


def test_missions_start_only_while_the_engine_runs(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path)

    async def main() -> None:
        with pytest.raises(EngineStateError, match="engine is Idle"):
            e.create_mission("quick")
        await e.build()
        m = e.create_mission("quick", n=3)              # created while Ready: Idle
        assert m.state == "Idle"
        with pytest.raises(EngineStateError, match="the engine is Ready, not Running"):
            await m.start()
        with pytest.raises(KeyError, match=r"no mission 'nope' \(missions: quick, wait_forever"):
            e.create_mission("nope")
        await e.start()
        await m.start()
        assert await m.join(2) == "Completed"
        assert m.steps == 3
        assert m.id not in e.instances                  # disposed after its record
        await e.stop()

    asyncio.run(main())


# ---- the script API -------------------------------------------------------------------


def test_variables_are_shared_across_scripts(tmp_path: Path) -> None:
    write(tmp_path, "producer.py", """\
        from sfc_host.engine import Variable, task

        level = Variable("level", 0)

        @task(interval=0.01)
        def fill(api):                 # a sync task: runs in a worker thread
            level.set(level.get() + 1)
    """)
    write(tmp_path, "consumer.py", """\
        from sfc_host.engine import Variable, mission

        level = Variable("level", 0)   # the same variable, declared again

        @mission
        async def watch(api, until):
            while api.vars["level"] < until:
                yield
            api.log.info(f"level reached {level.value}")
            try:
                api.vars["levle"] = 1
            except KeyError as e:
                api.log.info(str(e))
    """)
    e = Engine(tmp_path)

    async def main() -> None:
        await e.build()
        await e.start()
        m = await e.start_mission("watch", until=5)
        assert await m.join(5) == "Completed"
        await e.stop()
        lines = [x["msg"] for x in m.record["log"]]
        assert lines[0].startswith("level reached ")
        assert int(lines[0].rsplit(" ", 1)[1]) >= 5
        assert "no variable 'levle'" in lines[1]

    asyncio.run(main())


def test_mqtt_publish_subscribe_between_scripts(tmp_path: Path) -> None:
    write(tmp_path, "bus.py", """\
        import json
        from sfc_host.engine import mission, task

        @task(interval=0.01)
        async def sensor(api):
            api.score += 1
            await api.mqtt.publish("plant/cell1/temp", {"t": api.score})

        @mission
        async def listen(api, count):
            got = []
            api.mqtt.subscribe("plant/+/temp", lambda topic, p: got.append(json.loads(p)))
            api.mqtt.subscribe("plant/status", lambda topic, p: got.append(p.decode()))
            while len(got) < count:
                yield
            api.score = len(got)
            api.log.info("retained seen" if "up" in got else repr(got))
            api.log.info(repr(next(g for g in got if isinstance(g, dict))))
    """)
    e = Engine(tmp_path)

    async def main() -> None:
        await e.build()
        await e.mqtt.publish("plant/status", b"up", retain=True)   # retained: delivered
        await e.start()
        m = await e.start_mission("listen", count=4)
        assert await m.join(5) == "Completed"
        await e.stop()
        assert m.record["log"][0]["msg"] == "retained seen"
        assert m.record["log"][1]["msg"].startswith("{'t': ")
        assert m.score == 4

    asyncio.run(main())
    assert topic_matches("a/+/c", "a/b/c") and topic_matches("a/#", "a/b/c")
    assert not topic_matches("a/+", "a/b/c") and not topic_matches("#", "$SYS/x")
    assert topic_matches("a/b", "a/b") and not topic_matches("a/b/c", "a/b")


def test_the_job_api_says_clearly_that_it_is_not_connected(tmp_path: Path) -> None:
    e = Engine(tmp_path)
    assert isinstance(e.jobs, JobsNotConnected)
    with pytest.raises(ScriptAPIError, match=r"api.jobs.submit: this engine is not "
                                             r"connected to job control"):
        asyncio.run(e.jobs.submit({"JobOrderID": "j1"}, scope="cell1"))


def test_status_reports_everything(tmp_path: Path) -> None:
    write(tmp_path, "counter.py", COUNTER)
    e = Engine(tmp_path)

    async def main() -> dict:
        await e.build()
        await e.start()
        await asyncio.sleep(0.05)
        s = e.status()
        await e.stop()
        return s

    s = asyncio.run(main())
    assert s["state"] == "Running"
    assert set(s["permitted"]) == {"Reset", "Stop", "FaultOccurred"}
    tick = next(t for t in s["tasks"] if t["name"] == "tick")
    assert tick["state"] == "Running" and tick["runs"] >= 1
    assert s["missions"] == ["quick", "wait_forever"]
    assert s["variables"]["ticks"] >= 1
