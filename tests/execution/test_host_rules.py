"""The host's Redis-side rules, one test each, against a real redis-server."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import Station, flush, quick_config, quiet, torque_ok, wait_until, work_master

from sfc_fast.events import Completed
from sfc_host.execution.host import Host
from sfc_host.store import states as store_mod
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.states import Record

S = "line1"
K = ScopeKeys(S)


async def _host(redis_url: str, station: Station | None = None, ended: list | None = None,
                **kw: Any) -> Host:
    await flush(redis_url)
    st = station or Station(torque_ok)
    host = Host(quick_config(redis_url, **kw), st.sink,
                on_end=(lambda s, j, d: ended.append((j, d.status, d.reason)))
                if ended is not None else None)
    st.attach(host)
    await host.store.put_work_master(S, work_master("tighten_rework", "wm1"))
    await host.add_scope(S)
    await host.start()
    return host


async def _order_state(host: Host, job: str) -> str | None:
    o = await host.orders.get(S, job)
    return o["state"] if o else None


def test_job_runs_to_completion_with_response_and_clean_indexes(redis_url: str) -> None:
    async def main() -> None:
        ended: list = []
        st = Station(torque_ok)
        host = await _host(redis_url, st, ended)
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: ended, what="job end")
            assert ended == [("J1", "completed", None)]
            assert st.ids() == ["J1:load_part#1", "J1:tighten#2", "J1:unload_part#3"]
            await wait_until(lambda: _order_state(host, "J1"), what="order")
            assert await wait_until(
                lambda: _is(host, "J1", "Ended_Completed"), what="Ended_Completed")
            resp = json.loads(await host.client.get(K.response("J1")))
            assert resp["JobOrderID"] == "J1" and resp["StartTime"] <= resp["EndTime"]
            assert {"ID": "tighten.torque", "Value": 85} in resp["JobResponseData"]
            c = host.client
            assert await c.zcard(K.due) == 0 and await c.scard(K.active) == 0
            view = await host.inspect(S, "J1")
            assert view["status"] == "completed"
            assert view["markers"]["sent:tighten"].endswith(":J1:tighten#2")
        finally:
            await host.aclose()
    run(main())


@pytest.mark.parametrize("cached_max", [None, 0])
def test_a_job_s_end_builds_its_response_from_the_archive_it_wrote(
        redis_url: str, monkeypatch: pytest.MonkeyPatch, cached_max: int | None) -> None:
    """The host that wrote every event of a job keeps its archive in the cache, so the
    end writes the job response without reading the job first; an archive too long to
    keep (``CACHED_ARCHIVE_MAX``, 0 here) is read then. The response is the same."""
    if cached_max is not None:
        monkeypatch.setattr(store_mod, "CACHED_ARCHIVE_MAX", cached_max)

    async def main() -> None:
        ended: list = []
        host = await _host(redis_url, Station(torque_ok), ended)
        reads: list[int] = []
        read_archives = host.store.read_archives

        async def counted(jobs: Any) -> Any:
            reads.append(len(jobs))
            return await read_archives(jobs)
        host.store.read_archives = counted  # type: ignore[method-assign]
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: ended, what="job end")
            resp = json.loads(await wait_until(lambda: host.client.get(K.response("J1")),
                                               what="response"))
            assert resp["JobResponseData"] == [{"ID": "tighten.torque", "Value": 85}]
            assert reads == ([] if cached_max is None else [1])
        finally:
            await host.aclose()
    run(main())


def test_a_start_reads_its_job_with_its_order(redis_url: str) -> None:
    """A start entry's job is read in the same pipeline as its order, and the settle
    takes that row instead of reading the job again: one round trip for both, and no
    second read of the job from entry to first command."""
    async def main() -> None:
        st = Station(lambda c: False)
        host = await _host(redis_url, st)
        seen: list[str] = []
        load, both = host.store.load, host.store.orders_and_jobs

        async def loading(wanted: Any) -> Any:
            seen.append(f"load {sorted(j for js in wanted.values() for j in js)}")
            return await load(wanted)

        async def reading(pairs: Any, wanted: Any) -> Any:
            seen.append(f"orders {[j for _, j in pairs]} and jobs {dict(wanted)}")
            return await both(pairs, wanted)
        host.store.load = loading  # type: ignore[method-assign]
        host.store.orders_and_jobs = reading  # type: ignore[method-assign]
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: st.commands, what="first command")
            assert st.ids() == ["J1:load_part#1"]
            assert seen == [f"orders ['J1'] and jobs {{'{S}': ['J1']}}"], seen
        finally:
            await host.aclose()
    run(main())


@pytest.mark.parametrize("written_elsewhere", [False, True])
def test_the_recipe_s_order_transitions_use_the_order_this_host_wrote(
        redis_url: str, written_elsewhere: bool) -> None:
    """Run and Complete take the order as this host read it at the start or wrote it
    since, with no read of their own; when the order was written elsewhere meanwhile
    (its version moved), the transition loses the version check, reads the order and
    is made all the same."""
    async def main() -> None:
        ended: list = []
        hold = asyncio.Event()
        st = Station(lambda c: False if c.action == "unload_part" and not hold.is_set()
                     else torque_ok(c))
        host = await _host(redis_url, st, ended)
        reads: list[list[str]] = []
        orders_many = host.store.orders_many

        async def reading(jobs: Any) -> Any:
            if jobs:
                reads.append([j for _, j in jobs])
            return await orders_many(jobs)
        host.store.orders_many = reading  # type: ignore[method-assign]
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: len(st.commands) == 3, what="the last command")
            assert await wait_until(lambda: _is(host, "J1", "Running"), what="Running")
            if written_elsewhere:
                await host.client.hincrby(K.order("J1"), "v", 1)
            hold.set()
            host.answer(S, Completed(st.commands[-1].command_id))
            await wait_until(lambda: ended, what="job end")
            assert await wait_until(lambda: _is(host, "J1", "Ended_Completed"),
                                    what="Ended_Completed")
            assert reads == []      # the start's order came with its job; no other read
            assert host.orders.known(S, "J1") is None       # ended: forgotten
        finally:
            await host.aclose()
    run(main())


@pytest.mark.parametrize("kind", ["sync", "async", "raising", "raising_async"])
def test_the_order_change_hook_sees_every_change_and_its_faults_stop_nothing(
        redis_url: str, kind: str) -> None:
    """The order's ``on_change`` hook is told of every write, the MES's and the recipe's
    own (Run, Complete), in order: a synchronous hook at once, an asynchronous one
    awaited. A hook that raises is logged and counted (``order_hook_errors``), and the
    order and the job go on."""
    async def main() -> None:
        ended: list = []
        host = await _host(redis_url, None, ended)
        seen: list[tuple[str, str, str]] = []
        runs_in: list[str] = []      # the coroutine of the task each call ran in

        def sync_hook(scope: str, job: str, old: str, new: str, h: dict, cause: Any) -> None:
            seen.append((job, old, new))
            task = asyncio.current_task()
            runs_in.append(task.get_coro().__qualname__ if task is not None else "")
            assert h["state"] == new
            if kind == "raising":
                raise RuntimeError("hook fault")

        async def async_hook(scope: str, job: str, old: str, new: str, h: dict,
                             cause: Any) -> None:
            await asyncio.sleep(0)
            seen.append((job, old, new))
            if kind == "raising_async":
                raise RuntimeError("hook fault")

        host.orders.on_change = sync_hook if kind in ("sync", "raising") else async_hook
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: ended, what="job end")
            assert await wait_until(lambda: _is(host, "J1", "Ended_Completed"),
                                    what="Ended_Completed")
            await wait_until(lambda: seen and seen[-1][2] == "Ended_Completed",
                             what="the hook told of the end")
            assert ended == [("J1", "completed", None)]
            news = [new for _, _, new in seen]
            assert news.index("Running") < news.index("Ended_Completed")
            # every change follows the one before it
            for (_, _, prev), (_, old, _) in itertools.pairwise(seen):
                assert old == prev
            if kind in ("sync", "raising"):
                # at once, in the task of the write: no task of its own per change
                assert "Orders._notify" not in runs_in and len(runs_in) == len(seen)
            faults = host.metrics["order_hook_errors"]
            assert faults == (len(seen) if kind.startswith("raising") else 0)
        finally:
            await host.aclose()
    run(main())


async def _is(host: Host, job: str, state: str) -> bool:
    return await _order_state(host, job) == state


def test_start_twice_is_absorbed(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)   # no answers: the job stays running
        host = await _host(redis_url, st)
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: st.commands, what="first command")
            v1 = (await host.inspect(S, "J1"))["version"]
            await host.client.xadd(K.work, {"k": "start", "j": "J1"})
            await host.client.xadd(K.work, {"k": "start", "j": "J1"})
            await wait_until(lambda: quiet(host), what="entries handled")
            await asyncio.sleep(0.1)
            view = await host.inspect(S, "J1")
            assert view["version"] == v1 and view["status"] == "running"
            assert st.ids() == ["J1:load_part#1"]
        finally:
            await host.aclose()
    run(main())


def test_restored_job_id_replaces_the_ended_job(redis_url: str) -> None:
    async def main() -> None:
        ended: list = []
        st = Station(torque_ok)
        host = await _host(redis_url, st, ended)
        try:
            order = {"JobOrderID": "J1", "WorkMasterID": [{"ID": "wm1"}]}
            await host.orders.store_order(S, order, start=True)
            await wait_until(lambda: ended, what="first run")
            await wait_until(lambda: _is(host, "J1", "Ended_Completed"), what="completed")
            # The same order again (an MES repeating a Store whose reply it lost) changes
            # nothing; once cleared the id can be stored again.
            assert await host.orders.store_order(S, order, start=True) == "Ended_Completed"
            assert len(ended) == 1
            await host.orders.trigger(S, "J1", "Clear")
            first = (await host.inspect(S, "J1"))["started_ms"]
            await host.orders.store_order(S, order, start=True)
            await wait_until(lambda: len(ended) == 2, what="second run")
            view = await host.inspect(S, "J1")
            assert view["status"] == "completed" and view["started_ms"] >= first
            # The second run numbers its commands after the first run's (no command id
            # is given out twice: receivers deduplicate by id), and all went out.
            assert st.ids()[3:] == ["J1:load_part#4", "J1:tighten#5", "J1:unload_part#6"]
            # Stored again with another recipe, whose graph cannot read the ended state:
            # the count of its commands comes with the Start, and the ids go on.
            other = work_master("tighten_rework", "wm2")
            other["data"]["Actions"][0]["TimeoutSeconds"] += 1
            await host.store.put_work_master(S, other)
            await host.orders.trigger(S, "J1", "Clear")
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm2"}]}, start=True)
            await wait_until(lambda: len(ended) == 3, what="third run, another recipe")
            assert (await host.inspect(S, "J1"))["status"] == "completed"
            assert st.ids()[6:] == ["J1:load_part#7", "J1:tighten#8", "J1:unload_part#9"]
        finally:
            await host.aclose()
    run(main())


def test_a_cleared_order_leaves_redis_after_the_retention(redis_url: str) -> None:
    """Clear and Cancel put the order, its job state and its job response on one timer
    (``ended_retention_s``), so ended orders do not pile up in Redis. A Store of the id
    within it takes the order off the timer (the new run replaces the job state, the
    old response is dropped); after it nothing of the id is left, and the id is stored
    as a new one."""
    async def main() -> None:
        ended: list = []
        st = Station(torque_ok)
        host = await _host(redis_url, st, ended, ended_retention_s=3600)
        c = host.client
        keys = (K.order("J1"), K.job("J1"), K.response("J1"))
        try:
            order = {"JobOrderID": "J1", "WorkMasterID": [{"ID": "wm1"}]}
            await host.orders.store_order(S, order, start=True)
            await wait_until(lambda: _is(host, "J1", "Ended_Completed"), what="completed")
            assert [await c.ttl(k) for k in keys] == [-1, -1, -1]
            await host.orders.trigger(S, "J1", "Clear")
            ttls = [await c.ttl(k) for k in keys]
            assert all(3590 < t <= 3600 for t in ttls), ttls
            await host.orders.store_order(S, order, start=True)       # within the retention
            assert await c.ttl(K.order("J1")) == -1
            await wait_until(lambda: len(ended) == 2, what="second run")
            await wait_until(lambda: _is(host, "J1", "Ended_Completed"), what="completed again")
            assert [await c.ttl(k) for k in keys] == [-1, -1, -1]
            host.orders.ended_retention_s = 1
            await host.orders.trigger(S, "J1", "Clear")

            async def gone() -> bool:
                return not await c.exists(*keys)
            await wait_until(gone, 5, "the order, job state and response expired")
            await host.orders.store_order(S, order, start=True)       # a new id again
            await wait_until(lambda: len(ended) == 3, what="third run")
            # Cancel (an order that never ran) is on the timer too
            await host.orders.store_order(S, {"JobOrderID": "C1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=False)
            host.orders.ended_retention_s = 3600
            await host.orders.trigger(S, "C1", "Cancel")
            assert 3590 < await c.ttl(K.order("C1")) <= 3600
            # 0 keeps them
            host.orders.ended_retention_s = 0
            await host.orders.trigger(S, "J1", "Clear")
            assert [await c.ttl(k) for k in keys] == [-1, -1, -1]
        finally:
            await host.aclose()
    run(main())


@pytest.mark.parametrize("case", ["missing", "no_data", "bad_schema", "compile_error"])
def test_unusable_recipe_aborts_the_job_with_its_reason(redis_url: str, case: str) -> None:
    async def main() -> None:
        st = Station(torque_ok)
        host = await _host(redis_url, st)
        try:
            wm = work_master("tighten_rework", "wm2")
            if case == "no_data":
                wm["data"] = None
            elif case == "bad_schema":
                wm["dataschema"] = "https://example.com/other/v9/"
            elif case == "compile_error":
                wm["data"]["Steps"][0]["Initial"] = False
            await host.store.put_work_master(S, wm)
            await host.orders.store_order(S, {"JobOrderID": "J2",
                                              "WorkMasterID": [{"ID": "wm2"}]}, start=True)
            if case == "missing":
                await host.store.delete_work_master(S, "wm2")
            await wait_until(lambda: _is(host, "J2", "Aborted"), what="order aborted")
            reason = (await host.orders.get(S, "J2"))["reason"]
            expect = {"missing": "not known", "no_data": "no recipe data",
                      "bad_schema": "does not compile", "compile_error": "SFC"}[case]
            assert expect in reason
            assert await host.inspect(S, "J2") is None
            assert st.commands == []
            assert host.metrics["unusable_recipes"] == 1
        finally:
            await host.aclose()
    run(main())


def test_garbled_entries_are_acked_and_counted(redis_url: str) -> None:
    async def main() -> None:
        host = await _host(redis_url)
        try:
            bad = [{"x": "1"}, {"k": "nonsense", "j": "J"}, {"k": "start"},
                   {"k": "tick", "j": "J1\nJ2\n"}, {"k": "event", "t": "T", "d": "[1"},
                   {"k": "job", "j": "J", "a": "Explode"}, {"k": "dispatch:a", "j": "J"},
                   {"k": b"\xff\xfe", "j": "J"}, {"k": "start", "j": "a{b}"}]
            for f in bad:
                await host.client.xadd(K.work, f)
            await wait_until(lambda: host.metrics["invalid_entries"] == len(bad),
                             what="all counted")
            await wait_until(lambda: quiet(host), what="all acked")
            # The host keeps serving.
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: _is(host, "J1", "Ended_Completed"), what="job done")
        finally:
            await host.aclose()
    run(main())


def test_entry_that_raises_stays_pending_then_goes_to_the_dead_stream(redis_url: str) -> None:
    async def main() -> None:
        host = await _host(redis_url, Station(lambda c: False))
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: _is(host, "J1", "Running"), what="running")
            await wait_until(lambda: quiet(host), what="quiet")
            # A state that cannot be decoded: every handler of the job raises.
            await host.client.hset(K.job("J1"), "s", b"garbage")
            eid = await host.client.xadd(K.work, {"k": "tick", "j": "J1"})
            await wait_until(lambda: host.metrics["entry_failures"] >= 1, what="failure")
            p = await host.client.xpending(K.work, host.config.group)
            assert p["pending"] == 1        # not acked after the handler failed
            await wait_until(lambda: host.metrics["dead_entries"] == 1, timeout=15,
                             what="dead letter")
            dead = await host.client.xrange(K.dead)
            assert len(dead) == 1
            fields = dead[0][1]
            assert fields[b"id"] == eid and fields[b"k"] == b"tick"
            assert b"StateFormatError" in fields[b"reason"]
            assert host.metrics["entry_failures"] == host.config.max_deliveries
            assert (await host.client.xpending(K.work, host.config.group))["pending"] == 0
            assert not await host.client.hlen(K.errors)
        finally:
            await host.aclose()
    run(main())


def test_scripts_are_loaded_again_after_script_flush(redis_url: str) -> None:
    async def main() -> None:
        ended: list = []
        host = await _host(redis_url, Station(torque_ok), ended)
        try:
            await host.client.script_flush()
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: ended, what="job end")
            assert ended[0][1] == "completed"
            assert host.scripts.reloads >= 1
            # the script calls went through the host's pipelined channel
            assert host.scripts.channel is host.channel and host.channel is not None
            assert host.channel.writes > 0
        finally:
            await host.aclose()
    run(main())


def test_order_writes_of_one_loop_pass_go_out_together(redis_url: str) -> None:
    """A burst of order stores (an MES storing many at once) costs one pipeline of
    order-script calls; each keeps its own result, and a refused one is refused alone."""
    from sfc_host.store.orders import UNABLE_TO_ACCEPT_JOB_ORDER, OrderError

    async def main() -> None:
        ended: list = []
        host = await _host(redis_url, Station(torque_ok), ended)
        batches: list[int] = []
        run_calls = host.scripts.run

        async def counted(calls: Any) -> list[Any]:
            batches.append(len(calls))
            return await run_calls(calls)
        host.scripts.run = counted  # type: ignore[method-assign]
        try:
            async def store(job: str, wm: str) -> str | OrderError:
                try:
                    return await host.orders.store_order(
                        S, {"JobOrderID": job, "WorkMasterID": [{"ID": wm}]}, start=True)
                except OrderError as e:
                    return e
            jobs = [f"B{i}" for i in range(20)]
            got = await asyncio.gather(*(store(j, "wm1") for j in jobs),
                                       store("BAD", "no-such-wm"))
            assert got[:-1] == ["AllowedToStart_Ready"] * 20
            assert isinstance(got[-1], OrderError)
            assert got[-1].status == UNABLE_TO_ACCEPT_JOB_ORDER
            assert 21 in batches          # the 21 order writes were one pipeline
            assert await host.orders.get(S, "BAD") is None
            await wait_until(lambda: len(ended) == 20, what="every job of the burst ends")
            assert sorted(j for j, status, _ in ended if status == "completed") == sorted(jobs)
        finally:
            host.scripts.run = run_calls  # type: ignore[method-assign]
            await host.aclose()
    run(main())


async def _one_job_sent(redis_url: str) -> Host:
    """A host with job J1 started, its first command sent and never answered."""
    st = Station(lambda c: False)
    host = await _host(redis_url, st)
    await host.orders.store_order(S, {"JobOrderID": "J1",
                                      "WorkMasterID": [{"ID": "wm1"}]}, start=True)
    await wait_until(lambda: st.commands, what="command")
    await wait_until(lambda: quiet(host), what="quiet")
    return host


def test_tick_that_writes_nothing_puts_the_job_back(redis_url: str) -> None:
    async def main() -> None:
        host = await _one_job_sent(redis_url)
        try:
            deadline = await host.client.zscore(K.due, "J1")
            assert deadline is not None
            version = (await host.inspect(S, "J1"))["version"]
            # A sweep popped it early (as after a clock step): the tick finds nothing due.
            await host.client.zrem(K.due, "J1")
            await host.client.xadd(K.work, {"k": "tick", "j": "J1"})
            await wait_until(lambda: host.client.zscore(K.due, "J1"), what="put back")
            assert await host.client.zscore(K.due, "J1") == deadline
            assert (await host.inspect(S, "J1"))["version"] == version   # nothing written
        finally:
            await host.aclose()
    run(main())


def test_an_outage_moves_every_deadline_at_once_and_each_state_catches_up(
        redis_url: str) -> None:
    """An outage's gap reaches every job of the scope in one step, however many there
    are (more than a sweep takes here): the sweep adds it to the scope's offset, no job
    is written for it, and each state takes the gap when it is next read."""
    async def main() -> None:
        st = Station(lambda c: False)
        host = await _host(redis_url, st, outage_threshold_ms=1000, sweep_limit=3)
        try:
            jobs = [f"J{i}" for i in range(8)]
            for j in jobs:
                await host.orders.store_order(S, {"JobOrderID": j,
                                                  "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: len(st.commands) == len(jobs), what="commands")
            await wait_until(lambda: quiet(host), what="quiet")
            before = {j: (await host.inspect(S, j))["actions"]["load_part"]["deadline_ms"]
                      for j in jobs}
            gap = 25_000
            await host.client.set(K.heartbeat, await host.store.now_ms() - gap)
            stored = {j: await host.client.hget(K.job(j), "s") for j in jobs}
            await wait_until(lambda: host.metrics["outages"] >= 1, what="outage seen")
            await wait_until(lambda: quiet(host), what="quiet")
            offset = int(await host.client.get(K.offset))
            assert gap <= offset <= gap + 2000
            for j in jobs:
                # the stored state is as it was: the outage wrote nothing per job
                assert await host.client.hget(K.job(j), "s") == stored[j]
                assert await host.client.hget(K.job(j), "o") is None
                a = (await host.inspect(S, j))["actions"]["load_part"]
                assert a["attempt"] == 1 and a["command_id"] == f"{j}:load_part#1"
                assert a["deadline_ms"] - before[j] == offset, j
                assert await host.client.zscore(K.due, j) + offset == a["deadline_ms"]
            assert len(st.commands) == len(jobs)       # nothing timed out or re-sent
            assert host.metrics["outages"] == 1
            # The next event of a job writes its state with the gap in it.
            host.answer(S, Completed(st.commands[0].command_id, None))
            await wait_until(lambda: len(st.commands) > len(jobs), what="next command")
            await wait_until(lambda: quiet(host), what="quiet")
            j0 = st.commands[0].job
            assert int(await host.client.hget(K.job(j0), "o")) == offset
            view = await host.inspect(S, j0)
            assert view["actions"]["load_part"]["phase"] != "open"
            nxt = [a for a in view["actions"].values() if a.get("deadline_ms") is not None]
            assert nxt
            for a in nxt:     # a fresh deadline (tighten: 30 s) is not moved by the gap
                assert a["deadline_ms"] <= await host.store.now_ms() + 30_000
                assert await host.client.zscore(K.due, j0) + offset == a["deadline_ms"]
        finally:
            await host.aclose()
    run(main())


def test_outage_moves_deadlines_instead_of_timing_out(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        host = await _host(redis_url, st, outage_threshold_ms=1000)
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: st.commands, what="command")
            before = (await host.inspect(S, "J1"))["actions"]["load_part"]["deadline_ms"]
            # The scope was not swept for 25 s, longer than the action's 20 s timeout.
            now = await host.store.now_ms()
            gap = 25_000
            await host.client.set(K.heartbeat, now - gap)
            await wait_until(lambda: host.metrics["outages"] >= 1, what="outage seen")
            await wait_until(lambda: quiet(host), what="quiet")
            view = await host.inspect(S, "J1")
            assert view["status"] == "running"          # no timeout
            a = view["actions"]["load_part"]
            assert a["attempt"] == 1 and a["command_id"] == "J1:load_part#1"
            assert gap <= a["deadline_ms"] - before <= gap + 2000
            offset = int(await host.client.get(K.offset))
            assert await host.client.zscore(K.due, "J1") + offset == a["deadline_ms"]
            assert st.ids() == ["J1:load_part#1"]
        finally:
            await host.aclose()
    run(main())


def test_a_state_read_before_an_outage_is_not_written_after_it(redis_url: str) -> None:
    """The compare-and-set refuses a state shifted to an older scope offset than the
    one in Redis (an outage was recorded after the read: the state has not seen its
    gap); the job is read again, caught up, and written with the new offset. A record
    that only touches the index still applies (its score does not depend on it)."""
    async def main() -> None:
        host = await _one_job_sent(redis_url)
        try:
            _, rows = (await host.store.load({S: ["J1"]}))[S]
            row = rows["J1"]
            assert row.offset == 0
            await host.client.incrby(K.offset, 7_000)     # an outage's sweep, meanwhile
            stale = Record("J1", row.version, row.state, 10**12, True, offset=0)
            res = await host.store.commit({S: [stale]})
            assert res[S].versions == [0]
            index_only = Record("J1", row.version, None, 10**12, None, offset=0)
            assert (await host.store.commit({S: [index_only]}))[S].versions[0] > 0
            assert await host.client.zscore(K.due, "J1") == 10**12
            # read again: caught up to the new offset, and then it is written
            _, rows = (await host.store.load({S: ["J1"]}))[S]
            again = rows["J1"]
            assert again.offset == 7_000 and again.state != row.state
            rec = Record("J1", again.version, again.state, 10**12 + 7_000, True, offset=7_000)
            assert (await host.store.commit({S: [rec]}))[S].versions[0] > 0
            assert await host.client.hget(K.job("J1"), "o") == b"7000"
            assert await host.client.zscore(K.due, "J1") == 10**12
        finally:
            await host.aclose()
    run(main())


def test_a_version_redis_lost_is_not_given_out_again(redis_url: str) -> None:
    """A crash or failover that loses writes takes a job back to an older version.
    The next write's version is above every version given out before (the server
    clock), so a state a host kept from the lost write cannot win a compare-and-set
    against the job's new state: its record loses and the job is read again."""
    async def main() -> None:
        host = await _one_job_sent(redis_url)
        try:
            _, rows = (await host.store.load({S: ["J1"]}))[S]
            old = rows["J1"]
            rec = Record("J1", old.version, old.state, 10**12, True, offset=0)
            lost = (await host.store.commit({S: [rec]}))[S].versions[0]
            assert lost > int(old.version)
            await host.client.hset(K.job("J1"), "v", old.version)   # the write is lost
            again = Record("J1", old.version, old.state, 10**12 + 1, True, offset=0)
            new = (await host.store.commit({S: [again]}))[S].versions[0]
            assert new > lost
            assert await host.client.hget(K.job("J1"), "v") == str(new).encode()
            kept = Record("J1", str(lost).encode(), old.state, 10**12 + 2, True, offset=0)
            assert (await host.store.commit({S: [kept]}))[S].versions == [0]
            assert await host.client.zscore(K.due, "J1") == 10**12 + 1
        finally:
            await host.aclose()
    run(main())


