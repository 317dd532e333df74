"""The host's Redis channel against redis-py, in one process, in turns.

    python benchmarks/redis_channel.py [--calls 20000] [--rounds 3]

A local redis-server (started here) and an event-sized script (HGET, HSET, ZADD, XADD,
as the compare-and-set of docs/design.md#compare-and-set-rounds), called by SHA:

- awaited one by one: ``sfc_host.store.channel.RedisChannel.execute`` against the host's
  redis-py client (``sfc_host.store.client.redis_from_url``: blocking pool, hiredis parser,
  packing in C), ``evalsha``;
- 64 at a time: ``execute_many`` against a redis-py pipeline of 64 ``EVALSHA``;
- 64 callers at once (``asyncio.gather``), each awaiting its own call: what the host's
  concurrent passes do, which the channel writes together and redis-py sends on 64
  pooled connections.

Printed: CPU µs of this process a call (``time.process_time``, Redis's own time not
included), calls/s, and the ratio redis-py ÷ channel per workload (the median of the
rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import uvloop
from helpers.servers import RedisServer

from sfc_host.store.channel import RedisChannel
from sfc_host.store.client import redis_from_url

SCRIPT = """
local v = redis.call('HGET', KEYS[1], 'v')
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'state', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'k', 'dispatch', 'j', KEYS[1])
return v
"""
KEYS = ("bench:{s}:job", "bench:{s}:due", "bench:{s}:work")
STATE = b"x" * 200


async def timed(n: int, run: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    await run()
    return (time.process_time() - c0) / n * 1e6, n / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            await bench(server.url, args.calls, args.rounds)
        finally:
            server.stop()


async def bench(url: str, n: int, rounds: int) -> None:
    client = redis_from_url(url, max_connections=64)
    channel = RedisChannel(url)
    sha = await client.script_load(SCRIPT)
    args = (sha, 3, *KEYS, 1, STATE)
    batches = n // 64

    async def py_one() -> None:
        for _ in range(n):
            await client.evalsha(*args)

    async def ch_one() -> None:
        for _ in range(n):
            await channel.execute("EVALSHA", *args)

    async def py_pipe() -> None:
        for _ in range(batches):
            pipe = client.pipeline(transaction=False)
            for _ in range(64):
                pipe.execute_command("EVALSHA", *args)
            await pipe.execute()

    async def ch_pipe() -> None:
        cmds = [("EVALSHA", *args)] * 64
        for _ in range(batches):
            await channel.execute_many(cmds)

    async def py_gather() -> None:
        for _ in range(batches):
            await asyncio.gather(*(client.evalsha(*args) for _ in range(64)))

    async def ch_gather() -> None:
        for _ in range(batches):
            await asyncio.gather(*(channel.execute("EVALSHA", *args) for _ in range(64)))

    workloads = [("awaited one by one", py_one, ch_one, n),
                 ("pipelines of 64", py_pipe, ch_pipe, batches * 64),
                 ("64 callers at once", py_gather, ch_gather, batches * 64)]
    await ch_one()                        # connections made, scripts warm
    await py_gather()
    print(f"EVALSHA of an event-sized script, {n:,} calls a run, {rounds} rounds in turns, "
          f"Python {sys.version.split()[0]}")
    print("| workload | redis-py µs CPU a call | channel µs CPU a call | redis-py calls/s "
          "| channel calls/s | ratio (CPU) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, py, ch, calls in workloads:
        py_cpu, ch_cpu, py_rate, ch_rate = [], [], [], []
        for _ in range(rounds):
            c, r = await timed(calls, py)
            py_cpu.append(c)
            py_rate.append(r)
            c, r = await timed(calls, ch)
            ch_cpu.append(c)
            ch_rate.append(r)
        pc, cc = statistics.median(py_cpu), statistics.median(ch_cpu)
        print(f"| {name} | {pc:.1f} | {cc:.1f} | {statistics.median(py_rate):,.0f} | "
              f"{statistics.median(ch_rate):,.0f} | {pc / cc:.1f}x |")
    await channel.aclose()
    await client.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    uvloop.run(main(p.parse_args()))
