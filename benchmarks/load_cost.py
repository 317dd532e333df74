"""The host's CPU per action and its answer latency's tail over load, against the floor.

    python benchmarks/load_cost.py                       # this checkout, once
    python benchmarks/load_cost.py --quick               # a smoke run
    python benchmarks/load_cost.py --baseline ../other --turns 3

The setting of ``report.py``'s end-to-end part (``report_e2e.setup``: one host in this
process, redis-server, mosquitto and the station process answering every command at
once; 5-step jobs of one push action a step). First the saturation (jobs stored at once)
and the host's CPU per action there; then jobs offered at 10, 25, 50 and 75 % of that
rate, each with the host's CPU per action, the p50 and p99 of answer -> command (the
answer read to the job's next command queued for the broker), the host's socket writes a
job (Redis and MQTT: below saturation each is a system call that wakes a server) and its
voluntary context switches an action (each a sleep and a wake-up of the loop).
Last, with the host closed, the floor: ``mqtt_floor.py``'s relay (a compare-and-set an
answer and nothing else of the host's work) at 50 and 75 % of saturation's action rate
through the same broker, Redis and station; its p99 is what the host's is held to.

``--baseline DIR`` runs this same script in turns, once with this checkout's package and
once with DIR's (a checkout of another commit whose compiled core was built in place:
``python setup.py build_ext --inplace``), and prints each figure's median per side and
their ratio: two runs in the same minutes on the same machine, the only comparison that
means anything on a shared two-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

FRACTIONS = (0.1, 0.25, 0.5, 0.75)


def switches() -> int:
    """Voluntary context switches of this process's threads."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        for line in Path(f"/proc/self/task/{t}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                n += int(line.split()[1])
    return n


def _writes(app: Any) -> tuple[int, int]:
    """Socket writes so far: the Redis channel's and the MQTT link's (a checkout from
    before the link counted them: -1)."""
    channel = app.host.channel
    return (channel.writes if channel is not None else 0, getattr(app.link, "writes", -1))


async def _measure(quick: bool) -> dict[str, Any]:
    import report_e2e as e2e
    from mqtt_e2e import floor_relay, settled

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sfc-load-") as tmp:
        async with e2e.setup(Path(tmp)) as run:
            n = 400 if quick else 2000
            await run.saturation("warm", min(n, 300))
            await settled(run.app)
            c0 = time.process_time()
            sat = await run.saturation("sat", n)
            out["saturation_jobs_s"] = sat
            out["sat_cpu_us"] = (time.process_time() - c0) / (n * 5) * 1e6
            seconds = 2.0 if quick else 6.0
            await settled(run.app)
            c0, t0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(seconds)
            # the host's own background (sweeps, index, keepalives) with no job running
            out["idle_core"] = (time.process_time() - c0) / (time.perf_counter() - t0)
            for f in FRACTIONS:
                await settled(run.app)
                w0, v0, c0 = _writes(run.app), switches(), time.process_time()
                r = await run.paced(f"p{int(f * 100)}-", f * sat, seconds)
                cpu = time.process_time() - c0
                v1, w1 = switches(), _writes(run.app)
                actions = r["jobs"] * 5
                p50, p99 = e2e.quantiles(r.pop("samples"), (0.5, 0.99))
                key = f"{int(f * 100)}"
                out[f"cpu_us@{key}"] = cpu / actions * 1e6
                out[f"p50_ms@{key}"] = p50 * 1e3
                out[f"p99_ms@{key}"] = p99 * 1e3
                out[f"redis_writes_job@{key}"] = (w1[0] - w0[0]) / r["jobs"]
                out[f"mqtt_writes_job@{key}"] = (
                    (w1[1] - w0[1]) / r["jobs"] if w0[1] >= 0 else float("nan"))
                out[f"wakeups@{key}"] = (v1 - v0) / actions
                out[f"achieved@{key}"] = r["achieved"] / sat
            await settled(run.app)
            await run.stop_host()
            loop = asyncio.get_running_loop()
            for f in (0.5, 0.75):
                fl = await loop.run_in_executor(None, floor_relay, run.broker_port,
                                                run.redis_port, f * sat * 5, seconds)
                out[f"floor_p99_ms@{int(f * 100)}"] = fl["p99_ms"]
    for f in FRACTIONS:
        key = f"{int(f * 100)}"
        out[f"cpu_ratio@{key}"] = out[f"cpu_us@{key}"] / out["sat_cpu_us"]
    for key in ("50", "75"):
        out[f"p99_over_floor@{key}"] = out[f"p99_ms@{key}"] / out[f"floor_p99_ms@{key}"]
    return out


def once(quick: bool) -> dict[str, Any]:
    import uvloop

    import sfc_host
    result = uvloop.run(_measure(quick))
    result["package"] = str(Path(sfc_host.__file__).resolve().parents[1])
    return result


def _side(src: Path | None, quick: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, str(Path(__file__).resolve()), "--json-line"]
    if quick:
        argv.append("--quick")
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"load_cost.py failed ({'baseline' if src else 'this'}): "
                         f"{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


ORDER = ["saturation_jobs_s", "sat_cpu_us", "idle_core"] + [
    f"{m}@{int(f * 100)}" for f in FRACTIONS
    for m in ("cpu_us", "cpu_ratio", "p50_ms", "p99_ms", "redis_writes_job", "mqtt_writes_job",
              "wakeups")] + [
    "floor_p99_ms@50", "p99_over_floor@50", "floor_p99_ms@75", "p99_over_floor@75"]


def turns(baseline: Path, n: int, quick: bool) -> None:
    base: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    for i in range(n):
        for side, src, into in (("baseline", baseline / "src", base), ("this", None, ours)):
            r = _side(src, quick)
            into.append(r)
            print(f"turn {i + 1}, {side} ({r['package']}): saturation "
                  f"{r['saturation_jobs_s']:,.0f} jobs/s, {r['sat_cpu_us']:.0f} µs an action; "
                  f"at 50 %: {r['cpu_us@50']:.0f} µs, p99 {r['p99_ms@50']:.2f} ms "
                  f"(floor {r['floor_p99_ms@50']:.2f})", flush=True)
    print(f"\nmedians of {n} turns each\n")
    print("| figure | baseline | this | this / baseline |")
    print("|---|---:|---:|---:|")
    for k in ORDER:
        b = statistics.median(r[k] for r in base)
        t = statistics.median(r[k] for r in ours)
        print(f"| {k} | {b:,.2f} | {t:,.2f} | {t / b if b else float('nan'):.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--baseline", type=Path,
                    help="another checkout (core built in place) to run in turns with")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--json-line", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline is not None:
        if not (args.baseline / "src" / "sfc_host").is_dir():
            print(f"load_cost.py: error: {args.baseline} is not a checkout of sfc-fast "
                  "(no src/sfc_host)", file=sys.stderr)
            return 2
        turns(args.baseline, args.turns, args.quick)
        return 0
    r = once(args.quick)
    if args.json_line:
        print(json.dumps(r))
        return 0
    for k in ORDER:
        print(f"{k:>22}: {r[k]:,.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