def test_a_tick_of_several_jobs_is_done_when_every_job_is(redis_url: str) -> None:
    """A sweep's tick entry names several jobs: each is settled; the entry is acked only
    when all of them are, else it stays pending with the first failure's reason (counted
    once) and the others are settled all the same."""
    async def main() -> None:
        st = Station(lambda c: False)
        host = await _host(redis_url, st, claim_min_idle_ms=60_000)   # no redelivery
        try:
            jobs = ["J1", "J2", "J3"]
            for j in jobs:
                await host.orders.store_order(S, {"JobOrderID": j,
                                                  "WorkMasterID": [{"ID": "wm1"}]}, start=True)
            await wait_until(lambda: len(st.commands) == 3, what="commands")
            await wait_until(lambda: quiet(host), what="quiet")
            for j in jobs:         # as a sweep would: off the index, one entry for all
                await host.client.zrem(K.due, j)
            await host.client.xadd(K.work, {"k": "tick", "j": "J1\nJ2\nJ3"})
            await wait_until(lambda: quiet(host), what="the tick entry acked")
            for j in jobs:         # nothing due yet: each put back, nothing written
                assert await host.client.zscore(K.due, j) is not None
            # J2's state is unreadable: the entry stays pending with the reason
            await host.client.hset(K.job("J2"), "s", b"\x00garbage")
            failures = host.metrics["entry_failures"]
            for j in jobs:
                await host.client.zrem(K.due, j)
            eid = await host.client.xadd(K.work, {"k": "tick", "j": "J1\nJ2\nJ3"})
            await wait_until(lambda: host.client.hget(K.errors, eid), what="the reason")
            reason = (await host.client.hget(K.errors, eid)).decode()
            assert reason.startswith("StateFormatError: not a job state document"), reason
            assert host.metrics["entry_failures"] == failures + 1
            pending = await host.client.xpending(K.work, host.config.group)
            assert pending["pending"] == 1
            for j in ("J1", "J3"):  # settled all the same
                assert await host.client.zscore(K.due, j) is not None
        finally:
            await host.aclose()
    run(main())
