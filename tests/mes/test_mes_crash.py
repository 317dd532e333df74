"""``kill -9`` of ``sfc-host run`` in the middle of a storm of MES StoreAndStart requests:
real redis-server and mosquitto, the host as a process of its own, an MES as a separate
MQTT client.

The MES keeps 20 requests in flight, each order ending at once (a recipe of one step
and no action), and sends a request again, with the same CloudEvent id, when no reply
came within 2 s. After the 60th reply Redis holds writes for 0.3 s and the host is
killed, then started again. Every request the killed host had acknowledged (its PUBACK,
read by a relay between host and broker) had its order stored when it died. Then every
request has been answered, each order was stored once and ended, and a subscriber that
connects after the run finds every order's retained result and final state, and the
state index listing them all with a result; the MES saw every order's end event.
The orders that ended in the killed host's last moments are the ones this is about: their
retained state was still to be published when it died (``benchmarks/reliability.py``
runs the same storm as its ``mes_kill9`` row).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from helpers.aio import run
from helpers.hosts import V110, flush, quick_config, wait_until, work_master
from helpers.mes import JC, WM, Mes, order, start_app
from helpers.servers import MosquittoServer, RedisServer, free_port

from sfc_fast.wire.mqtt5 import MalformedPacket, Message, Reader
from sfc_host.execution.host import Host
from sfc_host.isa95 import state_list, state_name
from sfc_host.mes import publishing
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.orders import NO_ERROR
from sfc_host.store.outbox import Outbox
from sfc_host.store.states import Record

SCOPE = "line1"
K = ScopeKeys(SCOPE)
N_ORDERS = 200
KILL_AFTER = 60          # replies before the kill
IN_FLIGHT = 20           # requests the MES has in flight at once
RETRY_S = 2.0            # the MES sends a request again after this long without a reply
INSTANT = {"ID": "instant", "dataschema": V110, "data": {
    "Steps": [{"Name": "Work", "Initial": True}], "Transitions": [], "Actions": []}}
ENDED = "Ended_Completed"
LATE_S = 5.0             # how long the late subscriber waits for what is missing


@dataclass
class StormRun:
    """What one storm with a kill did: every list names orders, and is empty on a pass."""

    orders: int = 0
    requests: int = 0                       # sent, repeats included
    repeats: int = 0                        # sent again for want of a reply
    seconds: float = 0.0
    unanswered: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)       # a reply other than NO_ERROR
    not_ended: list[str] = field(default_factory=list)
    stored_again: list[str] = field(default_factory=list)  # more writes than one run's 3
    no_result: list[str] = field(default_factory=list)     # no retained result/{id}
    stale_order: list[str] = field(default_factory=list)   # retained order/{id} not ended
    no_end_event: list[str] = field(default_factory=list)
    index_problem: str = ""
    acked_at_kill: int = 0                  # requests the killed host had acknowledged
    acked_not_stored: list[str] = field(default_factory=list)   # ... without their order

    @property
    def lost(self) -> list[str]:
        return sorted({*self.unanswered, *self.refused, *self.not_ended, *self.stored_again,
                       *self.no_result, *self.stale_order, *self.no_end_event,
                       *self.acked_not_stored})

    @property
    def ok(self) -> bool:
        return not self.lost and not self.index_problem

    def summary(self) -> str:
        parts = [f"{name} {getattr(self, name)}" for name in (
            "unanswered", "refused", "not_ended", "stored_again", "no_result",
            "stale_order", "no_end_event", "acked_not_stored") if getattr(self, name)]
        if self.index_problem:
            parts.append(f"state index: {self.index_problem}")
        return (f"{self.orders} orders, {self.requests} requests ({self.repeats} repeats), "
                f"{self.seconds:.1f} s" + ("" if not parts else "; " + "; ".join(parts)))


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Tap:
    """A TCP relay between the host and the broker that reads what passes: the MES
    requests the broker delivers to the host (packet id -> job order id, per
    connection) and the host's PUBACKs, so a test knows which requests the host had
    acknowledged when it was killed."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.acked: set[str] = set()
        self.server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"mqtt://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks):
            t.cancel()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        jobs: dict[int, str] = {}        # packet id of a request in flight -> its job
        down = asyncio.ensure_future(self._down(up_r, w, jobs))
        self._tasks.add(down)
        try:
            await self._up(r, up_w, jobs)
        finally:
            down.cancel()
            self._tasks.discard(down)
            up_w.close()
            w.close()

    async def _down(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    jobs: dict[int, str]) -> None:
        """Broker to host: each QoS 1 MES request's packet id and job."""
        reader = Reader(True)
        with contextlib.suppress(ConnectionError, MalformedPacket):
            while data := await r.read(65536):
                for item in reader.feed(data):
                    if type(item) is Message and item.qos and \
                            item.topic.endswith("/commands"):
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            body = json.loads(item.payload)
                            body = body.get("data", body)
                            jobs[item.mid] = body["JobOrder"]["JobOrderID"]
                w.write(data)

    async def _up(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                  jobs: dict[int, str]) -> None:
        """Host to broker: the PUBACKs of those requests."""
        buf = b""
        with contextlib.suppress(ConnectionError):
            while data := await r.read(65536):
                w.write(data)
                buf += data
                while len(buf) >= 2:
                    n, shift, i = 0, 0, 1
                    while i < len(buf) and buf[i] & 0x80:
                        n |= (buf[i] & 0x7F) << shift
                        shift += 7
                        i += 1
                    if i >= len(buf):
                        break
                    n |= buf[i] << shift
                    if len(buf) < i + 1 + n:
                        break
                    if buf[0] >> 4 == 4:               # PUBACK
                        job = jobs.pop(int.from_bytes(buf[i + 1:i + 3], "big"), None)
                        if job is not None:
                            self.acked.add(job)
                    buf = buf[i + 1 + n:]


