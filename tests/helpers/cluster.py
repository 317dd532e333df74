"""A Redis Cluster host's shared pieces for the cluster tests: scopes spread over the
three shards of the ``redis_cluster`` fixture, their Work Master, a host config on the
cluster, and an order's state read through a cluster client."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

from helpers.hosts import quick_config, work_master
from helpers.servers import RedisClusterServer
from sfc_host.config import HostConfig
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

# Two scopes per shard of the fixture's three (slots split evenly): checked in each test.
SCOPES = ["line1", "line2", "line3", "line4", "line7", "line8"]
WM = "wm-tighten"


def cluster_config(cluster: RedisClusterServer, **kw: Any) -> HostConfig:
    """A host's config on ``cluster`` (the quick test settings, ``kw`` over them)."""
    return quick_config(cluster.url, redis_cluster=True, **kw)


async def store_work_masters(host: Host) -> None:
    """The tightening Work Master ``WM`` in every scope of ``SCOPES``."""
    for s in SCOPES:
        await host.store.put_work_master(s, work_master("tighten_rework", WM))


async def order_state(rc: RedisCluster, scope: str, job: str) -> str | None:
    """The ISA-95 state of ``job`` in ``scope`` (None when it is not stored)."""
    v = await rc.hget(ScopeKeys(scope).order(job), "state")
    return v.decode() if v is not None else None


async def all_completed(rc: RedisCluster, jobs: list[tuple[str, str]]) -> bool:
    """Every ``(scope, job)`` of ``jobs`` is Ended_Completed."""
    for s, j in jobs:
        if await order_state(rc, s, j) != "Ended_Completed":
            return False
    return True
