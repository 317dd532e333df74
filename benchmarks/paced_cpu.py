"""CPU an action at paced rates, for the host and for the servers it talks to.

    python benchmarks/paced_cpu.py                    # 250, 1,000 and 2,500 actions/s
    python benchmarks/paced_cpu.py --rates 500 2000 --seconds 8

The setting of ``mqtt_e2e.py`` (one host in this process, a local redis-server and
mosquitto, the station process answering every command at once; 5-step jobs of one
push action a step), but only paced runs: jobs are offered at each rate in turn, and
for each the CPU seconds of the host (this process), of redis-server and of mosquitto
are divided by the actions run. Also per job: the Redis channel's writes (each a round
trip the host waits for, unless a lazy request rode along) and the host's voluntary
context switches per action (each a sleep and a wake-up of the event loop).

At moderate rates an action costs several times what it costs at saturation (nothing
batches, and on a virtual machine every wake-up of another process is expensive), and
the servers' CPU is on the same two cores as the host: the figures that decide the
answer latency's tail at half of saturation (the target: its p99 within 2x of the
broker's own p99 at the same rate).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import uvloop
from helpers.servers import cpu_seconds
from mqtt_e2e import SCOPE, WM, run_jobs, servers_and_station, settled

from sfc_host.config import HostConfig
from sfc_host.service.app import App


def switches() -> int:
    """Voluntary context switches of this process's threads."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        for line in Path(f"/proc/self/task/{t}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                n += int(line.split()[1])
    return n


async def main(args: argparse.Namespace) -> None:
    with servers_and_station() as (redis, broker):
        assert redis.proc is not None and broker.proc is not None
        cfg = HostConfig(redis_url=redis.url, mqtt_url=broker.url, consumer="bench",
                         sweep_interval_ms=500, mqtt_binary=True)
        async with App(cfg) as app:
            await app.host.store.put_work_master(SCOPE, WM)
            await app.host.add_scope(SCOPE)
            await run_jobs(app, "warm", 200, None)
            channel = app.host.channel
            print(f"paced, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; 5 push "
                  "actions a job; CPU µs an action (host, redis-server, mosquitto)")
            for rate in args.rates:
                n = max(1, int(rate * args.seconds / 5))
                await settled(app)
                r0, b0 = cpu_seconds(redis.proc.pid), cpu_seconds(broker.proc.pid)
                w0 = channel.writes if channel is not None else 0
                v0, c0 = switches(), time.process_time()
                secs = await run_jobs(app, f"p{rate}-", n, rate / 5)
                host = time.process_time() - c0
                v1 = switches()
                w1 = channel.writes if channel is not None else 0
                rc = cpu_seconds(redis.proc.pid) - r0
                bc = cpu_seconds(broker.proc.pid) - b0
                a = n * 5
                print(f"{rate:>6,} actions/s: host {host / a * 1e6:,.0f} µs "
                      f"({host / secs:.0%} of a core), redis {rc / a * 1e6:,.0f} µs, "
                      f"mosquitto {bc / a * 1e6:,.0f} µs; Redis writes a job "
                      f"{(w1 - w0) / n:.1f}; host wake-ups an action {(v1 - v0) / a:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", type=int, nargs="+", default=[250, 1000, 2500],
                   help="offered actions/s, one run each")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds a rate")
    uvloop.run(main(p.parse_args()))
