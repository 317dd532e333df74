"""The compiled core against the plain-Python baseline (py_evolve.py), same process.

    python benchmarks/evolve_ratio.py            # the figures of docs/benchmarks.md
    python benchmarks/evolve_ratio.py --quick    # small N, a smoke run

Workloads, each through ``sfc_fast.evolve`` and through ``py_evolve`` with the same
event objects (tests/core/test_py_evolve_parity.py checks that both decide the same):

- run: many jobs of a 6-step recipe (a push action per step, a condition on every
  transition): start every job, then complete each command as it is dispatched (FIFO
  over all jobs) until every job is done. completions/s counts the Completed events
  over the whole run's time, starts and the driver loop included;
- one completion: the same completion (step 3 of 6, with and without a result dict)
  evolved over and over against the same state bytes: the cost of one evolve call.
  The Decision builds its commands and work entries when they are first read, so a
  second row reads the new command's id (what any caller does): the honest per-call
  figure, and the one the targets are judged on;
- the run through the embedded ``Runner`` (deadline index, waits, callback included);
- memory per job in the Runner with 100,000 running jobs: RSS growth and tracemalloc.

The two sides take turns round by round; a rate is the median over rounds, a ratio the
median of the rounds' own ratios (both sides of a round saw the same machine).

Targets: >= 1,000,000 completions/s on one core; >= 50x the plain-Python run; Runner
memory <= 1 KB per job. The figures are printed as measured, met or not, for the
workload the targets are judged on (one completion, id read) and for whole runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.recipes import V110, push
from py_evolve import load_recipe, py_evolve, status_of

from sfc_fast import Runner, compile_recipe
from sfc_fast.events import Completed, Start
from sfc_fast.evolve import evolve

NOW = 1_000_000
RESULT = {"torque": 85.5, "ok": True}
GOAL_RATE = 1_000_000
GOAL_RATIO = 50
GOAL_BYTES = 1024


def six_steps(retries: int = 0) -> dict[str, Any]:
    """S0..S5 in sequence, one push action each (with parameters); every transition
    has a condition on the result of the step's action (true without a result)."""
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(6)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": f"a{i}.ok != false"}
             for i in range(5)]
    extra: dict[str, Any] = {"Retries": retries} if retries else {}
    acts = [push(f"a{i}", f"S{i}", Parameters={"program": i, "speed": 1.5}, **extra)
            for i in range(6)]
    return {"Steps": steps, "Transitions": trans, "Actions": acts}


def job_ids(n: int) -> list[str]:
    return [f"job-{i:07d}" for i in range(n)]


# ---------------------------------------------------------------- the run workload


def run_core(graph, jobs: list[str], result: dict | None) -> tuple[int, dict[str, bytes]]:
    states: dict[str, bytes] = {}
    queue: deque[tuple[str, str]] = deque()
    for job in jobs:
        d = evolve(graph, None, Start(job, "s1"), NOW)
        states[job] = d.state
        for c in d.commands:
            queue.append((job, c.command_id))
    n = 0
    while queue:
        job, cid = queue.popleft()
        d = evolve(graph, states[job], Completed(cid, result), NOW)
        n += 1
        states[job] = d.state
        for c in d.commands:
            queue.append((job, c.command_id))
    return n, states


def run_py(model, jobs: list[str], result: dict | None) -> tuple[int, dict[str, bytes]]:
    states: dict[str, bytes] = {}
    queue: deque[tuple[str, str]] = deque()
    for job in jobs:
        _, state, _, commands, _ = py_evolve(model, None, Start(job, "s1"), NOW)
        states[job] = state
        for c in commands:
            queue.append((job, c["command_id"]))
    n = 0
    while queue:
        job, cid = queue.popleft()
        _, state, _, commands, _ = py_evolve(model, states[job], Completed(cid, result), NOW)
        n += 1
        states[job] = state
        for c in commands:
            queue.append((job, c["command_id"]))
    return n, states


def run_runner(graph, jobs: list[str], result: dict | None) -> tuple[int, Runner]:
    sent: deque[str] = deque()
    runner = Runner(lambda c: sent.append(c.command_id), clock=lambda: NOW)
    for job in jobs:
        runner.start(job, graph, "s1")
    n = 0
    while sent:
        runner.complete(sent.popleft(), result)
        n += 1
    return n, runner


def timed(fn, *args) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------- one completion


