"""Mission rules: pause at a yield, resume right after it, cancel, final states, records."""

from __future__ import annotations

import asyncio
import json
import textwrap
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from sfc_fast.machines import MISSION, InvalidTransition
from sfc_host.engine import Engine, MemoryMissionStore, RedisMissionStore

MISSIONS = """\
    import asyncio
    from sfc_host.engine import mission

    TRACE = []
    GATE = asyncio.Event()
    TICKETS = asyncio.Queue()

    @mission
    async def checkpoints(api, n):
        for i in range(n):
            await TICKETS.get()
            TRACE.append(f"step {i}")
            yield i
            TRACE.append(f"after {i}")

    @mission
    async def steps(api, n):
        for i in range(n):
            TRACE.append(f"before {i}")
            yield i
            TRACE.append(f"after {i}")
            api.score += 10

    @mission
    async def gated(api):
        TRACE.append("waiting at the gate")
        await GATE.wait()
        TRACE.append("through the gate")
        yield "gate"
        TRACE.append("after the gate")

    @mission
    async def long_wait(api):
        try:
            TRACE.append("sleeping")
            await asyncio.sleep(60)
            yield
        finally:
            TRACE.append("cleanup")

    @mission
    async def forever(api):
        try:
            while True:
                await asyncio.sleep(0.005)
                yield
        finally:
            TRACE.append("closed")

    @mission
    async def broken(api):
        api.log.info("starting")
        yield
        raise RuntimeError("gripper lost the part")
"""


async def running_engine(folder: Path, store=None) -> Engine:
    (folder / "m.py").write_text(textwrap.dedent(MISSIONS))
    e = Engine(folder, store=store or MemoryMissionStore(), stop_timeout=2)
    assert await e.build() == []
    await e.start()
    return e


def trace(e: Engine) -> list[str]:
    return e.missions["steps"].fn.__globals__["TRACE"]


async def until(pred, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.002)


def test_a_paused_mission_resumes_exactly_after_the_yield_where_it_stopped(
        tmp_path: Path) -> None:
    states: list[str] = []

    async def main() -> None:
        e = await running_engine(tmp_path)
        g = e.missions["checkpoints"].fn.__globals__
        t, tickets = g["TRACE"], g["TICKETS"]
        m = e.create_mission("checkpoints", n=4)
        e.on_change(lambda _: states.append(m.state) if states[-1:] != [m.state] else None)
        await m.start()
        tickets.put_nowait(1)
        await until(lambda: t == ["step 0", "after 0"])    # waiting for its next ticket
        m.pause()
        assert m.state == "Pausing"
        tickets.put_nowait(1)
        await m.wait("Paused", timeout=2)
        assert t == ["step 0", "after 0", "step 1"]         # paused at the yield of step 1
        assert m.steps == 2 and m.last_value == 1
        tickets.put_nowait(1)
        tickets.put_nowait(1)
        await asyncio.sleep(0.1)
        assert t == ["step 0", "after 0", "step 1"]         # not advanced while paused
        assert tickets.qsize() == 2
        m.resume()
        assert await m.join(2) == "Completed"
        assert t == ["step 0", "after 0", "step 1", "after 1", "step 2", "after 2",
                     "step 3", "after 3"]                   # went on right after that yield
        assert m.steps == 4 and tickets.qsize() == 0
        assert m.record["paused_ms"] >= 90
        await e.stop()

    asyncio.run(main())
    assert states == ["Running", "Pausing", "Paused", "Resuming", "Running", "Completed"]


