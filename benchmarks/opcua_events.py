"""The MQTT face's saturation with the OPC UA face off, and on with 0, 1 and 10 clients
subscribed to the status events, in turns.

    python benchmarks/opcua_events.py                        # the figures of benchmarks.md
    python benchmarks/opcua_events.py --jobs 300 --rounds 1  # a smoke run

``mqtt_e2e.py``'s saturation run (one host in this process, a local redis-server and
mosquitto, the station process answering every command, 5 push actions a job), once
per setting: ``opcua = false``; ``opcua = true`` (security None on loopback) with no
client; with one client session; with ten. The clients run in a process of their own
(``--subscribe``; ``--client-procs K`` spreads them over K processes), each session
subscribed to the scope's status events, and count the events of the measured jobs:
none may be missing. Goal: with the face on, 1 and 10
subscribers, jobs/s within 10 % of the face off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mqtt_e2e import SCOPE, WM, run_jobs, servers_and_station, settled

from sfc_host.config import HostConfig
from sfc_host.demo.servers import free_port
from sfc_host.service.app import App

SETTINGS = (("off", None), ("on, 0 clients", 0), ("on, 1 client", 1), ("on, 10 clients", 10))


async def subscribe(url: str, sessions: int, prefix: str) -> None:
    """``--subscribe``: ``sessions`` client sessions on the scope's status events, each
    selecting the type's fields (the three structures and the message); on a line on
    stdin, print how many events of jobs named ``prefix…`` each received, once they
    stop arriving. The clients are ours (``sfc_host.opcua_client``, on the compiled
    codec): ten asyncua sessions decoding every event would take most of these two
    cores from the host they measure, and fall behind it. The structures stay encoded;
    the event's Message names the job."""
    from sfc_fast.wire.uabinary import NodeId, QualifiedName
    from sfc_host.opcua_client import Client

    counts = [0] * sessions

    class Handler:
        def __init__(self, i: int) -> None:
            self.i = i

        def event(self, handle: int, fields: list[Any]) -> None:
            message = fields[0]
            if message is not None and str(message.text).startswith(prefix):
                counts[self.i] += 1

        def data_changed(self, handle: int, value: Any) -> None:
            pass

        def status_changed(self, status: int) -> None:
            print(f"subscription ended: {status:#x}", file=sys.stderr)

    clients = []
    for i in range(sessions):
        c = Client(url)
        await c.connect()
        own = await c.namespace_index("urn:sfc-fast:opcua")
        jc = await c.namespace_index("http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/")
        event_type = NodeId("SfcJobOrderStatusEventType", own)
        sub = await c.create_subscription(100, Handler(i))
        await sub.watch_events(
            NodeId(f"{SCOPE}.JobOrderResults", own),
            [(NodeId(2041), [QualifiedName("Message")]),
             (NodeId(1006, jc), [QualifiedName("JobOrder", jc)]),
             (NodeId(1006, jc), [QualifiedName("JobState", jc)]),
             (NodeId(1006, jc), [QualifiedName("JobResponse", jc)])],
            [event_type], queue=10_000)
        clients.append(c)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    last = -1
    while sum(counts) != last:      # until the last publish intervals' events are in
        last = sum(counts)
        await asyncio.sleep(0.5)
    print(json.dumps(counts), flush=True)
    for c in clients:
        await c.close()


async def raised_all(app: App) -> None:
    """Wait until the host has sent what it queued and the face raised every event."""
    await settled(app)
    while app.opcua is not None and not app.opcua._changes.empty():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)        # the batch being raised


