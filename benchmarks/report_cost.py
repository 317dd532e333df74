"""Cost as the work grows, for benchmarks/report.py.

    python benchmarks/report_cost.py active REDIS_URL --jobs N [--seconds S] [--shift]

``active`` runs in a process of its own (so its RSS is a host's): one host with the
in-process sink on the given Redis (flushed first), ``--jobs`` idle running jobs of a
10-step recipe (each at step 5 with its command out and marked sent) written in bulk
through the host's own store (``Store.commit``, the compare-and-set the settler uses,
and ``Store.write_markers``), then a working set of 1,000 jobs looping over two push
actions, answered at once, over the same 10 scopes: the per-action time with that many
jobs held. With ``--shift``: the sweep of every deadline of the index (none due), the
outage shift of every job (heartbeat set older than the threshold: one sweep takes all
jobs, then the host settles a Shift and a Tick per job until its streams are drained),
and a sweep that pops as many due deadlines from one scope's index. Prints one JSON
object.

The other measurements here (recipe size, scopes) run in report.py's process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis.asyncio as aioredis
import uvloop
from helpers.recipes import chain
from host_throughput import LOOP, V110

import sfc_fast
from sfc_fast import Graph, compile_recipe, sent_markers
from sfc_fast.deadlines import DeadlineIndex
from sfc_fast.events import Completed, Start
from sfc_fast.evolve import evolve
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Item
from sfc_host.execution.sweep import Sweeper
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.states import Record, caught_up

RESULT = {"ok": True, "torque": 85.5}
SCOPES = 10
WORKING_SET = 1000
FILL_CHUNK = 4000


def advanced(graph: Graph, job: str, scope: str, done: int, now: int) -> bytes:
    """The state of ``job`` after its start and ``done`` completions (with a result)."""
    d = evolve(graph, None, Start(job, scope), now)
    for _ in range(done):
        d = evolve(graph, d.state, Completed(d.commands[0].command_id, RESULT), now)
    assert d.state is not None
    return d.state


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- recipe size (in-process)


def recipe_size(steps: int, rounds: int = 5) -> dict[str, float]:
    """Compile time (median) and the time of one completion evolved in the middle: as
    the host evolves it (``evolve_live``: the live part of the state, its archive kept
    apart) and as one whole document (``evolve``: the archive copied along)."""
    r = chain(steps)
    times = []
    graph = None
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        graph = compile_recipe(r, V110)
        times.append(time.perf_counter() - t0)
    assert graph is not None
    live_fn = getattr(sfc_fast, "evolve_live", evolve)   # a format-1 build: one document
    now = 1_000_000
    d = live_fn(graph, None, Start("job-1", "s"), now)
    archive = [getattr(d, "archived", b"")]
    for _ in range(steps // 2):
        d = live_fn(graph, d.state, Completed(d.commands[0].command_id, RESULT), now)
        archive.append(getattr(d, "archived", b""))
    ev = Completed(d.commands[0].command_id, RESULT)
    live = d.state
    assert live is not None
    whole = live + b"".join(archive)

    def per_call(fn: Callable[..., Any], state: bytes, calls: int) -> float:
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(graph, state, ev, now)
            samples.append((time.perf_counter() - t0) / calls)
        return statistics.median(samples)

    whole_calls = max(100, min(20_000, 2_000_000 // steps))   # it grows with the history
    return {"steps": steps, "compile_s": statistics.median(times),
            "evolve_s": per_call(live_fn, live, 20_000 if live_fn is not evolve
                                 else whole_calls),
            "evolve_whole_s": per_call(evolve, whole, whole_calls),
            "graph_bytes": len(graph.to_bytes()), "state_bytes": len(live),
            "state_whole_bytes": len(whole)}


# ---------------------------------------------------------------- active jobs (own process)


async def fill(host: Host, graph: Graph, scopes: list[str], n: int) -> float:
    """Write ``n`` running jobs (at step 5 of 10, command marked sent) through the
    host's store in bulk; seconds taken."""
    store = host.store
    now = await store.now_ms()
    t0 = time.perf_counter()
    with_graph: set[str] = set()
    for base in range(0, n, FILL_CHUNK):
        batches: dict[str, list[Record]] = {}
        marks: list[tuple[str, str, str, str]] = []
        for i in range(base, min(n, base + FILL_CHUNK)):
            s = scopes[i % len(scopes)]
            job = f"idle-{i:07d}"
            state = advanced(graph, job, s, 5, now)
            d = evolve(graph, state, Start(job, s), now)   # absorbed: only for the deadline
            rec = Record(job, b"0", state, d.next_deadline, True, fingerprint=graph.fingerprint)
            if s not in with_graph:
                rec.graph = graph.to_bytes()
                with_graph.add(s)
            batches.setdefault(s, []).append(rec)
            started, open_ = sent_markers(graph, state)
            marks.extend((s, job, f, f"{started}:{cid}") for f, cid in open_)
        got = await store.commit(batches)
        assert all(all(v for v in c.versions) for c in got.values()), "a filler was refused"
        await store.write_markers(marks)
    for s in with_graph:
        store.graphs.stored.add((s, graph.fingerprint))
    return time.perf_counter() - t0


