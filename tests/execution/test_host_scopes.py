"""Many scopes, most of them idle, against a real redis-server: a pass reads and sweeps
only the scopes that may have work, and what the per-scope passes did before still
happens: work in a long idle scope starts at once, deadlines fire on time, the
heartbeat stays fresh (no false outage) and a real outage is still seen in every scope,
orphaned entries are claimed, several hosts share the scopes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from helpers.aio import run
from helpers.hosts import Station, flush, one_step, quick_config, quiet, wait_until
from helpers.recipes import V110, linear

from sfc_fast import compile_recipe
from sfc_fast.events import Completed, Start
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.schedule import Schedule
from sfc_host.execution.settle import APPLIED, Item
from sfc_host.store.keys import SCOPES, ScopeKeys


def scopes(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


async def serve(redis_url: str, st: Station, names: list[str], *, wm: dict[str, Any] | None = None,
                loops: bool = True, ended: list | None = None, **kw: Any) -> Host:
    host = Host(quick_config(redis_url, **kw), st.sink, loops=loops,
                on_end=(lambda s, j, d: ended.append((s, j, d.status, d.reason)))
                if ended is not None else None)
    st.attach(host)
    for s in names:
        if wm is not None:
            await host.store.put_work_master(s, wm)
        await host.add_scope(s)
    await host.start()
    return host


async def calls(client: Any) -> dict[str, int]:
    info = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()}


def order(job: str, wm: str = "quick") -> dict[str, Any]:
    return {"JobOrderID": job, "WorkMasterID": [{"ID": wm}]}


# ---------------------------------------------------------------- the schedule


def test_schedule_takes_only_the_due_scopes_and_keeps_an_earlier_time_noted_meanwhile(
        ) -> None:
    plan = Schedule()
    for i, s in enumerate(scopes(5)):
        plan.set(s, float(i))
    assert plan.due(1.5) == ["s0", "s1"]
    assert "s0" not in plan and len(plan) == 3
    plan.earlier("s3", 0.5)                 # sooner than its 3.0
    plan.earlier("s4", 9.0)                 # later than its 4.0: kept
    plan.earlier("s0", 0.2)                 # taken by a pass: noted for it
    plan.earlier("nobody", 0.0)             # never scheduled: ignored
    assert plan.due(1.5) == ["s3"]
    plan.set("s0", 7.0)                     # the pass gives its time: the noted one wins
    assert plan.at("s0") == 0.2
    plan.set("s1", 7.0)
    assert plan.at("s1") == 7.0
    assert plan.due(4.0) == ["s0", "s2", "s4"]
    for _ in range(1000):                   # replaced entries do not pile up
        plan.set("s1", 8.0)
    assert len(plan._heap) < 100
    assert plan.due(100.0) == ["s1"]


# ---------------------------------------------------------------- cost


def test_idle_scopes_cost_no_command_per_pass(redis_url: str) -> None:
    """300 idle scopes and passes every 20-30 ms: over a second the host sweeps each
    scope about once (its heartbeat) and reads every stream about once, where a pass
    over every scope would cost tens of thousands of commands."""
    async def main() -> None:
        await flush(redis_url)
        n = 300
        host = await serve(redis_url, Station(), scopes(n), outage_threshold_ms=10_000,
                           idle_sweep_interval_ms=1000, full_read_interval_ms=1000,
                           claim_interval_ms=10_000)
        c = aioredis.Redis.from_url(redis_url)
        try:
            await asyncio.sleep(1.5)          # the first sweep and read of every scope
            assert int(await c.exists(*[ScopeKeys(s).heartbeat for s in scopes(n)])) == n
            before, t0 = await calls(c), time.monotonic()
            await asyncio.sleep(1.0)
            after, dt = await calls(c), time.monotonic() - t0
            diff = {k: after[k] - before.get(k, 0) for k in after}
            sweeps_per_scope = dt / 0.8 + 1       # idle sweeps come 80-100 % apart
            assert diff.get("set", 0) <= n * sweeps_per_scope, diff   # heartbeats
            assert diff.get("xreadgroup", 0) <= dt / 1.0 + 2, diff     # full reads only
            # at most one sweep call a pass (30 ms) for the few scopes then due
            assert diff.get("evalsha", 0) <= dt / 0.03 + 3 * sweeps_per_scope, diff
            assert diff.get("xautoclaim", 0) == 0, diff   # nothing pending to claim
            # the stream is looked at only on the looks for orphans (every 8-10 s here)
            assert diff.get("xinfo|groups", 0) <= n * dt / 8 + 5, diff
            assert sum(diff.values()) < 10 * n * sweeps_per_scope, diff
        finally:
            await c.aclose()
            await host.aclose()
    run(main())


def drain(sink: InProcessSink) -> list[Any]:
    return [sink.queue.get_nowait() for _ in range(sink.queue.qsize())]


@contextlib.asynccontextmanager
async def one_job_a_scope(redis_url: str, n: int
                          ) -> AsyncIterator[tuple[Host, InProcessSink, list[Any], Any]]:
    """A host without its loops serving ``n`` scopes, one job each with its first
    command out: the host, its sink, those commands and a client of the test's own."""
    await flush(redis_url)
    sink = InProcessSink()
    host = Host(quick_config(redis_url), sink, loops=False)
    c = aioredis.Redis.from_url(redis_url)
    try:
        for s in scopes(n):
            await host.add_scope(s)
        await host.start()
        graph = host.store.graphs.put(compile_recipe(linear(3), V110))   # no recipe read
        await host.settler.settle([Item(s, f"j{i}", [Start(f"j{i}", s)], graph=graph)
                                   for i, s in enumerate(scopes(n))])
        while await host.consume_once(block_ms=0):    # the entries besides the commands
            pass
        await host.dispatcher.markers.drain()          # their acks, in the background
        firsts = drain(sink)
        assert sorted(cmd.scope for cmd in firsts) == sorted(scopes(n))
        yield host, sink, firsts, c
    finally:
        await c.aclose()
        await host.aclose()


