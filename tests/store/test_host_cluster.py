"""The host on Redis Cluster: the same code as on one Redis (every key of a scope carries
the hash tag ``{scope}``), with scopes whose slots land on all three shards.

Covered: whole jobs in every shard, a repeated start absorbed, ``SCRIPT FLUSH`` on the
nodes mid-run (scripts loaded again), an outage (deadlines moved by the gap) and two
host instances sharing the scopes (every job completes exactly once).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from helpers.cluster import (
    SCOPES,
    WM,
    all_completed,
    cluster_config,
    store_work_masters,
)
from helpers.hosts import Station, torque_ok, wait_until
from helpers.servers import RedisClusterServer
from redis.asyncio.cluster import RedisCluster

from sfc_fast.events import Completed
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

pytestmark = pytest.mark.servers

GROUP = "sfc-host"


async def _with_cluster(cluster: RedisClusterServer,
                        body: Callable[[RedisCluster], Awaitable[None]]) -> None:
    """Run ``body`` with a cluster client, on an empty cluster whose scopes (checked
    with CLUSTER KEYSLOT) land on every shard."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        await rc.initialize()
        await rc.flushall(target_nodes=RedisCluster.PRIMARIES)
        ports = set()
        for s in SCOPES:
            k = ScopeKeys(s)
            node = rc.get_node_from_key(k.work)
            slot = await rc.execute_command("CLUSTER KEYSLOT", k.work, target_nodes=node)
            assert slot == rc.keyslot(k.work) == rc.keyslot(k.job("J")) == rc.keyslot(s)
            ports.add(node.port)
        assert ports == set(cluster.ports), "the scopes must land on all three shards"
        await body(rc)
    finally:
        try:
            await rc.flushall(target_nodes=RedisCluster.PRIMARIES)
        finally:
            await rc.aclose()


async def _start_jobs(host: Host, per_scope: int = 1, prefix: str = "J",
                      same_ids: bool = False) -> list[tuple[str, str]]:
    """Store and start jobs in every scope; job ids differ between scopes unless
    ``same_ids`` (a command id ``{job}:{action}#{n}`` is unique only in its scope)."""
    jobs = []
    for s in SCOPES:
        for i in range(per_scope):
            job = f"{prefix}{i}" if same_ids else f"{s}-{prefix}{i}"
            assert await host.orders.store_order(
                s, {"JobOrderID": job,
                    "WorkMasterID": [{"ID": WM}]}, start=True) == "AllowedToStart_Ready"
            jobs.append((s, job))
    return jobs


async def _pending(rc: RedisCluster, scope: str) -> int:
    info = await rc.xpending(ScopeKeys(scope).work, GROUP)
    return int(info["pending"])


async def _no_pending(rc: RedisCluster) -> bool:
    for s in SCOPES:
        if await _pending(rc, s):
            return False
    return True


async def _check_done(rc: RedisCluster, jobs: list[tuple[str, str]], timeout: float = 10.0
                      ) -> None:
    await wait_until(lambda: all_completed(rc, jobs), timeout, "every job Ended_Completed")
    await wait_until(lambda: _no_pending(rc), 5, "no pending entries")
    for s, j in jobs:
        k = ScopeKeys(s)
        assert await rc.exists(k.response(j)) == 1
        assert not await rc.sismember(k.active, j)
        assert await rc.zscore(k.due, j) is None


def _answer_recorded(host: Host, station: Station, done: set[str]) -> None:
    """Answer the recorded commands not answered yet (as ``torque_ok`` would)."""
    for cmd in station.commands:
        if cmd.command_id not in done:
            done.add(cmd.command_id)
            host.answer(cmd.scope, Completed(cmd.command_id, torque_ok(cmd)))


# ---- (a) whole jobs in every shard


