"""Several host instances on the same scopes, in one process: every job ends exactly as
with one host, every command goes out once, every job order transition applies once,
and the work streams end with nothing pending and nothing dead.

Each instance is its own ``Host`` (own client, own consumer name, same group). The
station answers every command through a random instance, sometimes twice at once and
sometimes once more a little later (a late duplicate): both must be absorbed.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import Station, flush, quick_config, wait_until, work_master

from sfc_fast import Command
from sfc_fast.events import Completed
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

SCOPES = ("cellA", "cellB", "cellC")
N_TIGHTEN = 16              # tighten_rework jobs per scope
N_AXLE = 4                  # axle_fit_qa jobs per scope
QA = "com.example.station.qa_result.v1"
TORQUE = "com.example.station.torque_result.v1"
PULL_TYPES = (QA, TORQUE)
REFEED_S = 0.3              # a wait still open this long after its event gets another


def jobs_of(scope: str) -> list[tuple[str, str]]:
    """(job id, Work Master id) of a scope: tighten_rework jobs ``T..``, axle ``A..``.
    Every scope has the same job ids (ids are per scope: they are different jobs, with
    the same command ids)."""
    out = [(f"T{i:02d}", "wm_tighten") for i in range(N_TIGHTEN)]
    out += [(f"A{i:02d}", "wm_axle") for i in range(N_AXLE)]
    return out


def reworks(job: str) -> int:
    """How many times a tighten_rework job's tightening is out of tolerance (0-2)."""
    return int(job[1:3]) % 3


class MultiStation(Station):
    """Answers through a random host; sometimes twice at once, sometimes again later."""

    def __init__(self, seed: int, dup_rate: float = 0.25, late_rate: float = 0.15) -> None:
        super().__init__(self._result)
        self.rng = random.Random(seed)
        self.dup_rate = dup_rate
        self.late_rate = late_rate
        self.duplicates = 0
        self.late: list[asyncio.TimerHandle] = []
        self._tightens: Counter[tuple[str, str]] = Counter()

    def _result(self, cmd: Command) -> dict[str, Any] | None:
        if cmd.action == "tighten" and cmd.job.startswith("T"):
            self._tightens[(cmd.scope, cmd.job)] += 1
            k = self._tightens[(cmd.scope, cmd.job)]
            return {"torque": 70 if k <= reworks(cmd.job) else 85}
        if cmd.action == "tighten":
            return {"torque": 85}
        return None

    def _on_command(self, cmd: Command) -> None:
        self.commands.append(cmd)
        ev = Completed(cmd.command_id, self.answer_fn(cmd))
        self.rng.choice(self.hosts).answer(cmd.scope, ev)
        if self.rng.random() < self.dup_rate:
            self.duplicates += 1
            self.rng.choice(self.hosts).answer(cmd.scope, ev)
        if self.rng.random() < self.late_rate:
            self.duplicates += 1
            host = self.rng.choice(self.hosts)
            delay = self.rng.uniform(0.02, 0.3)
            self.late.append(asyncio.get_running_loop().call_later(
                delay, host.answer, cmd.scope, ev))


async def feed_pull_events(station: MultiStation, hosts: list[Host],
                           stop: asyncio.Event) -> None:
    """The pull side of axle_fit_qa: one event per open wait (an event settles the
    oldest wait of its type, so a wait still open a while after its event gets
    another one; an extra event is absorbed or goes unmatched)."""
    fed: dict[tuple[str, str, bytes], float] = {}
    loop = asyncio.get_running_loop()
    c = hosts[0].client
    while not stop.is_set():
        for scope in SCOPES:
            k = ScopeKeys(scope)
            for t in PULL_TYPES:
                for job in await c.zrange(k.waits(t), 0, -1):
                    last = fed.get((scope, t, job))
                    if last is not None and loop.time() - last < REFEED_S:
                        continue
                    fed[(scope, t, job)] = loop.time()
                    data = {"torque_ok": True, "torque": 85} if t == TORQUE else {"ok": True}
                    await station.rng.choice(hosts).queue_event(scope, t, data=data)
        await asyncio.sleep(0.01)


