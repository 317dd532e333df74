"""End to end through mosquitto: jobs per second and answer-to-command latency.

    python benchmarks/mqtt_e2e.py             # the figures of docs/benchmarks.md
    python benchmarks/mqtt_e2e.py --quick     # a smoke run
    python benchmarks/mqtt_e2e.py --pin       # the host on a core of its own

One host (``sfc_host.service.app.App``: Redis side, MQTT link, equipment) and one local
redis-server and mosquitto, all started here; the station is a separate process
(``mqtt_station_proc.py``) that answers every command at once. Each job runs a
5-step recipe with one push action per step, so a job is five commands and five
answers through the broker. Measured:

- saturation: N jobs stored at once; jobs/s from the first store to the last completion;
- paced: jobs offered at a fixed rate (``--rate`` actions/s, default half of the
  saturation just measured), once the host has sent what the saturation run left
  queued (``settled``); the host's latency from an answer arriving to the job's next
  command leaving (p50, p99, every sample of the host's
  ``answer_to_command_seconds``);
- the broker's own latency at that rate: a plain MQTT 5 QoS 1 ping-pong through the
  same mosquitto (``mqtt_pingpong_proc.py``) once the host is closed, the yardstick of
  the paced p99.

``--pin`` (Linux, two CPUs at least): this process, the host, on the first CPU; Redis,
mosquitto and the station on the second, as docs/operations.md suggests for a small
server (the ping-pong then runs on the first, the host closed).

Targets: >= 1,000 jobs/s at saturation; p99 <= 5 ms at 1,000 actions/s; host CPU
<= 60 µs an action at saturation; the paced p99 at half of saturation <= 2x the
broker's own p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import itertools

import uvloop
from helpers.servers import MosquittoServer, RedisServer

from sfc_host.config import HostConfig
from sfc_host.mes.publishing import INTERVAL_S
from sfc_host.metrics import Metrics
from sfc_host.service.app import App

V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"
STEPS = [f"S{i}" for i in range(5)]
WM = {"ID": "five", "dataschema": V110, "data": {
    "Steps": [{"Name": n, "Initial": i == 0} for i, n in enumerate(STEPS)],
    "Transitions": [{"Source": a, "Target": b, "Condition": "always"}
                    for a, b in itertools.pairwise(STEPS)],
    "Actions": [{"Name": n.lower(), "Step": n, "Qualifier": "N",
                 "Interaction": "push_command", "TypeId": f"com.example.{n.lower()}.v1",
                 "TimeoutSeconds": 60, "Parameters": {"p": i}} for i, n in enumerate(STEPS)]}}
SCOPE = "cell"


_OFFERED: set[asyncio.Task[None]] = set()     # stores in flight, held until done


async def store(app: App, job: str) -> None:
    """Store and start one job order of the benchmark's Work Master."""
    await app.host.orders.store_order(SCOPE, {"JobOrderID": job,
                                              "WorkMasterID": [{"ID": WM["ID"]}]}, start=True)


async def offer(app: App, prefix: str, n: int, rate_jobs_s: float, t0: float,
                store: Callable[[App, str], Awaitable[None]] = store) -> None:
    """Store job ``i`` at ``t0 + i / rate_jobs_s``, each its own task: a store slower
    than the interval must not hold back the next one, or the rate offered falls short
    of the one asked. Returns once the last is offered."""
    for i in range(n):
        delay = t0 + i / rate_jobs_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(store(app, f"{prefix}{i}"))
        _OFFERED.add(t)
        t.add_done_callback(_OFFERED.discard)


async def run_jobs(app: App, prefix: str, n: int, rate_jobs_s: float | None,
                   store: Callable[[App, str], Awaitable[None]] = store) -> float:
    """Store ``n`` jobs (all at once or paced) with ``store``; seconds until every job
    completed."""
    done = 0
    finished = asyncio.Event()
    prev = app.host.settler.on_end

    def on_end(scope: str, job: str, d: Any) -> None:
        nonlocal done
        if job.startswith(prefix):
            done += 1
            if done >= n:
                finished.set()
        if prev:
            prev(scope, job, d)
    app.host.settler.on_end = on_end
    t0 = time.perf_counter()

    if rate_jobs_s is None:
        for i in range(0, n, 200):
            await asyncio.gather(*(store(app, f"{prefix}{j}")
                                   for j in range(i, min(n, i + 200))))
    else:
        await offer(app, prefix, n, rate_jobs_s, t0, store)
    await asyncio.wait_for(finished.wait(), 120)
    app.host.settler.on_end = prev
    return time.perf_counter() - t0


async def settled(app: App, timeout_s: float = 20.0) -> float:
    """Wait until the host has sent everything a run before left queued (after a
    saturation run, thousands of status messages of the orders that ended); seconds
    waited. A paced window measures the host at its rate, not the last run's tail."""
    t0 = time.perf_counter()
    while app.link.queued or app.host.backlog:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"the host did not settle in {timeout_s} s")
        await asyncio.sleep(0.01)
    await asyncio.sleep(INTERVAL_S)     # the last changes' coalesced retained publish
    return time.perf_counter() - t0