def test_jobs_complete_on_every_shard(redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(torque_ok)
        ended: list[tuple[str, str, str]] = []
        cfg = cluster_config(redis_cluster)
        async with Host(cfg, station.sink,
                        on_end=lambda s, j, d: ended.append((s, j, d.status))) as host:
            station.attach(host)
            await store_work_masters(host)
            jobs = await _start_jobs(host, per_scope=3)
            await _check_done(rc, jobs)
            await wait_until(lambda: len(ended) == len(jobs), 5, "every on_end")
        assert sorted(ended) == sorted((s, j, "completed") for s, j in jobs)
        # three commands a job (load, tighten in tolerance, unload), each sent once
        ids = station.ids()
        assert len(ids) == len(set(ids)) == 3 * len(jobs)
        assert {c.scope for c in station.commands} == set(SCOPES)

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- (b) a repeated start is absorbed


def test_repeated_start_is_absorbed(redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(lambda c: False)   # no answers: the jobs stay in load_part
        cfg = cluster_config(redis_cluster)
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await store_work_masters(host)
            jobs = await _start_jobs(host)
            await wait_until(lambda: len(station.commands) == len(jobs), 10,
                             "a load_part command per job")
            await wait_until(lambda: _no_pending(rc), 5, "no pending entries")
            before = {(s, j): await host.inspect(s, j) for s, j in jobs}
            orders = {(s, j): await rc.hgetall(ScopeKeys(s).order(j)) for s, j in jobs}
            assert all(v is not None and v["status"] == "running" for v in before.values())
            # the baseline before the entries go in: the host may handle some of them
            # before the last xadd returns
            entries = host.metrics.snapshot().get("entries", 0)
            for s, j in jobs:
                await rc.xadd(ScopeKeys(s).work, {"k": "start", "j": j})
            await wait_until(lambda: host.metrics.snapshot().get("entries", 0)
                             >= entries + len(jobs), 15, "the repeated starts handled")
            await wait_until(lambda: _no_pending(rc), 5, "no pending entries")
            for s, j in jobs:
                assert await host.inspect(s, j) == before[(s, j)]
                assert await rc.hgetall(ScopeKeys(s).order(j)) == orders[(s, j)]
                assert await rc.xlen(ScopeKeys(s).dead) == 0
            assert len(station.commands) == len(jobs)
            # and the jobs still run to the end
            station.answer_fn = torque_ok
            _answer_recorded(host, station, set())
            await _check_done(rc, jobs)

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- (c) SCRIPT FLUSH on the nodes mid-run


async def _scripts_on(rc: RedisCluster, node: Any, host: Host) -> list[bool]:
    """Which of the host's scripts one node has."""
    shas = [s.sha for s in host.scripts.by_name.values()]
    return [bool(x) for x in await rc.execute_command("SCRIPT EXISTS", *shas,
                                                       target_nodes=node)]


def test_script_flush_mid_run_reloads_on_the_nodes(redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(lambda c: False)
        cfg = cluster_config(redis_cluster)
        answered: set[str] = set()
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await store_work_masters(host)
            jobs = await _start_jobs(host, per_scope=2)
            await wait_until(lambda: len(station.commands) == len(jobs), 10,
                             "a load_part command per job")
            # every node forgets every script (the sweeps, every 30 ms, meet it first)
            reloads = host.scripts.reloads
            for node in rc.get_primaries():
                await rc.execute_command("SCRIPT FLUSH", target_nodes=node)
            _answer_recorded(host, station, answered)   # load_part: settled by scripts
            await wait_until(lambda: len(station.commands) == 2 * len(jobs), 10,
                             "a tighten command per job")
            assert host.scripts.reloads > reloads

            async def everywhere() -> bool:   # a reload may still be under way
                return all([all(await _scripts_on(rc, n, host)) for n in rc.get_primaries()])
            await wait_until(everywhere, 5, "every script on every primary")
            # one node only forgets them (a restarted or failed-over primary)
            node = rc.get_node_from_key(ScopeKeys("line3").work)
            reloads = host.scripts.reloads
            await rc.execute_command("SCRIPT FLUSH", target_nodes=node)
            station.answer_fn = torque_ok
            _answer_recorded(host, station, answered)
            await _check_done(rc, jobs)
            assert host.scripts.reloads > reloads

            async def loaded() -> bool:   # a reload may still be under way (a sweep's)
                return all(await _scripts_on(rc, node, host))
            await wait_until(loaded, 5, "every script on the flushed node")
            assert host.metrics.snapshot().get("answer_errors", 0) == 0
            assert len(station.commands) == 3 * len(jobs)

    asyncio.run(_with_cluster(redis_cluster, body))


def test_script_pipeline_reloads_after_flush_on_any_node(
        redis_cluster: RedisClusterServer) -> None:
    """No loops: every refused call of one pipeline over the three shards is the host's
    own, retried after loading the scripts on every primary."""
    async def body(rc: RedisCluster) -> None:
        async with Host(cluster_config(redis_cluster), Station().sink, loops=False) as host:
            await store_work_masters(host)
            jobs = await _start_jobs(host)
            await host.discover()
            while await host.consume_once(block_ms=0):   # start, job and dispatch entries
                pass
            await host.dispatcher.markers.drain()        # markers and acks: no call after
            want = {s: [j] for s, j in jobs}
            before = await host.store.load(want)
            versions = {s: before[s][1][j].version for s, j in jobs}
            assert all(v != b"0" for v in versions.values())
            primaries = rc.get_primaries()
            for flushed in ([*primaries], [primaries[0]], [primaries[2]]):
                for node in flushed:
                    await rc.execute_command("SCRIPT FLUSH", target_nodes=node)
                    assert not any(await _scripts_on(rc, node, host))
                reloads = host.scripts.reloads
                rows = await host.store.load(want)   # one pipeline, three nodes
                assert host.scripts.reloads == reloads + 1
                assert {s: rows[s][1][j].version for s, j in jobs} == versions
                for node in primaries:
                    assert all(await _scripts_on(rc, node, host))
            # and a single call (one scope) too
            s, j = jobs[0]
            node = rc.get_node_from_key(ScopeKeys(s).work)
            await rc.execute_command("SCRIPT FLUSH", target_nodes=node)
            rows = await host.store.load({s: [j]})
            assert rows[s][1][j].version == versions[s]

    asyncio.run(_with_cluster(redis_cluster, body))


def test_orphaned_entries_are_claimed_on_every_shard(redis_cluster: RedisClusterServer) -> None:
    """Entries a vanished consumer read but never acked (XAUTOCLAIM, XPENDING)."""
    async def body(rc: RedisCluster) -> None:
        station = Station(torque_ok)
        cfg = cluster_config(redis_cluster)
        async with Host(cfg, station.sink, loops=False) as writer:
            await store_work_masters(writer)
            jobs = await _start_jobs(writer)
            await writer.discover()   # creates the groups
        for s in SCOPES:
            got = await rc.xreadgroup(GROUP, "ghost", {ScopeKeys(s).work: ">"})
            assert got and len(got[0][1]) == 1
            assert await _pending(rc, s) == 1
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await _check_done(rc, jobs)
            assert host.metrics.snapshot().get("entries_claimed", 0) >= len(SCOPES)
        for s in SCOPES:
            assert await rc.xlen(ScopeKeys(s).dead) == 0

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- (d) an outage moves the open deadlines by the gap


def test_outage_moves_open_deadlines_by_the_gap(redis_cluster: RedisClusterServer) -> None:
    gap = 120_000   # far longer than load_part's 20 s timeout

    async def body(rc: RedisCluster) -> None:
        station = Station(lambda c: False)
        cfg = cluster_config(redis_cluster, outage_threshold_ms=400)
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await store_work_masters(host)
            jobs = await _start_jobs(host)
            await wait_until(lambda: len(station.commands) == len(jobs), 10,
                             "a load_part command per job")
            await wait_until(lambda: _no_pending(rc), 5, "no pending entries")
            before: dict[tuple[str, str], int] = {}
            attempts: dict[tuple[str, str], int] = {}
            for s, j in jobs:
                view = await host.inspect(s, j)
                assert view is not None
                before[(s, j)] = view["actions"]["load_part"]["deadline_ms"]
                attempts[(s, j)] = view["actions"]["load_part"]["attempt"]
                assert before[(s, j)] is not None
            outages = host.metrics.snapshot().get("outages", 0)
            now_ms = int(time.time() * 1000)
            for s in SCOPES:   # no sweep for `gap` ms on every shard
                await rc.set(ScopeKeys(s).heartbeat, now_ms - gap)
            await wait_until(lambda: host.metrics.snapshot().get("outages", 0)
                             >= outages + len(SCOPES), 5, "an outage seen in every scope")

            async def moved() -> bool:
                for s, j in jobs:
                    view = await host.inspect(s, j)
                    assert view is not None
                    if view["actions"]["load_part"]["deadline_ms"] == before[(s, j)]:
                        return False
                return True

            await wait_until(moved, 5, "the deadlines moved")
            await wait_until(lambda: _no_pending(rc), 5, "no pending entries")
            for s, j in jobs:
                view = await host.inspect(s, j)
                assert view is not None
                act = view["actions"]["load_part"]
                assert view["status"] == "running"
                assert act["phase"] == "open" and act["attempt"] == attempts[(s, j)], act
                assert abs(act["deadline_ms"] - (before[(s, j)] + gap)) < 2_000, (s, j, act)
                # the index holds deadlines minus the scope's offset (the outages' gaps)
                due = await rc.zscore(ScopeKeys(s).due, j)
                offset = int(await rc.get(ScopeKeys(s).offset))
                assert due is not None and due + offset == act["deadline_ms"]
            assert len(station.commands) == len(jobs)   # nothing timed out, nothing resent
            station.answer_fn = torque_ok
            _answer_recorded(host, station, set())
            await _check_done(rc, jobs)

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- (e) two host instances share the scopes


def test_two_hosts_share_the_scopes(redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(torque_ok)
        ended: list[tuple[str, str, str, str]] = []

        def on_end(name: str) -> Callable[[str, str, Any], None]:
            return lambda s, j, d: ended.append((name, s, j, d.status))

        h1 = Host(cluster_config(redis_cluster, consumer="h1"), station.sink,
                  on_end=on_end("h1"))
        h2 = Host(cluster_config(redis_cluster, consumer="h2"), station.sink,
                  on_end=on_end("h2"))
        async with h1, h2:
            station.attach(h1)
            station.attach(h2)
            await store_work_masters(h1)
            jobs = await _start_jobs(h1, per_scope=3, prefix="A")
            jobs += await _start_jobs(h2, per_scope=3, prefix="B")
            await _check_done(rc, jobs, timeout=15)
            await wait_until(lambda: len(ended) >= len(jobs), 5, "every on_end")
            await asyncio.sleep(0.2)   # a duplicate end would show by now
        per_job = Counter((s, j) for _, s, j, _ in ended)
        assert per_job == Counter(jobs), "every job ends exactly once"
        assert {st for *_, st in ended} == {"completed"}
        assert {name for name, *_ in ended} == {"h1", "h2"}, "both hosts did work"
        ids = station.ids()
        assert len(ids) == len(set(ids)) == 3 * len(jobs)
        for s in SCOPES:
            consumers = await rc.xinfo_consumers(ScopeKeys(s).work, GROUP)
            assert {c["name"] for c in consumers} <= {b"h1", b"h2", "h1", "h2"}

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- a lost work stream stops only its own scope, briefly


def test_deleted_work_stream_is_recreated_and_other_scopes_go_on(
        redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(torque_ok)
        cfg = cluster_config(redis_cluster)
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await store_work_masters(host)
            first = await _start_jobs(host, prefix="A")
            await _check_done(rc, first)
            lost = ScopeKeys("line3").work
            assert await rc.delete(lost) == 1     # the stream and its group
            await wait_until(lambda: host.metrics.snapshot().get("read_errors", 0), 5,
                             "the read of the lost stream refused (NOGROUP)")
            jobs = await _start_jobs(host, prefix="B")
            await _check_done(rc, jobs)
            groups = await rc.xinfo_groups(lost)
            assert [g["name"] for g in groups] in ([GROUP.encode()], [GROUP])
            assert host.metrics.snapshot().get("loop_errors_consume", 0) == 0

    asyncio.run(_with_cluster(redis_cluster, body))


# ---- the same job id in several scopes


def test_same_job_id_in_every_scope(redis_cluster: RedisClusterServer) -> None:
    async def body(rc: RedisCluster) -> None:
        station = Station(torque_ok)
        cfg = cluster_config(redis_cluster)
        # the orders go in before the host reads: one batch holds every scope's start
        async with Host(cfg, station.sink, loops=False) as writer:
            await store_work_masters(writer)
            jobs = await _start_jobs(writer, same_ids=True)
        async with Host(cfg, station.sink) as host:
            station.attach(host)
            await _check_done(rc, jobs, timeout=4)   # load_part's timeout is 20 s
        assert len(station.commands) == 3 * len(jobs)

    asyncio.run(_with_cluster(redis_cluster, body))
