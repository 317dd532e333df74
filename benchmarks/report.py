"""The performance report: one run on this machine, written to docs/benchmarks-report.md
with plots under docs/img/.

    python benchmarks/report.py            # the full run (5 to 15 minutes on 2 cores)
    python benchmarks/report.py --quick    # a smoke run (a minute or two, small sizes)

What it measures, in this order, each part in the same run so the figures compare:

1. ratios: the compiled core against its plain-Python interpretation (evolve_ratio.py's
   workloads) and the job order machine against ``transitions`` and
   ``python-statemachine`` (machines_ratio.py's contenders);
2. the machine's limits: redis-benchmark against the redis-server the host then uses
   (SET/GET and a compare-and-set-shaped EVALSHA, with and without pipelining), and
   host_throughput.py's host on the same server as a fraction of them;
3. end to end through mosquitto (mqtt_e2e.py's setup): the broker's own QoS 1 rate
   with no host in between, then jobs/s at saturation, a curve of offered loads with
   the answer-to-command latency (p50, p99, p99.9), and a cProfile of a saturated run;
4. cost as the work grows (report_cost.py): active jobs 1,000 to 1,000,000 (per-action
   time, Redis memory per job, host RSS; the 1,000,000 case also sweeps and shifts
   every job), recipe size 10 to 10,000 steps, 1 to 10,000 scopes;
5. scale: 1, 2 and 3 host processes on one Redis and on a 3-shard Redis Cluster.

``--json FILE`` keeps the raw results; ``--render FILE`` writes the report from them
again without measuring. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis as redis_sync
import report_limits
import uvloop
from helpers.servers import RedisClusterServer, RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


# ---------------------------------------------------------------- 1. ratios


def part_ratios(quick: bool) -> dict[str, Any]:
    import evolve_ratio as er
    import machines_ratio as mr
    from py_evolve import load_recipe

    from sfc_fast import compile_recipe
    from sfc_fast.events import Completed

    recipe = er.six_steps()
    graph = compile_recipe(recipe, er.V110)
    model = load_recipe(recipe)
    calls, rounds = (10_000, 3) if quick else (100_000, 5)
    jobs = 1_000 if quick else 10_000
    c_state, p_state = er.step3_states(graph, model, "job-0000001")
    core: list[dict[str, Any]] = []
    for label, result in (("one completion, id read", None),
                          ("one completion, result dict, id read", er.RESULT)):
        ev = Completed("job-0000001:a2#3", result)
        sc, sp = er.per_call_samples(
            [(er.loop_core_read, (graph, c_state, ev, er.NOW), calls),
             (er.loop_py_read, (model, p_state, ev, er.NOW), max(calls // 10, 500))], rounds)
        core.append({"workload": label, "core": 1 / statistics.median(sc),
                     "py": 1 / statistics.median(sp), "ratio": er.paired_ratio(sc, sp)})
    for label, result in (("whole runs, no result", None), ("whole runs, result dict", er.RESULT)):
        tc, (nc, _) = er.timed(er.run_core, graph, er.job_ids(jobs), result)
        tp, (np_, _) = er.timed(er.run_py, model, er.job_ids(max(jobs // 4, 250)), result)
        core.append({"workload": label, "core": nc / tc, "py": np_ / tp,
                     "ratio": (nc / tc) / (np_ / tp)})
    machines: list[dict[str, Any]] = []
    for name, make in mr.CONTENDERS:
        try:
            run = make()
        except ImportError as e:
            machines.append({"contender": name, "rate": None, "missing": e.name})
            continue
        run(1)
        machines.append({"contender": name, "rate": mr.rate(run, 0.3 if quick else 1.0)})
    return {"core": core, "machines": machines}


# ---------------------------------------------------------------- 2. limits and the host


async def _host_case(url: str, jobs: int, scopes: int, seconds: float) -> dict[str, float]:
    import host_throughput as ht
    return await ht.case(url, jobs, scopes, seconds)


def part_limits(quick: bool, tmp: Path) -> dict[str, Any]:
    import host_throughput as ht
    server = RedisServer(tmp / "limits")
    server.start()
    try:
        c = redis_sync.Redis(port=server.port)
        sha = c.script_load(report_limits.CAS_LIKE)
        completion_sha = c.script_load(report_limits.COMPLETION_LIKE)
        c.xgroup_create("b:cwork", "g", id="$", mkstream=True)
        out: dict[str, Any] = {"redis": report_limits.redis_limits(
            server.port, 50_000 if quick else 300_000, sha, completion_sha)}
        c.flushall()
        secs = 3.0 if quick else 8.0
        out["host"] = uvloop.run(_host_case(server.url, 1000, 10, secs))
        out["redis_py"] = uvloop.run(ht.baseline(server.url))
        return out
    finally:
        server.stop()


# ---------------------------------------------------------------- 3. end to end


async def _e2e(quick: bool, tmp: Path) -> dict[str, Any]:
    import report_e2e as e2e
    from mqtt_e2e import broker_pingpong, floor_relay, settled
    out: dict[str, Any] = {}
    async with e2e.setup(tmp) as run:
        out["mqtt"] = await asyncio.get_running_loop().run_in_executor(
            None, report_limits.mqtt_limit, run.broker_port, 30_000 if quick else 200_000)
        n = 300 if quick else 2000
        await run.saturation("warm", min(n, 200))
        out["saturation_jobs"] = n
        out["saturation"] = await run.saturation("sat", n)
        out["saturation_cpu"] = run.cpu_share
        sat = out["saturation"]
        fractions = (0.25, 0.5, 0.9) if quick else (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25)
        seconds = 2.0 if quick else 6.0
        curve = []
        for i, f in enumerate(fractions):
            r = await run.paced(f"p{i}-", f * sat, seconds)
            p50, p99, p999 = e2e.quantiles(r.pop("samples"))
            r.update(fraction=f, p50_ms=p50 * 1e3, p99_ms=p99 * 1e3, p999_ms=p999 * 1e3)
            curve.append(r)
        out["curve"] = curve
        out["profile"] = await e2e.profiled_saturation(run, "prof", n)
        out["metrics"] = run.app.metrics.snapshot()
        # the broker's own p99 at half of saturation's message rate (an action is a
        # command and an answer: two messages, as a ping and its pong): the broker
        # alone, once the host has sent what the runs left queued and is closed
        await settled(run.app)
        await run.stop_host()
        out["pingpong"] = await asyncio.get_running_loop().run_in_executor(
            None, broker_pingpong, run.broker_port, 0.5 * sat * 5, seconds)
        # the floor: a relay with none of the host's work, a compare-and-set an answer
        # (mqtt_floor.py), at the same rate through the same servers and station
        # (a failure of its own is noted, not the end of this part's figures)
        try:
            out["floor"] = await asyncio.get_running_loop().run_in_executor(
                None, floor_relay, run.broker_port, run.redis_port, 0.5 * sat * 5, seconds)
        except (subprocess.SubprocessError, ValueError) as e:
            detail = getattr(e, "stderr", "") or ""
            out.setdefault("errors", []).append(f"floor: {e} {detail[-1500:]}")
            print(out["errors"][-1], file=sys.stderr, flush=True)
    return out


def part_e2e(quick: bool, tmp: Path) -> dict[str, Any]:
    return uvloop.run(_e2e(quick, tmp / "e2e"))


# ---------------------------------------------------------------- 4. cost


def part_cost(quick: bool, tmp: Path) -> dict[str, Any]:
    import host_throughput as ht
    from report_cost import recipe_size
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    out: dict[str, Any] = {"active": []}
    server = RedisServer(tmp / "cost")
    server.start()
    try:
        for n in sizes:
            argv = [sys.executable, str(HERE / "report_cost.py"), "active", server.url,
                    "--jobs", str(n), "--seconds", "3" if quick else "6"]
            if n == sizes[-1]:
                argv.append("--shift")
            p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            if p.returncode != 0:
                out.setdefault("errors", []).append(f"active {n}: {p.stderr[-1500:]}")
                print(out["errors"][-1], file=sys.stderr, flush=True)
            else:
                out["active"].append(json.loads(p.stdout.strip().splitlines()[-1]))
            redis_sync.Redis(port=server.port).flushall()
        steps = (10, 100, 1000) if quick else (10, 100, 1000, 10_000)
        out["recipe"] = [recipe_size(s, 3 if quick else 5) for s in steps]
        scopes = (1, 10, 100) if quick else (1, 10, 100, 1000, 10_000)
        out["scopes"] = []
        for s in scopes:
            r = uvloop.run(ht.case(server.url, max(1000, s), s, 2.0 if quick else 5.0))
            out["scopes"].append(r)
    finally:
        server.stop()
    return out


# ---------------------------------------------------------------- 5. scale


def _redis_cpu(ports: list[int]) -> float:
    total = 0.0
    for p in ports:
        info = redis_sync.Redis(port=p).info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def _scale_case(url: str, ports: list[int], cluster: bool, hosts: int, seconds: float,
                warmup: float) -> dict[str, Any]:
    for p in ports:
        redis_sync.Redis(port=p).flushall()
    procs = []
    try:
        for i in range(hosts):
            argv = [sys.executable, str(HERE / "scale_proc.py"), url, f"h{i}",
                    "--seconds", str(seconds), "--warmup", str(warmup)]
            if cluster:
                argv.append("--cluster")
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a scale_proc.py host did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        time.sleep(warmup)
        cpu0 = _redis_cpu(ports)
        time.sleep(seconds)
        redis_cpu = (_redis_cpu(ports) - cpu0) / seconds
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"hosts": hosts, "cluster": cluster, "rate": sum(r["rate"] for r in results),
            "per_host": [r["rate"] for r in results],
            "host_cpu": sum(r["cpu_s"] / r["wall_s"] for r in results),
            "redis_cpu": redis_cpu}


def part_scale(quick: bool, tmp: Path) -> dict[str, Any]:
    seconds, warmup = (3.0, 1.5) if quick else (6.0, 2.0)
    out: dict[str, Any] = {"single": [], "cluster": []}
    server = RedisServer(tmp / "scale")
    server.start()
    try:
        for k in (1, 2, 3):
            out["single"].append(_scale_case(server.url, [server.port], False, k, seconds,
                                             warmup))
    finally:
        server.stop()
    cluster = RedisClusterServer(tmp / "cluster", 3)
    cluster.start()
    try:
        for k in (1, 2, 3):
            out["cluster"].append(_scale_case(cluster.url, cluster.ports, True, k, seconds,
                                              warmup))
    finally:
        cluster.stop()
    return out


# ---------------------------------------------------------------- the run


PARTS: list[tuple[str, Callable[[bool, Path], dict[str, Any]]]] = [
    ("limits", part_limits), ("e2e", part_e2e), ("cost", part_cost), ("scale", part_scale),
]


def measure(quick: bool, only: set[str] | None) -> dict[str, Any]:
    R: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "quick": quick,
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "uptime_before": uptime(), "seconds": {}, "errors": {},
    }
    todo: list[tuple[str, Callable[..., dict[str, Any]]]] = [
        ("ratios", lambda q, _t: part_ratios(q)), *PARTS]
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in todo:
            if only and name not in only:
                continue
            print(f"[report] {name} ...", flush=True)
            t0 = time.perf_counter()
            try:
                R[name] = fn(quick, Path(tmp))
            except Exception:
                R["errors"][name] = traceback.format_exc(limit=6)
                print(R["errors"][name], file=sys.stderr, flush=True)
            R["seconds"][name] = time.perf_counter() - t0
            print(f"[report] {name}: {R['seconds'][name]:.0f} s; {uptime()}", flush=True)
    R["uptime_after"] = uptime()
    return R


def _mistake(text: str) -> int:
    print(f"report.py: {text}", file=sys.stderr)
    return 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--only", help="comma-separated parts: ratios,limits,e2e,cost,scale")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--render", type=Path, help="write the report from saved results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-report.md")
    ap.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--update", action="store_true",
                    help="with --only: replace those parts' sections in the existing report, "
                         "marked as from this run, instead of writing a report of them alone")
    a = ap.parse_args()
    if a.update and not a.only:
        return _mistake("--update goes with --only PARTS")
    if a.update and not a.out.is_file():
        return _mistake(f"--update: {a.out} is not there: run the report whole first")
    try:     # before the run, not after its minutes
        from report_render import render, update
    except ImportError as e:
        return _mistake(f"{e.name} is not installed: pip install -e '.[bench]'")
    if a.render:
        R = json.loads(a.render.read_text())
    else:
        R = measure(a.quick, set(a.only.split(",")) if a.only else None)
        if a.json:
            a.json.write_text(json.dumps(R, indent=1))
    if a.update:
        parts = update(R, a.out, a.img)
        print(f"[report] replaced {', '.join(parts) or 'nothing'} in {a.out}")
    else:
        render(R, a.out, a.img)
        print(f"[report] wrote {a.out} and plots in {a.img}")
    return 1 if R["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