def step3_states(graph, model, job: str) -> tuple[bytes, bytes]:
    """Both implementations' state of ``job`` at step S2 (two completions done)."""
    d = evolve(graph, None, Start(job, "s1"), NOW)
    p = py_evolve(model, None, Start(job, "s1"), NOW)
    for i in range(2):
        ev = Completed(f"{job}:a{i}#{i + 1}", RESULT)
        d = evolve(graph, d.state, ev, NOW)
        p = py_evolve(model, p[1], ev, NOW)
    return d.state, p[1]


def evolve_read(graph, state: bytes, ev, now: int) -> str:
    """evolve, then read the first command's id (the Decision builds it on demand)."""
    return evolve(graph, state, ev, now).commands[0].command_id


# The per-call loops: one per case, the call written inline, so that neither side pays a
# wrapper frame or an argument tuple per call (1.2x of the core's call when it did).

def loop_core(graph, state: bytes, ev, now: int, n: int) -> None:
    ev_ = evolve
    for _ in range(n):
        ev_(graph, state, ev, now)


def loop_core_read(graph, state: bytes, ev, now: int, n: int) -> None:
    ev_ = evolve
    for _ in range(n):
        cid = ev_(graph, state, ev, now).commands[0].command_id
    assert cid


def loop_py(model, state: bytes, ev, now: int, n: int) -> None:
    ev_ = py_evolve
    for _ in range(n):
        ev_(model, state, ev, now)


def loop_py_read(model, state: bytes, ev, now: int, n: int) -> None:
    ev_ = py_evolve
    for _ in range(n):
        cid = ev_(model, state, ev, now)[3][0]["command_id"]
    assert cid


def per_call_samples(cases: list[tuple[Any, tuple, int]], rounds: int) -> list[list[float]]:
    """Seconds per call of each ``(loop, args, calls)`` case in each of ``rounds`` rounds
    (``loop(*args, calls)`` makes ``calls`` calls).

    The cases take turns round by round, so that on a shared machine the core and the
    baseline see the same load (one after the other, a busy spell would land on one)."""
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for i, (loop, args, calls) in enumerate(cases):
            t0 = time.perf_counter()
            loop(*args, calls)
            samples[i].append((time.perf_counter() - t0) / calls)
    return samples


def paired_ratio(core: list[float], py: list[float]) -> float:
    """Median over rounds of the baseline's time per call over the core's, in the same
    round: a round the machine was slow in slows both of its samples, so their ratio
    moves less than the ratio of two medians taken apart."""
    return statistics.median(p / c for c, p in zip(core, py, strict=True))


# ---------------------------------------------------------------- memory


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:   # not Linux: peak RSS is the best there is
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def runner_memory(graph, n: int, traced: bool) -> tuple[int, Runner]:
    """Bytes the Runner holds for ``n`` started jobs (one command open each)."""
    jobs = job_ids(n)           # the ids exist before: the host has them anyway
    gc.collect()
    if traced:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = rss_bytes()
    runner = Runner(lambda c: None, clock=lambda: NOW)
    for job in jobs:
        runner.start(job, graph, "s1")
    gc.collect()
    if traced:
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    else:
        after = rss_bytes()
    assert len(runner) == n
    return after - before, runner


# ---------------------------------------------------------------- report


