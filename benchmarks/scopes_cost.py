"""What a host pays for the number of scopes it serves (the targets: idle scopes cost
no command per pass; 10,000 scopes within 1.3x of 10 scopes in CPU per completion).

    python benchmarks/scopes_cost.py [--seconds S] [--scopes N]

One local redis-server started for the run, one host in this process (as
host_throughput.py). Three measurements:

- ``idle``: the host serves N scopes with one job each whose command is out and not
  answered (nothing due for 600 s): host and Redis CPU seconds per second and Redis
  commands per second (``INFO commandstats``, commands inside scripts included). This
  is the cost of scopes that have nothing to do.
- ``rate``: host_throughput.py's case (jobs answered at once) with 1,000 jobs over 10
  scopes, 1,000 jobs over 10 scopes with N - 10 more scopes served but idle, and
  N jobs over N scopes (one job a scope, the report's "scopes" part).
Prints one JSON object a line. The machine's load changes the rates from run to run:
compare figures of one run (or runs of two builds in turns), not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis.asyncio as aioredis
import uvloop
from helpers.servers import RedisServer
from host_throughput import LOOP, V110, case

from sfc_fast import compile_recipe
from sfc_fast.events import Start
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Item


async def idle(url: str, n: int, seconds: float) -> dict[str, float]:
    """CPU and commands a second of a host serving ``n`` scopes with nothing due."""
    c = aioredis.Redis.from_url(url)
    await c.flushall()
    host = Host(HostConfig(redis_url=url, read_count=512, sweep_interval_ms=1000,
                           consumer="idle"), InProcessSink(on_command=None))
    names = [f"s{i}" for i in range(n)]
    for s in names:
        await host.add_scope(s)
    await host.start()
    try:
        graph = compile_recipe(LOOP, V110)
        items = [Item(s, f"j{i}", [Start(f"j{i}", s)], graph=graph)
                 for i, s in enumerate(names)]
        for i in range(0, n, 2000):
            await host.settler.settle(items[i:i + 2000])
        await asyncio.sleep(4.0)       # the first sweeps and reads of every scope

        async def snap() -> tuple[float, float, int]:
            cpu = await c.info("cpu")
            stats = await c.info("commandstats")
            return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                    time.process_time(), sum(v["calls"] for v in stats.values()))
        a, t0 = await snap(), time.perf_counter()
        await asyncio.sleep(seconds)
        b, dt = await snap(), time.perf_counter() - t0
        return {"part": "idle", "scopes": n, "redis_cpu_s_per_s": (b[0] - a[0]) / dt,
                "host_cpu_s_per_s": (b[1] - a[1]) / dt,
                "redis_commands_per_s": (b[2] - a[2] - 2) / dt}
    finally:
        await host.aclose()
        await c.aclose()


async def main(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for n in (10, a.scopes):
                print(json.dumps(await idle(server.url, n, a.seconds)), flush=True)
            for jobs, scopes, idle_scopes in ((1000, 10, 0), (1000, 10, a.scopes - 10),
                                              (a.scopes, a.scopes, 0)):
                r = await case(server.url, jobs, scopes, a.seconds, idle_scopes)
                print(json.dumps({"part": "rate", **r}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--scopes", type=int, default=10_000)
    uvloop.run(main(p.parse_args()))
