"""Task rules: the Task machine through the runner, timer phase, errors, overlap, dispose."""

from __future__ import annotations

import asyncio
import textwrap
import threading
from pathlib import Path

import pytest

from sfc_fast.machines import TASK, InvalidTransition
from sfc_host.engine import Engine, EngineStateError, TaskDisposed


async def engine_with(folder: Path, source: str, *, start: bool = True) -> Engine:
    (folder / "s.py").write_text(textwrap.dedent(source))
    e = Engine(folder, stop_timeout=2)
    assert await e.build() == []
    if start:
        await e.start()
    return e


PROBE = """\
    import asyncio
    from sfc_host.engine import task

    LOG = []          # (loop time, event)

    @task(interval={interval}, auto_start=False)
    async def probe(api):
        LOG.append((asyncio.get_running_loop().time(), "run"))
        await asyncio.sleep({work})
"""


def probe_log(e: Engine) -> list[tuple[float, str]]:
    return e.tasks["probe"].defn.fn.__globals__["LOG"]


# one execution that sleeps; notes whether it was cancelled or finished
SLEEPER = """\
    import asyncio
    from sfc_host.engine import task

    DONE = []
    CANCELLED = []

    @task(interval={interval})
    async def sleeper(api):
        try:
            await asyncio.sleep({seconds})
        except asyncio.CancelledError:
            CANCELLED.append(1)
            raise
        DONE.append(1)
"""


def test_task_transitions_through_the_runner(tmp_path: Path) -> None:
    seen: list[str] = []

    async def main() -> None:
        e = await engine_with(tmp_path, PROBE.format(interval=0.05, work=0.08))
        t = e.task("probe")
        e.on_change(lambda _: seen.append(t.state) if seen[-1:] != [t.state] else None)
        assert t.state == "Idle"
        for op in (t.enable, t.disable):
            with pytest.raises(InvalidTransition, match="not permitted in state Idle"):
                await op()
        assert await t.start() == "Running"
        with pytest.raises(InvalidTransition, match="Start is not permitted in state Running"):
            await t.start()
        with pytest.raises(InvalidTransition, match="Resume is not permitted in state Running"):
            await t.enable()
        await asyncio.sleep(0.02)                      # an execution is in flight
        assert await t.disable() == "Paused"           # waited for it: Pausing on the way
        assert not any(x.get_name().startswith("task:probe:run") and not x.done()
                       for x in asyncio.all_tasks())
        with pytest.raises(InvalidTransition, match="Pause is not permitted in state Paused"):
            await t.disable()
        assert await t.enable() == "Running"
        await e.stop()
        assert t.state == "Stopped"
        with pytest.raises(InvalidTransition, match="Resume is not permitted in state Stopped"):
            await t.enable()

    asyncio.run(main())
    assert seen == ["Running", "Pausing", "Paused", "Resuming", "Running", "Stopping",
                    "Stopped"]
    allowed = {(s, d) for s, _, d in TASK.transitions()}
    assert all(p in allowed for p in zip(["Idle", *seen], seen, strict=False))


def test_a_paused_task_keeps_its_timer_phase_and_counts_skips(tmp_path: Path) -> None:
    interval = 0.1

    async def main() -> None:
        e = await engine_with(tmp_path, PROBE.format(interval=interval, work=0))
        t = e.task("probe")
        loop = asyncio.get_running_loop()
        await t.start()
        await asyncio.sleep(0.25)          # runs at 0, 0.1, 0.2
        await t.disable()
        paused_at = loop.time()
        runs_when_paused = t.runs
        await asyncio.sleep(0.43)          # ticks at 0.3 .. 0.6 are skipped
        assert t.runs == runs_when_paused  # no execution while paused
        assert t.skipped_paused >= 3
        resumed_at = loop.time()           # off phase: about 0.68
        await t.enable()
        await asyncio.sleep(0.25)
        await e.stop()
        log = probe_log(e)
        t0 = log[0][0]
        after = [at for at, _ in log if at > resumed_at]
        assert after, "ran again after resume"
        # the first run after resume waits for the next phase point, not the resume
        assert after[0] - resumed_at > 0.005
        for at in (x for x, _ in log):
            k = (at - t0) / interval
            assert abs(k - round(k)) < 0.3, f"run at {at - t0:.3f} s is off phase"
        assert all(not paused_at < at < resumed_at for at, _ in log)

    asyncio.run(main())


def test_an_execution_that_raises_moves_the_task_to_error(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, """\
            from sfc_host.engine import task

            class Jam(Exception):
                pass

            N = [0]

            @task(interval=0.01)
            async def feeder(api):
                N[0] += 1
                if N[0] == 2:
                    raise Jam("conveyor jammed")
        """)
        t = e.task("feeder")
        for _ in range(100):
            if t.state == "Error":
                break
            await asyncio.sleep(0.01)
        assert t.state == "Error"
        assert type(t.error).__name__ == "Jam" and str(t.error) == "conveyor jammed"
        assert t.error_text == "Jam: conveyor jammed (s.py line 12)"
        assert t.errors == 1
        runs = t.runs
        await asyncio.sleep(0.05)
        assert t.runs == runs              # the timer ended
        assert t.permitted() == ("Start",)
        assert await t.start() == "Running"   # Error --Start--> Running runs it again
        assert t.error is None
        await asyncio.sleep(0.05)
        assert t.runs > runs
        await e.stop()

    asyncio.run(main())