class HostRun:
    """``sfc-host run`` as a process of its own, its log in a file (a pipe nobody reads
    would fill and stop it)."""

    def __init__(self, workdir: Path, redis_url: str, mqtt_url: str, prefix: str) -> None:
        self.port = free_port()
        self.conf = workdir / "host.toml"
        self.conf.write_text(
            f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\nmes_prefix = "{prefix}"\n'
            f'consumer = "crash"\nmetrics_port = {self.port}\nlog_level = "WARNING"\n'
            "sweep_interval_ms = 50\ndiscover_interval_ms = 100\nread_block_ms = 20\n"
            "claim_min_idle_ms = 300\nclaim_interval_ms = 100\n")
        self.log = workdir / "host.log"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 20) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sfc_host", "run", "--config", str(self.conf)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        end = time.monotonic() + timeout
        while not await asyncio.to_thread(_ready, self.port):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the host did not start:\n{self.tail()}")
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()                  # SIGKILL: nothing of the host runs after it
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


async def _reply(mes: Mes, rid: str, timeout: float) -> dict[str, Any] | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rep = mes.replies.get(rid)
        if rep is not None:
            return rep
        await asyncio.sleep(0.01)
    return None


async def storm(redis_url: str, mqtt_url: str, workdir: Path, *,
                kill_after: int = KILL_AFTER, n_orders: int = N_ORDERS,
                deadline_s: float = 25) -> StormRun:
    """The storm, the kill and the restart, then what a late subscriber finds."""
    await flush(redis_url)
    prefix = f"crash{uuid.uuid4().hex[:8]}"      # no retained message of another run
    tap = Tap(int(mqtt_url.rsplit(":", 1)[1]))
    host = HostRun(workdir, redis_url, await tap.start(), prefix)
    out = StormRun(orders=n_orders)
    jobs = [f"C{i:03d}" for i in range(n_orders)]
    redis = aioredis.Redis.from_url(redis_url)
    t0 = time.monotonic()
    end = t0 + deadline_s
    try:
        await host.start()
        async with Mes(mqtt_url, prefix=prefix, scope=SCOPE) as mes:
            rep = await mes.call(WM, INSTANT)
            assert rep["data"]["ReturnStatus"] == NO_ERROR, rep
            answered = 0
            kill_now = asyncio.Event()
            window = asyncio.Semaphore(IN_FLIGHT)

            async def request(job: str) -> None:
                nonlocal answered
                rid = str(uuid.uuid4())             # the same id on every repeat
                async with window:
                    while time.monotonic() < end:
                        await mes.send(JC + "StoreAndStart.v2", order(job, "instant"),
                                       rid=rid)
                        out.requests += 1
                        rep = await _reply(mes, rid, RETRY_S)
                        if rep is None:
                            out.repeats += 1
                            continue
                        if rep["data"].get("ReturnStatus") != NO_ERROR:
                            out.refused.append(job)
                        answered += 1
                        if answered == kill_after:
                            kill_now.set()
                        return
                    out.unanswered.append(job)

            async def crash() -> None:
                await kill_now.wait()
                # Redis holds writes a moment before the kill: requests that reach the
                # host then wait in their handlers, and one acknowledged before its
                # order is stored would be lost with the host
                await redis.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
                await asyncio.sleep(0.3)
                host.kill()
                # what the dead host acknowledged must be stored (its order exists)
                acked = sorted(tap.acked)
                pipe = redis.pipeline(transaction=False)
                for j in acked:
                    pipe.exists(K.order(j))
                out.acked_at_kill = len(acked)
                out.acked_not_stored = [j for j, n in zip(acked, await pipe.execute(),
                                                          strict=True) if not n]
                await redis.execute_command("CLIENT", "UNPAUSE")
                await host.start()

            crasher = asyncio.create_task(crash())
            await asyncio.gather(*(request(j) for j in jobs))
            await asyncio.wait_for(crasher, max(1.0, end - time.monotonic()))

            # every order ends, each stored once: Store, Run and Complete are its writes
            async def orders() -> list[list[bytes | None]]:
                pipe = redis.pipeline(transaction=False)
                for j in jobs:
                    pipe.hmget(K.order(j), "state", "v")
                return list(await pipe.execute())
            rows = await orders()
            while not all(s == ENDED.encode() for s, _ in rows) and time.monotonic() < end:
                await asyncio.sleep(0.05)
                rows = await orders()
            for j, (s, v) in zip(jobs, rows, strict=True):
                if s != ENDED.encode():
                    out.not_ended.append(j)
                elif v != b"3":
                    out.stored_again.append(j)

            # every ended order's end event reached the MES that was there all along
            def no_end() -> list[str]:
                return [j for j in jobs
                        if ENDED not in mes.states(j) and j not in out.not_ended]
            settle = time.monotonic() + LATE_S
            while no_end() and time.monotonic() < settle:
                await asyncio.sleep(0.05)
            out.no_end_event = no_end()

        # an MES connecting now sees every order's retained result and final state
        async with Mes(mqtt_url, prefix=prefix, scope=SCOPE) as late:
            def missing() -> tuple[list[str], list[str], list[str]]:
                """Orders without their retained result, final state, index entry."""
                idx = late.retained_json("state-index") or {}
                listed = {e["job_order_id"]: (state_name(e["state"]), e["has_result"])
                          for e in idx.get("jobs", [])}
                return ([j for j in jobs if (late.retained_json(f"result/{j}") or {})
                         .get("JobState") != state_list(ENDED)],
                        [j for j in jobs if (late.retained_json(f"order/{j}") or {})
                         .get("State") != state_list(ENDED)],
                        [j for j in jobs if listed.get(j) != (ENDED, True)])
            settle = time.monotonic() + LATE_S
            while any(missing()) and time.monotonic() < settle:
                await asyncio.sleep(0.05)
            out.no_result, out.stale_order, unlisted = missing()
            if unlisted:
                out.index_problem = f"{len(unlisted)} orders not listed as ended with a " \
                                    f"result: {unlisted[:10]}"
        out.seconds = time.monotonic() - t0
        return out
    finally:
        host.stop()
        await tap.aclose()
        await redis.aclose()


