"""One host process for the scale measurement of benchmarks/report.py (docs/scale.md).

    python benchmarks/scale_proc.py REDIS_URL NAME [--cluster] [--jobs N] [--scopes S]

The host serves scopes ``x0`` .. ``x{S-1}`` (shared with every other such process: the
consumer groups split the work entries) and starts ``N`` jobs of its own (host_throughput's
two-step loop). Its station is in-process and answers every command at once. It prints
``ready``, waits for a line on stdin, answers for ``--warmup`` seconds, counts
completions for ``--seconds`` and prints ``{"rate", "cpu_s", "wall_s"}`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvloop
from host_throughput import LOOP, V110
from report_cost import answer_at_once

from sfc_fast import compile_recipe
from sfc_fast.events import Start
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Item


async def main(a: argparse.Namespace) -> None:
    sink = InProcessSink(on_command=None)
    cfg = HostConfig(redis_url=a.url, redis_cluster=a.cluster, consumer=a.name,
                     read_count=512, sweep_interval_ms=1000)
    host = Host(cfg, sink)
    scopes = [f"x{i}" for i in range(a.scopes)]
    for s in scopes:
        await host.add_scope(s)
    await host.start()
    graph = compile_recipe(LOOP, V110)
    items = [Item(scopes[i % a.scopes], f"{a.name}-{i}",
                  [Start(f"{a.name}-{i}", scopes[i % a.scopes])], graph=graph)
             for i in range(a.jobs)]
    for i in range(0, len(items), 1000):
        await host.settler.settle(items[i:i + 1000])
    while await host.consume_once(block_ms=0):
        pass
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    count = answer_at_once(host, sink)
    await asyncio.sleep(a.warmup)
    c0, t0, cpu0 = count(), time.perf_counter(), time.process_time()
    await asyncio.sleep(a.seconds)
    wall = time.perf_counter() - t0
    out = {"rate": (count() - c0) / wall, "cpu_s": time.process_time() - cpu0, "wall_s": wall}
    sink.on_command = None
    await host.aclose()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("--cluster", action="store_true")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--scopes", type=int, default=12)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=5.0)
    uvloop.run(main(p.parse_args()))