def test_answers_in_many_scopes_cost_a_bounded_number_of_commands(redis_url: str) -> None:
    """A batch of answers, each in a scope of its own, is settled by one compare-and-set
    call and one marker call (written in the background) on a single Redis: one read of
    every scope's offset, one XREADGROUP that delivers the new entries of every scope
    (each pending on this host until its command went out), then one XACK per stream
    (XACK cannot span streams).
    The next commands go out at once and every entry is acked."""
    async def main() -> None:
        n = 300
        async with one_job_a_scope(redis_url, n) as (host, sink, firsts, c):
            before = await calls(c)
            items = await host.settle_answers([(cmd.scope, Completed(cmd.command_id))
                                               for cmd in firsts])
            await host.dispatcher.markers.drain()      # the markers go in the background
            diff = {k: v - before.get(k, 0) for k, v in (await calls(c)).items()}
            assert [it.outcome for it in items] == [APPLIED] * n
            assert sorted((cmd.scope, cmd.action) for cmd in drain(sink)) == \
                sorted((s, "a1") for s in scopes(n))
            assert diff.get("evalsha") == 2, diff      # the compare-and-set, the markers
            assert diff.get("get") == n and not diff.get("mget"), diff   # offsets, inside
            assert diff.get("xreadgroup") == 1, diff
            assert diff.get("xadd") == n and diff.get("xack") == n, diff
            while await host.consume_once(block_ms=0):
                pass
            pipe = c.pipeline(transaction=False)
            for s in scopes(n):
                pipe.xpending(ScopeKeys(s).work, "sfc-host")
            assert sum(p["pending"] for p in await pipe.execute()) == 0
    run(main())


def test_a_scope_whose_group_is_gone_does_not_stop_the_others_deliveries(
        redis_url: str) -> None:
    """One read delivers the entries of every scope of a compare-and-set call, and a
    missing group fails the whole read: then each stream is read alone, so the other
    scopes' commands still go out at once, and the scope without its group is read
    (its group made again) by the consumer."""
    async def main() -> None:
        n = 20
        async with one_job_a_scope(redis_url, n) as (host, sink, firsts, c):
            await c.xgroup_destroy(ScopeKeys("s3").work, "sfc-host")
            items = await host.settle_answers([(cmd.scope, Completed(cmd.command_id))
                                               for cmd in firsts])
            assert [it.outcome for it in items] == [APPLIED] * n
            assert sorted(cmd.scope for cmd in drain(sink)) == \
                sorted(set(scopes(n)) - {"s3"})
            host.streams.mark("s3")
            for _ in range(3):       # NOGROUP: the group is made again, then read
                await host.consume_once(block_ms=0)
            assert [(cmd.scope, cmd.action) for cmd in drain(sink)] == [("s3", "a1")]
    run(main())


# ---------------------------------------------------------------- latency


