"""What OpenTelemetry spans cost the host: ``otel = false`` against ``otel = true`` with
the batch processor and the host's OTLP/HTTP JSON exporter, in turns in one process.

    python benchmarks/otel_cost.py                 # the figures of docs/benchmarks.md
    python benchmarks/otel_cost.py --quick         # a smoke run
    python benchmarks/otel_cost.py --protocol http/json   # the JSON encoding

mqtt_e2e.py's setting (its 5-step recipe, one push action a step; redis-server,
mosquitto and the station process, all started here). Each round runs both sides, one
after the other (which first alternates by round), each with a host of its own on an
emptied Redis: a warm-up, then ``--jobs`` jobs stored at once by MES requests, each a
StoreAndStart CloudEvent with a ``traceparent`` of its own, handed to the host's MES
side as the broker would deliver it (its reply goes out through the broker). Both sides
do the same work on the wire (the context flows either way); with ``otel = true`` a
job makes seven spans: the request, the job and five attempts. The spans go over HTTP
to a receiver in a process of its own (it takes them and answers 200), so its CPU is
not the host's.

Measured per side: jobs/s and the host process's CPU (every thread: the exporter's
too) an action. A ratio is the median of the rounds' own ratios (both sides of a round
saw the same machine). Target: host CPU an action with spans <= 1.15x without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis.asyncio
import uvloop
from mqtt_e2e import SCOPE, WM, run_jobs, servers_and_station

from sfc_fast.wire.mqtt5 import Message
from sfc_host.config import HostConfig
from sfc_host.mqtt.cloudevents import CloudEvent, encode
from sfc_host.service.app import App
from sfc_host.tracing.context import new_trace

STORE_AND_START = "org.opcfoundation.ISA95-JOBCONTROL_V2.StoreAndStart.v2"


def receive(port_file: str) -> None:
    """The receiver process: OTLP/HTTP POSTs taken and answered 200; its port written
    to ``port_file``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


async def run_side(cfg: HostConfig, prefix: str, warm: int, n: int) -> tuple[float, float, int]:
    """One side, on an emptied Redis: jobs/s, host CPU seconds an action, spans
    recorded."""
    r = redis.asyncio.Redis.from_url(cfg.redis_url)
    await r.flushall()
    await r.aclose()
    async with App(cfg) as app:
        await app.host.store.put_work_master(SCOPE, WM)
        await app.host.add_scope(SCOPE)
        await jobs(app, f"{prefix}w", warm)
        spans = app.spans
        if spans is not None:
            await asyncio.to_thread(spans.processor.force_flush)     # the warm-up's
        before = spans.recorded if spans is not None else 0
        cpu0 = time.process_time()
        secs = await jobs(app, prefix, n)
        if spans is not None:
            # the spans of the measured jobs exported, inside the measured CPU
            await asyncio.to_thread(spans.processor.force_flush)
        cpu = time.process_time() - cpu0
        recorded = spans.recorded - before if spans is not None else 0
    return n / secs, cpu / (5 * n), recorded


def request(job: str) -> Message:
    """A StoreAndStart of ``job`` as an MES sends it: binary mode, with a trace."""
    trace = new_trace()
    ev = CloudEvent(id=f"req-{job}", source="urn:bench:mes", type=STORE_AND_START,
                    subject=SCOPE, data={"JobOrder": {"JobOrderID": job,
                                                      "WorkMasterID": [{"ID": WM["ID"]}]}},
                    extensions={"traceparent": trace.traceparent})
    ev.response_topic = "bench/replies"
    payload, props = encode(ev, v5=True, binary=True)
    return Message(f"mes/{SCOPE}/commands", payload, 1, False, props)


async def by_request(app: App, job: str) -> None:
    """Store and start ``job`` by an MES request, as the broker would deliver it."""
    await app.mes.on_request(request(job))


async def jobs(app: App, prefix: str, n: int) -> float:
    """Store and start ``n`` jobs at once; seconds until every one completed."""
    return await run_jobs(app, prefix, n, None, by_request)


async def main(args: argparse.Namespace) -> None:
    n = 300 if args.quick else args.jobs
    rounds = 1 if args.quick else args.rounds
    with servers_and_station() as (db, broker), contextlib.ExitStack() as stack:
        pf = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "port"
        recv = subprocess.Popen([sys.executable, __file__, "--receiver", str(pf)])
        stack.callback(recv.wait, 5)
        stack.callback(recv.terminate)
        for _ in range(100):
            if pf.exists() and pf.read_text():
                break
            time.sleep(0.05)
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{pf.read_text()}"
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = args.protocol
        rows: list[tuple[float, float, float, float, int]] = []
        print(f"spans' cost, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
              f"{n} jobs a side, 5 push actions a job; exporter {args.protocol}")
        for r in range(rounds):
            got = {}
            for otel in ((False, True) if r % 2 == 0 else (True, False)):
                cfg = HostConfig(redis_url=db.url, mqtt_url=broker.url,
                                 consumer=f"otel{int(otel)}", sweep_interval_ms=500,
                                 otel=otel)
                got[otel] = await run_side(cfg, f"r{r}o{int(otel)}-", min(n, 200), n)
            (rate0, cpu0, _), (rate1, cpu1, spans) = got[False], got[True]
            rows.append((rate0, cpu0, rate1, cpu1, spans))
            print(f"round {r + 1}: off {rate0:,.0f} jobs/s, {cpu0 * 1e6:.1f} µs an action; "
                  f"on {rate1:,.0f} jobs/s, {cpu1 * 1e6:.1f} µs an action "
                  f"({spans:,} spans, {spans / n:.1f} a job): CPU x{cpu1 / cpu0:.3f}, "
                  f"rate x{rate1 / rate0:.3f}")
        med = statistics.median
        print(f"median: host CPU an action {med(r[1] for r in rows) * 1e6:.1f} µs off, "
              f"{med(r[3] for r in rows) * 1e6:.1f} µs on: x{med(r[3] / r[1] for r in rows):.3f}"
              f" (target <= 1.15); jobs/s x{med(r[2] / r[0] for r in rows):.3f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--receiver":
        receive(sys.argv[2])
        sys.exit(0)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "http/json"])
    p.add_argument("--quick", action="store_true")
    uvloop.run(main(p.parse_args()))
