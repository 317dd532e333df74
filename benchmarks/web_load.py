"""What open web pages cost the host: ``mqtt_e2e.py``'s saturation run with and
without five live job pages (Server-Sent Events) and a scopes page refreshing, in turns.

    python benchmarks/web_load.py              # 3 pairs of 3,000-job runs
    python benchmarks/web_load.py --quick      # a smoke run

One host (``App`` with ``web = true``), redis-server, mosquitto and the station process
as in ``mqtt_e2e.py``. The pages are a separate process (this file with ``--viewers``),
so their own CPU is not the host's: five streams, each on a job of the run being
measured, and the scopes table fetched every 2 s as the page does. Printed per pair:
jobs/s and the host's CPU per job without and with the pages; at the end the median
ratios (with / without) of both: the CPU a job is the steadier one on a shared machine
(the pages' process competes for the same cores). Target: the pages cost less than
5 % of saturation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import uvloop
from helpers.servers import free_port
from mqtt_e2e import SCOPE, WM, run_jobs, servers_and_station

from sfc_host.config import HostConfig
from sfc_host.service.app import App

PAGES = 5
SCOPES_EVERY_S = 2.0


async def viewers(base: str, jobs: list[str]) -> None:
    """The pages: one SSE stream per job, the scopes table every 2 s; the counts of
    updates and fetches on stdout when stopped (SIGTERM)."""
    import aiohttp

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    counts = {"updates": 0, "scopes": 0}

    async def stream(session: aiohttp.ClientSession, job: str) -> None:
        async with session.get(f"{base}/scopes/{SCOPE}/live", params={"id": job}) as r:
            async for line in r.content:
                if line.startswith(b"data: "):
                    counts["updates"] += 1

    async def scopes(session: aiohttp.ClientSession) -> None:
        while True:
            async with session.get(f"{base}/part/scopes") as r:
                await r.read()
            counts["scopes"] += 1
            await asyncio.sleep(SCOPES_EVERY_S)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(stream(session, j)) for j in jobs]
        tasks.append(asyncio.create_task(scopes(session)))
        print("ready", flush=True)
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"{counts['updates']} updates, {counts['scopes']} scopes fetches", flush=True)


async def measure(app: App, prefix: str, n: int, base: str | None) -> tuple[float, float, str]:
    """One saturation run (jobs/s, host CPU µs a job), with pages open when ``base``."""
    pages = None
    if base is not None:
        jobs = [f"{prefix}{i * (n // PAGES)}" for i in range(PAGES)]
        pages = subprocess.Popen([sys.executable, __file__, "--viewers", base, *jobs],
                                 stdout=subprocess.PIPE, text=True)
        assert pages.stdout is not None
        pages.stdout.readline()    # "ready"
        await asyncio.sleep(0.5)   # the streams are open and polling
    try:
        cpu0 = time.process_time()
        secs = await run_jobs(app, prefix, n, None)
        cpu = time.process_time() - cpu0
    finally:
        seen = ""
        if pages is not None:
            pages.send_signal(signal.SIGTERM)
            out, _ = pages.communicate(timeout=10)
            seen = out.strip().splitlines()[-1] if out.strip() else ""
    return n / secs, cpu / n * 1e6, seen


async def main(args: argparse.Namespace) -> None:
    with servers_and_station() as (redis, broker):
        port = free_port()
        cfg = HostConfig(redis_url=redis.url, mqtt_url=broker.url, consumer="bench",
                         sweep_interval_ms=500, metrics_port=port, web=True)
        base = f"http://127.0.0.1:{port}"
        async with App(cfg) as app:
            await app.host.store.put_work_master(SCOPE, WM)
            await app.host.add_scope(SCOPE)
            n = 500 if args.quick else args.jobs
            pairs = 1 if args.quick else args.pairs
            await run_jobs(app, "warm", min(n, 300), None)
            print(f"web view load, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
                  f"{n} jobs a run, 5 push actions a job; {PAGES} job pages (SSE) and a "
                  f"scopes page every {SCOPES_EVERY_S:g} s")
            ratios, cpu_ratios = [], []
            for i in range(pairs):
                # alternate which goes first: a drift of the machine hits both
                order = [None, base] if i % 2 == 0 else [base, None]
                got = {}
                for b in order:
                    got[b] = await measure(app, f"p{i}{'w' if b else 'n'}-", n, b)
                (r0, c0, _), (r1, c1, seen) = got[None], got[base]
                ratios.append(r1 / r0)
                cpu_ratios.append(c1 / c0)
                print(f"pair {i + 1}: without {r0:,.0f} jobs/s ({c0:,.0f} µs CPU a job), "
                      f"with pages {r1:,.0f} jobs/s ({c1:,.0f} µs CPU a job; pages got "
                      f"{seen}): ratio {r1 / r0:.3f}")
            med = statistics.median(ratios)
            print(f"median ratio with / without pages: {med:.3f} "
                  f"(cost {max(0.0, 1 - med):.1%} of saturation; goal < 5 %)")
            # the host's CPU a job is steadier than the rate on a shared machine
            print(f"median host CPU a job, with / without pages: "
                  f"{statistics.median(cpu_ratios):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--viewers", nargs="+", metavar=("BASE", "JOB"),
                   help=argparse.SUPPRESS)   # the pages' own process
    a = p.parse_args()
    if a.viewers:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(viewers(a.viewers[0], a.viewers[1:]))
    else:
        uvloop.run(main(a))