async def workload(redis_url: str, n_hosts: int, seed: int) -> dict[str, Any]:
    """Run every job of every scope on ``n_hosts`` instances; what was seen."""
    await flush(redis_url)
    rng = random.Random(seed)
    station = MultiStation(seed)
    ended: list[tuple[str, str, str, str | None]] = []
    hosts = [station.attach(Host(
        quick_config(redis_url, consumer=f"h{i + 1}", scopes=list(SCOPES)), station.sink,
        on_end=lambda s, j, d: ended.append((s, j, d.status, d.reason))))
        for i in range(n_hosts)]
    all_jobs = [(s, j, wm) for s in SCOPES for j, wm in jobs_of(s)]
    stop = asyncio.Event()
    feeder: asyncio.Task[None] | None = None
    try:
        for s in SCOPES:
            await hosts[0].store.put_work_master(s, work_master("tighten_rework", "wm_tighten"))
            await hosts[0].store.put_work_master(s, work_master("axle_fit_qa", "wm_axle"))
        for h in hosts:
            await h.start()
        feeder = asyncio.create_task(feed_pull_events(station, hosts, stop))
        rng.shuffle(all_jobs)
        await asyncio.gather(*(rng.choice(hosts).orders.store_order(
            s, {"JobOrderID": j,
                "WorkMasterID": [{"ID": wm}]}, start=True) for s, j, wm in all_jobs))
        await wait_until(lambda: len(ended) >= len(all_jobs), timeout=10,
                         what=f"all {len(all_jobs)} jobs to end")
        c = hosts[0].client

        async def orders_done() -> bool:
            pipe = c.pipeline(transaction=False)
            for s, j, _ in all_jobs:
                pipe.hget(ScopeKeys(s).order(j), "state")
            return all(v == b"Ended_Completed" for v in await pipe.execute())

        await wait_until(orders_done, timeout=10, what="every job order Ended_Completed")

        async def quiet() -> bool:
            for s in SCOPES:
                k = ScopeKeys(s)
                if (await c.xpending(k.work, "sfc-host"))["pending"]:
                    return False
            return True

        await wait_until(quiet, timeout=10, what="nothing pending in the work streams")
        # Late duplicates all delivered and absorbed.
        await wait_until(lambda: all(h.when() <= asyncio.get_running_loop().time()
                                     for h in station.late), timeout=5, what="late answers")
        await wait_until(
            lambda: sum(h.metrics["answers_applied"] + h.metrics["answers_absorbed"]
                        for h in hosts) == len(station.commands) + station.duplicates,
            timeout=5, what="every answer settled")
        stop.set()
        await feeder
        feeder = None

        result: dict[str, Any] = {"ended": ended, "station": station, "hosts": hosts}
        per_job: dict[tuple[str, str], list[str]] = defaultdict(list)
        for cmd in station.commands:
            per_job[(cmd.scope, cmd.job)].append(cmd.command_id)
        result["commands"] = dict(per_job)
        pipe = c.pipeline(transaction=False)
        for s, j, _ in all_jobs:
            pipe.hgetall(ScopeKeys(s).order(j))
        result["orders"] = {(s, j): o for (s, j, _), o in zip(all_jobs, await pipe.execute(),
                                                               strict=True)}
        result["views"] = {(s, j): await hosts[0].inspect(s, j) for s, j, _ in all_jobs}
        pend, dead, due, active = {}, {}, {}, {}
        for s in SCOPES:
            k = ScopeKeys(s)
            pend[s] = (await c.xpending(k.work, "sfc-host"))["pending"]
            dead[s] = await c.xlen(k.dead)
            due[s] = await c.zcard(k.due)
            active[s] = await c.scard(k.active)
        result.update(pending=pend, dead=dead, due=due, active=active)
        return result
    finally:
        stop.set()
        if feeder is not None:
            feeder.cancel()
        for h in station.late:
            h.cancel()
        for h in hosts:
            await h.aclose()