def test_a_sync_task_runs_in_a_thread_and_its_error_is_kept(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, """\
            import threading
            from sfc_host.engine import Variable, task

            THREADS = set()
            fail = Variable("fail", False)

            @task(interval=0.01)
            def blocking(api):
                THREADS.add(threading.get_ident())
                if fail.get():
                    raise ValueError("bad reading")
        """)
        t = e.task("blocking")
        await asyncio.sleep(0.05)
        threads = t.defn.fn.__globals__["THREADS"]
        assert threads and threading.get_ident() not in threads
        assert t.state == "Running"
        e.vars["fail"] = True
        for _ in range(100):
            if t.state == "Error":
                break
            await asyncio.sleep(0.01)
        assert t.state == "Error"
        assert isinstance(t.error, ValueError)
        assert t.error_text == "ValueError: bad reading (s.py line 11)"
        await e.stop()
        assert e.state == "Ready"          # a Task in Error is at rest

    asyncio.run(main())


def test_an_execution_that_outlasts_its_interval_is_not_run_twice(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, """\
            import asyncio
            from sfc_host.engine import task

            NOW = [0]
            MAX = [0]

            @task(interval=0.02)
            async def slow(api):
                NOW[0] += 1
                MAX[0] = max(MAX[0], NOW[0])
                await asyncio.sleep(0.07)
                NOW[0] -= 1
        """)
        await asyncio.sleep(0.3)
        t = e.task("slow")
        await e.stop()
        g = t.defn.fn.__globals__
        assert g["MAX"][0] == 1
        assert t.skipped_busy >= 5
        assert 3 <= t.runs <= 6

    asyncio.run(main())


def test_dispose_works_from_any_state_and_stops_first(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, """\
            import asyncio
            from sfc_host.engine import task

            @task(interval=0.01)
            async def a(api):
                await asyncio.sleep(0.03)

            @task(interval=0.01)
            async def b(api):
                pass

            @task(interval=0.01, auto_start=False)
            async def c(api):
                pass

            @task(interval=0.01)
            async def d(api):
                raise RuntimeError("x")
        """)
        await asyncio.sleep(0.05)
        await e.task("b").disable()
        a, b, c, d = (e.task(n) for n in "abcd")
        assert (a.state, b.state, c.state, d.state) == ("Running", "Paused", "Idle", "Error")
        for t in (a, b, c, d):
            await t.dispose()
            assert t.disposed
        assert (a.state, b.state, c.state, d.state) == ("Stopped", "Stopped", "Idle", "Error")
        runs = a.runs
        await asyncio.sleep(0.05)
        assert a.runs == runs
        with pytest.raises(TaskDisposed, match="task a is disposed"):
            await a.start()
        await a.dispose()                  # twice is fine
        await e.stop()

    asyncio.run(main())


def test_tasks_start_only_while_the_engine_starts_or_runs(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, PROBE.format(interval=0.05, work=0), start=False)
        with pytest.raises(EngineStateError, match="task probe can start only while the "
                                                   "engine is Starting or Running; it is "
                                                   "Ready"):
            await e.task("probe").start()
        assert e.task("probe").state == "Idle"

    asyncio.run(main())


def test_back_to_back_task_pauses_between_executions(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, """\
            import asyncio
            from sfc_host.engine import task

            @task(interval=0)
            async def loop(api):
                await asyncio.sleep(0.005)
        """)
        t = e.task("loop")
        await asyncio.sleep(0.1)
        assert t.runs >= 5
        await t.disable()
        runs = t.runs
        await asyncio.sleep(0.05)
        assert t.runs == runs
        await t.enable()
        await asyncio.sleep(0.05)
        assert t.runs > runs
        await e.stop()
        assert t.state == "Stopped"

    asyncio.run(main())


def test_stop_cancels_an_execution_past_the_stop_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        e = await engine_with(tmp_path, SLEEPER.format(interval=1, seconds=60))
        e.stop_timeout = 0.1
        await asyncio.sleep(0.02)
        t = e.task("sleeper")
        await e.stop()
        assert t.state == "Stopped" and e.state == "Ready"
        assert t.defn.fn.__globals__["CANCELLED"] == [1]
        assert t.errors == 0               # a cancelled execution is not an error

    asyncio.run(main())


def test_stopping_a_back_to_back_task_lets_its_execution_finish(tmp_path: Path) -> None:
    """The timer of a back-to-back task waits for each execution; ending the timer (a
    stop) must not cancel the execution in flight: it finishes within the stop
    timeout, as a host pass finishes the batch it holds."""
    async def main() -> None:
        e = await engine_with(tmp_path, SLEEPER.format(interval=0, seconds=0.2))
        e.stop_timeout = 5
        await asyncio.sleep(0.05)       # the first execution is under way
        t = e.task("sleeper")
        await e.stop()
        g = t.defn.fn.__globals__
        assert t.state == "Stopped"
        assert g["CANCELLED"] == [] and g["DONE"] == [1] and t.runs == 1

    asyncio.run(main())
