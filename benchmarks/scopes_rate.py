"""One host_throughput.py case with the CPU it cost: completions/s, client and Redis
commands per completion, host and Redis CPU microseconds per completion, and the
commands Redis ran per completion by name (``INFO commandstats``, inside scripts
included). For comparing two builds in turns on a loaded machine (what the number of
scopes costs, say): CPU per completion moves less with the load than the rate does.

    python benchmarks/scopes_rate.py --jobs 10000 --scopes 10000 [--seconds 4]
        [--host-src DIR] [--profile FILE] [--pin]

``--host-src``: a directory holding another build's ``sfc_host`` package, imported
instead of this checkout's (the compiled ``sfc_fast`` stays the installed one).
``--profile``: cProfile of the host over the measured seconds, written to FILE.
``--pin``: the host on the first CPU, redis-server on the second (Linux; two CPUs at
least). Each then has a core of its own and the figures move far less from run to run
(about ±0.5 µs a completion here, against ±2 µs unpinned).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--jobs", type=int, default=10_000)
p.add_argument("--scopes", type=int, default=10_000)
p.add_argument("--seconds", type=float, default=4.0)
p.add_argument("--host-src", default="")
p.add_argument("--profile", default="")
p.add_argument("--pin", action="store_true")
ARGS = p.parse_args()
if ARGS.host_src:
    # before anything imports sfc_host: the other build's package wins
    sys.path.insert(0, str(Path(ARGS.host_src).resolve()))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import cProfile  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import host_throughput  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
import uvloop  # noqa: E402
from helpers.servers import RedisServer  # noqa: E402

import sfc_host  # noqa: E402

_commands = host_throughput.commands
# (host CPU s, Redis CPU s, calls by command) at case()'s two counts of commands, which
# bound its measured seconds
SNAPS: list[tuple[float, float, float, dict[str, int]]] = []
PROFILE = cProfile.Profile() if ARGS.profile else None


async def _snap(url: str) -> tuple[float, float, float, dict[str, int]]:
    c = aioredis.Redis.from_url(url)
    try:
        cpu = await c.info("cpu")
        stats = await c.info("commandstats")
    finally:
        await c.aclose()
    return (time.perf_counter(), time.process_time(),
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            {**{k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()},
             **{"us:" + k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in stats.items()}})


async def _counting(url: str) -> int:
    if PROFILE is not None and SNAPS:
        PROFILE.disable()
    SNAPS.append(await _snap(url))
    n = await _commands(url)
    if len(SNAPS) == 1:
        print("measuring", file=sys.stderr, flush=True)   # for a sampling profiler
        if PROFILE is not None:
            PROFILE.enable()
    return n


host_throughput.commands = _counting  # type: ignore[assignment]
GC = {"s": 0.0, "n": 0, "t0": 0.0}


def _gc_timer(phase: str, info: dict[str, int]) -> None:
    """Time the collector's passes (the host's objects per scope are its work)."""
    if phase == "start":
        GC["t0"] = time.perf_counter()
    elif len(SNAPS) == 1:
        GC["s"] += time.perf_counter() - GC["t0"]
        GC["n"] += 1


gc.callbacks.append(_gc_timer)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        if ARGS.pin:
            assert server.proc is not None
            os.sched_setaffinity(0, {0})
            os.sched_setaffinity(server.proc.pid, {1})
        try:
            r = await host_throughput.case(server.url, ARGS.jobs, ARGS.scopes, ARGS.seconds)
        finally:
            server.stop()
    (t0, h0, r0, c0), (t1, h1, r1, c1) = SNAPS[0], SNAPS[-1]
    done = r["rate"] * (t1 - t0)    # case() times its completions over about this window
    by_cmd = {k: round((v - c0.get(k, 0)) / done, 3) for k, v in c1.items()
              if not k.startswith("us:") and v - c0.get(k, 0) > done / 100}
    # Redis's own time per completion by command (a script's includes its commands')
    us_cmd = {k[3:]: round((v - c0.get(k, 0)) / done, 2) for k, v in c1.items()
              if k.startswith("us:") and v - c0.get(k, 0) > done / 100}
    print(json.dumps({
        "build": str(Path(sfc_host.__file__).parent.parent), "jobs": ARGS.jobs,
        "scopes": ARGS.scopes, "rate": round(r["rate"]),
        "client_commands": round(r["commands"], 4),
        "redis_commands": round(r["server_commands"], 2),
        "host_us": round((h1 - h0) * 1e6 / done, 1), "redis_us": round((r1 - r0) * 1e6 / done, 1),
        "cpu_us": round(((h1 - h0) + (r1 - r0)) * 1e6 / done, 1),
        "gc_us": round(GC["s"] * 1e6 / done, 2), "gc_passes": GC["n"],
        "by_command": dict(sorted(by_cmd.items(), key=lambda kv: -kv[1])),
        "us_by_command": dict(sorted(us_cmd.items(), key=lambda kv: -kv[1]))}), flush=True)
    if PROFILE is not None:
        PROFILE.dump_stats(ARGS.profile)


if __name__ == "__main__":
    uvloop.run(main())
