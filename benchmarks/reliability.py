"""Every fault scenario of ``tests/faults`` and the fuzz summary, in one table.

    python benchmarks/reliability.py                 # 20 kill -9 seeds, 4 of each other fault
    python benchmarks/reliability.py --seeds 5 --other-seeds 1 --fuzz-n 2000 --out -

Each fault run is a real load over real processes (``tests/faults/fault_harness.py``:
redis-server with AOF, mosquitto, the station, two ``sfc-host run`` hosts) with one
fault injected, then measured against a fault-free run: jobs lost, command ids lost,
ids a fault-free run would not send, ids received twice and whether inside the fault's
window, anything left pending. Then ``benchmarks/fuzz.py`` and, where atheris is
installed, ``benchmarks/fuzz_guided.py`` (``--fuzz-n`` inputs per decoder). Writes
``docs/reliability.md`` (``--out``; ``-`` prints it) and exits 1 if any run failed an
invariant or any decoder crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.paths import test_folders_on_path  # noqa: E402

test_folders_on_path()   # tests/faults and tests/mes (test_mes_crash's storm)

from fault_harness import (  # noqa: E402
    KILL_TAIL_S,
    RECONNECT_S,
    SCENARIOS,
    WINDOW_S,
    Outcome,
)
from test_mes_crash import N_ORDERS, storm_with_own_servers  # noqa: E402

RUN_TIMEOUT_S = 180
# run with --seeds, the others with --other-seeds
HOST_KILLS = ("kill9", "kill9_patient", "cluster_primary_kill9", "kill9_answers",
              "kill9_answers_aedes")
# What each scenario does to the load, for the table (the harness has the details).
WHAT = {
    "kill9": "`kill -9` of a host at a random point of 200 jobs (odd seeds: both "
             "original hosts, one after the other); the other takes over, a restarted "
             "host recovers and joins",
    "kill9_patient": "the same `kill -9` runs with a patient takeover: entries are "
                     "claimed after 2 s idle, above the station's 1 s answer repeat "
                     "(the row above: 0.3 s; production's default: 30 s)",
    "kill9_answers": "`kill -9` of a host (two hosts on even seeds, three on odd ones) "
                     "mid-load, with a station that answers each command once and at "
                     "once (no repeats) and no retries in the recipe: the answers the "
                     "dead host had taken are had again (its open commands sent again "
                     "by the host that takes over its end), so no job aborts or waits "
                     "past 5 s; any id at most twice",
    "kill9_answers_aedes": "the same on aedes (MQTT 3.1.1, no shared subscriptions: "
                           "`mqtt_shared_group = \"\"`, every host hears every answer)",
    "kill9_stalled_broker": "`kill -9` of a host while mosquitto is stalled (SIGSTOP 1 s: "
                            "commands wait for acknowledgements in the hosts' queues), "
                            "5 s action timeouts",
    "redis_restart": "redis-server (AOF `everysec`) stopped and started again mid-load, "
                     "down 0.5 s",
    "redis_kill9": "redis-server (AOF `everysec`) killed (`kill -9`) mid-load, started "
                   "again on the same port and data 0.5 s later",
    "redis_kill9_lost_second": "the same, and the AOF's last second cut before the "
                               "start (a machine crash: `everysec` fsyncs once a "
                               "second); losses of the jobs that second touched are "
                               "the known limit, any other fails",
    "redis_kill9_always": "redis-server with `appendfsync always` killed (`kill -9`) "
                          "mid-load, started again 0.5 s later",
    "broker_restart": "mosquitto stopped and started again mid-load, down 0.5 s",
    "sigstop_one": "one host stopped (SIGSTOP) for 4.5 s, past the 1.5 s outage "
                   "threshold, then continued",
    "sigstop_all": "both hosts stopped for 4.5 s with 3 s action timeouts (an outage: "
                   "deadlines must move by the gap), then continued",
    "clock_jump": "the hosts' wall clocks jump mid-load (+1 h then -2 h; -30 min)",
    "pause_storm": "two MES clients race Pause/Resume requests over MQTT at 40 running "
                   "jobs on two hosts",
    "mqtt_poison": "a device publishes retained messages with invalid properties "
                   "(PayloadFormatIndicator 2, an empty or wildcard ResponseTopic) on the "
                   "hosts' event, answer and MES request topics mid-load, then a third "
                   "host starts and gets them at its subscribe: each is dropped, no host "
                   "reconnects",
    "broker_hang": "mosquitto frozen (SIGSTOP) mid-load for 4 s, twice the hosts' 2 s "
                   "keep alive, its TCP links left open: each host must find it gone "
                   "within 1.5 x the keep alive while it publishes",
    "acl_refused": "a third host started mid-load with a user whose ACL keeps it from the "
                   "MES topics (mosquitto grants the subscriptions and delivers nothing): "
                   "it must stop with one line naming its ACL, not serve deaf",
    "cluster_primary_kill9": "Redis Cluster (3 primaries, a replica each, node timeout "
                             "0.5 s): `kill -9` of the primary serving the scope's slot "
                             "mid-load; its replica is promoted, the killed node started "
                             "again joins as a replica",
    "cluster_reshard": "Redis Cluster: the scope's slot migrated to another primary "
                       "mid-load, four keys at a time, as `redis-cli --cluster reshard` "
                       "does (the hosts meet TRYAGAIN, ASK, then MOVED)",
    "mes_kill9": "`kill -9` of `sfc-host run` under a storm of 200 MES StoreAndStart "
                 "requests (20 in flight, each order ending at once), after a reply "
                 "count drawn from the seed and 0.3 s of Redis holding writes, then "
                 "started again; the MES sends what got no reply again with the same "
                 "id: every request the host had acknowledged was stored, every ended "
                 "order has its retained result",
}


async def mes_kill9(seed: int) -> Outcome:
    """``tests/mes/test_mes_crash.py``'s storm as a row: an order lost is one not answered,
    not ended, stored twice, or without its retained result, final retained state or
    end event."""
    logging.getLogger("mqtt").setLevel(logging.ERROR)    # the MES client's queue notes
    run = await storm_with_own_servers(seed)
    out = Outcome("kill -9 under an MES request storm", seed, jobs=N_ORDERS, faults=1,
                  jobs_lost=len(run.lost), seconds=run.seconds,
                  notes={"requests": run.requests, "repeats": run.repeats,
                         "acknowledged at the kill": run.acked_at_kill})
    if not run.ok:
        out.problems.append(run.summary())
    return out


# the fault harness's scenarios, then the rows that bring their own processes
RUNS: dict[str, Callable[[int], Awaitable[Outcome]]] = {**SCENARIOS, "mes_kill9": mes_kill9}


@dataclass
class Row:
    name: str
    runs: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self, attr: str) -> int:
        return sum(int(getattr(o, attr)) for o in self.runs)


def run_one(name: str, seed: int) -> Outcome | str:
    try:
        return asyncio.run(asyncio.wait_for(RUNS[name](seed), RUN_TIMEOUT_S))
    except Exception as e:          # a run that could not finish is a failed run
        return f"{name} seed {seed}: {type(e).__name__}: {e}"


def fuzz(n: int, script_name: str = "fuzz.py") -> list[dict[str, Any]] | None:
    """The JSON lines of a fuzzer in benchmarks/ (fuzz.py, or fuzz_guided.py: none
    when atheris is not installed)."""
    script = ROOT / "benchmarks" / script_name
    if not script.exists():
        return None
    p = subprocess.run([sys.executable, str(script), "-n", str(n), "--json"],
                       capture_output=True, text=True, timeout=3600)
    rows = []
    for line in p.stdout.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def render(rows: list[Row], fuzzed: list[dict[str, Any]] | None, args: argparse.Namespace,
           seconds: float, guided: list[dict[str, Any]] | None = None) -> str:
    cpu = os.cpu_count()
    out = [
        "# Reliability: faults survived, bad inputs tried",
        "",
        f"Produced by `python benchmarks/reliability.py --seeds {args.seeds} "
        f"--other-seeds {args.other_seeds} --fuzz-n {args.fuzz_n}"
        f"{f' --only {args.only}' if args.only else ''}` "
        f"({time.strftime('%Y-%m-%d', time.gmtime())}, Python {platform.python_version()}, "
        f"{cpu} CPUs, {seconds / 60:.1f} min). Do not edit by hand: run it again.",
        "",
        "## Faults",
        "",
        "Every run is real processes: redis-server (AOF `everysec`), mosquitto "
        "(persistent), a station process that logs every command id it receives with "
        "its time and answers at least once (it repeats the answer to a job's latest "
        "command every second until the job moves on), and two `sfc-host run` hosts "
        "sharing one scope (the Redis Cluster rows: three primaries with a replica "
        "each instead of the one redis-server). The load is `tighten_rework` jobs "
        "(3, 5 or 7 push commands each, decided by the job id), stored while the "
        "fault happens. After the fault the run waits for every job to end and the "
        "work stream to drain, then compares with what a fault-free run does "
        "([tests/faults](../tests/faults/fault_harness.py)):",
        "",
        "- **jobs lost**: not `Ended_Completed`, or a job response of another shape "
        "(every job has the same response fields, `tighten.torque` 85);",
        "- **commands lost**: an id of the job's expected sequence the station never "
        "received; **unexpected**: an id a fault-free run would not send (a timeout's "
        "retry, an abort);",
        "- **duplicates**: ids received more than once; *in window* when the first copy "
        f"arrived at most {WINDOW_S:g} s before the fault began or while it lasted (the "
        "documented window between a command being sent and its sent marker, or a "
        "QoS 1 message sent again after a reconnect: for a restart, until "
        f"{RECONNECT_S:g} s after the server is back, the hosts' reconnect backoff; for "
        f"a `kill -9`, until {KILL_TAIL_S:g} s after it, since the broker still reads "
        "and forwards what the dead host wrote to its socket, and any command still open "
        "at the kill, since the host that takes the death over sends each again: its "
        "answer may have died with the host: one copy more per kill) and the id came exactly "
        "twice (four times for a broker restart or freeze: each QoS 1 hop it cuts, host to "
        "broker and broker to station, may deliver once more, and the other host sends it "
        "too when it takes the entry over while the first waits for the broker's PUBACK);",
        "- **left**: work entries pending or dead, jobs still on the due index or the "
        "active set.",
        "",
        "| fault | runs | faults injected | jobs | commands received | jobs lost | "
        "commands lost | unexpected | duplicates (in window) | left | outcome |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = not r.errors and all(o.ok for o in r.runs)
        outcome = "**FAIL**" if not ok else \
            "known limit" if any(o.limit for o in r.runs) else "pass"
        dups = r.total("duplicates")
        inside = r.total("dups_in_window")
        cmds = sum(int(o.notes.get("commands", 0)) for o in r.runs)
        out.append(
            f"| {WHAT[r.name]} | {len(r.runs) + len(r.errors)} | {r.total('faults')} | "
            f"{r.total('jobs')} | {cmds} | {r.total('jobs_lost')} | "
            f"{r.total('commands_lost')} | {r.total('unexpected')} | {dups} ({inside}) | "
            f"{r.total('left')} | {outcome} |")
    worst = max(((o.duplicates / max(1, o.faults), o) for r in rows for o in r.runs
                 if r.name != "pause_storm" and not o.limit),
                default=None, key=lambda x: x[0])
    out += ["", "Notes:", ""]
    if worst is not None and worst[0] > 0:
        o = worst[1]
        why = ("A killed host's commands that were sent and still waited for the "
               "broker's PUBACK have no sent marker yet, so the host that takes the "
               "entries over sends them again: every command of the batch in flight at "
               "the kill can come twice, always with the same id."
               if "kill -9 of a host" in o.fault else
               "QoS 1 messages not acknowledged when a connection ended go out again "
               "once it is back (MQTT's own at-least-once, the same id), and commands "
               "whose sent marker could not be written meanwhile are sent again by "
               "their entries.")
        out.append(f"- Most duplicates per fault: {worst[0]:g} ({o.fault}, seed {o.seed}: "
                   f"{o.duplicates} over {o.faults}). {why}")
    waits = [float(o.notes["longest wait s"]) for r in rows for o in r.runs
             if "longest wait s" in o.notes]
    if waits:
        out.append(f"- *Answers in flight at a kill*: the longest any job waited for its "
                   f"next command or its end, over {len(waits)} runs: {max(waits):g} s "
                   f"(median of the runs' longest {sorted(waits)[len(waits) // 2]:g} s); "
                   "a lost answer would show as the action's timeout (20 s and more).")
    by = {r.name: r for r in rows}
    if "kill9" in by and "kill9_patient" in by:
        fast, slow = by["kill9"], by["kill9_patient"]
        out.append(
            f"- *Takeover time against duplicates*: {fast.total('duplicates')} duplicates over "
            f"{fast.total('faults')} kills with entries taken over after 0.3 s idle, "
            f"{slow.total('duplicates')} over {slow.total('faults')} after 2 s. A kill's "
            "duplicates are its commands whose sent marker died with the host and whose "
            "answer did too (it reached the host before the marker was written, or was "
            "still on its way to it). A takeover sooner than the equipment repeats its "
            "answer sends such a command again; a later one finds it settled by the "
            "repeated answer. `claim_min_idle_ms` trades the one for the other; its "
            "default, 30 s, is above the answer time of most equipment.")
    if "mes_kill9" in by:
        out.append("- *kill -9 under an MES request storm* "
                   "([tests/mes/test_mes_crash.py](../tests/mes/test_mes_crash.py)): *jobs lost* "
                   "counts orders not answered, not ended, stored twice, acknowledged "
                   "by the killed host (its PUBACK, read by a relay between host and "
                   "broker) without being stored when it died, or that a "
                   "subscriber connecting after the run finds without their retained "
                   "result or final state (or the MES never saw their end event); the "
                   "notes count the requests, repeats included. The orders that ended in "
                   "the killed host's last 0.1 s are the ones at stake: their changes "
                   "wait in the scope's outbox, which the restarted host publishes again "
                   "([host.md](host.md#mes-state-at-least-once)).")
    out += ["- *Pause/Resume storm*: the faults column counts the requests. Accepted Pauses "
            "and Resumes of a job alternate, so after the storm a job with one Pause more "
            "than Resumes must be Interrupted with its recipe held, any other neither; then "
            "every Interrupted job is resumed and must complete. *Completed under a late "
            "Pause* counts jobs whose last step ended before the accepted Pause reached the "
            "recipe (checked: the job response's end at most 0.5 s after the Pause was "
            "accepted); their order goes Interrupted -> Ended_Completed.",
            "- *Wall clock*: the hosts run `sfc-host run` through `tests/faults/run_host.py`, "
            "which moves `time.time` in that process; job response times are checked to be "
            "the real (server) time.",
            "- `kill9` notes: entries pending on the killed host when it died (taken over by "
            "the other).", *redis_kill_notes(rows), *cluster_notes(rows), ""]
    out += ["Per run (seed: seconds, duplicates, notes):", ""]
    for r in rows:
        parts = []
        for o in r.runs:
            notes = {k: v for k, v in o.notes.items() if k != "commands"}
            extra = f", {notes}" if notes else ""
            parts.append(f"{o.seed}: {o.seconds:.1f} s, {o.duplicates} dup{extra}"
                         + ("" if o.ok else " **FAIL**"))
        parts += [f"**{e}**" for e in r.errors]
        out.append(f"- `{r.name}`: " + "; ".join(parts))
    failures = [o.summary() for r in rows for o in r.runs if not o.ok]
    if failures:
        out += ["", "Failed runs:", "", "```"]
        out += [f[:3000] for f in failures]
        out += ["```"]
    out += ["", "## Bad input", ""]
    if fuzzed is None:
        out.append("`benchmarks/fuzz.py` is not there: no fuzz summary.")
    else:
        out += [f"`python benchmarks/fuzz.py -n {args.fuzz_n}`: inputs per decoder, mostly "
                "mutations of valid ones. A crash is any exception but the decoder's one "
                "clear error. The full run (1,000,000 per decoder) is "
                "`python benchmarks/fuzz.py`.", "",
                "| decoder | inputs | accepted | refused with the clear error | crashes | "
                "slowest input |", "|---|---|---|---|---|---|"]
        for f in fuzzed:
            out.append(f"| {f['name']} | {f['inputs']:,} | {f['accepted']:,} | "
                       f"{f['refused']:,} | {f['crashes']} | "
                       f"{f['slowest_s'] * 1000:.2f} ms |")
    if guided:
        out += ["", f"`python benchmarks/fuzz_guided.py -n {args.fuzz_n}`: coverage-guided "
                "(atheris, libFuzzer), one process per decoder, seeded with the valid inputs. "
                "*python*: edges of the instrumented `sfc_host` decoder; *outcome*: the "
                "compiled decoders give no coverage, so kinds of refusal stand in for it. "
                "The full run (1,000,000 per decoder) is `python benchmarks/fuzz_guided.py`.",
                "", "| decoder | feedback | inputs | edges or kinds | corpus | crashes |",
                "|---|---|---|---|---|---|"]
        for g in guided:
            out.append(f"| {g['name']} | {g['feedback']} | {g['inputs']:,} | {g['edges']} | "
                       f"{g['corpus']} | {g['crashes']} |")
    out += ["", "Other bad input is covered by the test suite with the host running and "
            "counting it: malformed and oversized MQTT payloads, wrong scopes, unknown "
            "command ids, garbled stream entries, recipes that do not compile "
            "(`tests/equipment/test_mqtt_equipment.py`, `tests/mes/test_mes.py`, "
            "`tests/core/test_recipe_bad_input.py`, `tests/execution/test_host_rules.py`).", ""]
    out += ["## Found and fixed", "",
            "- **A decision written after an outage with a clock from before it** (found "
            "by *both hosts stopped*): a host frozen between reading a job (and the server "
            "time) and its compare-and-set wrote deadlines computed before the freeze, "
            "after the other host's outage sweep had moved every deadline on the index "
            "by the gap; the job was not on the index yet, so its action timed out at "
            "once and the job aborted. `cas.lua` now refuses a decision older than "
            "`outage_threshold_ms` and the host decides again on a fresh clock "
            "(`tests/faults/test_stale_clock_write.py`).",
            "- **A command lost with a kill -9** (found by *kill -9* seed 20, 1 run in 20, "
            "and every run of *kill -9 while the broker stalls*): the MQTT sink reported a "
            "command sent as soon as it was in the host's in-memory outgoing queue, so its "
            "sent marker was written and its entry acked while it could still wait for its "
            "turn (256 QoS 1 messages unacknowledged at once) or sit in the socket; the "
            "killed host took it along and the marker kept the other hosts from sending "
            "it: the action timed out (a retry with a new id, or an aborted job). The sink "
            "now waits for the broker's PUBACK (at most 2 s; a command not acknowledged "
            "by then gets no marker, so its entry is taken over or its deadline sends the "
            "same id again) (`tests/faults/test_marker_after_puback.py`).",
            "- **Memory growing with every ended job** (found by `benchmarks/soak.py`: "
            "+1.5 MB a minute at 140 jobs/s): the answer-to-command latency map kept the "
            "last answer's arrival of every ended job (a last answer is followed by no "
            "command) until 100,000 of them; the entry now goes when the job ends "
            "(`tests/faults/test_arrived_ends_with_the_job.py`).", ""]
    return "\n".join(out)


def cluster_notes(rows: list[Row]) -> list[str]:
    """What the Redis Cluster rows show, with the promotion times."""
    names = {r.name: r for r in rows}
    out = []
    kill = names.get("cluster_primary_kill9")
    if kill is not None and kill.runs:
        took = sorted(float(o.notes.get("promoted after s", 0)) for o in kill.runs)
        out.append(
            f"- *Redis Cluster primary killed*: the scope's slot was served again "
            f"{took[0]:.2f}-{took[-1]:.2f} s after the kill (median "
            f"{took[len(took) // 2]:.2f} s; node timeout 0.5 s, then the replica's "
            "election). Meanwhile the hosts' requests to that slot fail and are sent "
            "again with backoff (`retries` in the notes), and each host reads the slot "
            "table again (`table_reads`, two of them each host's first). Replication is "
            "asynchronous: a write the killed primary acknowledged but had not yet passed "
            "to its replica would be lost ([operations.md](operations.md#redis-cluster) "
            "says what `WAIT` and `min-replicas-to-write` buy); on loopback that window "
            "is well under a millisecond, and any loss fails the run.")
    if "cluster_reshard" in names:
        out.append(
            "- *Redis Cluster reshard*: the notes count the keys moved and how long the "
            "move took; `redirects` are requests answered MOVED or ASK, `retries` "
            "requests answered TRYAGAIN (a script whose keys were half moved) and sent "
            "again after a pause.")
    return out


def redis_kill_notes(rows: list[Row]) -> list[str]:
    """What the Redis kill rows mean, with the lost second's figures."""
    names = {r.name: r for r in rows}
    if not names.keys() & {"redis_kill9", "redis_kill9_lost_second", "redis_kill9_always"}:
        return []
    out = ["- *Redis killed*: a killed redis-server loses nothing it acknowledged, under "
           "`everysec` as under `always`: it appends each write to the AOF (the kernel's "
           "page cache, which outlives the process) before it replies. `appendfsync` only "
           "decides what reaches the disk, so what a crash of the machine (power, kernel) "
           "takes: under `everysec` up to the last second of acknowledged writes, under "
           "`always` nothing acknowledged (redis-server fsyncs before it replies or shows a "
           "write to another client), so there the kill is the machine crash too."]
    lost = names.get("redis_kill9_lost_second")
    if lost is not None and lost.runs:
        cut = Counter[str]()
        ends = Counter[str]()
        for o in lost.runs:
            cut.update(o.notes.get("cut", {}))
            ends.update(o.notes.get("jobs cut", {}))
        n = len(lost.runs)
        out.append(
            f"- *The AOF's last second lost* (machine crash under `everysec`): over {n} "
            f"run{'s' * (n > 1)} the cut second held {cut['commands']:,} writes touching "
            f"{cut['jobs']} jobs; of those, {ends['never stored']} were never stored (the "
            f"MES's Store was acknowledged, then lost), {ends['Aborted']} aborted (an "
            "equipment answer applied in that second was lost with it; the station had "
            "already been sent the next command, so nothing answers the reopened one until "
            f"its timeout; `tighten` retries once, the other actions abort) and "
            f"{ends['Ended']} completed, some through a timeout's retry (the *unexpected* "
            "ids) or a command sent again (the duplicates). "
            + ("No job the lost second did not touch lost anything, and nothing was left "
               "pending. " if all(o.ok for o in lost.runs) and not lost.errors else "")
            + "This is the limit of `everysec`: run Redis with `appendfsync always` where "
            "an acknowledged Store or answer must survive a machine crash "
            "([operations.md](operations.md#redis-durability-everysec-or-always)).")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="kill -9 seeds (1..N)")
    p.add_argument("--other-seeds", type=int, default=4,
                   help="seeds of every other fault (1..N)")
    p.add_argument("--only", default="", help=f"comma-separated of {','.join(RUNS)}")
    p.add_argument("--fuzz-n", type=int, default=20_000, help="fuzz inputs per decoder")
    p.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"),
                   help="where to write the report (- prints it)")
    args = p.parse_args()
    only = [s for s in args.only.split(",") if s]
    t0 = time.time()
    rows: dict[str, Row] = defaultdict(lambda: Row(""))
    for name in RUNS:
        if only and name not in only:
            continue
        rows[name] = Row(name)
        seeds = args.seeds if name in HOST_KILLS else args.other_seeds
        for seed in range(1, seeds + 1):
            res = run_one(name, seed)
            if isinstance(res, str):
                rows[name].errors.append(res)
                print(f"ERROR {res}", flush=True)
                continue
            rows[name].runs.append(res)
            print(("ok   " if res.ok else "FAIL ") + res.summary().split("\n")[0][:300],
                  flush=True)
            if not res.ok:
                print(res.summary()[:3000], flush=True)
    fuzzed = fuzz(args.fuzz_n) if args.fuzz_n > 0 and not only else None
    guided = fuzz(args.fuzz_n, "fuzz_guided.py") if args.fuzz_n > 0 and not only else None
    text = render(list(rows.values()), fuzzed, args, time.time() - t0, guided)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    failed = any(r.errors or not all(o.ok for o in r.runs) for r in rows.values())
    crashed = any(f.get("crashes") for f in [*(fuzzed or []), *(guided or [])])
    return 1 if failed or crashed else 0


if __name__ == "__main__":
    sys.exit(main())