@pytest.fixture(scope="module")
def reference(redis_url: str) -> dict[str, Any]:
    """The same workload on one host: what every multi-host run must reproduce."""
    return run(workload(redis_url, 1, seed=1))


def expected_ids(scope: str, job: str) -> list[str]:
    if job.startswith("A"):
        return [f"{job}:position_axle#1", f"{job}:tighten#2"]
    ids = [f"{job}:load_part#1"]
    n = 2
    for _ in range(reworks(job)):
        ids += [f"{job}:tighten#{n}", f"{job}:loosen#{n + 1}"]
        n += 2
    return [*ids, f"{job}:tighten#{n}", f"{job}:unload_part#{n + 1}"]


def check_run(res: dict[str, Any]) -> None:
    all_jobs = [(s, j) for s in SCOPES for j, _ in jobs_of(s)]
    # Each job ended once, completed.
    ends = Counter((s, j) for s, j, _, _ in res["ended"])
    assert set(ends) == set(all_jobs)
    assert [k for k, n in ends.items() if n != 1] == []
    assert {st for _, _, st, _ in res["ended"]} == {"completed"}
    for key in all_jobs:
        ids = res["commands"][key]
        assert len(ids) == len(set(ids)), f"{key}: a command id went out twice: {ids}"
        assert ids == expected_ids(*key)
        order = res["orders"][key]
        # Store-and-start, Run, Complete: three writes, each once.
        assert order[b"state"] == b"Ended_Completed", (key, order)
        assert order[b"v"] == b"3", (key, order)
        assert res["views"][key]["status"] == "completed"
    assert res["pending"] == dict.fromkeys(SCOPES, 0)
    assert res["dead"] == dict.fromkeys(SCOPES, 0)
    assert res["due"] == dict.fromkeys(SCOPES, 0)
    assert res["active"] == dict.fromkeys(SCOPES, 0)
    hosts = res["hosts"]
    # Every command was answered; each answer applied once, every duplicate absorbed.
    assert sum(h.metrics["answers_applied"] for h in hosts) == len(res["station"].commands)
    assert (sum(h.metrics["answers_absorbed"] for h in hosts)
            == res["station"].duplicates)
    assert sum(h.metrics["answer_errors"] for h in hosts) == 0
    assert sum(h.metrics["dead_entries"] for h in hosts) == 0


def test_single_host_reference_run(reference: dict[str, Any]) -> None:
    check_run(reference)
    assert reference["station"].duplicates > 0


@pytest.mark.parametrize(("n_hosts", "seed"), [(2, 2), (2, 12), (3, 3), (3, 13)])
def test_instances_end_every_job_as_one_host_does(
        redis_url: str, reference: dict[str, Any], n_hosts: int, seed: int) -> None:
    res = run(workload(redis_url, n_hosts, seed))
    check_run(res)
    # Same final status and the same command ids, in the same order, per job.
    assert {(s, j): st for s, j, st, _ in res["ended"]} == \
        {(s, j): st for s, j, st, _ in reference["ended"]}
    assert res["commands"] == reference["commands"]
    # The work was spread: every instance handled entries and applied answers.
    for h in res["hosts"]:
        assert h.metrics["entries"] > 0, h.config.consumer
        assert h.metrics["answers_applied"] > 0, h.config.consumer
    assert res["station"].duplicates > 0


