"""The fault harness: a load of jobs across real host processes, one fault injected
mid-load, then the invariants checked.

Everything is a real process: redis-server (AOF ``everysec``), mosquitto (persistent, so
a restart keeps the station's queued commands), the station (``fault_station.py``,
which logs every command id it receives with its time) and two or more ``sfc-host run``
processes (``run_host.py``: plain ``sfc-host run`` with a generated TOML config, or
with a jumping wall clock). Jobs are ``tighten_rework`` orders stored directly in
Redis (as the MES path does); equipment answers go over MQTT.

After the fault, ``Cluster.check`` waits (bounded) for every job to end and the work
stream to drain, and measures:

- jobs lost: a job that did not end ``Ended_Completed`` with a job response of the
  same shape as without a fault (every job's response data has the same fields,
  ``tighten.torque`` 85);
- commands lost: an id of the job's expected sequence the station never received
  (and ids it received that a fault-free run would not send: timeouts, retries);
- duplicates: an id received more than once; each is inside the fault's window
  (its first copy went out within ``WINDOW_S`` before the fault, or while it lasted:
  the documented window between a command being sent and its sent marker, or a QoS 1
  message sent again after a reconnect) or not;
- anything left: entries pending or dead, jobs on the due index or the active set.

A scenario that takes acknowledged writes away from Redis on purpose (the last second
of its AOF, as a machine crash under ``appendfsync everysec`` may) names the jobs those
writes touched (``Cluster.cut_jobs``): what they lose is counted all the same, but as
the fault's known limit (``Outcome.limit``) instead of a failure; a loss in any other
job still fails the run.

Each scenario is a coroutine returning an ``Outcome``; the tests assert ``ok`` and
``benchmarks/reliability.py`` tabulates them.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from helpers.rework import expected_ids
from helpers.scripted_broker import prop_byte, prop_str, props, publish, utf8, varint
from helpers.servers import AedesServer, MosquittoServer, RedisClusterServer, RedisServer, free_port
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from sfc_host.config import HostConfig
from sfc_host.execution.host import Host
from sfc_host.isa95 import state_list
from sfc_host.mes.client import MesClient
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.orders import INVALID_JOB_ORDER_STATUS, OrderError

ENDED_COMPLETED = state_list("Ended_Completed")   # as a job response carries it

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "src" / "sfc_host" / "examples"
SCOPE = "line1"
K = ScopeKeys(SCOPE)
GROUP = "sfc-host"
WINDOW_S = 1.0          # a duplicate's first copy went out at most this long before the fault
# A killed host's last writes are still in its socket when it dies; the broker reads
# them after the kill and the station logs them later still. Measured on a burst (kill
# -9 seed 9: 44 commands, then 200 retained orders, written before the kill): the
# broker forwarded them before it saw the connection end, the station logged them
# 0.21 s after the kill. (A first copy from a surviving host inside this tail would
# pass unnoticed only if it came exactly twice.)
KILL_TAIL_S = 0.5
BASE_SETTINGS: dict[str, Any] = {
    "scopes": [SCOPE], "claim_min_idle_ms": 300, "claim_interval_ms": 100,
    "sweep_interval_ms": 50, "read_block_ms": 20, "discover_interval_ms": 100,
    "outage_threshold_ms": 3000, "max_deliveries": 10, "log_level": "WARNING",
}


def work_master(timeout_s: int | None = None, retries: int | None = None) -> dict[str, Any]:
    """The ``tighten_rework`` example as Work Master ``wm1`` (optionally every action's
    timeout shortened, so that a missed outage would time actions out, and its retries
    set, so that a lost answer cannot hide behind a retry)."""
    wm = json.loads((EXAMPLES / "tighten_rework.json").read_text())
    wm["ID"] = "wm1"
    for a in wm["data"]["Actions"]:
        if timeout_s is not None:
            a["TimeoutSeconds"] = timeout_s
        if retries is not None:
            a["Retries"] = retries
    return wm


class PersistentMosquitto(MosquittoServer):
    """mosquitto that saves its sessions and queued QoS 1 messages at shutdown. It
    stays the user that started it (as root it would switch to ``mosquitto``, which
    cannot write the private temp folder)."""

    def _argv(self) -> list[str]:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"user {getpass.getuser()}\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.workdir}/\n"
            "max_queued_messages 100000\n"
            "max_inflight_messages 1000\n"
            "log_dest stderr\nlog_type error\nlog_type warning\n"
            + "".join(f"{line}\n" for line in self.extra))
        return [self.path, "-c", str(conf)]


def scrape(port: int) -> str | None:
    """A host's Prometheus text, None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return None


def is_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:     # 503 (HTTPError) or no answer yet
        return False


class HostProcess:
    """One ``sfc-host run`` process (through ``run_host.py``) with its own TOML config."""

    def __init__(self, name: str, workdir: Path, settings: dict[str, Any],
                 clock_jumps: str = "") -> None:
        self.name = name
        self.metrics_port = free_port()
        conf = workdir / f"{name}.toml"
        values = {**settings, "consumer": name, "metrics_port": self.metrics_port}
        # JSON strings, numbers, booleans and arrays of strings are TOML as they are
        conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
        self.log = workdir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
        if clock_jumps:
            env["FAULT_CLOCK_JUMPS"] = clock_jumps
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, str(HERE / "run_host.py"), str(conf)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    async def ready(self, timeout: float = 30) -> None:
        """Until ``/readyz`` answers 200: recovered, and every MQTT subscription
        acknowledged (a request sent before that could reach no host)."""
        end = time.monotonic() + timeout
        while not await asyncio.to_thread(is_ready, self.metrics_port):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"host {self.name} did not start:\n{self.tail()}")
            await asyncio.sleep(0.05)

    def tail(self, n: int = 1500) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def signal(self, sig: int) -> float:
        """Send ``sig``; the wall-clock time it was sent."""
        at = time.time()
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=10)
        return at

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)    # a stopped host cannot exit
                self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@dataclass
