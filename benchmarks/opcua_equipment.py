"""Equipment over OPC UA: actions per second through one host against 1, 10 and 100
PackML units, the host's CPU per action against the MQTT transport on the same recipe,
and the answer-to-next-command latency.

    python benchmarks/opcua_equipment.py                  # 1, 10, 100 units on one server
    python benchmarks/opcua_equipment.py --servers 4      # the units over four servers
    python benchmarks/opcua_equipment.py --units 1,10 --jobs 4    # a smoke run

One host (``App``, in this process: its CPU is this process's) with a local redis-server
and mosquitto. Each unit serves one scope: every job of the scope runs the recipe of
five push actions on it, one after the other (a unit takes one command at a time), so
the units run in parallel and one unit's rate is its own cycle's (read, write, Start,
the state to Complete, Reset). The units are the example units
(``sfc_host.examples.packml_unit``, no work time: each acting state lasts 10 ms) in
``--servers`` processes of their own. The MQTT transport runs the same jobs against
``mqtt_station_proc.py``, which answers every command at once: the host's CPU per
action there is the yardstick (goal: OPC UA at most 2x), measured twice: at the rate
the units ran (jobs paced to it: the like-for-like figure, as a host's cost per action
grows as its load falls) and saturated (jobs stored at once).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import uvloop
from helpers.servers import free_port
from mqtt_e2e import run_jobs as e2e_run_jobs
from mqtt_e2e import servers_and_station

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.service.app import App

V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"
TYPE = "com.example.bench.work.v1"
STEPS = [f"S{i}" for i in range(5)]
WM = {"ID": "five", "dataschema": V110, "data": {
    "Steps": [{"Name": n, "Initial": i == 0} for i, n in enumerate(STEPS)],
    "Transitions": [{"Source": a, "Target": b, "Condition": "always"}
                    for a, b in itertools.pairwise(STEPS)],
    "Actions": [{"Name": n.lower(), "Step": n, "Qualifier": "N",
                 "Interaction": "push_command", "TypeId": TYPE,
                 "TimeoutSeconds": 120} for n in STEPS]}}
URI = "urn:sfc-fast:example-units"


def scopes(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def start_servers(units: list[str], n_servers: int) -> list[tuple[subprocess.Popen[str], int,
                                                                 list[str]]]:
    """The units split over ``n_servers`` processes of the example server."""
    out = []
    for k in range(n_servers):
        mine = units[k::n_servers]
        if not mine:
            continue
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "sfc_host.examples.packml_unit",
                              "--port", str(port), "--units", ",".join(mine),
                              "--work-ms", "0"], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.readline()         # its ready line
        out.append((p, port, mine))
    return out


def equipment_file(path: Path, servers: list[tuple[Any, int, list[str]]]) -> Path:
    text = []
    for k, (_, port, names) in enumerate(servers):
        text.append(f'[[server]]\nname = "s{k}"\nendpoint = '
                    f'"opc.tcp://127.0.0.1:{port}/units/"\n')
        for name in names:
            node = f"nsu={URI};s={name}"
            text.append(f'[[unit]]\nequipment = "{name}"\nserver = "s{k}"\n'
                        f'scopes = ["{name}"]\nnode = "{node}"\ntypes = ["{TYPE}"]\n'
                        f'command_id = "{node}.CommandId"\n')
    path.write_text("\n".join(text))
    return path


async def run_jobs(app: App, names: list[str], jobs: int, prefix: str,
                   rate_jobs_s: float | None = None) -> float:
    """``jobs`` jobs in each scope, stored at once or at ``rate_jobs_s`` (``mqtt_e2e.
    run_jobs`` with the jobs dealt over the scopes); seconds until every one ended."""
    async def store(app: App, job: str) -> None:
        scope = names[int(job[len(prefix):]) % len(names)]
        await app.host.orders.store_order(
            scope, {"JobOrderID": job, "WorkMasterID": [{"ID": "five"}]}, start=True)
    return await e2e_run_jobs(app, prefix, jobs * len(names), rate_jobs_s, store)


async def measure(cfg: HostConfig, names: list[str], jobs: int,
                  rate_jobs_s: float | None = None) -> dict[str, float]:
    """Warm up, then one measured run (jobs stored at once, or at ``rate_jobs_s``):
    actions/s, host CPU per action, latency."""
    tag = cfg.consumer_name
    async with App(cfg) as app:
        eq = app.opcua_equipment
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while eq is not None and eq.not_ready():
            if loop.time() > end:
                raise RuntimeError("; ".join(eq.not_ready()[:3]))
            await asyncio.sleep(0.05)
        for s in names:
            await app.host.store.put_work_master(s, WM)
            await app.host.add_scope(s)
        await run_jobs(app, names, 1, f"{tag}-warm")
        samples: list[float] = []
        m: Metrics = app.metrics
        observe = m.observe

        def keep(name: str, value: float) -> None:
            if name == "answer_to_command_seconds":
                samples.append(value)
            observe(name, value)
        m.observe = keep  # type: ignore[method-assign]
        cpu0 = time.process_time()
        secs = await run_jobs(app, names, jobs, f"{tag}-run", rate_jobs_s)
        cpu = time.process_time() - cpu0
        m.observe = observe  # type: ignore[method-assign]
    samples.sort()
    actions = 5 * jobs * len(names)

    def q(f: float) -> float:
        return samples[min(len(samples) - 1, int(f * len(samples)))] * 1000 if samples \
            else float("nan")
    return {"actions": actions, "seconds": secs, "rate": actions / secs,
            "cpu_us": cpu / actions * 1e6, "p50_ms": q(0.5), "p99_ms": q(0.99)}


async def main(args: argparse.Namespace) -> None:
    counts = [int(x) for x in args.units.split(",") if x]
    print(f"equipment over OPC UA, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"5 push actions per job, {args.jobs} jobs per unit, units on {args.servers} "
          "server process(es)")
    with servers_and_station() as (redis, broker), \
            tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            names = scopes(n)
            procs = start_servers([f"{s}" for s in names], args.servers)
            try:
                eq_file = equipment_file(Path(tmp) / f"eq{n}.toml", procs)
                base = dict(redis_url=redis.url, mqtt_url=broker.url, sweep_interval_ms=500,
                            log_level="WARNING")
                opcua = await measure(HostConfig(**base, consumer=f"opcua{n}",
                                                 equipment_opcua=str(eq_file)),
                                      names, args.jobs)
            finally:
                for p, _, _ in procs:
                    p.terminate()
                    p.wait(5)
            mqtt = await measure(HostConfig(**base, consumer=f"mqtt{n}"), names, args.jobs)
            # the same recipe over MQTT at the rate the units ran: a host's cost per
            # action depends on its load, so this is the like-for-like yardstick
            paced = await measure(HostConfig(**base, consumer=f"paced{n}"), names, args.jobs,
                                  opcua["rate"] / 5)
            print(f"{n:>4} units: OPC UA {opcua['rate']:,.0f} actions/s, host CPU "
                  f"{opcua['cpu_us']:,.0f} µs an action, answer to next command p50 "
                  f"{opcua['p50_ms']:.2f} ms p99 {opcua['p99_ms']:.2f} ms | MQTT at the same "
                  f"rate {paced['rate']:,.0f} actions/s, {paced['cpu_us']:,.0f} µs an action, "
                  f"p50 {paced['p50_ms']:.2f} ms p99 {paced['p99_ms']:.2f} ms: CPU "
                  f"{opcua['cpu_us'] / paced['cpu_us']:.2f}x | MQTT saturated "
                  f"{mqtt['rate']:,.0f} actions/s, {mqtt['cpu_us']:,.0f} µs an action: CPU "
                  f"{opcua['cpu_us'] / mqtt['cpu_us']:.2f}x", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--units", default="1,10,100", help="unit counts, comma-separated")
    p.add_argument("--servers", type=int, default=1, help="server processes for the units")
    p.add_argument("--jobs", type=int, default=20, help="jobs per unit")
    uvloop.run(main(p.parse_args()))
