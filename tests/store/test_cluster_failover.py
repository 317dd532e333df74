"""The host on a Redis Cluster whose primary is killed under load: a replica per primary,
``kill -9`` of one while jobs run on every shard; the replica is promoted, the host rides
through (its channel reads the slot table again, redis-py's client for the rest) and
every job ends, none lost or stuck; commands may be sent again only as the at-least-once
rules allow (with their ids)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.cluster import SCOPES, WM, all_completed, cluster_config, store_work_masters
from helpers.hosts import Station, store_retrying, torque_ok, wait_until
from helpers.servers import RedisClusterServer
from redis.asyncio.cluster import RedisCluster

from sfc_host.execution.host import Host

pytestmark = pytest.mark.servers


def test_a_primary_killed_under_load_loses_no_job(tmp_path: Path) -> None:
    cluster = RedisClusterServer(tmp_path / "c", node_timeout_ms=500, replicas=1)
    cluster.start()
    try:
        async def main() -> None:
            station = Station(torque_ok)
            cfg = cluster_config(cluster, claim_min_idle_ms=500, outage_threshold_ms=5000)
            rc = RedisCluster.from_url(cluster.url)
            try:
                async with Host(cfg, station.sink) as host:
                    station.attach(host)
                    await store_work_masters(host)
                    jobs: list[tuple[str, str]] = []
                    for wave in range(6):
                        if wave == 2:
                            cluster.nodes[1].stop(signal.SIGKILL)
                            killed = time.monotonic()
                        await asyncio.gather(*(store_retrying(host, s, f"{s}-w{wave}-{i}", WM)
                                               for s in SCOPES for i in range(3)))
                        jobs += [(s, f"{s}-w{wave}-{i}") for s in SCOPES for i in range(3)]
                        await asyncio.sleep(0.3)
                    await wait_until(lambda: all_completed(rc, jobs), 60,
                                     "every job Ended_Completed after the failover")
                    took = time.monotonic() - killed
                ids = Counter(station.ids())
                again = {cid: n for cid, n in ids.items() if n > 1}
                # three commands a job, each id once; one sent again keeps its id (the
                # at-least-once rule), and the station absorbs it by that id
                assert len(ids) == 3 * len(jobs), (len(ids), 3 * len(jobs))
                print(f"failover: {len(jobs)} jobs ended {took:.1f} s after the kill; "
                      f"{len(again)} commands sent twice")
            finally:
                await rc.aclose()
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        cluster.stop()


def test_a_busy_scopes_slot_migrates_under_load(tmp_path: Path) -> None:
    """The slot of a scope with jobs running moves to another primary while they run:
    the host follows ASK and then MOVED, every job ends."""
    cluster = RedisClusterServer(tmp_path / "c", node_timeout_ms=2000)
    cluster.start()
    try:
        async def main() -> None:
            station = Station(torque_ok)
            cfg = cluster_config(cluster)
            rc = RedisCluster.from_url(cluster.url)
            try:
                await rc.initialize()
                async with Host(cfg, station.sink) as host:
                    station.attach(host)
                    await store_work_masters(host)
                    scope = SCOPES[0]
                    slot = rc.keyslot(f"sfc:{{{scope}}}:x")
                    src = rc.get_node_from_key(f"sfc:{{{scope}}}:x").port
                    dst = next(p for p in cluster.ports if p != src)
                    jobs = [(scope, f"m{i}") for i in range(40)]
                    await asyncio.gather(*(store_retrying(host, s, j, WM) for s, j in jobs[:10]))
                    refreshes = host.channel.refreshes  # type: ignore[union-attr]
                    loop = asyncio.get_running_loop()
                    moving = loop.run_in_executor(None, cluster.migrate, slot, src, dst)
                    for w in range(1, 8):       # jobs keep coming while the slot moves
                        await asyncio.gather(*(store_retrying(host, s, j, WM)
                                               for s, j in jobs[w * 5 - 5 + 10:w * 5 + 10]))
                        await asyncio.sleep(0.15)
                    moved = await moving
                    assert moved > 0
                    ch = host.channel
                    print(f"resharding: {moved} keys moved; the channel followed "
                          f"{ch.redirects} redirects, read the table "  # type: ignore[union-attr]
                          f"{ch.refreshes - refreshes} times")  # type: ignore[union-attr]
                    assert ch.refreshes > refreshes  # type: ignore[union-attr]
                    await wait_until(lambda: all_completed(rc, jobs), 60,
                                     "every job of the moved scope Ended_Completed")
                    assert host.channel is not None
                    assert host.channel.slots[slot] == ("127.0.0.1", dst)  # type: ignore[union-attr]
                ids = Counter(station.ids())
                assert len(ids) == 3 * len(jobs)
            finally:
                await rc.aclose()
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        cluster.stop()