def test_a_pause_before_the_first_step_holds_the_mission_before_it_begins(
        tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        m = await e.start_mission("steps", n=2)
        m.pause()                      # the generator has not been advanced yet
        await m.wait("Paused", timeout=2)
        assert trace(e) == [] and m.steps == 0
        m.resume()
        assert await m.join(2) == "Completed"
        assert trace(e) == ["before 0", "after 0", "before 1", "after 1"]
        assert m.score == 20
        await e.stop()

    asyncio.run(main())


def test_pause_takes_effect_at_the_next_yield(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        g = e.missions["gated"].fn.__globals__
        m = await e.start_mission("gated")
        await until(lambda: "waiting at the gate" in g["TRACE"])
        m.pause()
        await asyncio.sleep(0.05)
        assert m.state == "Pausing"          # still inside its step
        with pytest.raises(InvalidTransition, match="Cancel is not permitted in state Pausing"):
            m.cancel()
        g["GATE"].set()
        await m.wait("Paused", timeout=2)
        assert g["TRACE"][-1] == "through the gate" and m.last_value == "gate"
        m.resume()
        assert await m.join(2) == "Completed"
        assert g["TRACE"][-1] == "after the gate"
        await e.stop()

    asyncio.run(main())


def test_the_engine_stop_cancels_a_mission_caught_in_pausing(tmp_path: Path) -> None:
    states: list[str] = []

    async def main() -> None:
        e = await running_engine(tmp_path)
        g = e.missions["gated"].fn.__globals__
        m = await e.start_mission("gated")
        e.on_change(lambda _: states.append(m.state) if states[-1:] != [m.state] else None)
        await until(lambda: "waiting at the gate" in g["TRACE"])
        m.pause()
        await e.stop()                       # the gate never opens
        assert m.state == "Canceled" and e.state == "Ready"
        assert "through the gate" not in g["TRACE"]

    asyncio.run(main())
    assert states == ["Pausing", "Paused", "Canceling", "Canceled"]


def test_cancel_from_running_interrupts_the_step_and_runs_cleanup(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        g = e.missions["long_wait"].fn.__globals__
        m = await e.start_mission("long_wait")
        await until(lambda: "sleeping" in g["TRACE"])
        assert m.cancel() == "Canceling"
        assert await m.join(2) == "Canceled"
        assert g["TRACE"] == ["sleeping", "cleanup"]
        assert m.record["state"] == "Canceled" and m.record["error"] is None
        await e.stop()

    asyncio.run(main())


def test_cancel_from_paused_closes_the_generator(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        g = e.missions["forever"].fn.__globals__
        m = await e.start_mission("forever")
        await asyncio.sleep(0.02)
        m.pause()
        await m.wait("Paused", timeout=2)
        assert "closed" not in g["TRACE"]
        m.cancel()
        assert await m.join(2) == "Canceled"
        assert g["TRACE"] == ["closed"]
        await e.stop()

    asyncio.run(main())


def test_refused_operations_and_final_states(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        m = e.create_mission("steps", n=1)
        for op in (m.pause, m.resume, m.cancel):
            with pytest.raises(InvalidTransition, match="not permitted in state Idle"):
                op()
        await m.start()
        with pytest.raises(InvalidTransition, match="Start is not permitted in state Running"):
            await m.start()
        with pytest.raises(InvalidTransition, match="Resume is not permitted in state Running"):
            m.resume()
        assert await m.join(2) == "Completed"
        assert MISSION.is_final(m.state) and m.permitted() == ()
        for op in (m.pause, m.resume, m.cancel):
            with pytest.raises(InvalidTransition, match="none, it is final"):
                op()
        with pytest.raises(InvalidTransition):
            await m.start()                  # an instance runs once: create a new one
        again = await e.start_mission("steps", n=1)
        assert again.id != m.id and await again.join(2) == "Completed"
        await e.stop()

    asyncio.run(main())


def test_an_exception_ends_the_mission_in_error_and_is_recorded(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        m = await e.start_mission("broken")
        assert await m.join(2) == "Error"
        line = textwrap.dedent(MISSIONS).splitlines().index(
            '    raise RuntimeError("gripper lost the part")') + 1
        assert m.error_text == f"RuntimeError: gripper lost the part (m.py line {line})"
        rec = await e.store.get(m.id)
        assert rec["state"] == "Error" and rec["error"] == m.error_text
        assert rec["log"][0]["msg"] == "starting"
        bad = await e.start_mission("steps", wrong=1)     # wrong arguments: Error too
        assert await bad.join(2) == "Error"
        assert "unexpected keyword argument 'wrong'" in bad.error_text
        await e.stop()

    asyncio.run(main())


def test_many_instances_run_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        e = await running_engine(tmp_path)
        ms = [await e.start_mission("steps", n=5) for _ in range(25)]
        assert len(e.instances) == 25
        assert {m.state for m in ms} == {"Running"}
        for m in ms[::2]:
            m.pause()
        await asyncio.gather(*(m.wait("Paused") for m in ms[::2]))
        done = await asyncio.gather(*(m.join(3) for m in ms[1::2]))
        assert set(done) == {"Completed"}
        for m in ms[::2]:
            m.resume()
        assert set(await asyncio.gather(*(m.join(3) for m in ms))) == {"Completed"}
        assert e.instances == {}               # each disposed after its record
        assert len(await e.store.list(limit=100)) == 25
        t = trace(e)
        assert t.count("after 4") == 25
        await e.stop()

    asyncio.run(main())


# ---- records in Redis (a real redis-server) -------------------------------------------


def test_a_mission_record_is_in_redis_after_it_ends(tmp_path: Path, redis_url: str) -> None:
    prefix = f"test:{uuid.uuid4().hex[:8]}:"

    async def main() -> None:
        store = RedisMissionStore(aioredis.Redis.from_url(redis_url), prefix=prefix)
        e = await running_engine(tmp_path, store)
        ok = await e.start_mission("steps", n=3)
        bad = await e.start_mission("broken")
        stopped = await e.start_mission("forever")
        assert await ok.join(2) == "Completed" and await bad.join(2) == "Error"
        await e.stop()                       # cancels the one still running
        assert stopped.state == "Canceled"
        r = aioredis.Redis.from_url(redis_url)
        raw = await r.get(f"{prefix}mission:{ok.id}")
        assert raw is not None
        rec = json.loads(raw)
        assert rec["state"] == "Completed" and rec["score"] == 30 and rec["steps"] == 3
        assert rec["args"] == {"n": 3}
        for k in ("created_at", "started_at", "ended_at", "duration_ms", "running_ms",
                  "paused_ms"):
            assert isinstance(rec[k], int), k
        assert rec["ended_at"] >= rec["started_at"] >= rec["created_at"]
        assert 0 < await r.ttl(f"{prefix}mission:{ok.id}") <= 30 * 86400
        index = [x.decode() for x in await r.zrange(f"{prefix}missions", 0, -1)]
        assert sorted(index) == sorted([ok.id, bad.id, stopped.id])
        assert [x["id"] for x in await store.list(state="Error")] == [bad.id]
        assert [x["id"] for x in await store.list(name="steps")] == [ok.id]
        assert len(await store.list(limit=2)) == 2
        await r.delete(f"{prefix}mission:{ok.id}")          # expired: dropped from index
        assert {x["id"] for x in await store.list()} == {bad.id, stopped.id}
        assert await r.zcard(f"{prefix}missions") == 2
        await r.aclose()
        await store.close()

    asyncio.run(main())


def test_records_survive_a_redis_outage(tmp_path: Path, make_redis) -> None:
    server = make_redis()

    async def main() -> None:
        store = RedisMissionStore(aioredis.Redis.from_url(server.url), prefix="o:")
        e = await running_engine(tmp_path, store)
        server.stop()
        first = await e.start_mission("steps", n=1)
        assert await first.join(5) == "Completed"
        assert not first.saved and len(e.unsaved) == 1     # kept, not lost
        server.start()
        second = await e.start_mission("steps", n=1)
        assert await second.join(5) == "Completed"
        assert second.saved and len(e.unsaved) == 0
        ids = {x["id"] for x in await store.list()}
        assert ids == {first.id, second.id}
        await e.stop()
        await store.close()

    asyncio.run(main())
