"""Action completions per second through one host process and one local redis-server.

    python benchmarks/host_throughput.py             # 1,000 and 100,000 jobs, 10 and 1,000 scopes
    python benchmarks/host_throughput.py --quick     # a smoke run

Each job runs a two-step loop (``A`` -> ``B`` -> ``A`` …, a push action per step) on a
real redis-server started for the run. The station is the in-process sink: every
command is answered at once through ``host.answer``, so every job always has one action
in flight and the host is the bottleneck. A completion's whole path is measured: the
answer's read and compare-and-set, the ``dispatch:{action}`` entry through the work
stream, the marker, the acks. Reported per case: completions/s, commands the client
sent per completion and round trips per completion (both counted on the client's
connections), commands Redis executed per completion including those inside the
scripts (``INFO commandstats``), and Redis memory per job. Then the baseline, in the
same process against the same server: an event-sized compare-and-set script (HGET,
HSET, ZADD, XADD) through plain redis-py, awaited one by one and in pipelines of 64.

Targets: >= 20,000 completions/s; <= 4 Redis commands and <= 0.1 round trips
per completion; the rate with 100,000 jobs within 1.5x of the rate with 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis.asyncio as aioredis
import uvloop
from helpers.servers import RedisServer
from redis.asyncio.connection import Connection

import sfc_host.store.channel as channel_mod
from sfc_fast import compile_recipe
from sfc_fast.events import Completed, Start
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Item
from sfc_host.store.client import FastConnection

V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"
LOOP = {
    "Steps": [{"Name": "A", "Initial": True}, {"Name": "B"}],
    "Transitions": [{"Source": "A", "Target": "B", "Condition": "always"},
                    {"Source": "B", "Target": "A", "Condition": "always"}],
    "Actions": [
        {"Name": "a", "Step": "A", "Qualifier": "N", "Interaction": "push_command",
         "TypeId": "com.example.a.v1", "TimeoutSeconds": 600},
        {"Name": "b", "Step": "B", "Qualifier": "N", "Interaction": "push_command",
         "TypeId": "com.example.b.v1", "TimeoutSeconds": 600, "Parameters": {"p": 1}},
    ],
}

ROUND_TRIPS = 0
SENT = 0
_send = Connection.send_packed_command
_pack_one = FastConnection.pack_command


async def _counting_send(self: Any, command: Any, check_health: bool = True) -> None:
    global ROUND_TRIPS
    ROUND_TRIPS += 1
    await _send(self, command, check_health)


def _count_one(self: Any, *args: Any) -> Any:
    global SENT
    SENT += 1
    return _pack_one(self, *args)


_channel_send = channel_mod._Connection.send
_channel_flush = channel_mod._Connection._flush


def _count_channel(self: Any, packed: bytes, n: int, lazy: bool = False) -> Any:
    global SENT
    SENT += n or 1
    return _channel_send(self, packed, n, lazy)


def _count_channel_write(self: Any) -> None:
    global ROUND_TRIPS
    if self.out and self.transport is not None:
        ROUND_TRIPS += 1
    _channel_flush(self)


# Count what the client sends (commands inside scripts are the server's business):
# through redis-py's pool and through the host's channel (one write a round trip).
Connection.send_packed_command = _counting_send  # type: ignore[method-assign]
FastConnection.pack_command = _count_one  # type: ignore[method-assign]
channel_mod._Connection.send = _count_channel  # type: ignore[method-assign]
channel_mod._Connection._flush = _count_channel_write  # type: ignore[method-assign]


async def commands(url: str) -> int:
    c = aioredis.Redis.from_url(url)
    try:
        info = await c.info("commandstats")
        return sum(v["calls"] for v in info.values())
    finally:
        await c.aclose()


async def case(url: str, n_jobs: int, n_scopes: int, seconds: float,
               idle_scopes: int = 0) -> dict[str, float]:
    """Completions/s of ``n_jobs`` over ``n_scopes``, the host serving ``idle_scopes``
    more scopes without any job (registered and swept like the others)."""
    c = aioredis.Redis.from_url(url)
    await c.flushall()
    await c.aclose()
    graph = compile_recipe(LOOP, V110)
    completions = 0
    host: Host

    def on_command(cmd: Any) -> None:
        host.answer(cmd.scope, Completed(cmd.command_id))

    sink = InProcessSink(on_command=None)
    cfg = HostConfig(redis_url=url, read_count=512,
                     sweep_interval_ms=1000, consumer="bench")
    host = Host(cfg, sink)
    scopes = [f"s{i}" for i in range(n_scopes)]
    for s in scopes + [f"idle{i}" for i in range(idle_scopes)]:
        await host.add_scope(s)
    await host.start()
    # Start the jobs through the settler in batches (the start path without orders).
    t0 = time.perf_counter()
    batch: list[Item] = []
    for i in range(n_jobs):
        s = scopes[i % n_scopes]
        job = f"j{i}"
        batch.append(Item(s, job, [Start(job, s)], graph=graph))
        if len(batch) == 2000:
            await host.settler.settle(batch)
            batch = []
    if batch:
        await host.settler.settle(batch)
    setup = time.perf_counter() - t0
    # Let the first dispatches go out without answers, then switch the station on.
    while await host.consume_once(block_ms=0):
        pass
    if os.environ.get("BENCH_DEBUG"):
        print("after setup", await host.client.xpending("sfc:{s0}:work", "sfc-host"),
              host.metrics.snapshot(), len(host._local))
    firsts = []
    while not sink.queue.empty():
        firsts.append(sink.queue.get_nowait())

    seen: set[str] = set()
    duplicates = 0

    def answered(cmd: Any) -> None:
        nonlocal completions, duplicates
        completions += 1
        if cmd.command_id in seen:
            duplicates += 1
        seen.add(cmd.command_id)
        host.answer(cmd.scope, Completed(cmd.command_id))
    sink.on_command = answered
    for cmd in firsts:
        host.answer(cmd.scope, Completed(cmd.command_id))
    await asyncio.sleep(min(2.0, seconds / 3))   # warm-up
    c0, rt0, cmd0, s0 = completions, ROUND_TRIPS, await commands(url), SENT
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    dt = time.perf_counter() - t0
    c1, rt1, cmd1, s1 = completions, ROUND_TRIPS, await commands(url), SENT
    sink.on_command = None   # the station stops answering; the host can close
    await host.aclose()
    if os.environ.get("BENCH_DEBUG"):
        print(host.metrics.snapshot(), "duplicates", duplicates, "unique", len(seen))
    done = c1 - c0
    info = aioredis.Redis.from_url(url)
    mem = (await info.info("memory"))["used_memory"]
    if os.environ.get("BENCH_DEBUG"):
        for sc in scopes[:3]:
            k = f"sfc:{{{sc}}}:work"
            pend = await info.xpending(k, "sfc-host")
            rng = await info.xpending_range(k, "sfc-host", "-", "+", 1000)
            ids = [r["message_id"] for r in rng]
            kinds = {}
            for i in ids:
                e = await info.xrange(k, i, i)
                kk = e[0][1][b"k"] if e else b"deleted"
                kinds[kk] = kinds.get(kk, 0) + 1
            print(kinds, rng[:2])
            print(sc, await info.xlen(k), pend["pending"],
                  await info.xrange(k, pend["min"], pend["min"]) if pend["min"] else None)
    await info.aclose()
    return {"jobs": n_jobs, "scopes": n_scopes, "idle_scopes": idle_scopes, "rate": done / dt,
            "commands": (s1 - s0 - 1) / max(done, 1),
            "server_commands": (cmd1 - cmd0 - 1) / max(done, 1),
            "round_trips": (rt1 - rt0 - 1) / max(done, 1), "setup_s": setup,
            "mem_per_job": mem / n_jobs}


BASELINE_CAS = """
local v = redis.call('HGET', KEYS[1], 'v') or '0'
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'v', tonumber(v) + 1)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'k', 'dispatch:a', 'j', ARGV[4])
return 1
"""


async def baseline(url: str, n: int = 4000) -> dict[str, float]:
    """The yardstick of docs/design.md#few-large-requests, same process and server: an
    event-sized compare-and-set script through plain redis-py, awaited one by one and in
    pipelines of 64."""
    c = aioredis.Redis.from_url(url)
    try:
        sha = await c.script_load(BASELINE_CAS)
        state = b"x" * 300
        keys = ("b:job", "b:due", "b:work")
        await c.delete(*keys)
        t0 = time.perf_counter()
        for i in range(n):
            await c.evalsha(sha, 3, *keys, i, state, i, "j")
        one = n / (time.perf_counter() - t0)
        await c.delete(*keys)
        t0 = time.perf_counter()
        for i in range(0, n, 64):
            pipe = c.pipeline(transaction=False)
            for j in range(i, i + 64):
                pipe.evalsha(sha, 3, *keys, j, state, j, "j")
            await pipe.execute()
        piped = n / (time.perf_counter() - t0)
        await c.delete(*keys)
        return {"one_by_one": one, "pipelined": piped}
    finally:
        await c.aclose()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            cases = ([(1000, 10, 3.0)] if args.quick else
                     [(1000, 10, args.seconds), (1000, 1000, args.seconds),
                      (100_000, 10, args.seconds), (100_000, 1000, args.seconds)])
            print(f"host throughput, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
            print(f"{'jobs':>8} {'scopes':>6} {'completions/s':>14} {'cmds/compl':>10} "
                  f"{'in Redis':>8} {'RTT/compl':>9} {'setup s':>8} {'Redis B/job':>11}")
            rates = {}
            for n, s, secs in cases:
                r = await case(server.url, n, s, secs)
                rates[(n, s)] = r["rate"]
                print(f"{n:>8} {s:>6} {r['rate']:>14,.0f} {r['commands']:>10.3f} "
                      f"{r['server_commands']:>8.2f} "
                      f"{r['round_trips']:>9.3f} {r['setup_s']:>8.1f} {r['mem_per_job']:>11,.0f}")
            base = await baseline(server.url)
            print(f"baseline, plain redis-py, one event-sized compare-and-set script per "
                  f"event: {base['one_by_one']:,.0f}/s awaited one by one, "
                  f"{base['pipelined']:,.0f}/s in pipelines of 64")
            best = rates[cases[0][:2]]
            print(f"host completions/s ({cases[0][0]:,} jobs, {cases[0][1]} scopes) against "
                  f"the baseline: {best / base['one_by_one']:.1f}x one by one, "
                  f"{best / base['pipelined']:.2f}x pipelined")
            for s in (10, 1000):
                if (1000, s) in rates and (100_000, s) in rates:
                    print(f"rate 1,000 / 100,000 jobs over {s} scopes: "
                          f"{rates[(1000, s)] / rates[(100_000, s)]:.2f}x")
        finally:
            server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seconds", type=float, default=8.0)
    uvloop.run(main(p.parse_args()))