async def memory(client: Any, scopes: list[str], n: int) -> dict[str, float]:
    """Bytes per filler job: MEMORY USAGE of sampled job hashes plus the job's share
    of its scope's due index and active set."""
    sample = [f"idle-{i:07d}" for i in range(0, n, max(1, n // 200))]
    hashes = [await client.memory_usage(ScopeKeys(scopes[int(j[5:]) % len(scopes)]).job(j))
              for j in sample]
    shared = 0
    for s in scopes:
        k = ScopeKeys(s)
        shared += await client.memory_usage(k.due, samples=0) or 0
        shared += await client.memory_usage(k.active, samples=0) or 0
    return {"hash": statistics.mean(hashes), "indexes": shared / n}


def answer_at_once(host: Host, sink: InProcessSink) -> Callable[[], int]:
    """From now on the sink answers every command at once (those it holds too); the
    returned function tells how many it answered."""
    count = 0

    def answered(cmd: Any) -> None:
        nonlocal count
        count += 1
        host.answer(cmd.scope, Completed(cmd.command_id))
    firsts = []
    while not sink.queue.empty():
        firsts.append(sink.queue.get_nowait())
    sink.on_command = answered
    for cmd in firsts:
        host.answer(cmd.scope, Completed(cmd.command_id))
    return lambda: count


async def working_rate(host: Host, sink: InProcessSink, scopes: list[str],
                       seconds: float) -> float:
    """Completions/s of ``WORKING_SET`` looping jobs answered at once (as
    host_throughput.py's case, with whatever else the scopes hold)."""
    graph = compile_recipe(LOOP, V110)
    items = [Item(scopes[i % len(scopes)], f"w{i}", [Start(f"w{i}", scopes[i % len(scopes)])],
                  graph=graph) for i in range(WORKING_SET)]
    await host.settler.settle(items)
    while await host.consume_once(block_ms=0):
        pass
    count = answer_at_once(host, sink)
    await asyncio.sleep(min(2.0, seconds / 3))
    c0, t0 = count(), time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (count() - c0) / (time.perf_counter() - t0)
    sink.on_command = None
    await asyncio.sleep(0.5)          # the answers in flight settle
    return rate


async def drained(host: Host, scopes: list[str], timeout: float) -> bool:
    """Wait until every scope's work stream has nothing pending or unread."""
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        left = 0
        for s in scopes:
            for g in await host.client.xinfo_groups(ScopeKeys(s).work):
                left += int(g.get("pending") or 0) + int(g.get("lag") or 0)
        if left == 0:
            return True
        await asyncio.sleep(0.1)
    return False


async def shift(host: Host, graph: Graph, scopes: list[str], n: int) -> dict[str, float]:
    """An outage over every job: the sweep that sees it (one INCRBY of each scope's
    offset moves every due score at once), then what a job pays later: reading a sample
    of idle jobs after the outage (each state caught up with a ``Shift``) against the
    same reads before it."""
    client = host.client
    out: dict[str, float] = {}
    # one sweep with every deadline held and none due
    t0 = time.perf_counter()
    await host.sweep_once()
    out["sweep_none_due_s"] = time.perf_counter() - t0
    probe = ScopeKeys(scopes[0])
    sample = [f"idle-{i:07d}" for i in range(0, min(n, 200_000), len(scopes))]

    async def deadline() -> float:
        return (await client.zscore(probe.due, "idle-0000000") or 0) + \
            int(await client.get(probe.offset) or 0)

    async def read_sample() -> float:
        host.store.cache = type(host.store.cache)(0)     # every row from Redis
        t = time.perf_counter()
        for i in range(0, len(sample), 1000):
            await host.store.load({scopes[0]: sample[i:i + 1000]})
        return time.perf_counter() - t

    cache = host.store.cache
    before = await deadline()
    read_before = await read_sample()
    # an outage: every heartbeat far older than the threshold
    now = await host.store.now_ms()
    gap = 3 * host.config.outage_threshold_ms
    held = 0
    for s in scopes:
        held += await client.zcard(ScopeKeys(s).due)
        await client.set(ScopeKeys(s).heartbeat, now - gap)
    t0 = time.perf_counter()
    await host.sweep_once()
    t1 = time.perf_counter()
    ok = await drained(host, scopes, timeout=60.0)
    after = await deadline()
    read_after = await read_sample()
    host.store.cache = cache
    # the catch-up alone: the core's Shift of each stored (not yet shifted) state
    pipe = client.pipeline(transaction=False)
    for j in sample:
        pipe.hget(probe.job(j), "s")
    states = await pipe.execute()
    t = time.perf_counter()
    for st in states:
        caught_up(graph, st, gap, now)
    catch_up = (time.perf_counter() - t) / len(states)
    out.update(shift_jobs=held, shift_take_s=t1 - t0, shift_total_s=t1 - t0,
               shift_drained=ok, shift_moved_ms=after - before, shift_gap_ms=gap,
               shift_sample=len(sample), shift_read_before_s=read_before,
               shift_read_after_s=read_after, shift_catch_up_us=catch_up * 1e6)
    out["rss_after_shift"] = rss_bytes()
    return out


async def sweep_due(host: Host, n: int, per_scope_limit: int = 10_000) -> dict[str, Any]:
    """Pop ``n`` due deadlines spread over 10 scopes of their own, sweeping back to back
    with ``sweep_limit`` = ``per_scope_limit`` until every one is popped. (One script
    popping a million at once holds Redis for seconds: every other client then gets
    BUSY, so the host never sweeps that way.)"""
    client = host.client
    keys = [ScopeKeys(f"sweepbench{i}") for i in range(SCOPES)]
    for k in keys:
        await client.delete(k.due, k.work, k.heartbeat)
    for base in range(0, n, 20_000):
        members: dict[str, dict[str, int]] = {}
        for i in range(base, min(n, base + 20_000)):
            members.setdefault(keys[i % SCOPES].due, {})[f"d{i}"] = 1 + i % 1000
        for key, m in members.items():
            await client.zadd(key, m)
    cfg = HostConfig(redis_url="redis://unused", sweep_limit=per_scope_limit,
                     sweep_interval_ms=60_000, outage_threshold_ms=7_200_000)
    sweeper = Sweeper(host.scripts, cfg, host.metrics)
    got = passes = 0
    t0 = time.perf_counter()
    while got < n:
        popped = await sweeper.sweep(keys)
        passes += 1
        if not popped:
            break
        got += popped
    dt = time.perf_counter() - t0
    for k in keys:
        await client.delete(k.due, k.work, k.heartbeat)
    # the core's own index (the embedded Runner's): pop every one of n due deadlines
    idx = DeadlineIndex()
    for i in range(n):
        idx.set(f"d{i}", 1 + i % 1000)
    t0 = time.perf_counter()
    popped_core = idx.pop_due(10_000)
    core = time.perf_counter() - t0
    return {"sweep_due_jobs": got, "sweep_due_s": dt, "sweep_due_passes": passes,
            "sweep_due_limit": per_scope_limit, "core_pop_due_s": core,
            "core_popped": len(popped_core)}


async def active(url: str, n: int, seconds: float, with_shift: bool) -> dict[str, Any]:
    c = aioredis.Redis.from_url(url)
    await c.flushall()
    out: dict[str, Any] = {"jobs": n, "scopes": SCOPES, "rss_start": rss_bytes()}
    graph = compile_recipe(chain(10), V110)
    sink = InProcessSink(on_command=None)
    # Sweeps only when called here: the outage below is set up, not raced.
    cfg = HostConfig(redis_url=url, consumer="cost", read_count=512,
                     sweep_interval_ms=3_600_000, outage_threshold_ms=7_200_000)
    host = Host(cfg, sink)
    scopes = [f"c{i}" for i in range(SCOPES)]
    for s in scopes:
        await host.add_scope(s)
    await host.start()
    try:
        base_mem = (await c.info("memory"))["used_memory"]
        out["fill_s"] = await fill(host, graph, scopes, n)
        out["redis_bytes_per_job"] = ((await c.info("memory"))["used_memory"] - base_mem) / n
        out.update({f"usage_{k}": v for k, v in (await memory(c, scopes, n)).items()})
        out["rss_filled"] = rss_bytes()
        out["rate"] = await working_rate(host, sink, scopes, seconds)
        out["action_s"] = 1 / out["rate"] if out["rate"] else None
        out["rss_running"] = rss_bytes()
        if with_shift:
            for part in (shift(host, graph, scopes, n), sweep_due(host, n)):
                try:   # one failing part keeps the figures of the others
                    out.update(await part)
                except Exception as e:
                    out.setdefault("errors", []).append(repr(e))
    finally:
        sink.on_command = None
        await host.aclose()
        await c.aclose()
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["active"])
    p.add_argument("url")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--shift", action="store_true")
    a = p.parse_args()
    print(json.dumps(uvloop.run(active(a.url, a.jobs, a.seconds, a.shift))), flush=True)
