"""Writes docs/benchmarks-report.md and the plots in docs/img/ from report.py's results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # files only, no display
import matplotlib.pyplot as plt

GOALS = {"redis_fraction": 0.5, "flat": 1.5, "bytes_per_job": 1024, "sweep_s": 1.0,
         "shift_s": 5.0, "p99_ms": 5.0, "recipe_flat": 3.0, "compile_chain_s": 0.002}

# Reading of the profile and the curves, written after the run named in the heading;
# the tables above each are regenerated, this text is not.
NOTES_PATH = Path(__file__).with_name("report_notes.md")


def n(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}"


def dur(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def mib(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**20:,.0f} MiB"


def met(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


class Doc:
    def __init__(self, img: Path) -> None:
        self.lines: list[str] = []
        self.img = img
        img.mkdir(parents=True, exist_ok=True)

    def __call__(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, head: list[str], rows: list[list[str]], align: str | None = None) -> None:
        self.lines.append("| " + " | ".join(head) + " |")
        self.lines.append("|" + "|".join("---" if (align and align[i] == "l") else "---:"
                                         for i in range(len(head))) + "|")
        self.lines.extend("| " + " | ".join(r) + " |" for r in rows)
        self.lines.append("")

    def plot(self, name: str, fig: Any, alt: str) -> None:
        fig.tight_layout()
        fig.savefig(self.img / name, dpi=110)
        plt.close(fig)
        self.lines += [f"![{alt}](img/{name})", ""]


# ---------------------------------------------------------------- goals


def goals(R: dict[str, Any]) -> list[list[str]]:
    rows = []
    lim = R.get("limits") or {}
    red = lim.get("redis") or {}
    host = lim.get("host") or {}
    if red and host:
        # the equivalent script: a completion's whole Redis work (older runs: one record's)
        whole = "completion_plain" in red
        key = "completion" if whole else "evalsha"
        limit = max(red.get(f"{key}_pipelined", 0), red.get(f"{key}_plain", 0))
        f = host["rate"] / limit if limit else None
        rec = max(red.get("evalsha_pipelined", 0), red.get("evalsha_plain", 0))
        also = (f"; {100 * host['rate'] / rec:.0f} % of {n(rec)}/s for one record's "
                "writes alone") if whole and rec else ""
        rows.append(["host throughput ≥ 50 % of the Redis limit for the equivalent script",
                     f"{n(host['rate'])} completions/s = {100 * f:.0f} % of {n(limit)} "
                     f"{'completion scripts' if whole else 'EVALSHA'}/s{also}" if f else "—",
                     met(f >= GOALS["redis_fraction"] if f else None)])
    cost = R.get("cost") or {}
    act = cost.get("active") or []
    if len(act) >= 2 and act[0].get("action_s") and act[-1].get("action_s"):
        worst = max(a["action_s"] for a in act) / act[0]["action_s"]
        rows.append([f"per-action cost flat within 1.5× from {n(act[0]['jobs'])} to "
                     f"{n(act[-1]['jobs'])} active jobs",
                     f"{dur(act[0]['action_s'])} → {dur(act[-1]['action_s'])} "
                     f"(worst {worst:.2f}×)", met(worst <= GOALS["flat"])])
    rows += _recipe_goals(cost.get("recipe") or [])
    if act:
        last = act[-1]
        b = last["redis_bytes_per_job"]
        rows.append([f"Redis memory ≤ 1 KB per active 10-action job ({n(last['jobs'])} jobs)",
                     f"{n(b)} B (INFO used_memory); hash {n(last['usage_hash'])} B + "
                     f"indexes {n(last['usage_indexes'])} B (MEMORY USAGE)",
                     met(b <= GOALS["bytes_per_job"])])
        if "sweep_due_s" in last:
            rows.append([f"sweep of {n(last['sweep_due_jobs'])} deadlines ≤ 1 s",
                         f"{dur(last['sweep_due_s'])} through Redis (sweep scripts, all due); "
                         f"core `DeadlineIndex` {dur(last['core_pop_due_s'])}",
                         met(last["sweep_due_s"] <= GOALS["sweep_s"])])
        if "shift_catch_up_us" in last:
            rows.append([f"outage shift of {n(last['shift_jobs'])} jobs ≤ 5 s",
                         f"{dur(last['shift_total_s'])} (one sweep: the scopes' offsets; "
                         f"then {last['shift_catch_up_us']:.2f} µs a job at its next read)",
                         met(last["shift_total_s"] <= GOALS["shift_s"])])
    e2e = R.get("e2e") or {}
    half = [c for c in e2e.get("curve", []) if abs(c["fraction"] - 0.5) < 1e-9]
    if half:
        c = half[0]
        rows.append(["p99 answer-to-command ≤ 5 ms at half of saturation",
                     f"p99 {c['p99_ms']:.2f} ms at {n(c['offered'])} jobs/s "
                     f"({n(5 * c['offered'])} actions/s)",
                     met(c["p99_ms"] <= GOALS["p99_ms"])])
        pp = e2e.get("pingpong")
        if pp:
            rows.append(["p99 answer-to-command at half of saturation ≤ 2× the broker's "
                         "own p99 (QoS 1 ping-pong, same rate)",
                         f"{c['p99_ms']:.2f} ms against {pp['p99_ms']:.2f} ms = "
                         f"{c['p99_ms'] / pp['p99_ms']:.2f}×" + _floor_note(e2e, pp),
                         met(c["p99_ms"] <= 2 * pp["p99_ms"])])
    return rows


def _floor_note(e2e: dict[str, Any], pp: dict[str, Any]) -> str:
    fl = e2e.get("floor")
    if not fl:
        return ""
    return (f" (a relay with none of the host's work, `mqtt_floor.py`: "
            f"{fl['p99_ms']:.2f} ms = {fl['p99_ms'] / pp['p99_ms']:.2f}×)")


def _recipe_goals(rec: list[dict[str, Any]]) -> list[list[str]]:
    """Per-action cost flat in recipe size; compile of the chain."""
    rows = []
    by = {r["steps"]: r for r in rec}
    if 10 in by and 10_000 in by:
        f = by[10_000]["evolve_s"] / by[10]["evolve_s"]
        rows.append(["evolve of one completion at 10,000 steps within 3× of 10 steps",
                     f"{dur(by[10]['evolve_s'])} → {dur(by[10_000]['evolve_s'])} "
                     f"({f:.2f}×)", met(f <= GOALS["recipe_flat"])])
    if 1000 in by:
        c = by[1000]["compile_s"]
        rows.append(["compile of a 1,000-step chain, a condition on every transition ≤ 2 ms",
                     dur(c), met(c <= GOALS["compile_chain_s"])])
    return rows


# ---------------------------------------------------------------- sections


def ratios(d: Doc, R: dict[str, Any]) -> None:
    r = R.get("ratios")
    if not r:
        return
    paired = all("ratio" in c for c in r["core"])    # results saved before had no ratio
    d("## 1. Against the baselines", "",
      "The compiled core (`sfc_fast.evolve`) against `benchmarks/py_evolve.py`, the same "
      "rules in plain Python with a JSON state document (evolve_ratio.py's 6-step recipe; "
      "one completion = the same completion evolved over and over, the new command's id "
      "read as every caller does, the two sides in turns and the ratio "
      + ("the median of the rounds' own" if paired else "that of the medians")
      + "; whole runs = start and complete every job's six actions, driver loop "
      "included):", "")
    d.table(["workload", "compiled core", "plain Python", "ratio"],
            [[c["workload"], f"{n(c['core'])}/s", f"{n(c['py'])}/s",
              f"{c.get('ratio', c['core'] / c['py']):.1f}×"] for c in r["core"]], "lrrr")
    ms = [m for m in r["machines"] if m.get("rate")]
    ours = ms[0]["rate"] if ms else None
    d("The ISA-95 job order machine (machines_ratio.py: the 7-transition cycle Store … "
      "Clear) against `transitions` and `python-statemachine`:", "")
    d.table(["contender", "transitions/s", "ours is"],
            [[m["contender"], n(m["rate"]), f"{ours / m['rate']:,.0f}×" if ours else "—"]
             for m in ms], "lrr")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [c["workload"].replace(", ", "\n") for c in r["core"]]
    x = range(len(labels))
    ax[0].bar([i - 0.2 for i in x], [c["core"] for c in r["core"]], 0.4, label="compiled core")
    ax[0].bar([i + 0.2 for i in x], [c["py"] for c in r["core"]], 0.4, label="plain Python")
    ax[0].set_xticks(list(x), labels, fontsize=7)
    ax[0].set_yscale("log")
    ax[0].set_ylabel("completions/s")
    ax[0].legend(fontsize=7)
    ax[0].set_title("evolve: core vs plain Python", fontsize=9)
    ax[1].barh([m["contender"] for m in ms][::-1], [m["rate"] for m in ms][::-1])
    ax[1].set_xscale("log")
    ax[1].tick_params(axis="y", labelsize=6)
    ax[1].set_xlabel("transitions/s")
    ax[1].set_title("job order machine", fontsize=9)
    d.plot("report-ratios.png", fig, "core and machine ratios")


def limits(d: Doc, R: dict[str, Any]) -> None:
    lim = R.get("limits")
    e2e = R.get("e2e") or {}
    if not lim:
        return
    red, host, rpy = lim["redis"], lim["host"], lim["redis_py"]
    whole = "completion_plain" in red
    d("## 2. The limits of this machine, and the host against them", "",
      f"`redis-benchmark` against the redis-server the host uses next ({red['clients']} "
      f"clients, {n(red['requests'])} requests a test, random keys over 100,000). Two "
      "scripts: *one record's writes* is shaped like one job's record in the host's "
      "compare-and-set (HGET the version, compare, HSET state and version, ZADD the due "
      "index, SADD the active set, XADD a work entry, trimmed); *a completion* is the "
      "whole Redis work of one completion as the host's two scripts do it for one job "
      "(`report_limits.COMPLETION_LIKE`: the scope's offset, the version, state, due "
      "index, the dispatch entry, the action's markers, the XREADGROUP that delivers the "
      "entry, then the sent marker and the XACK), in one call. The second is the "
      "equivalent script of the goal.", "")
    rows = [["SET", n(red["set_plain"]), n(red["set_pipelined"])],
            ["GET", n(red["get_plain"]), n(red["get_pipelined"])],
            ["EVALSHA (one record's writes)", n(red["evalsha_plain"]),
             n(red["evalsha_pipelined"])]]
    if whole:
        rows.append(["EVALSHA (a completion)", n(red["completion_plain"]),
                     n(red["completion_pipelined"])])
    d.table(["command", "one per round trip", f"pipelined {red['pipeline']} deep"], rows,
            "lrr")
    key = "completion" if whole else "evalsha"
    limit = max(red[f"{key}_plain"], red[f"{key}_pipelined"])
    rec = max(red["evalsha_plain"], red["evalsha_pipelined"])
    d(f"The host on the same server (host_throughput.py's case: 1,000 jobs over 10 scopes, "
      f"in-process station answering at once, every completion's whole path): "
      f"**{n(host['rate'])} completions/s = {100 * host['rate'] / limit:.0f} % of the "
      f"{'completion' if whole else 'script'} limit** ({n(limit)}/s), "
      f"{100 * host['rate'] / red[f'{key}_plain']:.0f} % of its unpipelined rate, "
      f"{100 * host['rate'] / rec:.0f} % of one record's writes ({n(rec)}/s); "
      f"{host['server_commands']:.1f} commands run inside Redis per completion, "
      f"{host['round_trips']:.3f} round trips. The same script through redis-py in this "
      f"process: {n(rpy['one_by_one'])}/s awaited one by one, {n(rpy['pipelined'])}/s in "
      "pipelines of 64. The host packs many jobs into one script call, so its Redis cost "
      "per completion is below one script call's; redis-benchmark's limit is what a "
      "single-threaded Redis does with one record per call.", "")
    mq = e2e.get("mqtt")
    if mq:
        sat = e2e.get("saturation") or 0
        msgs = sat * 5 * 2
        d(f"MQTT through the same mosquitto as the end-to-end run, no host in between (one "
          f"publisher and one subscriber process, QoS 1, a host command's shape: 5 user "
          f"properties, 200-byte payload, 1,000 unacked at once): **{n(mq['delivered_per_s'])} "
          f"messages/s** delivered ({n(mq['messages'])} messages). The host at saturation "
          f"moves {n(sat, 1)} jobs/s × 5 actions × 2 messages (command, answer) = "
          f"{n(msgs)} messages/s, **{100 * msgs / mq['delivered_per_s']:.1f} %** of the "
          "broker's rate (MES status messages not counted).", "")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = [("SET", red["set_plain"], 0), ("SET ×16", red["set_pipelined"], 0),
            ("record", red["evalsha_plain"], 0), ("record ×16", red["evalsha_pipelined"], 0)]
    if whole:
        bars += [("completion", red["completion_plain"], 0),
                 ("completion\n×16", red["completion_pipelined"], 0)]
    bars.append(("host\ncompletions", host["rate"], 1))
    if mq:
        bars += [("MQTT msgs\n(broker)", mq["delivered_per_s"], 0),
                 ("MQTT msgs\n(host e2e)", (e2e.get("saturation") or 0) * 10, 1)]
    ax.bar([b[0] for b in bars], [b[1] for b in bars],
           color=["#c52" if b[2] else "#889" for b in bars])
    ax.set_yscale("log")
    ax.set_ylabel("per second")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title("limits of this machine (grey) and the host (red)", fontsize=9)
    d.plot("report-limits.png", fig, "limits and the host")


def e2e_part(d: Doc, R: dict[str, Any]) -> None:
    e = R.get("e2e")
    if not e:
        return
    d("## 3. End to end: throughput and latency against offered load", "",
      f"mqtt_e2e.py's setup (one host, redis-server, mosquitto and the station process on "
      f"this machine; 5-step recipe, one push action per step, binary CloudEvents; jobs "
      f"stored with `Orders.store_order`). Saturation: {n(e['saturation_jobs'])} jobs "
      f"stored at once → **{n(e['saturation'], 1)} jobs/s** "
      f"({n(5 * e['saturation'])} actions/s; this process, the host, used "
      f"{e.get('saturation_cpu', 0):.2f} of a core meanwhile). Then each offered rate for "
      "a few seconds, every job stored at its scheduled time as its own task; latency = the host's "
      "answer-to-command samples (an answer arriving to the job's next command queued for "
      "the broker), all of them, exact quantiles.", "")
    d.table(["offered (share of saturation)", "offered jobs/s", "achieved jobs/s", "jobs",
             "p50", "p99", "p99.9"],
            [[f"{c['fraction']:.0%}", n(c["offered"], 1), n(c["achieved"], 1), n(c["jobs"]),
              f"{c['p50_ms']:.2f} ms", f"{c['p99_ms']:.2f} ms", f"{c['p999_ms']:.2f} ms"]
             for c in e["curve"]])
    pp = e.get("pingpong")
    if pp:
        d(f"The broker's own latency at half of saturation's message rate (a plain MQTT 5 "
          f"QoS 1 ping-pong through the same mosquitto, `mqtt_pingpong_proc.py`, once "
          f"the host is closed, {n(pp['rate'])} round trips/s): p50 {pp['p50_ms']:.2f} ms, p99 "
          f"{pp['p99_ms']:.2f} ms, p99.9 {pp['p999_ms']:.2f} ms.", "")
    fl = e.get("floor")
    if fl:
        d(f"The floor at the same rate: a relay with none of the host's work "
          f"(`mqtt_floor.py`: one process, plain sockets, one compare-and-set script an "
          f"answer before the job's next command, through the same broker, station and "
          f"Redis, the host closed), {n(fl['rate'])} actions/s: p50 {fl['p50_ms']:.2f} ms, "
          f"p99 {fl['p99_ms']:.2f} ms, p99.9 {fl['p999_ms']:.2f} ms, using "
          f"{fl['core']:.0%} of a core.", "")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    off = [c["offered"] for c in e["curve"]]
    ax[0].plot(off, [c["achieved"] for c in e["curve"]], "o-", label="achieved")
    ax[0].plot(off, off, ":", color="grey", label="offered")
    ax[0].axhline(e["saturation"], color="#c52", ls="--", label="saturation (burst)")
    ax[0].set_xlabel("offered jobs/s")
    ax[0].set_ylabel("jobs/s")
    ax[0].legend(fontsize=7)
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        ax[1].plot(off, [c[key] for c in e["curve"]], "o-", label=label)
    ax[1].axhline(5, color="grey", ls=":", label="goal p99 ≤ 5 ms")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("offered jobs/s")
    ax[1].set_ylabel("answer → command, ms")
    ax[1].legend(fontsize=7)
    d.plot("report-e2e.png", fig, "end-to-end throughput and latency against offered load")
    p = e.get("profile")
    if p:
        d("### Profile at saturation", "",
          f"cProfile of this process (host, MQTT link, MES side) while {n(p['jobs'])} jobs "
          f"run at once ({n(p['rate'], 1)} jobs/s under the profiler; the station, broker "
          "and Redis are other processes). Own time by package:", "")
        d.table(["package", "share of own time"],
                [[g, f"{100 * s:.1f} %"] for g, s in p["groups"]], "lr")
        d("Top functions by own time:", "", p["table"], "")
        if p.get("counts"):
            d(f"Counts in the profiled run ({n(p['jobs'])} jobs = {n(5 * p['jobs'])} "
              "commands and as many answers):", "")
            d.table(["what", "count", "per action"],
                    [[k, n(v), f"{v / (5 * p['jobs']):.2f}"]
                     for k, v in sorted(p["counts"].items())], "lrr")
        if p.get("cumulative"):
            d("The host's own functions by cumulative time (callees included; nested calls "
              "count in each caller):", "", p["cumulative"], "")


def cost(d: Doc, R: dict[str, Any]) -> None:
    c = R.get("cost")
    if not c:
        return
    act = c["active"]
    d("## 4. Cost as the work grows", "", "### Active jobs", "",
      "Per size, in a process of its own: one host on a flushed redis-server, 10 scopes. "
      "The idle jobs (a 10-step recipe, one push action per step, each job at step 5 "
      "with five results stored and its command out and marked sent) are **written in "
      "bulk through the host's store** (`Store.commit`, the compare-and-set script the "
      "settler uses, 4,000 records a call, then `Store.write_markers`), not started "
      "through orders and the work stream: a million starts through the full path take "
      "minutes here. Then 1,000 more jobs loop over two push actions in the same scopes "
      "(answered at once): per-action time = 1 / completions per second of one host. "
      "Memory: `INFO used_memory` growth over the fill ÷ jobs, and `MEMORY USAGE` of 200 "
      "sampled job hashes plus the job's share of the due index and active set.", "")
    d.table(["active jobs", "fill", "completions/s", "per action", "Redis B/job (INFO)",
             "job hash (MEMORY USAGE)", "indexes/job", "host RSS"],
            [[n(a["jobs"]), dur(a["fill_s"]), n(a["rate"]), dur(a["action_s"]),
              n(a["redis_bytes_per_job"]), n(a["usage_hash"]), n(a["usage_indexes"], 1),
              mib(a["rss_running"])] for a in act])
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    xs = [a["jobs"] for a in act]
    ax[0].plot(xs, [a["action_s"] * 1e6 for a in act], "o-")
    ax[0].set_xscale("log")
    ax[0].set_ylim(bottom=0)
    ax[0].set_xlabel("active jobs")
    ax[0].set_ylabel("µs per action (one host)")
    ax[1].plot(xs, [a["redis_bytes_per_job"] for a in act], "o-", label="INFO used_memory")
    ax[1].plot(xs, [a["usage_hash"] + a["usage_indexes"] for a in act], "s--",
               label="MEMORY USAGE")
    ax[1].axhline(1024, color="grey", ls=":", label="goal ≤ 1 KB")
    ax[1].set_xscale("log")
    ax[1].set_ylim(bottom=0)
    ax[1].set_xlabel("active jobs")
    ax[1].set_ylabel("Redis bytes per job")
    ax[1].legend(fontsize=7)
    d.plot("report-active.png", fig, "per-action time and memory against active jobs")
    last = act[-1]
    if "shift_catch_up_us" in last:   # older runs shifted job by job: not shown
        d(f"### Sweep and outage shift ({n(last['jobs'])} jobs)", "",
          f"- one sweep of the 10 scopes holding {n(last['jobs'])} deadlines, none due: "
          f"{dur(last['sweep_none_due_s'])};",
          f"- {n(last['sweep_due_jobs'])} due deadlines over 10 scopes of their own, swept "
          f"back to back with `sweep_limit` {n(last.get('sweep_due_limit'))} (each script "
          f"pops at most that many of a scope and queues tick entries of 32 jobs) until all "
          f"were popped: **{dur(last['sweep_due_s'])}** in {last.get('sweep_due_passes')} "
          f"passes; the core's in-memory `DeadlineIndex` (the embedded `Runner`'s) pops as "
          f"many in **{dur(last['core_pop_due_s'])}**;",
          f"- outage shift: every heartbeat set {last['shift_gap_ms'] / 3.6e6:.1f} h old; the "
          f"sweep that sees it adds the gap to each scope's offset, which moves the "
          f"deadlines of all {n(last['shift_jobs'])} jobs (the working set included) at "
          f"once: **{dur(last['shift_total_s'])}** (a probed job's deadline moved by "
          f"{n(last['shift_moved_ms'])} ms; nothing queued per job: drained "
          f"{last['shift_drained']}); each state takes the gap when it is next read: the "
          f"core's Shift of a stored state costs {last['shift_catch_up_us']:.2f} µs a job, "
          f"and reading {n(last['shift_sample'])} idle jobs took "
          f"{dur(last['shift_read_before_s'])} before the outage and "
          f"{dur(last['shift_read_after_s'])} after it (with the catch-up);",
          f"- host RSS: {mib(last['rss_start'])} at start, {mib(last['rss_filled'])} after the "
          f"fill, {mib(last['rss_running'])} running, {mib(last['rss_after_shift'])} after the "
          "shift (its state cache holds at most `state_cache_size` = 100,000 jobs).", "")
    rec = c.get("recipe") or []
    if rec:
        d("### Recipe size", "",
          "A chain of N steps, one push action each (with parameters), a condition on every "
          "transition: compile time (`compile_recipe` from a dict, median) and one "
          "completion evolved at the middle step (median of 5 rounds): as the host does "
          "(`evolve_live` on the live part, the archive kept apart) and on the whole "
          "document (`evolve`, the archive copied along).", "")
        d.table(["steps", "compile", "per action (evolve)", "whole document", "graph bytes",
                 "state bytes (live)", "whole"],
                [[n(r["steps"]), dur(r["compile_s"]), dur(r["evolve_s"]),
                  dur(r.get("evolve_whole_s")), n(r["graph_bytes"]), n(r["state_bytes"]),
                  n(r.get("state_whole_bytes"))] for r in rec])
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = [r["steps"] for r in rec]
        ax.plot(xs, [r["compile_s"] * 1e3 for r in rec], "o-", label="compile (ms)")
        ax.plot(xs, [r["evolve_s"] * 1e6 for r in rec], "s-", label="evolve per action (µs)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("recipe steps")
        ax.legend(fontsize=7)
        d.plot("report-recipe.png", fig, "compile and evolve time against recipe size")
    sc = c.get("scopes") or []
    if sc:
        d("### Scopes", "",
          "host_throughput.py's case with max(1,000, scopes) jobs spread over the scopes "
          "(one host, in-process station):", "")
        d.table(["scopes", "jobs", "completions/s", "client commands/completion",
                 "commands in Redis/completion", "Redis B/job"],
                [[n(s["scopes"]), n(s["jobs"]), n(s["rate"]), f"{s['commands']:.3f}",
                  f"{s['server_commands']:.2f}", n(s["mem_per_job"])] for s in sc])
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([s["scopes"] for s in sc], [s["rate"] for s in sc], "o-")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("scopes")
        ax.set_ylabel("completions/s (one host)")
        d.plot("report-scopes.png", fig, "throughput against scopes")


def scale(d: Doc, R: dict[str, Any]) -> None:
    s = R.get("scale")
    if not s:
        return
    d("## 5. Several hosts, Redis Cluster", "",
      "Host processes (`benchmarks/scale_proc.py`, each with 1,000 looping jobs of its own "
      "over 12 shared scopes and an in-process station) on one redis-server and on a "
      "3-shard Redis Cluster, all on this machine. CPU is cores in use over the measured "
      "window. The model and its limits: [scale.md](scale.md).", "")
    rows = []
    for kind in ("single", "cluster"):
        for c in s[kind]:
            rows.append(["3-shard cluster" if c["cluster"] else "one Redis", str(c["hosts"]),
                         n(c["rate"]), " / ".join(n(x) for x in c["per_host"]),
                         f"{c['host_cpu']:.2f}", f"{c['redis_cpu']:.2f}",
                         dur(c["host_cpu"] / c["rate"]) if c["rate"] else "—",
                         dur(c["redis_cpu"] / c["rate"]) if c["rate"] else "—"])
    d.table(["Redis", "hosts", "completions/s", "per host", "hosts' CPU (cores)",
             "Redis CPU (cores)", "host CPU/completion", "Redis CPU/completion"], rows,
            "lrrrrrrr")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for kind, label in (("single", "one Redis"), ("cluster", "3-shard cluster")):
        ax.plot([c["hosts"] for c in s[kind]], [c["rate"] for c in s[kind]], "o-", label=label)
    ax.set_xticks([1, 2, 3])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("host processes (2 cores in all)")
    ax.set_ylabel("completions/s")
    ax.legend(fontsize=7)
    d.plot("report-scale.png", fig, "throughput against host processes")


def render(R: dict[str, Any], out: Path, img: Path) -> None:
    d = Doc(img)
    mode = "quick (smoke run, small sizes)" if R.get("quick") else "full"
    d("# Benchmark report (generated)", "",
      "Written by `python benchmarks/report.py` — do not edit by hand; the hand-written "
      "notes are in [benchmarks.md](benchmarks.md). Every figure below comes from one run "
      "on one machine, the servers (redis-server, mosquitto) and stations on it too.", "",
      f"- run: {R['when']}, {mode}; Python {R['python']}, {R['cpus']} CPUs visible",
      f"- load before: `{R['uptime_before']}`",
      f"- load after: `{R['uptime_after']}`",
      *([f"- {R['note']}"] if R.get("note") else []),
      "- time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in R["seconds"].items()),
      "- the machine is shared with other work (test runs), so a figure can move by "
      "±20 % or more from one run to the next", "")
    if R.get("errors"):
        d("**Parts that failed in this run:** " + ", ".join(R["errors"]), "")
        for k, v in R["errors"].items():
            d(f"<details><summary>{k}</summary>", "", "```", v.strip(), "```", "</details>", "")
    rows = goals(R)
    if rows:
        d("## Goals", "")
        d.table(["goal", "measured", ""], rows, "llr")
    if NOTES_PATH.exists():
        d(NOTES_PATH.read_text().strip(), "")
    ratios(d, R)
    limits(d, R)
    e2e_part(d, R)
    cost(d, R)
    scale(d, R)
    out.write_text("\n".join(d.lines).rstrip() + "\n")


PART_SECTIONS = {"ratios": ratios, "limits": limits, "e2e": e2e_part, "cost": cost,
                 "scale": scale}


def update(R: dict[str, Any], out: Path, img: Path) -> list[str]:
    """Replace, in the report ``out`` already holds, the sections of the parts ``R``
    measured, each marked as from a later run; the rest stays as the full run wrote it.
    The parts replaced."""
    text = out.read_text()
    done = []
    for part, fn in PART_SECTIONS.items():
        if part not in R:
            continue
        d = Doc(img)
        fn(d, R)
        if not d.lines:
            continue
        head = d.lines[0]
        start = text.find(head + "\n")
        if start < 0:
            raise SystemExit(f"{out} has no section {head!r} to replace: run it whole")
        d.lines[2:2] = [f"*This section is from a later run than the rest of the report: "
                        f"{R['when']} (`report.py --only {part} --update`), load before "
                        f"`{R['uptime_before']}`, after `{R['uptime_after']}`.*", ""]
        nxt = text.find("\n## ", start + len(head))
        end = len(text) if nxt < 0 else nxt + 1
        text = text[:start] + "\n".join(d.lines).rstrip() + "\n\n" + text[end:].lstrip("\n")
        done.append(part)
    out.write_text(text.rstrip() + "\n")
    return done