def fmt_rate(r: float) -> str:
    return f"{r:>12,.0f}/s"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs in the run workload")
    ap.add_argument("--calls", type=int, default=500_000,
                    help="calls per round of the one-completion loop (compiled core)")
    ap.add_argument("--mem-jobs", type=int, default=100_000, help="jobs for memory per job")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--run-rounds", type=int, default=3, help="turns of the run workload")
    ap.add_argument("--quick", action="store_true", help="small N (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.jobs, a.calls, a.mem_jobs, a.rounds, a.run_rounds = 1_000, 10_000, 5_000, 3, 1
    # about 0.6 s a round for each baseline loop and 0.3 s for each core loop: long
    # enough that a collection of the garbage collector or a scheduler blip is averaged
    py_calls = max(a.calls // 25, 1_000)
    py_jobs = max(a.jobs // 4, 500)

    recipe = six_steps()
    graph = compile_recipe(recipe, V110)
    model = load_recipe(recipe)
    print(f"sfc_fast evolve against py_evolve; Python {platform.python_version()} "
          f"({platform.machine()}), {os.cpu_count()} CPUs visible, one thread")
    print("recipe: 6 steps, one push action each, a condition on every transition")
    print()

    # memory first, while the heap is fresh (RSS growth is meaningful then)
    rss, runner = runner_memory(graph, a.mem_jobs, traced=False)
    del runner
    traced, runner = runner_memory(graph, a.mem_jobs, traced=True)
    del runner
    gc.collect()
    per_job_rss = rss / a.mem_jobs
    per_job_traced = traced / a.mem_jobs
    print(f"Runner memory, {a.mem_jobs:,} running jobs (one command open each):")
    print(f"  RSS growth        {per_job_rss:>8.0f} bytes/job")
    print(f"  tracemalloc       {per_job_traced:>8.0f} bytes/job")
    c_state, p_state = step3_states(graph, model, "job-0000001")
    print(f"  state document at S2: {len(c_state)} bytes (core), {len(p_state):,} bytes "
          f"(py JSON)")
    print()

    # one completion
    rows = []
    for label, result in (("one completion", None), ("one completion + result", RESULT)):
        ev = Completed("job-0000001:a2#3", result)
        assert evolve(graph, c_state, ev, NOW).commands[0].command_id == "job-0000001:a3#4"
        assert py_evolve(model, p_state, ev, NOW)[3][0]["command_id"] == "job-0000001:a3#4"
        sc, sr, sp, spr = per_call_samples(
            [(loop_core, (graph, c_state, ev, NOW), a.calls),
             (loop_core_read, (graph, c_state, ev, NOW), a.calls),
             (loop_py, (model, p_state, ev, NOW), py_calls),
             (loop_py_read, (model, p_state, ev, NOW), py_calls)], a.rounds)
        med = statistics.median
        rows.append((label, 1 / med(sc), 1 / med(sp), paired_ratio(sc, sp)))
        rows.append((label + ", id read", 1 / med(sr), 1 / med(spr), paired_ratio(sr, spr)))

    # the run: core, baseline and Runner take turns, median rate of each
    for label, result in (("run (no result)", None), ("run (result dict)", RESULT)):
        jobs = job_ids(a.jobs)
        pjobs = job_ids(py_jobs)
        rc, rp, rr = [], [], []
        for _ in range(a.run_rounds):
            tc, (nc, states) = timed(run_core, graph, jobs, result)
            assert nc == 6 * a.jobs
            assert evolve(graph, states[jobs[-1]], Completed("x"), NOW).status == "completed"
            del states
            tp, (np_, pstates) = timed(run_py, model, pjobs, result)
            assert np_ == 6 * py_jobs and status_of(pstates[pjobs[-1]])[0] == "completed"
            del pstates
            tr, (nr, runner) = timed(run_runner, graph, jobs, result)
            assert nr == 6 * a.jobs and runner.status(jobs[-1]) == "completed"
            del runner
            rc.append(nc / tc)
            rp.append(np_ / tp)
            rr.append(nr / tr)
        rows.append((label, statistics.median(rc), statistics.median(rp),
                     statistics.median(c / p for c, p in zip(rc, rp, strict=True))))
        rows.append((label.replace("run", "Runner run"), statistics.median(rr), None, None))

    print(f"{'completions/s':<34}{'compiled core':>16}{'plain Python':>16}{'ratio':>9}")
    for label, rc, rp, ratio in rows:
        if rp is None:
            print(f"{label:<34}{fmt_rate(rc):>16}{'-':>16}{'-':>9}")
        else:
            print(f"{label:<34}{fmt_rate(rc):>16}{fmt_rate(rp):>16}{ratio:>8.1f}x")
    print(f"(core: {a.calls:,} calls x {a.rounds} rounds; py: {py_calls:,} calls; "
          f"run: {a.jobs:,} jobs core and Runner, {py_jobs:,} jobs py, {a.run_rounds} "
          f"rounds; the implementations take turns; rates are medians, a ratio is the "
          f"median of the rounds' ratios)")
    print()

    one = next(r for r in rows if r[0] == "one completion, id read")
    run = next(r for r in rows if r[0] == "run (no result)")
    print("targets, judged on the workload of one action completion (its evolve, the new")
    print("command's id read); whole runs add the driver loop both sides share:")
    print(f"  >= {GOAL_RATE:,} completions/s      {one[1]:,.0f}/s: {verdict(one[1] >= GOAL_RATE)}"
          f" (whole runs {run[1]:,.0f}/s: {verdict(run[1] >= GOAL_RATE)})")
    print(f"  >= {GOAL_RATIO}x the plain-Python run   {one[3]:.1f}x: "
          f"{verdict(one[3] >= GOAL_RATIO)} (whole runs {run[3]:.1f}x: "
          f"{verdict(run[3] >= GOAL_RATIO)})")
    print(f"  <= {GOAL_BYTES} bytes per job in Runner   {per_job_rss:.0f} (RSS), "
          f"{per_job_traced:.0f} (tracemalloc): "
          f"{verdict(max(per_job_rss, per_job_traced) <= GOAL_BYTES)}")


if __name__ == "__main__":
    main()