def test_a_job_in_a_long_idle_scope_starts_within_a_poll(redis_url: str) -> None:
    """A Start the serving host writes itself is read in its next pass; one another
    process writes (no reader of its own) at the latest at the next full read."""
    async def main() -> None:
        await flush(redis_url)
        names = scopes(200)
        st = Station(lambda c: False)
        seen: dict[str, float] = {}
        st.answer_fn = lambda c: (seen.setdefault(c.job, time.monotonic()), False)[1]
        host = await serve(redis_url, st, names, wm=one_step(600),
                           outage_threshold_ms=10_000, full_read_interval_ms=700)
        writer = Host(quick_config(redis_url), Station().sink, loops=False)
        await writer.start()
        try:
            await asyncio.sleep(1.5)          # every scope idle, swept and read
            t0 = time.monotonic()
            await host.orders.store_order("s123", order("A"), start=True)
            await wait_until(lambda: "A" in seen, timeout=5, what="A's command")
            assert seen["A"] - t0 < 0.5, seen["A"] - t0
            t0 = time.monotonic()
            await writer.orders.store_order("s77", order("B"), start=True)
            await wait_until(lambda: "B" in seen, timeout=5, what="B's command")
            assert seen["B"] - t0 < 0.7 + 0.8, seen["B"] - t0
        finally:
            await writer.aclose()
            await host.aclose()
    run(main())


def test_a_deadline_in_an_idle_scope_fires_on_time(redis_url: str) -> None:
    """Idle scopes are swept only every few seconds here, but a scope with a deadline
    is swept when the deadline comes: the timeout ends the job about 1 s after its
    command, not at the next idle sweep."""
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)
        sent: list[float] = []
        st.answer_fn = lambda c: (sent.append(time.monotonic()), False)[1]
        ended: list = []
        ended_at: list[float] = []
        host = await serve(redis_url, st, scopes(200), wm=one_step(1), ended=ended,
                           outage_threshold_ms=20_000, idle_sweep_interval_ms=8000)
        host.settler.end_listeners.append(lambda s, j, d: ended_at.append(time.monotonic()))
        try:
            await asyncio.sleep(1.0)
            await host.orders.store_order("s42", order("T"), start=True)
            await wait_until(lambda: ended, timeout=6, what="the timeout")
            assert ended[0][:3] == ("s42", "T", "aborted") and "timed out" in ended[0][3]
            assert 0.9 <= ended_at[0] - sent[0] < 2.0, ended_at[0] - sent[0]
        finally:
            await host.aclose()
    run(main())


# ---------------------------------------------------------------- outage rule


def test_idle_scopes_are_not_taken_for_an_outage_while_a_host_runs(redis_url: str) -> None:
    """Swept only every idle interval (half the threshold at most), an idle scope's
    heartbeat never gets older than the outage threshold while a host runs."""
    async def main() -> None:
        await flush(redis_url)
        names = scopes(50)
        st = Station(lambda c: False)
        cfg = quick_config(redis_url, outage_threshold_ms=1000, idle_sweep_interval_ms=60_000)
        assert cfg.idle_sweep_ms == 500
        host = await serve(redis_url, st, names, wm=one_step(600),
                           outage_threshold_ms=1000, idle_sweep_interval_ms=60_000)
        try:
            for s in names[:10]:
                await host.orders.store_order(s, order(f"J-{s}"), start=True)
            await wait_until(lambda: len(st.commands) == 10, what="commands")
            hb_keys = [ScopeKeys(s).heartbeat for s in names]

            async def all_swept() -> bool:
                return await host.client.exists(*hb_keys) == len(names)
            await wait_until(all_swept, what="the first sweep of every scope")
            oldest = 0
            end = time.monotonic() + 3.0          # three thresholds
            while time.monotonic() < end:
                now = await host.store.now_ms()
                hbs = await host.client.mget(hb_keys)
                oldest = max(oldest, max(now - int(h) for h in hbs))
                await asyncio.sleep(0.1)
            assert oldest < 1000, oldest
            assert host.metrics["outages"] == 0
            assert len(st.commands) == 10          # nothing timed out, nothing resent
        finally:
            await host.aclose()
    run(main())