async def one(redis_url: str, mqtt_url: str, clients: int | None, n: int, r: int,
              procs: int = 1) -> tuple[float, float, list[int], int, int]:
    """One saturation run: jobs/s, host CPU µs a job, what each client counted, the
    events the face raised for the measured jobs, and those it dropped."""
    port = free_port()
    url = f"opc.tcp://127.0.0.1:{port}/sfc-host/"
    cfg = HostConfig(redis_url=redis_url, mqtt_url=mqtt_url, consumer="bench",
                     sweep_interval_ms=500, opcua=clients is not None,
                     opcua_endpoint=url, opcua_security=["None"],
                     max_job_orders=1_000_000)
    prefix = f"sat{r}x{clients}x"
    async with App(cfg) as app:
        await app.host.store.put_work_master(SCOPE, WM)
        await app.host.add_scope(SCOPE)
        await asyncio.sleep(1.2 if clients is not None else 0)   # the scope's objects
        running: list[subprocess.Popen[str]] = []
        if clients:
            k = min(clients, procs)
            for i in range(k):      # the sessions spread over k client processes
                sessions = clients // k + (1 if i < clients % k else 0)
                running.append(subprocess.Popen(
                    [sys.executable, __file__, "--subscribe", url, str(sessions), prefix],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for proc in running:
                assert proc.stdout is not None and proc.stdin is not None
                # the server runs on this loop: wait for the clients off it
                ready = await asyncio.to_thread(proc.stdout.readline)
                assert ready.strip() == "ready", ready
        await run_jobs(app, f"warm{r}x{clients}x", min(n, 200), None)
        await raised_all(app)
        raised0 = app.metrics["opcua_events"]
        cpu0 = time.process_time()
        secs = await run_jobs(app, prefix, n, None)
        cpu = time.process_time() - cpu0
        await raised_all(app)
        raised = app.metrics["opcua_events"] - raised0
        dropped = app.metrics["opcua_events_dropped"]
        counts: list[int] = []
        for proc in running:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
            counts += json.loads(await asyncio.to_thread(proc.stdout.readline))
        for proc in running:
            await asyncio.to_thread(proc.wait, 30)
    return n / secs, cpu / n * 1e6, counts, int(raised), int(dropped)


async def main(args: argparse.Namespace) -> None:
    with servers_and_station() as (redis, broker):
        rows: dict[str, list[tuple[float, float]]] = {}
        notes: list[str] = []
        settings = [x for x in SETTINGS if args.only is None or x[0] in args.only]
        for r in range(args.rounds):
            order = settings if r % 2 == 0 else settings[::-1]
            for name, clients in order:
                rate, cpu, counts, raised, dropped = await one(
                    redis.url, broker.url, clients, args.jobs, r, args.client_procs)
                rows.setdefault(name, []).append((rate, cpu))
                if counts:
                    notes.append(f"round {r + 1}, {name}: {raised:,} events raised "
                                 f"({dropped:,} dropped by the face), each client "
                                 f"received {min(counts):,}–{max(counts):,}")
                    # a job of the measured ones makes three status events; ``raised``
                    # may count the warm-up's last events too
                    if min(counts) < 3 * args.jobs or dropped:
                        notes.append("  EVENTS MISSING")
    med = statistics.median
    off = med(x[0] for x in rows["off"]) if "off" in rows else 0.0
    print(f"MQTT face saturation with the OPC UA face, Python {sys.version.split()[0]}; "
          f"{args.jobs} jobs of 5 push actions a run, {args.rounds} rounds in turns "
          "(medians)")
    for name in rows:
        rate = med(x[0] for x in rows[name])
        cpu = med(x[1] for x in rows[name])
        print(f"{name:<16} {rate:>8,.0f} jobs/s  {rate / (off or rate):>5.2f}x of off  "
              f"host CPU {cpu:>6,.0f} µs a job")
    for line in notes:
        print(line)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=[x[0] for x in SETTINGS],
                   help="these settings alone (quoted: 'on, 1 client')")
    p.add_argument("--client-procs", type=int, default=1,
                   help="spread the client sessions over this many processes (default 1)")
    p.add_argument("--subscribe", nargs=3, metavar=("URL", "SESSIONS", "PREFIX"),
                   help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.subscribe:
        asyncio.run(subscribe(a.subscribe[0], int(a.subscribe[1]), a.subscribe[2]))
    else:
        import uvloop
        uvloop.run(main(a))
