"""The demo's summary: job outcomes, throughput, latencies and the time per step.

Step times come from the final state documents in Redis (``state_to_json``: each
action's ``since_ms`` and ``settled_ms``); the host latency from the hosts'
``answer_to_command_seconds`` histogram (in-process, or scraped from their
``/metrics``); the station's view from the station mission's ``station_stats``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from sfc_fast import Graph, StateFormatError, state_to_json
from sfc_host.metrics import Histogram
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.states import whole_state

if TYPE_CHECKING:
    from sfc_host.demo.tally import Job, Tally

_SAMPLE = re.compile(r'^(\w+?)(_bucket|_sum|_count)(?:\{([^}]*)\})? (\S+)$')
_LE = re.compile(r'le="([^"]+)"')


def merge_histograms(texts: list[str], name: str) -> Histogram | None:
    """One histogram from the Prometheus text of several hosts (same buckets)."""
    merged: Histogram | None = None
    for text in texts:
        cum: dict[float, int] = {}
        total, count = 0.0, 0
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m is None or m.group(1) != name:
                continue
            kind, labels, value = m.group(2), m.group(3) or "", m.group(4)
            if kind == "_bucket":
                le = _LE.search(labels)
                if le:
                    cum[float(le.group(1))] = int(float(value))
            elif kind == "_sum":
                total = float(value)
            else:
                count = int(float(value))
        bounds = sorted(b for b in cum if not math.isinf(b))
        if not bounds:
            continue
        h = Histogram(bounds)
        prev = 0
        for i, b in enumerate([*bounds, math.inf]):
            c = cum.get(b, prev)
            h.counts[i] = c - prev
            prev = c
        h.sum, h.count = total, count
        if merged is None:
            merged = h
        else:
            merged.merge(h)
    return merged


def counter(text: str, name: str) -> int:
    """A counter's value in one host's Prometheus text (0 when absent)."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


@dataclass
class StepRow:
    recipe: str
    step: str
    jobs: int
    mean_ms: float
    p90_ms: float
    rounds: float


@dataclass
class Report:
    submitted: int
    completed: int
    aborted: Counter[str]
    unfinished: int
    not_accepted: Counter[str]
    elapsed_s: float
    host_latency: Histogram | None
    station_latency_ms: list[float]
    steps: list[StepRow] = field(default_factory=list)
    job_ms: dict[str, list[float]] = field(default_factory=dict)
    paused: int = 0          # jobs the MES paused and resumed
    held: int = 0            # hold commands the stations answered "held"
    restarted: int = 0       # restart commands they served
    per_host: list[int] = field(default_factory=list)   # answers each host received


