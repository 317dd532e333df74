"""Soak: a host at half of saturation for N minutes, memory and latency per minute.

    python benchmarks/soak.py                        # 15 minutes, saturation measured first
    python benchmarks/soak.py --minutes 3 --rate 60  # jobs/s given, no saturation run

The end-to-end setup of ``mqtt_e2e.py`` with the host in its own process: redis-server,
mosquitto, the benchmark station (``mqtt_station_proc.py``, answers every command at
once) and one ``sfc-host run`` process with a metrics endpoint. The load is an MES
client (MQTT job control): StoreAndStart of 5-step push jobs at a fixed rate, and
Clear of every job once it completed, as an MES that keeps its order list short does
(so the state index the host publishes stays bounded). Saturation is measured first
(``--saturation-jobs`` submitted at once, completions per second) unless ``--rate``.

Per minute: jobs submitted and completed, refused requests, the host's RSS (from
``/proc``), Redis's used memory (cleared jobs leave it after ``--retention`` seconds)
and the host's answer-to-command latency p50/p99 (the minute's share of the
``answer_to_command_seconds`` histogram). Verdict: RSS growth from the end of minute 2
to the end below 5 %, and p99 stable (no minute from 2 on above twice the median
minute's p99 + 1 ms). The state cache is bounded at ``--state-cache`` jobs (default
5,000, so it is full within the first minutes: a cache still filling is growth by
design, not a leak).

Host settings for an experiment: ``SOAK_SETTINGS='{"tune_gc": false}'`` (JSON, over the
soak's own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "faults"), str(ROOT / "benchmarks")]

import redis.asyncio as aioredis  # noqa: E402
import uvloop  # noqa: E402
from fault_harness import HostProcess, scrape  # noqa: E402
from helpers.servers import MosquittoServer, RedisServer, cpu_seconds  # noqa: E402
from mqtt_e2e import SCOPE, WM  # noqa: E402

from sfc_host.config import HostConfig  # noqa: E402
from sfc_host.demo.report import merge_histograms  # noqa: E402
from sfc_host.mes.client import MesClient, MesError  # noqa: E402
from sfc_host.metrics import Histogram  # noqa: E402
from sfc_host.store.keys import ScopeKeys  # noqa: E402

K = ScopeKeys(SCOPE)
HIST = "sfc_answer_to_command_seconds"
IN_FLIGHT = 64             # MES requests in flight at once


class Load:
    """Submits jobs over MQTT, watches them complete in Redis, clears them."""

    def __init__(self, mes: MesClient, client: Any) -> None:
        self.mes = mes
        self.client = client
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.outstanding: set[str] = set()
        self.submitted = 0
        self.completed = 0
        self.refused = 0
        self.n = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _request(self, method: str, job: str) -> bool:
        async with self.slots:
            try:
                if method == "StoreAndStart":
                    reply = await self.mes.submit(SCOPE, {"JobOrderID": job,
                                                          "WorkMasterID": [{"ID": "five"}]})
                else:
                    reply = await self.mes.control(SCOPE, method, job)
            except MesError:
                self.refused += 1
                return False
            if not reply.ok:
                self.refused += 1
            return reply.ok

    async def _submit(self, job: str) -> None:
        if await self._request("StoreAndStart", job):
            self.outstanding.add(job)

    def submit(self) -> None:
        self.n += 1
        self.submitted += 1
        self._spawn(self._submit(f"s{self.n}"))

    async def watch(self) -> None:
        """Every 0.25 s: which outstanding jobs ended; completed ones are cleared."""
        while True:
            await asyncio.sleep(0.25)
            jobs = list(self.outstanding)
            if not jobs:
                continue
            pipe = self.client.pipeline(transaction=False)
            for j in jobs:
                pipe.hget(K.order(j), "state")
            for j, st in zip(jobs, await pipe.execute(), strict=True):
                if st is not None and st.startswith((b"Ended", b"Aborted")):
                    self.outstanding.discard(j)
                    if st == b"Ended_Completed":
                        self.completed += 1
                    self._spawn(self._request("Clear", j))


def rss_mb(host: HostProcess) -> float:
    return host.rss_kb() / 1024


def cpu_s(host: HostProcess) -> float:
    """The host process's CPU time so far (user + system)."""
    return cpu_seconds(host.proc.pid)


def histogram(port: int) -> Histogram | None:
    text = scrape(port)
    return merge_histograms([text], HIST) if text else None


def minus(a: Histogram, b: Histogram | None) -> Histogram:
    """The observations of ``a`` not in the earlier ``b`` (same buckets)."""
    out = Histogram(a.bounds)
    out.counts = [x - (b.counts[i] if b else 0) for i, x in enumerate(a.counts)]
    out.count = a.count - (b.count if b else 0)
    out.sum = a.sum - (b.sum if b else 0.0)
    return out


async def saturation(load: Load, n: int) -> float:
    """Jobs per second with ``n`` jobs submitted at once."""
    t0 = time.perf_counter()
    done0 = load.completed
    for _ in range(n):
        load.submit()
    while load.completed - done0 < n - load.refused:
        if time.perf_counter() - t0 > 300:
            raise SystemExit("saturation run did not finish within 300 s")
        await asyncio.sleep(0.1)
    rate = (load.completed - done0) / (time.perf_counter() - t0)
    while load.outstanding or load.tasks:
        await asyncio.sleep(0.1)
    return rate


