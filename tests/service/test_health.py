"""What a host tells a service manager and a monitoring system: ``/healthz`` and
``/readyz`` before and after it is ready, ``sfc_build_info`` and every counter from
the start, and a log line when a job ends."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from helpers.aio import run
from helpers.health import get
from helpers.hosts import Station, flush, quick_config, torque_ok, wait_until, work_master
from helpers.servers import MosquittoServer, free_port

from sfc_host import __version__
from sfc_host.execution.host import Host
from sfc_host.metrics import COUNTERS
from sfc_host.service.app import App

S = "health1"


def test_healthz_and_readyz_before_and_after_ready(make_redis: Any, tmp_path: Path) -> None:
    redis = make_redis()
    broker_port, http_port = free_port(), free_port()

    async def main() -> None:
        app = App(quick_config(redis.url, mqtt_url=f"mqtt://127.0.0.1:{broker_port}",
                               metrics_port=http_port, consumer="health-a", scopes=[S]))
        # the broker is not there yet: the host waits for it with its port bound
        starting = asyncio.create_task(app.start(connect_timeout_s=30))
        broker: MosquittoServer | None = None
        try:
            async def bound() -> bool:
                return (await get(http_port, "/healthz"))[0] == 200
            await wait_until(bound, 10, "the HTTP port")
            assert await get(http_port, "/healthz") == (200, "ok\n")
            status, text = await get(http_port, "/readyz")
            assert status == 503 and text.startswith("not ready: "), text
            assert "mqtt: not connected" in text and "engine: Ready" in text
            assert "recovery: not done" in text and "redis" not in text
            # monitoring sees the version and every counter before the first event
            status, text = await get(http_port, "/metrics")
            assert status == 200
            assert (f'sfc_build_info{{consumer="health-a",version="{__version__}",'
                    in text)
            for name in COUNTERS:        # (the failed connects count already)
                assert f'sfc_{name}_total{{consumer="health-a"}} ' in text, name
            for name in ("commands_sent", "dead_entries", "answers_applied"):
                assert f'sfc_{name}_total{{consumer="health-a"}} 0\n' in text, name
            assert 'sfc_loop_errors_consume_total{consumer="health-a"} 0\n' in text

            broker = MosquittoServer(tmp_path / "mosquitto", broker_port)
            broker.start()
            await starting
            assert await get(http_port, "/readyz") == (200, "ready\n")
            assert await get(http_port, "/healthz") == (200, "ok\n")

            redis.stop()
            status, text = await get(http_port, "/readyz")
            assert status == 503 and text.startswith("not ready: redis: "), text
            assert (await get(http_port, "/healthz"))[0] == 200   # the process still runs
        finally:
            if not starting.done():
                starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await app.aclose()
            if broker is not None:
                broker.stop()
        assert (await get(http_port, "/healthz"))[0] == 0       # closed with the host

    run(main())


def test_readyz_names_the_broker_when_it_goes_away(redis_url: str, tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mosquitto")
    broker.start()
    http_port = free_port()

    async def main() -> None:
        await flush(redis_url)
        app = App(quick_config(redis_url, mqtt_url=broker.url, metrics_port=http_port))
        await app.start(connect_timeout_s=5)
        try:
            assert await get(http_port, "/readyz") == (200, "ready\n")
            broker.stop()
            await wait_until(lambda: not app.link.connected.is_set(), 10, "the disconnect")
            status, text = await get(http_port, "/readyz")
            assert status == 503 and text.startswith("not ready: mqtt: not connected ("), text
        finally:
            await app.aclose()

    try:
        run(main())
    finally:
        broker.stop()


def test_a_log_line_when_a_job_completes_aborts_or_stops(
        redis_url: str, caplog: Any) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: torque_ok(c) if c.job.startswith("C") else False)
        host = Host(quick_config(redis_url), st.sink)
        st.attach(host)
        await host.store.put_work_master(S, work_master("tighten_rework", "wm"))
        await host.add_scope(S)
        await host.start()
        try:
            with caplog.at_level(logging.INFO, logger="sfc_host"):
                for job in ("C1", "A1", "B1"):
                    await host.orders.store_order(
                        S, {"JobOrderID": job, "WorkMasterID": [{"ID": "wm"}]}, start=True)
                await wait_until(lambda: {c.job for c in st.commands} >= {"A1", "B1"},
                                 what="the first commands")
                await host.orders.trigger(S, "A1", "Abort", reason="operator abort")
                await host.orders.trigger(S, "B1", "Stop")

                def ended() -> dict[str, logging.LogRecord]:
                    return {getattr(r, "job", ""): r for r in caplog.records
                            if r.getMessage().startswith("job ")}
                await wait_until(lambda: len(ended()) == 3, what="three job ends logged")
        finally:
            await host.aclose()
        lines = ended()
        for job, says in (("C1", f"job C1 in {S} completed"),
                          ("A1", f"job A1 in {S} aborted: operator abort"),
                          ("B1", f"job B1 in {S} stopped")):
            r = lines[job]
            assert r.levelno == logging.INFO and r.getMessage().startswith(says), \
                r.getMessage()
            assert getattr(r, "scope", None) == S     # a field for the JSON log format

    run(main())