class Outcome:
    """What one fault run did to the load."""

    fault: str
    seed: int
    jobs: int = 0
    jobs_lost: int = 0            # not completed, or a job response of another shape
    commands_lost: int = 0        # expected ids never received
    unexpected: int = 0           # ids a fault-free run would not send (timeouts, retries)
    duplicates: int = 0           # ids received more than once
    dups_in_window: int = 0       # ... of which inside the fault's window
    left: int = 0                 # pending or dead entries, due or active jobs at the end
    faults: int = 0               # faults injected (kills, restarts, stops, jumps, requests)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    # losses the fault itself explains (jobs whose acknowledged writes it took away):
    # counted above too; per kind (jobs, commands, unexpected, duplicates), and why
    limit: Counter[str] = field(default_factory=Counter)
    limit_notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        lim = self.limit
        return (not self.problems and self.jobs_lost == lim["jobs"]
                and self.commands_lost == lim["commands"]
                and self.unexpected == lim["unexpected"] and self.left == 0
                and self.duplicates - self.dups_in_window == lim["duplicates"])

    def summary(self) -> str:
        return (f"{self.fault} seed {self.seed}: {self.jobs} jobs, lost {self.jobs_lost}, "
                f"commands lost {self.commands_lost}, unexpected {self.unexpected}, "
                f"duplicates {self.duplicates} ({self.dups_in_window} in window), "
                f"left {self.left}, {self.seconds:.1f} s {self.notes}"
                + (f", known limit {dict(self.limit)}" if self.limit else "")
                + ("" if not self.problems else "\n" + "\n".join(self.problems[:20])))


