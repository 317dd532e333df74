"""Primaries of a Redis Cluster killed again and again under load: is any job lost or
stuck, and how long from a kill to the first completion after it?

    python benchmarks/cluster_failover.py              # 10 kills
    python benchmarks/cluster_failover.py --kills 3    # a shorter run

A 3-primary cluster with a replica each (node timeout 500 ms), one host in this process
with an in-process station answering every command, and jobs stored without pause (12
scopes over the three shards). Every ``--every`` seconds the primary of a shard is
killed with SIGKILL (the shards in turn); its replica takes over, and the killed node is
started again, to rejoin as the new primary's replica before its shard's next turn. At
the end every job must have ended (Ended_Completed) and each command must have been
sent once (a second send keeps its id: counted). Printed per kill: the seconds until
the first job completed after it, and the jobs stored so far.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.hosts import Station, quick_config, store_retrying, torque_ok, work_master
from helpers.servers import RedisClusterServer
from redis.asyncio.cluster import RedisCluster

from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

SCOPES = [f"line{i}" for i in range(1, 13)]
WM = "wm-tighten"
IN_FLIGHT_S = 0.05


async def ended(rc: RedisCluster, jobs: list[tuple[str, str]]) -> int:
    pipe = rc.pipeline(transaction=False)
    for s, j in jobs:
        pipe.hget(ScopeKeys(s).order(j), "state")
    got = await pipe.execute(raise_on_error=False)
    return sum(1 for g in got if g == b"Ended_Completed")


async def main(args: argparse.Namespace) -> int:
    # what a killed node costs the host's loops is counted, not printed
    logging.getLogger("sfc_host").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = RedisClusterServer(Path(tmp) / "c", node_timeout_ms=500, replicas=1)
        cluster.start()
        try:
            return await run(cluster, args)
        finally:
            cluster.stop()


async def run(cluster: RedisClusterServer, args: argparse.Namespace) -> int:
    station = Station(torque_ok)
    completions: list[float] = []
    cfg = quick_config(cluster.url, redis_cluster=True, claim_min_idle_ms=500,
                       outage_threshold_ms=5000)
    rc = RedisCluster.from_url(cluster.url)
    jobs: list[tuple[str, str]] = []
    stop = asyncio.Event()
    try:
        async with Host(cfg, station.sink,
                        on_end=lambda s, j, d: completions.append(time.monotonic())) as host:
            station.attach(host)
            for s in SCOPES:
                await host.store.put_work_master(s, work_master("tighten_rework", WM))

            async def feed() -> None:
                n = 0
                while not stop.is_set():
                    batch = [(s, f"{s}-{n}") for s in SCOPES]
                    await asyncio.gather(*(store_retrying(host, s, j, WM) for s, j in batch))
                    jobs.extend(batch)
                    n += 1
                    await asyncio.sleep(0.05)

            feeding = asyncio.create_task(feed())
            await asyncio.sleep(args.every)
            print(f"cluster failover, {args.kills} kills, one every {args.every:g} s; "
                  f"{len(SCOPES)} scopes on 3 shards, a replica each")
            gaps = []
            loop = asyncio.get_running_loop()
            for k in range(args.kills):
                victim = cluster.primary_of(cluster.shard_slot(k % 3))
                victim.stop(signal.SIGKILL)
                t_kill = time.monotonic()
                before = len(completions)
                deadline = t_kill + 30
                # the first completion after the kill (a job of any shard may complete
                # while the cluster is down: wait for the first after it is up again);
                # one within IN_FLIGHT_S of the kill had its writes under way already
                settled = t_kill + IN_FLIGHT_S
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    if len(completions) > before and completions[-1] > settled \
                            and cluster.is_ok():
                        break
                gap = next((c for c in completions[before:] if c > settled), deadline) - t_kill
                await loop.run_in_executor(None, victim.start)   # back, as a replica
                gaps.append(gap)
                print(f"kill {k + 1}: port {victim.port}, first completion after "
                      f"{gap:.2f} s; {len(jobs)} jobs stored")
                await asyncio.sleep(args.every)
            stop.set()
            await feeding
            errors = sum(v for k, v in host.metrics.snapshot().items()
                         if k.startswith("loop_errors") and isinstance(v, int))
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60 and await ended(rc, jobs) < len(jobs):
                await asyncio.sleep(0.5)
            done = await ended(rc, jobs)
    finally:
        await rc.aclose()
    ids = Counter(station.ids())
    twice = sum(1 for n in ids.values() if n > 1)
    lost = len(jobs) - done
    gaps.sort()
    print(f"jobs: {len(jobs)} stored, {done} ended, {lost} lost or stuck; commands: "
          f"{len(ids)} ids, {twice} sent twice (same id); host loop passes that failed "
          f"and went on: {errors}")
    print(f"kill to the first completion: median {gaps[len(gaps) // 2]:.2f} s, "
          f"longest {gaps[-1]:.2f} s")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--every", type=float, default=4.0)
    sys.exit(asyncio.run(main(p.parse_args())))