def _p(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def collect(redis_url: str, tally: Tally, host_latency: Histogram | None,
                  station_stats: dict[str, Any], work_masters: dict[str, Any],
                  per_host: list[int]) -> Report:
    jobs = list(tally.jobs.values())
    aborted: Counter[str] = Counter(j.reason or "no reason given" for j in jobs
                                    if j.state == "Aborted")
    refused: Counter[str] = Counter(j.reason for j in jobs if j.state == "NotAccepted")
    completed = [j for j in jobs if j.state.startswith("Ended")]
    station = [v for s in station_stats.values() for v in s.get("latency_ms", [])]
    report = Report(len(jobs), len(completed), aborted,
                    sum(1 for j in jobs if not j.ended_at), refused,
                    max(tally.last_end - tally.started_at, 1e-9), host_latency, station)
    report.paused = sum(1 for j in jobs if j.paused)
    report.per_host = per_host
    report.held = sum(int(s.get("held", 0)) for s in station_stats.values())
    report.restarted = sum(int(s.get("restarted", 0)) for s in station_stats.values())
    views = await _states(redis_url, completed)
    per_step: dict[tuple[str, str], list[float]] = defaultdict(list)
    rounds: dict[tuple[str, str], list[int]] = defaultdict(list)
    for job, view in views:
        acts = view["actions"].values()
        settled = [a["settled_ms"] for a in acts if a["settled_ms"] is not None]
        if settled:   # times are the server's epoch ms
            report.job_ms.setdefault(job.recipe, []).append(max(settled) - view["started_ms"])
        for step in {a["step"] for a in acts}:
            mine = [a for a in acts if a["step"] == step]
            since = [a["since_ms"] for a in mine if a["since_ms"] is not None]
            done = [a["settled_ms"] for a in mine if a["settled_ms"] is not None]
            if since and done:
                per_step[job.recipe, step].append(max(done) - min(since))
                rounds[job.recipe, step].append(view["step_rounds"].get(step, 1))
    for recipe, wm in work_masters.items():
        for s in wm["data"]["Steps"]:
            times = per_step.get((recipe, s["Name"]))
            if times:
                report.steps.append(StepRow(recipe, s["Name"], len(times),
                                            statistics.fmean(times), _p(times, 0.9),
                                            statistics.fmean(rounds[recipe, s["Name"]])))
    return report


async def _states(redis_url: str, jobs: list[Job]) -> list[tuple[Job, dict[str, Any]]]:
    """(job, state_to_json view) of each job whose state and recipe are in Redis."""
    client = aioredis.Redis.from_url(redis_url)
    graphs: dict[tuple[str, bytes], Graph | None] = {}
    out = []
    try:
        pipe = client.pipeline(transaction=False)
        for j in jobs:
            pipe.hgetall(ScopeKeys(j.scope).job(j.id))    # the archive fields too
        rows = await pipe.execute()
        for j, h in zip(jobs, rows, strict=True):
            state, fp = whole_state(h), h.get(b"g")
            if not state or not fp:
                continue
            key = (j.scope, fp)
            if key not in graphs:
                raw = await client.get(ScopeKeys(j.scope).graph(fp.decode()))
                graphs[key] = Graph.from_bytes(raw) if raw else None
            g = graphs[key]
            if g is None:
                continue
            try:
                out.append((j, state_to_json(g, state)))
            except StateFormatError:
                continue
    finally:
        await client.aclose()
    return out


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def render(r: Report) -> str:
    ended = r.submitted - r.unfinished
    n_aborted = sum(r.aborted.values())
    lines = [f"Jobs: {r.submitted} submitted, {ended} ended: {r.completed} completed, "
             f"{n_aborted} aborted" + (f", {r.unfinished} NOT ENDED" if r.unfinished else "")]
    for reason, n in r.aborted.most_common():
        lines.append(f"  aborted {n:>4} x {reason}")
    for reason, n in r.not_accepted.most_common():
        lines.append(f"  not accepted {n} x {reason}")
    lines.append(f"Throughput: {ended / r.elapsed_s:,.1f} jobs/s ({ended} jobs in "
                 f"{r.elapsed_s:.2f} s)")
    if len(r.per_host) > 1:
        lines.append(f"Shared by {len(r.per_host)} hosts: equipment answers received "
                     + " / ".join(f"{n:,}" for n in r.per_host))
    if r.paused:
        # the stations count their holds; PackML units (--equipment opcua) are not asked
        held = (f"; the equipment held {r.held} commands and restarted {r.restarted}"
                if r.held or r.restarted else "")
        lines.append(f"MES Pause/Resume: {r.paused} jobs paused and resumed{held}")
    h = r.host_latency
    if h is not None and h.count:
        q = {p: _ms(h.quantile(p / 100) * 1000) for p in (50, 90, 99)}
        lines.append(f"Answer-to-command latency in the host (answer in, next command out): "
                     f"p50 {q[50]} ms, p90 {q[90]} ms, p99 {q[99]} ms over {h.count:,} "
                     "answers")
        lines.append("  (estimated within the histogram's buckets: ..., 5, 10, 25 ms)")
    if r.station_latency_ms:
        s = r.station_latency_ms
        lines.append(f"At the station (answer sent, next command received): "
                     f"p50 {_ms(_p(s, 0.5))} ms, p90 {_ms(_p(s, 0.9))} ms, "
                     f"p99 {_ms(_p(s, 0.99))} ms")
    lines.append("")
    lines.append("Mean time per step, completed jobs (from the state documents):")
    head = f"{'recipe':<20} {'step':<14} {'jobs':>5} {'mean ms':>9} {'p90 ms':>9} {'rounds':>7}"
    lines.append(head)
    lines.append("-" * len(head))
    for recipe in dict.fromkeys(row.recipe for row in r.steps):
        for row in (row for row in r.steps if row.recipe == recipe):
            lines.append(f"{recipe:<20} {row.step:<14} {row.jobs:>5} {_ms(row.mean_ms):>9} "
                         f"{_ms(row.p90_ms):>9} {row.rounds:>7.2f}")
        times = r.job_ms.get(recipe, [])
        if times:
            lines.append(f"{recipe:<20} {'(whole job)':<14} {len(times):>5} "
                         f"{_ms(statistics.fmean(times)):>9} {_ms(_p(times, 0.9)):>9}")
    return "\n".join(lines)
