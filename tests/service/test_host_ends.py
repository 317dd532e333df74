"""The ends of hosts' runs, taken over once: a Last Will seen by several hosts is taken
by one; a retained one seen on subscribing counts too; a host's own previous run found
in Redis is taken at start; a host's own status and "online" ones are not ends. Real
Redis and mosquitto; the take-over itself is counted, not run (the fault rows in
``tests/faults`` run it end to end)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink
from sfc_host.service.app import App
from sfc_host.service.ends import RunEnds
from sfc_host.store.keys import HOSTS, run_taken

PREFIX = "ends-test"


class Watcher:
    """A link and a ``RunEnds`` as a host has them, counting its take-overs."""

    def __init__(self, mqtt_url: str, redis_url: str, consumer: str, run_id: str) -> None:
        # a prefix of this module's own: the session's broker keeps other tests' retained
        # statuses (their hosts' Wills) under the default one
        self.config = HostConfig(mqtt_url=mqtt_url, redis_url=redis_url, consumer=consumer,
                                 mes_prefix=PREFIX)
        self.link = MqttLink(self.config, Metrics())
        self.client = aioredis.Redis.from_url(redis_url)
        self.taken = 0
        self.ends = RunEnds(self.link, self.client, Metrics(), consumer, run_id, self._take)

    async def _take(self) -> int:
        self.taken += 1
        return 0

    async def start(self) -> Watcher:
        await self.link.start()
        await self.link.wait_connected()
        await wait_until(lambda: self.link.listening, 10, "the subscriptions")
        await self.ends.start()
        return self

    async def aclose(self) -> None:
        await self.ends.aclose()
        await self.link.aclose()
        await self.client.aclose()


def status(host: str, run_id: str, online: bool, reason: str = "") -> bytes:
    body: dict[str, Any] = {"host": host, "online": online, "started_at": run_id}
    if reason:
        body["reason"] = reason
    return json.dumps(body).encode()


def test_a_death_seen_by_two_hosts_is_taken_over_once(mqtt_url: str, redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        a = await Watcher(mqtt_url, redis_url, "ends-a", "run-a").start()
        b = await Watcher(mqtt_url, redis_url, "ends-b", "run-b").start()
        try:
            a.link.publish_nowait(f"{PREFIX}/hosts/ends-x", status(
                "ends-x", "run-x", False, "the connection ended without a goodbye"), qos=1,
                retain=True)
            await wait_until(lambda: a.taken + b.taken >= 1, 10, "the take-over")
            await asyncio.sleep(0.3)
            assert a.taken + b.taken == 1
            assert await a.client.get(run_taken("ends-x", "run-x")) in (b"ends-a", b"ends-b")
            # a host that starts later sees the retained Will: taken already, nothing more
            c = await Watcher(mqtt_url, redis_url, "ends-c", "run-c").start()
            await asyncio.sleep(0.5)
            assert c.taken == 0 and a.taken + b.taken == 1
            await c.aclose()
            # a status that is online, or not JSON: not an end
            a.link.publish_nowait(f"{PREFIX}/hosts/ends-y", status("ends-y", "run-y", True), qos=1)
            a.link.publish_nowait(f"{PREFIX}/hosts/ends-z", b"not json", qos=1)
            await asyncio.sleep(0.5)
            assert a.taken + b.taken == 1
            # a host's own stop is taken by the other, never by itself
            before_a, before_b = a.taken, b.taken
            a.link.publish_nowait(f"{PREFIX}/hosts/ends-a", status("ends-a", "run-a", False,
                                                             "stopped"), qos=1)
            await wait_until(lambda: b.taken == before_b + 1, 10, "the other's take-over")
            await asyncio.sleep(0.3)
            assert a.taken == before_a
        finally:
            a.link.publish_nowait(f"{PREFIX}/hosts/ends-x", b"", qos=1, retain=True)
            await a.aclose()
            await b.aclose()
    run(main())


def test_a_retained_will_seen_at_start_is_taken_over(mqtt_url: str, redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        pub = MqttLink(HostConfig(mqtt_url=mqtt_url, consumer="ends-pub", mes_prefix=PREFIX),
                       Metrics())
        await pub.start()
        await pub.wait_connected()
        pub.publish_nowait(f"{PREFIX}/hosts/ends-gone", status("ends-gone", "run-1", False,
                                                         "Last Will"), qos=1, retain=True)
        await asyncio.sleep(0.2)
        w = await Watcher(mqtt_url, redis_url, "ends-late", "run-l").start()
        try:
            await wait_until(lambda: w.taken == 1, 10, "the take-over of a retained Will")
        finally:
            pub.publish_nowait(f"{PREFIX}/hosts/ends-gone", b"", qos=1, retain=True)
            await w.aclose()
            await pub.aclose()
    run(main())


def test_a_hosts_own_previous_run_is_taken_over_at_start(mqtt_url: str,
                                                         redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        r = aioredis.Redis.from_url(redis_url)
        await r.hset(HOSTS, "ends-solo", "run-before")   # a run that died, alone
        w = await Watcher(mqtt_url, redis_url, "ends-solo", "run-now").start()
        try:
            await wait_until(lambda: w.taken == 1, 10, "the previous run's take-over")
            assert await r.hget(HOSTS, "ends-solo") == b"run-now"
            assert await r.get(run_taken("ends-solo", "run-before")) == b"ends-solo"
        finally:
            await w.aclose()
        # the next start of the same run (same id) takes nothing
        w2 = await Watcher(mqtt_url, redis_url, "ends-solo", "run-now").start()
        await asyncio.sleep(0.3)
        assert w2.taken == 0
        await w2.aclose()
        await r.aclose()
    run(main())


def test_a_clean_stop_is_recorded_and_costs_no_resend(mqtt_url: str, redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        other = await Watcher(mqtt_url, redis_url, "ends-other", "run-o").start()
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, consumer="ends-app",
                               mes_prefix=PREFIX))
        await app.start(connect_timeout_s=5)
        run_id = app.presence.started_at
        await app.aclose()
        try:
            assert await other.client.get(run_taken("ends-app", run_id)) == b"ends-app"
            await asyncio.sleep(0.5)           # its "offline" has reached the other
            assert other.taken == 0
        finally:
            await other.aclose()
    run(main())