class AlternatingStation(MultiStation):
    """Answers the commands of each job through the hosts in turn: the host that wrote
    a job last is never the one that gets the answer to the command it issued."""

    def __init__(self) -> None:
        super().__init__(seed=0, dup_rate=0, late_rate=0)
        self._turn: Counter[tuple[str, str]] = Counter()

    def _on_command(self, cmd: Command) -> None:
        self.commands.append(cmd)
        k = self._turn[(cmd.scope, cmd.job)]
        self._turn[(cmd.scope, cmd.job)] += 1
        host = self.hosts[k % len(self.hosts)]
        host.answer(cmd.scope, Completed(cmd.command_id, self.answer_fn(cmd)))


def test_answers_alternating_between_hosts(redis_url: str) -> None:
    """Each answer of a job goes through the other host than the one before: a host
    that has an older state of the job in memory must still apply the answer to the
    job's current command (read it again), not absorb it as a late one."""
    async def main() -> None:
        await flush(redis_url)
        station = AlternatingStation()
        ended: list[tuple[str, str]] = []
        hosts = [station.attach(Host(
            quick_config(redis_url, consumer=f"h{i}", scopes=["cellA"]), station.sink,
            on_end=lambda s, j, d: ended.append((j, d.status)))) for i in (1, 2)]
        jobs = [f"T{i:02d}.cellA" for i in range(6)]
        try:
            await hosts[0].store.put_work_master("cellA", work_master("tighten_rework", "wm1"))
            for h in hosts:
                await h.start()
            for j in jobs:
                await hosts[0].orders.store_order("cellA", {"JobOrderID": j,
                                                            "WorkMasterID": [{"ID": "wm1"}]},
                                                  start=True)
            await wait_until(lambda: len(ended) == len(jobs), timeout=5,
                             what="every job to end")
            assert sorted(ended) == [(j, "completed") for j in jobs]
            for j in jobs:
                assert [c.command_id for c in station.commands if c.job == j] == \
                    expected_ids("cellA", j)
            assert sum(h.metrics["answers_absorbed"] for h in hosts) == 0
        finally:
            for h in hosts:
                await h.aclose()
    run(main())


def test_same_job_id_in_two_scopes_in_one_dispatch_batch(redis_url: str) -> None:
    """Job ids are per scope: ``J1`` in cellA and ``J1`` in cellB are two jobs, and
    both get their first command at once, also when their dispatch entries are read in
    one batch."""
    async def main() -> None:
        await flush(redis_url)
        station = Station(lambda c: False)     # commands are only recorded
        host = station.attach(Host(quick_config(redis_url, scopes=["cellA", "cellB"]),
                                   station.sink))
        try:
            for s in ("cellA", "cellB"):
                await host.store.put_work_master(s, work_master("tighten_rework", "wm1"))
                await host.orders.store_order(s, {"JobOrderID": "J1",
                                                  "WorkMasterID": [{"ID": "wm1"}]},
                                              start=True)
            await host.start()     # both start entries in the first read, so both
            await wait_until(      # dispatch entries in the next one
                lambda: sorted((c.scope, c.command_id) for c in station.commands)
                == [("cellA", "J1:load_part#1"), ("cellB", "J1:load_part#1")],
                timeout=3, what="J1's first command in both scopes")
        finally:
            await host.aclose()
    run(main())


def test_more_concurrent_calls_than_the_pool_has(redis_url: str) -> None:
    """Job control requests arrive concurrently (one coroutine per MES request): more of
    them at once than the pool has connections must wait, not fail."""
    async def main() -> None:
        await flush(redis_url)
        host = Host(quick_config(redis_url, scopes=["cellA"]), Station().sink)
        try:
            await host.store.put_work_master("cellA", work_master("tighten_rework", "wm1"))
            await host.start()
            n = host.config.redis_pool_size * 3
            states = await asyncio.gather(*(host.orders.store_order(
                "cellA", {"JobOrderID": f"J{i}", "WorkMasterID": [{"ID": "wm1"}]}, start=True)
                for i in range(n)))
            assert states == ["AllowedToStart_Ready"] * n
        finally:
            await host.aclose()
    run(main())