class Cluster:
    """redis-server, mosquitto, the station and host processes in one temp folder."""

    def __init__(self, seed: int, *, hosts: int = 2, settings: dict[str, Any] | None = None,
                 clock_jumps: dict[str, str] | None = None, station_delay_s: float = 0.1,
                 repeat_s: float = 1.0, wm_timeout_s: int | None = None,
                 appendfsync: str = "everysec", redis_cluster: bool = False,
                 retries: int | None = None, broker: str = "mosquitto") -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.n_hosts = hosts
        self.settings = {**BASE_SETTINGS, **(settings or {})}
        self.clock_jumps = clock_jumps or {}
        self.station_delay_s = station_delay_s
        self.repeat_s = repeat_s
        self.wm_timeout_s = wm_timeout_s
        self.retries = retries
        self.dir = Path(tempfile.mkdtemp(prefix="sfc-faults-"))
        self.redis_cluster = redis_cluster
        # on a cluster: three primaries, a replica each, a failover within a second
        self.redis: RedisServer | RedisClusterServer = RedisClusterServer(
            self.dir / "redis", node_timeout_ms=500, replicas=1) if redis_cluster else \
            RedisServer(self.dir / "redis", aof=True, extra=(
                [] if appendfsync == "everysec" else ["--appendfsync", appendfsync]))
        # aedes: MQTT 3.1.1 and no shared subscriptions (every host hears every answer)
        self.broker: MosquittoServer | AedesServer = AedesServer(self.dir / "mqtt") \
            if broker == "aedes" else PersistentMosquitto(self.dir / "mqtt")
        self.mqtt_version = 3 if broker == "aedes" else 5
        if broker == "aedes":
            self.settings.update(mqtt_version=3, mqtt_shared_group="")
        self.kills: list[float] = []       # when hosts were killed (wall clock)
        self.hosts: dict[str, HostProcess] = {}
        self.station: subprocess.Popen[bytes] | None = None
        self.station_log = self.dir / "station.jsonl"
        self.jobs: list[str] = []
        self.client: Any = None
        self.orders: Host | None = None
        self.windows: list[tuple[float, float]] = []   # (from, to): duplicates allowed
        # copies a duplicate in a window may have: one redelivery per QoS 1 hop that the
        # fault can cut (host -> broker always; broker -> station when the broker
        # restarts), and a takeover's copy (see broker_restart)
        self.max_copies = 2
        self.times: list[tuple[str | None, str | None]] = []   # job responses' start, end
        self.cut_jobs: set[str] = set()   # jobs whose acknowledged writes a fault took away
        self.t0 = 0.0

    # ---- life cycle

    async def __aenter__(self) -> Cluster:
        try:
            await asyncio.to_thread(self.redis.start)
            await asyncio.to_thread(self.broker.start)
            self.settings.update(redis_url=self.redis.url, mqtt_url=self.broker.url,
                                 redis_cluster=self.redis_cluster)
            self.client = RedisCluster.from_url(self.redis.url) if self.redis_cluster \
                else aioredis.Redis.from_url(self.redis.url)
            self.orders = Host(HostConfig(redis_url=self.redis.url, consumer="faults",
                                          redis_cluster=self.redis_cluster), loops=False)
            await self.orders.store.put_work_master(
                SCOPE, work_master(self.wm_timeout_s, self.retries))
            await self.orders.orders.register_scope(SCOPE)
            await self.start_station()
            for i in range(1, self.n_hosts + 1):
                self.add_host(f"h{i}")
            for h in self.hosts.values():
                await h.ready()
            self.t0 = time.time()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start_station(self) -> None:
        self.station = subprocess.Popen(
            [sys.executable, str(HERE / "fault_station.py"), str(self.broker.port),
             str(self.station_log), str(self.seed), str(self.station_delay_s),
             str(self.repeat_s), str(self.mqtt_version)],
            stdout=subprocess.PIPE, stderr=(self.dir / "station.log").open("ab"))
        assert self.station.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.station.stdout.readline), 15)
        if line.strip() != b"ready":
            raise AssertionError(f"the station did not start: {line!r}")

    def add_host(self, name: str) -> HostProcess:
        h = HostProcess(name, self.dir, self.settings, self.clock_jumps.get(name, ""))
        self.hosts[name] = h
        return h

    async def aclose(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(h.stop) for h in self.hosts.values()))
        if self.station is not None and self.station.poll() is None:
            self.station.kill()
            self.station.wait(timeout=10)
        if self.orders is not None:
            await self.orders.aclose()
        if self.client is not None:
            await self.client.aclose()
        await asyncio.to_thread(self.broker.stop)
        await asyncio.to_thread(self.redis.stop)
        if not os.environ.get("FAULT_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- load

    async def store(self, job: str) -> None:
        """Store-and-start one order, again after a connection error (Redis restarts)."""
        assert self.orders is not None
        for attempt in range(50):
            try:
                await self.orders.orders.store_order(
                    SCOPE, {"JobOrderID": job, "WorkMasterID": [{"ID": "wm1"}]}, start=True)
                return
            except OrderError as e:
                if e.status == INVALID_JOB_ORDER_STATUS:
                    return                      # a repeat that found the order stored
                raise
            except RedisError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)

    async def load(self, n: int, gap_s: float, burst: int = 1) -> None:
        """Store ``n`` jobs, ``burst`` at once, ``gap_s`` apart (bursts fill the hosts'
        outgoing queues, so a fault finds commands between queue and marker)."""
        new = [f"J{i:03d}" for i in range(len(self.jobs), len(self.jobs) + n)]
        self.jobs += new
        for i in range(0, n, burst):
            await asyncio.gather(*(self.store(j) for j in new[i:i + burst]))
            await asyncio.sleep(gap_s)

    def received(self) -> list[dict[str, Any]]:
        """Every command the station received so far, in order."""
        if not self.station_log.exists():
            return []
        out = []
        for line in self.station_log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    # ---- checks

    async def states(self) -> list[bytes | None]:
        pipe = self.client.pipeline(transaction=False)
        for j in self.jobs:
            pipe.hget(K.order(j), "state")
        return list(await pipe.execute())

    async def wait_ended(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                # an order whose Store a fault took away never comes: nothing to wait for
                if all((s is None and j in self.cut_jobs) or (
                        s is not None and not s.startswith((b"Running", b"AllowedToStart",
                                                            b"Interrupted")))
                       for j, s in zip(self.jobs, await self.states(), strict=True)):
                    return True
            await asyncio.sleep(0.1)
        return False

    async def pending(self) -> int:
        return int((await self.client.xpending(K.work, GROUP))["pending"])

    async def check(self, out: Outcome, timeout: float = 40) -> Outcome:
        """Wait for the load to end, then measure it against a fault-free run."""
        out.jobs = len(self.jobs)
        await self.wait_ended(timeout)
        end = time.monotonic() + 10
        while await self.pending() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)     # late copies of commands reach the station's log
        assert self.orders is not None
        shapes: Counter[tuple[str, ...]] = Counter()
        for j, st in zip(self.jobs, await self.states(), strict=True):
            raw = await self.client.get(K.response(j))
            resp = json.loads(raw) if raw else {}
            data = {d["ID"]: d["Value"] for d in resp.get("JobResponseData", [])}
            if st != b"Ended_Completed" or resp.get("JobState") != ENDED_COMPLETED \
                    or data.get("tighten.torque") != 85:
                out.jobs_lost += 1
                view = await self.orders.inspect(SCOPE, j) or {}
                self._lost(out, j,
                           f"job {j}: order {st!r}, status {view.get('status')}, reason "
                           f"{await self.client.hget(K.order(j), 'reason')!r}, "
                           f"markers {view.get('markers')}, response {resp or None}",
                           jobs=1)
                if j in self.cut_jobs:
                    continue        # counted once, as the fault's limit: not a shape
            shapes[tuple(sorted(data))] += 1
            self.times.append((resp.get("StartTime"), resp.get("EndTime")))
        if len(shapes) > 1:
            out.jobs_lost += sum(shapes.values()) - shapes.most_common(1)[0][1]
            out.problems.append(f"job responses of {len(shapes)} shapes: {dict(shapes)}")
        self._check_commands(out)
        left = {"pending": await self.pending(), "dead": await self.client.xlen(K.dead),
                "due": await self.client.zcard(K.due),
                "active": await self.client.scard(K.active)}
        out.left = sum(left.values())
        if out.left:
            out.problems.append(f"left at the end: {left}")
            pend = await self.client.xpending_range(K.work, GROUP, "-", "+", 10)
            out.problems.append(f"pending: {pend}")
        out.seconds = time.time() - self.t0
        if not out.ok:
            for h in self.hosts.values():
                out.problems.append(f"--- {h.name} log:\n{h.tail(800)}")
        return out

    def host_killed(self, at: float) -> None:
        """A host died at ``at``: the host that takes its end over sends every command
        still open again, so any of them, however old, may come once more (its answer
        may have died with the host), and the kill's own tail may add a copy."""
        self.kills.append(at)
        self.windows.append((at, at + KILL_TAIL_S))
        self.windows.append((self.t0, at + RESEND_AFTER_S))
        self.max_copies = 2 + len(self.kills)

    def longest_wait(self) -> tuple[float, str]:
        """The longest time any job spent between two of its commands reaching the
        station, or between its last command and its end; and that job."""
        at: dict[str, list[float]] = defaultdict(list)
        for r in self.received():
            at[r["job"]].append(r["t"])
        worst, who = 0.0, ""
        for job, (_, end) in zip(self.jobs, self.times, strict=False):
            times = sorted(set(at.get(job, [])))
            if end:
                times.append(_parse_iso(end))
            for a, b in itertools.pairwise(times):
                if b - a > worst:
                    worst, who = b - a, job
        return worst, who

    def _lost(self, out: Outcome, job: str, what: str, **kinds: int) -> None:
        """A loss (``kinds``: how many of each): the fault's known limit when its writes
        to the job were taken away, else a failure."""
        if job in self.cut_jobs:
            out.limit.update({k: n for k, n in kinds.items() if n})
            out.limit_notes.append(what)
        else:
            out.problems.append(what)

    def _check_commands(self, out: Outcome) -> None:
        got = self.received()
        per_job: dict[str, list[str]] = defaultdict(list)
        at: dict[str, list[float]] = defaultdict(list)
        for r in got:
            per_job[r["job"]].append(r["id"])
            at[r["id"]].append(r["t"])
        for j in self.jobs:
            want = expected_ids(j)
            seen = list(dict.fromkeys(per_job.get(j, [])))
            lost = [c for c in want if c not in seen]
            extra = [c for c in seen if c not in want]
            out.commands_lost += len(lost)
            out.unexpected += len(extra)
            if lost or extra or [c for c in seen if c in want] != want[:len(seen)]:
                self._lost(out, j, f"job {j}: lost {lost}, unexpected {extra}, "
                                   f"received {per_job.get(j)}",
                           commands=len(lost), unexpected=len(extra))
        for cid, times in at.items():
            if len(times) < 2:
                continue
            out.duplicates += 1
            first = times[0]
            inside = len(times) <= self.max_copies and any(a - WINDOW_S <= first <= b
                                             for a, b in self.windows)
            if inside:
                out.dups_in_window += 1
            else:
                wins = [(round(a - self.t0, 3), round(b - self.t0, 3)) for a, b in self.windows]
                self._lost(out, cid.split(":", 1)[0],
                           f"duplicate {cid} outside the window: received at "
                           f"{[round(t - self.t0, 3) for t in times]} s, windows {wins}",
                           duplicates=1)
        out.notes["commands"] = len(got)