async def main(a: argparse.Namespace) -> int:
    # SIGTERM cancels the run, so the servers and processes it started are stopped
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with tempfile.TemporaryDirectory(prefix="sfc-soak-") as tmp:
        d = Path(tmp)
        redis = RedisServer(d / "redis")
        broker = MosquittoServer(d / "mqtt")
        redis.start()
        broker.start()
        station = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "benchmarks" / "mqtt_station_proc.py"), "127.0.0.1",
            str(broker.port), stdout=asyncio.subprocess.PIPE)
        host: HostProcess | None = None
        client = aioredis.Redis.from_url(redis.url)
        try:
            assert station.stdout is not None
            await asyncio.wait_for(station.stdout.readline(), 15)
            await client.set(K.work_master("five"), json.dumps(WM))
            await client.sadd("sfc:scopes", SCOPE)
            host = HostProcess("soak-host", d, {
                "redis_url": redis.url, "mqtt_url": broker.url, "scopes": [SCOPE],
                "log_level": "WARNING", "state_cache_size": a.state_cache,
                "max_job_orders": 100_000, "ended_retention_s": a.retention,
                **json.loads(os.environ.get("SOAK_SETTINGS", "{}"))})
            await host.ready()
            async with MesClient(HostConfig(mqtt_url=broker.url), timeout_s=30) as mes:
                load = Load(mes, client)
                watcher = asyncio.create_task(load.watch())
                rate = a.rate
                if rate is None:
                    sat = await saturation(load, a.saturation_jobs)
                    rate = sat / 2
                    print(f"saturation: {sat:,.0f} jobs/s ({a.saturation_jobs} jobs at once, "
                          f"5 commands each, MES submit and clear over MQTT); soak at "
                          f"{rate:,.0f} jobs/s", flush=True)
                else:
                    print(f"soak at {rate:,.0f} jobs/s (given)", flush=True)
                rows = await soak(load, host, client, rate, a.minutes)
                watcher.cancel()
        finally:
            await client.aclose()
            if host is not None:
                host.stop()
            station.terminate()
            await station.wait()
            broker.stop()
            redis.stop()
    return verdict(rows)


async def soak(load: Load, host: HostProcess, client: Any, rate: float,
               minutes: float) -> list[dict[str, Any]]:
    print(f"{'min':>4}{'submitted':>11}{'completed':>11}{'refused':>9}{'open':>7}"
          f"{'RSS MB':>9}{'Redis MB':>10}{'CPU %':>7}{'p50 ms':>9}{'p99 ms':>9}", flush=True)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    prev_h = histogram(host.metrics_port)
    prev_cpu, prev_t = cpu_s(host), time.perf_counter()
    sub0, done0, ref0 = load.submitted, load.completed, load.refused
    n_min = max(1, round(minutes))
    for m in range(1, n_min + 1):
        end = t0 + m * 60 * minutes / n_min
        i = 0
        start = time.perf_counter()
        while (now := time.perf_counter()) < end:
            due = int((now - start) * rate)
            while i < due:
                load.submit()
                i += 1
            await asyncio.sleep(0.005)
        h = histogram(host.metrics_port)
        diff = minus(h, prev_h) if h else None
        cpu, t = cpu_s(host), time.perf_counter()
        cpu_pct = (cpu - prev_cpu) / (t - prev_t) * 100
        prev_cpu, prev_t = cpu, t
        prev_h = h
        row = {"minute": m, "submitted": load.submitted - sub0,
               "completed": load.completed - done0, "refused": load.refused - ref0,
               "open": len(load.outstanding), "rss": rss_mb(host),
               "redis": (await client.info("memory"))["used_memory"] / 2**20,
               "cpu": cpu_pct,
               "p50": diff.quantile(0.5) * 1000 if diff and diff.count else float("nan"),
               "p99": diff.quantile(0.99) * 1000 if diff and diff.count else float("nan")}
        sub0, done0, ref0 = load.submitted, load.completed, load.refused
        rows.append(row)
        print(f"{m:>4}{row['submitted']:>11,}{row['completed']:>11,}{row['refused']:>9}"
              f"{row['open']:>7}{row['rss']:>9.1f}{row['redis']:>10.1f}{row['cpu']:>7.0f}"
              f"{row['p50']:>9.2f}"
              f"{row['p99']:>9.2f}",
              flush=True)
    return rows


def verdict(rows: list[dict[str, Any]]) -> int:
    if len(rows) < 3:
        print("verdict: too short (needs 3 minutes at least)")
        return 1
    base = rows[1]["rss"]
    growth = (rows[-1]["rss"] - base) / base * 100
    later = [r["p99"] for r in rows[1:]]
    med = statistics.median(later)
    worst = max(later)
    rss_ok = growth < 5
    p99_ok = worst <= 2 * med + 1
    refused = sum(r["refused"] for r in rows)
    print(f"RSS {base:.1f} MB at the end of minute 2, {rows[-1]['rss']:.1f} MB at the end: "
          f"{growth:+.1f} % ({'ok' if rss_ok else 'FAIL'}, < 5 %)")
    print(f"p99 per minute from minute 2: median {med:.2f} ms, worst {worst:.2f} ms "
          f"({'stable' if p99_ok else 'UNSTABLE'}: worst <= 2 x median + 1 ms)")
    print(f"refused requests: {refused}")
    ok = rss_ok and p99_ok and refused == 0
    print("verdict:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=15)
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: saturation / 2)")
    p.add_argument("--saturation-jobs", type=int, default=3000)
    p.add_argument("--state-cache", type=int, default=5000)
    p.add_argument("--retention", type=int, default=60,
                   help="ended_retention_s of the host: cleared jobs leave Redis this long "
                        "after (at soak rates the 7-day default grows Redis by GBs)")
    try:
        sys.exit(uvloop.run(main(p.parse_args())))
    except asyncio.CancelledError:        # SIGTERM: everything started was stopped
        print("soak: stopped", file=sys.stderr)
        sys.exit(143)