def test_an_outage_is_seen_in_every_idle_scope_at_the_next_start(redis_url: str) -> None:
    """Every host down for longer than the threshold: the next host's first sweep of
    each scope sees the gap and moves that scope's open deadlines by it."""
    async def main() -> None:
        await flush(redis_url)
        names = scopes(30)
        st = Station(lambda c: False)
        host = await serve(redis_url, st, names, wm=one_step(600), outage_threshold_ms=1000)
        jobs = {s: f"J-{s}" for s in names[::3]}
        for s, j in jobs.items():
            await host.orders.store_order(s, order(j), start=True)
        await wait_until(lambda: len(st.commands) == len(jobs), what="commands")
        await wait_until(lambda: quiet(host), what="quiet")
        before = {j: (await host.inspect(s, j))["actions"]["work"]["deadline_ms"]
                  for s, j in jobs.items()}
        await host.aclose()
        await asyncio.sleep(1.6)                   # all hosts down past the threshold
        st2 = Station(lambda c: False)
        host = await serve(redis_url, st2, [], outage_threshold_ms=1000)   # discovers
        try:
            await wait_until(lambda: host.metrics["outages"] == len(names), timeout=5,
                             what="an outage seen in every scope")
            for s, j in jobs.items():
                offset = int(await host.client.get(ScopeKeys(s).offset))
                assert offset >= 1600
                after = (await host.inspect(s, j))["actions"]["work"]["deadline_ms"]
                assert after - before[j] == offset
            assert st2.commands == []              # nothing resent, nothing timed out
        finally:
            await host.aclose()
    run(main())


# ---------------------------------------------------------------- several hosts, claims


def test_an_orphaned_entry_in_an_idle_scope_is_claimed(redis_url: str) -> None:
    """An entry a vanished consumer read and never acked, in one of many idle scopes:
    the sweep that looks for orphans (every claim interval) finds it, and the host
    claims and handles it."""
    async def main() -> None:
        await flush(redis_url)
        names = scopes(100)
        host = await serve(redis_url, Station(), names, outage_threshold_ms=10_000,
                           claim_min_idle_ms=300, claim_interval_ms=200)
        k = ScopeKeys("s61")
        try:
            await asyncio.sleep(0.5)
            await host.client.xadd(k.work, {"k": "nonsense", "j": "J"})
            got = await host.client.xreadgroup(host.config.group, "ghost", {k.work: ">"},
                                               count=10)
            assert got and len(got[0][1]) == 1       # pending on the ghost consumer
            await wait_until(lambda: host.metrics["entries_claimed"] == 1, timeout=5,
                             what="the claim")
            await wait_until(lambda: host.metrics["invalid_entries"] == 1, what="handled")
            await wait_until(lambda: quiet(host), what="acked and trimmed")
            assert host.metrics["entries_claimed"] == 1
        finally:
            await host.aclose()
    run(main())


def test_two_hosts_share_many_scopes(redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        names = scopes(60)
        st = Station(lambda c: None)           # completes every command at once
        ended: list = []
        a = await serve(redis_url, st, names, wm=one_step(600), ended=ended,
                        outage_threshold_ms=10_000)
        b = await serve(redis_url, st, names, ended=ended, outage_threshold_ms=10_000)
        try:
            for i, s in enumerate(names):
                await (a if i % 2 else b).orders.store_order(s, order(f"J{i}"), start=True)
            await wait_until(lambda: len(ended) == len(names), timeout=15, what="every job")
            assert sorted(e[1] for e in ended) == sorted(f"J{i}" for i in range(len(names)))
            assert {e[2] for e in ended} == {"completed"}
            for h in (a, b):
                await wait_until(lambda h=h: quiet(h), what="quiet")
            assert a.metrics["outages"] == b.metrics["outages"] == 0
        finally:
            await a.aclose()
            await b.aclose()
    run(main())


def test_a_scope_registered_later_is_served_with_what_its_stream_holds(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)
        host = await serve(redis_url, st, scopes(20), outage_threshold_ms=10_000)
        writer = Host(quick_config(redis_url), Station().sink, loops=False)
        try:
            await writer.store.put_work_master("late", one_step(600))
            await writer.orders.store_order("late", order("L"), start=True)   # registers it
            assert b"late" in await host.client.smembers(SCOPES)
            await wait_until(lambda: st.commands, timeout=5, what="the late scope's job")
            assert st.commands[0].scope == "late"
        finally:
            await writer.aclose()
            await host.aclose()
    run(main())


def test_idle_sweep_interval_stays_inside_the_outage_threshold() -> None:
    cfg = HostConfig(outage_threshold_ms=10_000, idle_sweep_interval_ms=2000)
    assert cfg.idle_sweep_ms == 2000
    assert HostConfig(outage_threshold_ms=3000, idle_sweep_interval_ms=2000).idle_sweep_ms \
        == 1500
    assert HostConfig(sweep_interval_ms=900, outage_threshold_ms=1000).idle_sweep_ms == 900
