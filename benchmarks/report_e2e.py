"""End to end through mosquitto, for benchmarks/report.py: jobs/s and the host's
answer-to-command latency against offered load, and a profile at saturation.

The setup is mqtt_e2e.py's (its recipe, Work Master and scope; one host ``App`` in this
process, redis-server, mosquitto and the station process ``mqtt_station_proc.py``).
Offered load is mqtt_e2e.py's ``offer``: job ``i`` is stored (``Orders.store_order``,
start=True) at ``t0 + i / rate`` as its own task, so a slow store does not hold back
the next one.
Latency is every sample the host takes for its ``answer_to_command_seconds`` histogram
(answer arrived to the job's next command queued for the broker), kept raw so p99.9 is
not a bucket's interpolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import pstats
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.servers import MosquittoServer, RedisServer
from mqtt_e2e import SCOPE, WM, offer, run_jobs, settled

from sfc_host.config import HostConfig
from sfc_host.service.app import App

HERE = Path(__file__).resolve().parent
LATENCY = "answer_to_command_seconds"


class E2E:
    """One running setup: servers, station, host; latency samples kept raw."""

    def __init__(self, app: App, broker_port: int, host: contextlib.AsyncExitStack,
                 redis_port: int = 0) -> None:
        self.app = app
        self.broker_port = broker_port
        self.redis_port = redis_port
        self._host = host
        self.samples: list[float] | None = None
        self.cpu_share = 0.0
        observe = app.metrics.observe

        def keep(name: str, value: float) -> None:
            if name == LATENCY and self.samples is not None:
                self.samples.append(value)
            observe(name, value)
        app.metrics.observe = keep  # type: ignore[method-assign]

    async def stop_host(self) -> None:
        """Close the host; the broker, Redis and the station stay up (the broker's own
        latency is then measured with nothing else publishing: the MES side's retained
        index of every order the runs made is megabytes, and its periodic publish
        stalls the broker for tens of milliseconds)."""
        await self._host.aclose()

    async def saturation(self, prefix: str, n: int) -> float:
        """Jobs/s with ``n`` jobs stored at once (mqtt_e2e's way)."""
        cpu0 = time.process_time()
        wall = await run_jobs(self.app, prefix, n, None)
        self.cpu_share = (time.process_time() - cpu0) / wall   # cores this process used
        return n / wall

    async def paced(self, prefix: str, rate: float, seconds: float) -> dict[str, Any]:
        """Offer ``rate`` jobs/s for ``seconds``, once the host has sent what the run
        before left queued; achieved jobs/s and latency samples."""
        await settled(self.app)
        n = max(20, int(rate * seconds))
        settler = self.app.host.settler
        prev = settler.on_end
        done = 0
        last = 0.0
        finished = asyncio.Event()

        def on_end(scope: str, job: str, d: Any) -> None:
            nonlocal done, last
            if job.startswith(prefix):
                done += 1
                last = time.perf_counter()
                if done >= n:
                    finished.set()
            if prev:
                prev(scope, job, d)
        settler.on_end = on_end
        self.samples = []
        t0 = time.perf_counter()
        try:
            await offer(self.app, prefix, n, rate, t0)
            offered_s = time.perf_counter() - t0
            await asyncio.wait_for(finished.wait(), max(120.0, 4 * seconds))
        finally:
            settler.on_end = prev
        samples, self.samples = self.samples, None
        return {"offered": rate, "offered_real": n / offered_s, "jobs": n,
                "achieved": n / (last - t0), "samples": samples}


def quantiles(samples: list[float], qs: tuple[float, ...] = (0.5, 0.99, 0.999)
              ) -> list[float]:
    s = sorted(samples)
    if not s:
        return [float("nan")] * len(qs)
    return [s[min(len(s) - 1, int(q * len(s)))] for q in qs]


@contextlib.asynccontextmanager
async def setup(tmp: Path) -> AsyncIterator[E2E]:
    redis = RedisServer(tmp / "redis")
    broker = MosquittoServer(tmp / "mqtt")
    redis.start()
    broker.start()
    station = subprocess.Popen([sys.executable, str(HERE / "mqtt_station_proc.py"),
                                "127.0.0.1", str(broker.port), "binary"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert station.stdout is not None
        station.stdout.readline()   # "ready"
        cfg = HostConfig(redis_url=redis.url, mqtt_url=broker.url, consumer="report",
                         sweep_interval_ms=500)
        async with contextlib.AsyncExitStack() as host:
            app = await host.enter_async_context(App(cfg))
            await app.host.store.put_work_master(SCOPE, WM)
            await app.host.add_scope(SCOPE)
            yield E2E(app, broker.port, host, redis.port)
    finally:
        station.terminate()
        station.wait(5)
        broker.stop()
        redis.stop()


def _group(filename: str) -> str:
    for key, label in (("sfc_host", "sfc_host"), ("sfc_fast", "sfc_fast (core)"),
                       ("redis", "redis-py"), ("asyncio", "asyncio"),
                       ("uvloop", "uvloop"), ("json", "json"), ("hiredis", "hiredis")):
        if key in filename:
            return label
    if filename.startswith("~") or filename == "<built-in>":
        return "builtins (C)"
    return "other"


def profile_text(prof: cProfile.Profile, top: int = 25
                 ) -> tuple[str, list[tuple[str, float]], str]:
    """The top functions by own time, own time by package, and the host's own
    functions by cumulative time (where its time goes, callees included)."""
    st = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in st.stats.values()) or 1.0   # type: ignore[attr-defined]
    by_group: dict[str, float] = {}
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        by_group[_group(fname)] = by_group.get(_group(fname), 0.0) + tt
        rows.append((tt, ct, nc, fname, line, func))
    rows.sort(reverse=True)
    out = ["| own time | share | cumulative | calls | function |", "|---:|---:|---:|---:|---|"]
    for tt, ct, nc, fname, line, func in rows[:top]:
        where = "/".join(fname.split("/")[-2:])   # package/module, no install path
        out.append(f"| {tt:.3f} s | {100 * tt / total:.1f} % | {ct:.3f} s | {nc:,} | "
                   f"`{func}` ({where}:{line}) |")
    groups = sorted(((g, t / total) for g, t in by_group.items()), key=lambda x: -x[1])
    ours = sorted((r for r in rows if "sfc_host" in r[3]), key=lambda r: -r[1])
    cum = ["| cumulative | share | calls | function |", "|---:|---:|---:|---|"]
    for _tt, ct, nc, fname, line, func in ours[:top]:
        where = "/".join(fname.split("/")[-2:])
        cum.append(f"| {ct:.3f} s | {100 * ct / total:.1f} % | {nc:,} | `{func}` "
                   f"({where}:{line}) |")
    return "\n".join(out), groups, "\n".join(cum)


async def profiled_saturation(e: E2E, prefix: str, n: int) -> dict[str, Any]:
    prof = cProfile.Profile()
    prof.enable()
    try:
        rate = await e.saturation(prefix, n)
    finally:
        prof.disable()
    table, groups, cum = profile_text(prof)
    return {"rate": rate, "table": table, "groups": groups, "cumulative": cum, "jobs": n,
            "cpu_share": e.cpu_share, "counts": call_counts(prof)}


# Plain (not async) functions whose call counts tell how batched the path is: cProfile
# counts every resumption of a coroutine as a call, so async ones would mislead.
COUNTED = {
    ("store/states.py", "cas_call"): "compare-and-set script calls",
    ("execution/settle.py", "_record"): "job records written",
    ("store/lua_scripts.py", "_pipe"): "script pipelines",
    ("", "<built-in method hiredis.hiredis.pack_command>"): "Redis commands packed",
    ("asyncio/streams.py", "writelines"): "Redis socket writes (redis-py, asyncio streams)",
    ("store/channel.py", "_flush"): "Redis socket writes (the host's channel)",
    ("mqtt/connection.py", "flush"): "MQTT socket writes (sfc_host.mqtt)",
    ("mqtt/connection.py", "data_received"): "MQTT socket reads (sfc_host.mqtt)",
    ("mqtt/cloudevents.py", "encode_binary"): "CloudEvents encoded",
    ("mqtt/cloudevents.py", "decode"): "CloudEvents decoded",
    ("encoder.py", "encode"): "json.dumps-style encodes",
}


def call_counts(prof: cProfile.Profile) -> dict[str, int]:
    st = pstats.Stats(prof, stream=io.StringIO())
    out: dict[str, int] = {}
    for (fname, _line, func), v in st.stats.items():  # type: ignore[attr-defined]
        for (where, name), label in COUNTED.items():
            if func == name and fname.endswith(where):
                out[label] = out.get(label, 0) + v[1]
    return out