async def storm_with_own_servers(seed: int) -> StormRun:
    """The storm on a redis-server and mosquitto of its own, killed after a reply count
    drawn from ``seed`` (``benchmarks/reliability.py``)."""
    kill_after = random.Random(seed).randint(20, N_ORDERS - 20)
    workdir = Path(tempfile.mkdtemp(prefix="sfc-mes-crash-"))
    redis, broker = RedisServer(workdir / "redis"), MosquittoServer(workdir / "mqtt")
    try:
        await asyncio.to_thread(redis.start)
        await asyncio.to_thread(broker.start)
        return await storm(redis.url, broker.url, workdir, kill_after=kill_after)
    finally:
        await asyncio.to_thread(broker.stop)
        await asyncio.to_thread(redis.stop)
        if not os.environ.get("FAULT_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.servers
def test_kill_9_under_an_mes_storm_leaves_every_ended_order_retained(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    out = asyncio.run(asyncio.wait_for(storm(redis_url, mqtt_url, tmp_path), 60))
    log = (tmp_path / "host.log").read_text(errors="replace")[-3000:] \
        if (tmp_path / "host.log").exists() else ""
    assert out.ok, out.summary() + "\n--- host log:\n" + log
    assert out.repeats > 0, "the kill cost no request a repeat: it missed the storm"
    assert out.acked_at_kill >= 40, out.acked_at_kill   # the check saw the host's acks


@pytest.mark.servers
def test_a_stamp_leaves_the_outbox_only_as_read(redis_url: str) -> None:
    """An order write and a job response stamp the order; a publisher's take-out of a
    stamp it read leaves a newer one; a host without the MES side stamps nothing."""
    async def main() -> None:
        await flush(redis_url)
        h = Host(quick_config(redis_url), loops=False)
        h.store.outbox = True
        box = Outbox(h.scripts)
        try:
            await h.store.put_work_master(SCOPE, work_master("tighten_rework", "wm"))
            await h.orders.store_order(SCOPE, order("O1")["JobOrder"], start=False)
            [read] = await box.read(K, ["O1"])
            assert read.state == "NotAllowedToStart_Ready" and read.stamp is not None
            await h.orders.trigger(SCOPE, "O1", "Abort")          # written after the read
            assert await box.take(K, [("O1", read.stamp)]) == 0
            [now] = await box.read(K, ["O1"])
            assert now.state == "Aborted" and int(now.stamp or 0) > int(read.stamp)
            assert await box.take(K, [("O1", now.stamp or b"")]) == 1
            assert (await box.read(K, ["O1"]))[0].stamp is None
            # a job response (cas.lua) stamps its order too
            await h.store.commit({SCOPE: [Record("O1", b"0", b"s", None, None,
                                                 response=b'{"JobOrderID":"O1"}')]})
            [resp] = await box.read(K, ["O1"])
            assert resp.response == b'{"JobOrderID":"O1"}' and resp.stamp is not None
            assert int(resp.stamp) > int(now.stamp or 0)
            assert await box.take(K, [("O1", resp.stamp)]) == 1
            h.store.outbox = False
            await h.orders.trigger(SCOPE, "O1", "Clear")
            assert (await box.read(K, ["O1"]))[0].stamp is None
        finally:
            await h.aclose()
    run(main())


@pytest.mark.servers
def test_a_running_host_publishes_what_another_left_in_the_outbox(
        redis_url: str, mqtt_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes another host wrote and died before publishing (its order writes stamped,
    nothing sent) reach the MES from a host that was running all along: the retained
    order, the index and the end's status event, then the outbox is empty."""
    monkeypatch.setattr(publishing, "SCAN_S", 0.2)
    monkeypatch.setattr(publishing, "LEFTOVER_S", 0.3)

    async def main() -> None:
        prefix = f"left{uuid.uuid4().hex[:8]}"
        app = await start_app(redis_url, mqtt_url, mes_prefix=prefix)
        dead = Host(quick_config(redis_url), loops=False)
        dead.store.outbox = True
        try:
            async with Mes(mqtt_url, prefix=prefix) as mes:
                await dead.orders.store_order(SCOPE, order("L1")["JobOrder"], start=False)
                await dead.orders.trigger(SCOPE, "L1", "Abort")
                await wait_until(lambda: (mes.retained_json("order/L1") or {}).get("State")
                                 == state_list("Aborted"), 5, "the retained order")
                await wait_until(lambda: mes.index().get("L1") == "Aborted", 5, "the index")
                await wait_until(lambda: "Aborted" in mes.states("L1"), 5, "the end event")
                ev = next(e for e in mes.events if e["data"]["JobOrder"]["JobOrderID"] == "L1")
                assert "correlationid" not in ev          # the request is not known
                await wait_until(_outbox_empty(app.host), 5, "the outbox emptied")
        finally:
            await dead.aclose()
            await app.aclose()
    run(main())


def _outbox_empty(host: Host) -> Any:
    async def check() -> bool:
        return not await host.client.hgetall(K.outbox)
    return check