def _json_of(script: str, args: list[str], seconds: float) -> dict[str, float]:
    """Run a benchmark script of this folder for about ``seconds``; the JSON object it
    prints last (CalledProcessError when it fails)."""
    out = subprocess.run([sys.executable, str(Path(__file__).with_name(script)), *args],
                         capture_output=True, text=True, timeout=seconds + 60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def broker_pingpong(port: int, rate: float, seconds: float) -> dict[str, float]:
    """The broker's own latency at ``rate`` messages/s: mqtt_pingpong_proc.py's plain
    MQTT 5 QoS 1 ping-pong through the same mosquitto (p50_ms, p99_ms, p999_ms, rate)."""
    return _json_of("mqtt_pingpong_proc.py", ["127.0.0.1", str(port), str(rate), str(seconds)],
                    seconds)


def floor_relay(broker_port: int, redis_port: int, rate: float,
                seconds: float) -> dict[str, float]:
    """The floor at ``rate`` actions/s: mqtt_floor.py's relay through a running broker
    (the station answering on it) and Redis (rate, p50_ms, p99_ms, p999_ms, core)."""
    return _json_of("mqtt_floor.py", ["--ports", str(broker_port), str(redis_port),
                                      "--rate", str(rate), "--seconds", str(seconds)], seconds)


@contextlib.contextmanager
def servers_and_station(structured: bool = False, pin: bool = False
                        ) -> Iterator[tuple[RedisServer, MosquittoServer]]:
    """A local redis-server and mosquitto, and the station process answering every
    command on that broker; all stopped on the way out. ``pin``: this process on the
    first CPU, the three others on the second."""
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp) / "redis")
        broker = MosquittoServer(Path(tmp) / "mqtt")
        redis.start()
        broker.start()
        station = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("mqtt_station_proc.py")),
             "127.0.0.1", str(broker.port), "structured" if structured else "binary"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert station.stdout is not None
            station.stdout.readline()   # "ready"
            if pin:
                assert redis.proc is not None and broker.proc is not None
                os.sched_setaffinity(0, {0})
                for pid in (redis.proc.pid, broker.proc.pid, station.pid):
                    os.sched_setaffinity(pid, {1})
            yield redis, broker
        finally:
            station.terminate()
            station.wait(5)
            broker.stop()
            redis.stop()


async def main(args: argparse.Namespace) -> None:
    with servers_and_station(args.structured, args.pin) as (redis, broker):
        cfg = HostConfig(redis_url=redis.url, mqtt_url=broker.url, consumer="bench",
                         sweep_interval_ms=500, mqtt_binary=not args.structured)
        async with App(cfg) as app:
            await app.host.store.put_work_master(SCOPE, WM)
            await app.host.add_scope(SCOPE)
            n = 200 if args.quick else args.jobs
            await run_jobs(app, "warm", min(n, 200), None)
            cpu0 = time.process_time()
            secs = await run_jobs(app, "sat", n, None)
            cpu = time.process_time() - cpu0
            mode = "structured" if args.structured else "binary"
            print(f"end to end, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
                  f"5 push actions per job; MQTT 5, {mode} CloudEvents")
            # the host's own CPU per job is steadier than the rate on a shared machine
            print(f"saturation: {n} jobs in {secs:.2f} s = {n / secs:,.0f} jobs/s "
                  f"({5 * n / secs:,.0f} actions/s); host CPU {cpu / n * 1e6:,.0f} µs "
                  f"a job, {cpu / n / 5 * 1e6:,.1f} µs an action ({cpu / secs:.0%} of "
                  "a core)")
            # an overload leaves the MES's status traffic queued (a lasting one refuses it)
            print(f"the link's queue at its end: {app.link.queued:,} messages; status "
                  f"messages refused: {app.metrics['mqtt_status_dropped']:,}")
            # every sample kept: the histogram's buckets (10 ms, 25 ms) are too
            # coarse for a p99 between them
            samples: list[float] = []
            m: Metrics = app.metrics
            observe = m.observe

            def keep(name: str, value: float) -> None:
                if name == "answer_to_command_seconds":
                    samples.append(value)
                observe(name, value)
            m.observe = keep  # type: ignore[method-assign]
            await settled(app)
            actions_s = args.rate or round(5 * n / secs / 2)
            rate = actions_s / 5
            paced_n = int(rate * (2 if args.quick else args.seconds))
            cpu0 = time.process_time()
            paced_s = await run_jobs(app, "paced", paced_n, rate)
            paced_cpu = time.process_time() - cpu0
            m.observe = observe  # type: ignore[method-assign]
            samples.sort()

            def q(f: float) -> float:
                return samples[min(len(samples) - 1, int(f * len(samples)))] * 1000
            print(f"paced at {actions_s:,} actions/s ({paced_n} jobs, {len(samples):,} "
                  f"answers): answer to next command p50 {q(0.5):.2f} ms, "
                  f"p99 {q(0.99):.2f} ms, p99.9 {q(0.999):.2f} ms; host CPU "
                  f"{paced_cpu / paced_n / 5 * 1e6:,.1f} µs an action "
                  f"({paced_cpu / paced_s:.0%} of a core)")
            if os.environ.get("BENCH_DEBUG"):
                print(app.metrics.snapshot())
            await settled(app)
        # The broker alone, the host closed: its MES side's retained index of every
        # order stored here is megabytes, and a publish of it stalls the broker.
        pp = await asyncio.get_running_loop().run_in_executor(
            None, broker_pingpong, broker.port, actions_s, 2 if args.quick else args.seconds)
        print(f"broker ping-pong (MQTT 5 QoS 1) at {pp['rate']:,.0f} round trips/s: "
              f"p50 {pp['p50_ms']:.2f} ms, p99 {pp['p99_ms']:.2f} ms, p99.9 "
              f"{pp['p999_ms']:.2f} ms; the host's p99 is "
              f"{q(0.99) / pp['p99_ms']:.2f}x the broker's")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--rate", type=int, default=0,
                   help="paced actions/s (default: half of the saturation measured)")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--structured", action="store_true",
                   help="structured CloudEvents (JSON payload, no user properties)")
    p.add_argument("--pin", action="store_true",
                   help="the host on the first CPU; Redis, mosquitto, station on the second")
    a = p.parse_args()
    if a.pin and (not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2):
        p.error("--pin needs Linux and two CPUs this process may use")
    uvloop.run(main(a))