# ---- scenarios


async def _during(load: Awaitable[None], fault: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.ensure_future(load)
    try:
        await fault()
        await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# The takeover of a patient host: entries idle longer than the station's answer repeat
# (1 s) plus its working time. A killed host's command whose answer died with it is then
# settled by the repeated answer before the entry is taken over, instead of being sent
# again (production's default claim_min_idle_ms is 30 s).
PATIENT_CLAIM_MS = 2000


async def kill9(seed: int, n_jobs: int = 200, claim_min_idle_ms: int | None = None) -> Outcome:
    """``kill -9`` of a host at a random point of the load (on odd seeds the other
    original host is killed later too); the other host takes its pending entries over
    (XAUTOCLAIM), and a restarted host joins (recovery runs while jobs run)."""
    out = Outcome("kill -9 of a host", seed)
    settings = None if claim_min_idle_ms is None else {"claim_min_idle_ms": claim_min_idle_ms}
    async with Cluster(seed, settings=settings) as c:
        rng = c.rng

        async def fault() -> None:
            originals = ["h1", "h2"]
            rng.shuffle(originals)
            kills = 1 + seed % 2
            for k, victim in enumerate(originals[:kills]):
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                at = c.hosts[victim].signal(signal.SIGKILL)
                c.host_killed(at)
                out.faults += 1
                busy = {x["name"].decode(): x["pending"]
                        for x in await c.client.xinfo_consumers(K.work, GROUP)}
                out.notes["pending at kill"] = [*out.notes.get("pending at kill", []),
                                                busy.get(victim, 0)]
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                await c.add_host(f"{victim}r{k}").ready()
        await _during(c.load(n_jobs, 0.1, burst=25), fault)
        return await c.check(out)


# The resend follows the kill within this (the Will, the takeover's claim, a scan of
# the running jobs); a resent command's first copy may be as old as the run
RESEND_AFTER_S = 3.0
# how long a job may wait for its next command or its end, kill or no kill (its own
# timeouts are 30 s and more: a lost answer shows as a wait of 30 s or an abort)
LONGEST_WAIT_S = 5.0


async def kill9_answers(seed: int, n_jobs: int = 150, broker: str = "mosquitto",
                        hosts: int = 2) -> Outcome:
    """``kill -9`` of a host at a random moment of the load, with a station that
    answers each command once and at once (no repeats) and a recipe with no retries: an
    answer the dead host had taken must be had again (its end taken over and the open
    commands sent again), so no job aborts or waits for its timeout. Every command id
    at most twice; the longest wait of any job for its next command or its end is
    measured (``notes["longest wait s"]``)."""
    out = Outcome(f"kill -9, answers in flight ({broker}, {hosts} hosts)", seed)
    async with Cluster(seed, hosts=hosts, station_delay_s=0.0, repeat_s=0.0, retries=0,
                       broker=broker) as c:
        rng = c.rng

        async def fault() -> None:
            # in full swing: after a random share of the load's commands went out
            want = rng.randint(n_jobs // 3, 2 * n_jobs)
            while len(c.received()) < want:
                await asyncio.sleep(0.01)
            victim = rng.choice(sorted(c.hosts))
            at = c.hosts[victim].signal(signal.SIGKILL)
            c.host_killed(at)
            out.faults += 1
        await _during(c.load(n_jobs, 0.04, burst=5), fault)
        await c.check(out)
        wait, job = c.longest_wait()
        out.notes["longest wait s"] = round(wait, 2)
        if wait > LONGEST_WAIT_S:
            out.problems.append(f"job {job} waited {wait:.1f} s for its next command or "
                                f"its end (at most {LONGEST_WAIT_S:g} s)")
        return out


async def kill9_stalled_broker(seed: int, n_jobs: int = 100) -> Outcome:
    """``kill -9`` of a host while the broker is stalled (SIGSTOP for 1 s): the hosts'
    commands wait for acknowledgements in their outgoing queues when one of them dies.
    Action timeouts are 5 s, so a command that died in a queue with its sent marker
    written (a lost command) shows as a timeout and an aborted job."""
    out = Outcome("kill -9 of a host while the broker stalls", seed)
    async with Cluster(seed, wm_timeout_s=5) as c:
        async def fault() -> None:
            await asyncio.sleep(c.rng.uniform(0.3, 1.0))
            assert c.broker.proc is not None
            at = time.time()
            c.broker.proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(1.0)
            victim = c.rng.choice(["h1", "h2"])
            killed = c.hosts[victim].signal(signal.SIGKILL)
            c.broker.proc.send_signal(signal.SIGCONT)
            c.windows.append((at, time.time() + 0.5))
            c.host_killed(killed)
            out.faults += 1
            await c.add_host(f"{victim}r").ready()
        await _during(c.load(n_jobs, 0.02), fault)
        return await c.check(out)


# The hosts reconnect with a backoff (0.1, 0.2, 0.5, 1 s …): until they are back, a
# QoS 1 message not acknowledged when a connection ended goes out again.
RECONNECT_S = 2.0


async def _restart(out: Outcome, c: Cluster, server: RedisServer | MosquittoServer,
                   n_jobs: int) -> Outcome:
    async def fault() -> None:
        await asyncio.sleep(c.rng.uniform(0.5, 2.0))
        down = time.time()
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
        c.windows.append((down, time.time() + RECONNECT_S))
        out.faults += 1
    await _during(c.load(n_jobs, 0.02), fault)
    return await c.check(out)


async def redis_restart(seed: int, n_jobs: int = 150) -> Outcome:
    """Redis (AOF everysec) stopped and started again mid-load, down for 0.5 s."""
    async with Cluster(seed) as c:
        assert isinstance(c.redis, RedisServer)
        return await _restart(Outcome("Redis restart (AOF everysec)", seed), c, c.redis,
                              n_jobs)


class AofTail:
    """The size of redis-server's newest AOF file, sampled every 20 ms while the load
    runs, so that a fault can cut the file back to where it was a moment before a kill:
    what a machine crash takes with it when the AOF is fsynced only once a second."""

    def __init__(self, redis: RedisServer) -> None:
        self.dir = redis.workdir / "appendonlydir"
        self.sizes: list[tuple[float, Path, int]] = []
        self._task: asyncio.Task[None] | None = None

    def newest(self) -> Path:
        # appendonly.aof.{n}.incr.aof: the highest n is the one being appended to
        return max(self.dir.glob("*.incr.aof"), key=lambda f: int(f.name.split(".")[2]))

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            f = self.newest()
            self.sizes.append((time.time(), f, f.stat().st_size))

    async def _sample(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.02)

    def __enter__(self) -> AofTail:
        self.sample()           # the setup (Work Master, scope) is never cut
        self._task = asyncio.ensure_future(self._sample())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def cut(self, at: float, lose_s: float) -> bytes:
        """Cut the newest AOF file (redis-server stopped) back to its size ``lose_s``
        before ``at``; the bytes cut. redis-server loads a file cut inside a command or
        a MULTI/EXEC block (``aof-load-truncated``, the default) up to the last whole
        one, as it would after a crash."""
        f = self.newest()
        before = [n for t, g, n in self.sizes if g == f and t <= at - lose_s]
        if not before:
            raise AssertionError(f"no size of {f.name} sampled {lose_s} s before the kill")
        keep = before[-1]
        data = f.read_bytes()
        with f.open("r+b") as fh:
            fh.truncate(keep)
        # what the load drops: from the end of the last whole command or MULTI/EXEC
        # block (a script's effects) before the cut; the bytes of a command or a block
        # the cut splits are lost with it, those before the cut too
        return data[_loaded_up_to(data, keep):]


def _loaded_up_to(data: bytes, keep: int) -> int:
    """The end of the last command, or MULTI/EXEC block, wholly in ``data[:keep]``: what
    redis-server loads of an AOF cut at ``keep`` (RESP arrays of bulk strings)."""
    pos = last = 0
    in_multi = False
    while data[pos:pos + 1] == b"*":
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        p, name = eol + 2, b""
        for i in range(int(data[pos + 1:eol])):
            eol = data.find(b"\r\n", p)
            if eol < 0 or data[p:p + 1] != b"$":
                return last
            n = int(data[p + 1:eol])
            if i == 0:
                name = data[eol + 2:eol + 2 + n].upper()
            p = eol + 2 + n + 2
        if p > keep:
            break
        pos = p
        if name == b"MULTI":
            in_multi = True
        elif name == b"EXEC":
            in_multi, last = False, pos
        elif not in_multi:
            last = pos
    return last


# A job id in an AOF command (a key, a stream field, a command id)
JOB_IN_AOF = re.compile(rb"(?<![0-9A-Za-z])(J\d{3})(?![0-9])")
# everysec fsyncs once a second: a machine crash may take the last second of writes
LOST_S = 1.0


def aof_commands(data: bytes) -> int:
    """Whole commands in a piece of AOF (RESP arrays of bulk strings; the first may be
    the rest of one cut in two, and is not counted)."""
    return len(re.findall(rb"\r\n\*\d+\r\n\$", b"\r\n" + data)) if data else 0


async def redis_kill9(seed: int, n_jobs: int = 150, appendfsync: str = "everysec",
                      lose_s: float = 0.0) -> Outcome:
    """redis-server killed (SIGKILL) mid-load and started again on the same port and
    data folder after 0.5 s.

    A killed process loses nothing it acknowledged: redis-server writes the AOF (to the
    OS's page cache) before it replies, and the kernel keeps the page cache when the
    process dies; ``appendfsync`` decides only what reaches the disk, so what a crash
    of the machine can take. ``lose_s`` > 0 plays that too: the AOF is cut back to its
    size ``lose_s`` before the kill (under ``everysec`` the last second may not be on
    disk yet); the jobs that second touched are named, and what they lose is the known
    limit of ``everysec``, counted but not a failure. Under ``always`` nothing is
    acknowledged or seen by another client before it is fsynced: a machine crash is
    this kill."""
    what = f"Redis kill -9 (AOF {appendfsync}" + (
        f", last {lose_s:g} s of the AOF lost)" if lose_s else ")")
    out = Outcome(what, seed)
    async with Cluster(seed, appendfsync=appendfsync) as c:
        assert isinstance(c.redis, RedisServer)
        with AofTail(c.redis) as aof:
            async def fault() -> None:
                # past the first second of load, so that a cut second holds only load
                await asyncio.sleep(lose_s + c.rng.uniform(0.5, 2.0))
                assert c.redis.proc is not None
                down = time.time()
                c.redis.proc.send_signal(signal.SIGKILL)
                await asyncio.to_thread(c.redis.proc.wait, 10)
                if lose_s:
                    cut = aof.cut(down, lose_s)
                    c.cut_jobs = {m.decode() for m in JOB_IN_AOF.findall(cut)}
                    out.notes["cut"] = {"bytes": len(cut), "commands": aof_commands(cut),
                                        "jobs": len(c.cut_jobs)}
                await asyncio.sleep(0.5)
                await asyncio.to_thread(c.redis.start)
                c.windows.append((down, time.time() + RECONNECT_S))
                out.faults += 1
            await _during(c.load(n_jobs, 0.02), fault)
        res = await c.check(out)
        if lose_s:
            # how the jobs the cut touched ended: never stored (an acknowledged Store
            # lost), aborted (an applied answer lost: the action timed out), completed
            ends = Counter((st or b"").decode().split("_")[0] or "never stored"
                           for j, st in zip(c.jobs, await c.states(), strict=True)
                           if j in c.cut_jobs)
            res.notes["jobs cut"] = dict(ends)
        return res


async def broker_restart(seed: int, n_jobs: int = 150) -> Outcome:
    """mosquitto stopped and started again mid-load, down for 0.5 s: the hosts send
    what was not acknowledged again after the reconnect, the station's session keeps
    what the broker held for it."""
    async with Cluster(seed) as c:
        # A command cut by the restart may come four times. Traced (the hosts' PUBLISH
        # with its DUP flag, mosquitto's debug log, the station's receipt), seed 24,
        # J007:loosen#3 at 1.578, 2.244, 2.393 and 2.411 s: mosquitto forwarded h1's
        # PUBLISH as it stopped (1.578) and acknowledged neither hop; once it was back
        # the station's persistent session got it again, DUP (2.244: broker to station);
        # h1 sent its unacknowledged copy again, DUP, on its reconnect (2.393: host to
        # broker); and h2 sent its own (2.411): h1's send waits for its batch's PUBACKs
        # (up to 2 s), so the entry, idle past claim_min_idle_ms (0.3 s here), was taken
        # over and had no sent marker yet. The full run's seed 2 (J051:unload_part#3 at
        # 1.936, 2.491, 2.742, 2.742 s) has the same timing: the stop, the station's
        # reconnect, both hosts' reconnect. With the takeover slower than that wait
        # (production's 30 s) the last copy does not come.
        c.max_copies = 4
        return await _restart(Outcome("MQTT broker restart", seed), c, c.broker, n_jobs)


OUTAGE_MS = 1500


async def sigstop(seed: int, n_jobs: int = 100, every_host: bool = False) -> Outcome:
    """SIGSTOP past the outage threshold, then SIGCONT.

    One host: the other takes its pending entries over (XAUTOCLAIM) and keeps sweeping,
    so there is no outage; what the stopped host held (answers in its socket, a send
    half done) is applied or absorbed when it continues. Action timeouts stay as in the
    recipe (20-30 s): a freeze longer than a timeout times the action out by design.

    Every host: an outage. The sweep finds the heartbeat older than the threshold and
    moves every deadline by the gap; action timeouts are 3 s and the stop lasts 4.5 s,
    so a missed outage would time actions out (unexpected ids, aborted jobs)."""
    what = "every host" if every_host else "one host"
    out = Outcome(f"SIGSTOP of {what} past the outage threshold", seed)
    async with Cluster(seed, settings={"outage_threshold_ms": OUTAGE_MS},
                       wm_timeout_s=3 if every_host else None) as c:
        async def fault() -> None:
            await asyncio.sleep(c.rng.uniform(0.3, 1.0))
            victims = ["h1", "h2"] if every_host else [c.rng.choice(["h1", "h2"])]
            at = min(c.hosts[v].signal(signal.SIGSTOP) for v in victims)
            await asyncio.sleep(OUTAGE_MS / 1000 + 3.0)
            for v in victims:
                c.hosts[v].signal(signal.SIGCONT)
            c.windows.append((at, time.time() + 0.5))
            out.faults += 1
        await _during(c.load(n_jobs, 0.01), fault)
        return await c.check(out)


async def clock_jump(seed: int, n_jobs: int = 100) -> Outcome:
    """The hosts' wall clocks jump mid-load (one an hour ahead and then two back, the
    other half an hour back): deadlines and job times follow the Redis server clock, so
    nothing times out and the job responses carry real times."""
    out = Outcome("host wall clock jumped", seed)
    jumps = {"h1": "1.0:3600,2.5:-7200", "h2": "1.5:-1800"}
    async with Cluster(seed, clock_jumps=jumps, wm_timeout_s=5) as c:
        real_start = time.time()
        await c.load(n_jobs, 0.03)
        out.faults = 3
        res = await c.check(out)
        real_end = time.time()
        bad = 0
        for s, e in c.times:
            for iso in (s, e):
                if iso is None:
                    continue
                t = _parse_iso(iso)
                if not real_start - 60 <= t <= real_end + 5:
                    bad += 1
        if bad:
            res.problems.append(f"{bad} job response times off the server clock")
        return res


def _parse_iso(s: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


async def pause_storm(seed: int, n_jobs: int = 40, seconds: float = 4.0) -> Outcome:
    """Two MES clients race Pause/Resume/Pause requests over MQTT at running jobs
    (shared subscriptions split them between two hosts). Accepted Pauses and Resumes of
    one job alternate, so after the storm a job with one Pause more than Resumes must be
    Interrupted with its recipe held, any other not Interrupted and not held. Then every
    Interrupted job is resumed and every job must complete, nothing stuck."""
    out = Outcome("Pause/Resume storm from two MES clients", seed)
    async with Cluster(seed, station_delay_s=0.4) as c:
        rng = c.rng
        cfg = HostConfig(mqtt_url=c.broker.url)
        accepted: dict[str, Counter[str]] = defaultdict(Counter)
        paused_at: dict[str, float] = {}       # job -> when its last Pause was accepted
        refused = 0
        sent = 0
        async with MesClient(cfg, timeout_s=10) as m1, MesClient(cfg, timeout_s=10) as m2:
            async def storm(mes: MesClient, r: random.Random) -> None:
                nonlocal refused, sent
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    job = r.choice(c.jobs) if c.jobs else None
                    if job is None:
                        await asyncio.sleep(0.05)
                        continue
                    method = r.choice(["Pause", "Resume", "Pause"])
                    reply = await mes.control(SCOPE, method, job)
                    sent += 1
                    if reply.ok:
                        accepted[job][method] += 1
                        if method == "Pause":
                            paused_at[job] = time.time()
                    else:
                        refused += 1
                    await asyncio.sleep(r.uniform(0.0, 0.02))

            load = asyncio.ensure_future(c.load(n_jobs, 0.02))
            await asyncio.gather(*(storm(m, random.Random(rng.random()))
                                   for m in (m1, m2, m1, m2)))
            await load
            out.faults = sent
            await asyncio.sleep(1.0)   # hold and release entries settle
            assert c.orders is not None
            states = dict(zip(c.jobs, await c.states(), strict=True))
            for j in c.jobs:
                p, r = accepted[j]["Pause"], accepted[j]["Resume"]
                st = (states[j] or b"").decode()
                view = await c.orders.inspect(SCOPE, j) or {}
                held = view.get("held_ms") is not None
                if p - r not in (0, 1):
                    out.problems.append(f"job {j}: {p} Pauses and {r} Resumes accepted")
                elif p - r == 1 and st == "Ended_Completed":
                    # The recipe's last step ended before the hold reached it (the order
                    # goes Interrupted -> Ended_Completed): only if it ended by then.
                    raw = await c.client.get(K.response(j))
                    ended = _parse_iso(json.loads(raw)["EndTime"]) if raw else None
                    if ended is None or ended > paused_at[j] + 0.5:
                        out.problems.append(f"job {j}: completed at {ended} under a Pause "
                                            f"accepted at {paused_at[j]}")
                    out.notes["completed under a late Pause"] = \
                        out.notes.get("completed under a late Pause", 0) + 1
                elif p - r == 1 and not (st.startswith("Interrupted") and held):
                    out.problems.append(f"job {j}: last accepted Pause, but {st} held {held}")
                elif p == r and (st.startswith("Interrupted") or held):
                    out.problems.append(f"job {j}: last accepted Resume, but {st} held {held}")
            for j in c.jobs:
                if (states[j] or b"").startswith(b"Interrupted"):
                    reply = await m1.control(SCOPE, "Resume", j)
                    if not reply.ok:
                        out.problems.append(f"job {j}: the final Resume was refused: "
                                            f"{reply.data}")
        out.notes.update(requests=sent, refused=refused,
                         accepted=sum(sum(v.values()) for v in accepted.values()))
        c.windows.clear()        # no fault window: a hold re-issues ids, never twice
        return await c.check(out)


def host_counts(c: Cluster, *names: str) -> dict[str, dict[str, float]]:
    """Each host's counters ``names`` (Prometheus families, labels folded in)."""
    out: dict[str, dict[str, float]] = {}
    for h in c.hosts.values():
        text = scrape(h.metrics_port) or ""
        got: dict[str, float] = {}
        for line in text.splitlines():
            for n in names:
                if line.startswith(f"sfc_{n}_total"):
                    key = n + (line[line.index("{"):line.index("}") + 1]
                               if 'reason="' in line else "")
                    key = re.sub(r'consumer="[^"]*",?', "", key).replace("{}", "")
                    got[key] = got.get(key, 0) + float(line.rsplit(" ", 1)[1])
        out[h.name] = got
    return out


def raw_publish(port: int, packets: list[bytes]) -> None:
    """A plain MQTT 5 client (written by hand) publishes ``packets`` (QoS 0 or 1) and
    leaves cleanly: another client's bad messages, as a device would send them."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + utf8("faults-device")
        s.sendall(b"\x10" + varint(len(body)) + body)
        s.recv(64)                                        # CONNACK
        for p in packets:
            s.sendall(p)
        time.sleep(0.2)                                   # the PUBACKs
        s.sendall(b"\xe0\x00")


async def mqtt_poison(seed: int, n_jobs: int = 100) -> Outcome:
    """A device publishes retained messages with invalid properties on topics every host
    subscribes to (PayloadFormatIndicator 2 on the events, an empty ResponseTopic on the
    answers, a ResponseTopic ``reply/+`` on the MES requests); mosquitto keeps and
    forwards them. Each host drops them and keeps its connection; a host started after
    them gets them again at its subscribe and starts all the same."""
    out = Outcome("retained messages with invalid properties", seed)
    async with Cluster(seed) as c:
        async def fault() -> None:
            await asyncio.sleep(c.rng.uniform(0.3, 1.0))
            bad = [publish(f"equipment/{SCOPE}/events", b"{}", qos=1, mid=1, retain=True,
                           properties=props(prop_byte(0x01, 2))),
                   publish(f"equipment/{SCOPE}/responses", b"{}", qos=1, mid=2,
                           retain=True, properties=props(prop_str(0x08, ""))),
                   publish(f"mes/{SCOPE}/commands", b"{}", qos=1, mid=3, retain=True,
                           properties=props(prop_str(0x08, "reply/+")))]
            await asyncio.to_thread(raw_publish, c.broker.port, bad)
            out.faults += 1
            await asyncio.sleep(0.5)
            await c.add_host("h3").ready()
        await _during(c.load(n_jobs, 0.02), fault)
        await c.check(out)
        counts = host_counts(c, "mqtt_reconnects", "mqtt_messages_dropped")
        out.notes["hosts"] = counts
        dropped = sum(v for got in counts.values() for k, v in got.items()
                      if k.startswith("mqtt_messages_dropped"))
        for name, got in counts.items():
            if got.get("mqtt_reconnects", 0):
                out.problems.append(f"{name} reconnected: {got}")
        # each message reaches one host of the shared group, and h3 at its subscribe
        if dropped < 3:
            out.problems.append(f"the hosts dropped {dropped} of the 3 bad messages")
        return out


HANG_KEEPALIVE_S = 2


async def broker_hang(seed: int, n_jobs: int = 100) -> Outcome:
    """mosquitto frozen (SIGSTOP) mid-load for twice the hosts' keep alive of 2 s, the
    TCP links left open: each host must find the broker gone within 1.5 x the keep
    alive while it publishes, connect again once it continues, and send what was not
    acknowledged again."""
    out = Outcome("MQTT broker hung", seed)
    async with Cluster(seed, settings={"mqtt_keepalive_s": HANG_KEEPALIVE_S}) as c:
        # the freeze cuts both QoS 1 hops, as a restart does, and outlasts the takeover
        # of an entry whose send waits for its PUBACK: up to four copies (broker_restart)
        c.max_copies = 4
        async def fault() -> None:
            await asyncio.sleep(c.rng.uniform(0.3, 1.0))
            assert c.broker.proc is not None
            at = time.time()
            c.broker.proc.send_signal(signal.SIGSTOP)
            found: dict[str, float] = {}
            while time.time() - at < 2 * HANG_KEEPALIVE_S:
                for name, got in host_counts(c, "mqtt_keepalive_timeouts").items():
                    if got.get("mqtt_keepalive_timeouts") and name not in found:
                        found[name] = round(time.time() - at, 2)
                await asyncio.sleep(0.1)
            c.broker.proc.send_signal(signal.SIGCONT)
            c.windows.append((at, time.time() + RECONNECT_S))
            # the broker, back, publishes every host's Last Will (their connections
            # ended without a goodbye): each end is taken over, and every command still
            # open is sent again once per host
            for _ in c.hosts:
                c.host_killed(time.time())
            c.max_copies += 2
            out.faults += 1
            out.notes["found after s"] = found
            late = {n: t for n, t in found.items() if t > 1.5 * HANG_KEEPALIVE_S + 0.2}
            if len(found) < len(c.hosts) or late:
                out.problems.append(f"hosts that did not find the hung broker in time "
                                    f"(1.5 x {HANG_KEEPALIVE_S} s): {found}")
        await _during(c.load(n_jobs, 0.02), fault)
        return await c.check(out)


# Anonymous clients (the hosts, the station, the MES side) may do anything; the user
# "deaf" may use the equipment topics only, as an ACL written for a station might read.
DEAF_ACL = "topic readwrite #\nuser deaf\ntopic readwrite equipment/#\n"


async def acl_refused(seed: int, n_jobs: int = 100) -> Outcome:
    """A third host is started mid-load with MQTT credentials whose ACL keeps it from
    the MES topics (mosquitto grants the subscriptions and delivers nothing on them).
    It must stop with one line naming its ACL instead of serving deaf; the other two
    carry the load."""
    out = Outcome("a host the broker's ACL refuses", seed)
    cluster = Cluster(seed)
    acl = cluster.dir / "acl"
    acl.write_text(DEAF_ACL)
    cluster.broker.extra.append(f"acl_file {acl}")
    async with cluster as c:
        async def fault() -> None:
            await asyncio.sleep(c.rng.uniform(0.3, 1.0))
            deaf = HostProcess("h3", c.dir, {**c.settings, "mqtt_username": "deaf"})
            out.faults += 1
            code = await asyncio.to_thread(deaf.proc.wait, 30)
            last = deaf.tail(600).strip().splitlines()[-1:] or [""]
            out.notes["h3"] = f"exit {code}: {last[0][:160]}"
            if code != 1 or "ACL" not in last[0]:
                out.problems.append(f"the refused host: exit {code}, {deaf.tail(1500)}")
        await _during(c.load(n_jobs, 0.02), fault)
        return await c.check(out)


CLUSTER_COUNTERS = ("redis_cluster_table_reads", "redis_cluster_redirects",
                    "redis_cluster_retries")
ClusterFault = Callable[[Cluster, RedisClusterServer, int, Outcome], Awaitable[None]]


async def _on_redis_cluster(out: Outcome, seed: int, fault: ClusterFault,
                            n_jobs: int) -> Outcome:
    """The load on a Redis Cluster with ``fault(cluster, nodes, scope's slot, out)``
    mid-load; the notes say what the hosts' channels met, from their metrics."""
    async with Cluster(seed, redis_cluster=True) as c:
        nodes = c.redis
        assert isinstance(nodes, RedisClusterServer)
        slot = key_slot(K.work.encode())
        await _during(c.load(n_jobs, 0.02), lambda: fault(c, nodes, slot, out))
        await c.check(out)
        counts = await asyncio.to_thread(host_counts, c, *CLUSTER_COUNTERS)
    for n in CLUSTER_COUNTERS:
        out.notes[n.removeprefix("redis_cluster_")] = int(sum(h.get(n, 0)
                                                              for h in counts.values()))
    return out


async def _kill_slot_primary(c: Cluster, nodes: RedisClusterServer, slot: int,
                             out: Outcome) -> None:
    await asyncio.sleep(c.rng.uniform(0.5, 2.0))
    victim = await asyncio.to_thread(nodes.primary_of, slot)
    down = time.time()
    await asyncio.to_thread(victim.stop, signal.SIGKILL)
    while time.time() - down < 30:
        with contextlib.suppress(RuntimeError):
            if (await asyncio.to_thread(nodes.primary_of, slot)) is not victim \
                    and await asyncio.to_thread(nodes.is_ok):
                break
        await asyncio.sleep(0.05)
    out.notes["promoted after s"] = round(time.time() - down, 2)
    await asyncio.to_thread(victim.start)
    c.windows.append((down, time.time() + RECONNECT_S))
    out.faults += 1


async def cluster_primary_kill9(seed: int, n_jobs: int = 150) -> Outcome:
    """On a Redis Cluster (three primaries, a replica each, node timeout 0.5 s), the
    primary serving the scope's slot killed (SIGKILL) mid-load. Its replica is promoted;
    the hosts' channels meet a refused connection, then CLUSTERDOWN or MOVED, read the
    slot table again and go on. The killed node is started again once the promotion is
    seen, and joins as the new primary's replica.

    Replication is asynchronous: a write the killed primary acknowledged but had not yet
    sent to its replica is lost (docs/operations.md, "Redis Cluster"). On loopback that
    window is well under a millisecond, and any loss fails the run."""
    return await _on_redis_cluster(Outcome("Redis Cluster primary kill -9", seed), seed,
                                   _kill_slot_primary, n_jobs)


async def _move_slot(c: Cluster, nodes: RedisClusterServer, slot: int,
                     out: Outcome) -> None:
    await asyncio.sleep(c.rng.uniform(0.3, 1.5))
    src = await asyncio.to_thread(nodes.primary_of, slot)
    dst = c.rng.choice([n for n in nodes.nodes[:nodes.n_masters] if n is not src])
    at = time.time()
    out.notes["keys moved"] = await asyncio.to_thread(nodes.migrate, slot, src.port,
                                                      dst.port, batch=4, pause_s=0.05)
    out.notes["moving s"] = round(time.time() - at, 2)
    c.windows.append((at, time.time() + 0.5))
    out.faults += 1


async def cluster_reshard(seed: int, n_jobs: int = 150) -> Outcome:
    """On a Redis Cluster, the scope's slot migrated to another primary mid-load, as
    ``redis-cli --cluster reshard`` does it (MIGRATING/IMPORTING, the keys four at a time,
    then SETSLOT NODE on every node): while it moves, a script whose keys are half moved
    gets TRYAGAIN, a key already gone ASK; after it, MOVED."""
    return await _on_redis_cluster(Outcome("Redis Cluster reshard of the busy slot", seed),
                                   seed, _move_slot, n_jobs)


SCENARIOS: dict[str, Callable[[int], Awaitable[Outcome]]] = {
    "kill9": kill9,
    "kill9_patient": lambda seed: kill9(seed, claim_min_idle_ms=PATIENT_CLAIM_MS),
    "kill9_stalled_broker": kill9_stalled_broker,
    # two hosts on even seeds, three on odd ones
    "kill9_answers": lambda seed: kill9_answers(seed, hosts=2 + seed % 2),
    "kill9_answers_aedes": lambda seed: kill9_answers(seed, broker="aedes",
                                                      hosts=2 + seed % 2),
    "redis_restart": redis_restart,
    "redis_kill9": redis_kill9,
    "redis_kill9_lost_second": lambda seed: redis_kill9(seed, lose_s=LOST_S),
    "redis_kill9_always": lambda seed: redis_kill9(seed, appendfsync="always"),
    "broker_restart": broker_restart,
    "sigstop_one": sigstop,
    "sigstop_all": lambda seed: sigstop(seed, every_host=True),
    "clock_jump": clock_jump,
    "pause_storm": pause_storm,
    "mqtt_poison": mqtt_poison,
    "broker_hang": broker_hang,
    "acl_refused": acl_refused,
    "cluster_primary_kill9": cluster_primary_kill9,
    "cluster_reshard": cluster_reshard,
}
