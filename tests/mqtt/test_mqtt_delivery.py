"""Ready means listening: a host says ready only once the broker delivers what it
subscribed to, on the first connection and after every reconnect; a broker that
rewrites dotted topics is named in one line; a message no subscription matches is said
once per topic with what probably happened; an MQTT 5 CONNECT closed without a CONNACK
hints at ``mqtt_version = 3``. Scripted brokers, a real Redis."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers.aio import run
from helpers.health import get
from helpers.hosts import flush, quick_config, wait_until
from helpers.scripted_broker import (
    ScriptedBroker,
    publish,
    publish_parts,
    read_packet,
    suback,
    subscribe_filters,
    unsuback,
)
from helpers.servers import free_port

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink, MqttUnsupported
from sfc_host.mqtt import subscriber as subscriber_module
from sfc_host.mqtt.topics import topic_matches
from sfc_host.service.app import App


async def readyz(port: int) -> tuple[int, str]:
    return await get(port, "/readyz")


class LoopBroker:
    """A broker script that grants every subscription and delivers what matches, with
    a rule per connection: ``deliver(n)`` False swallows every message (a broker that
    grants $share and delivers nothing), ``rewrite`` turns '.' in topics into '/'
    before matching and delivering. ``writers`` keeps each connection's writer, so a
    test can send a message of its own."""

    def __init__(self, deliver: Any = lambda n: True, rewrite: bool = False) -> None:
        self.deliver = deliver
        self.rewrite = rewrite
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.mid = 0

    async def __call__(self, n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.writers[n] = w
        subs: list[str] = []
        while True:
            p = await read_packet(r)
            kind = p[0] >> 4
            if kind == 8:
                subs.extend(f.split("/", 2)[2] if f.startswith("$share/") else f
                            for f in subscribe_filters(p))
                w.write(suback(p))
            elif kind == 10:
                w.write(unsuback(p))
            elif kind == 12:
                w.write(b"\xd0\x00")
            elif kind == 14:
                return
            elif kind == 3:
                qos, topic, mid, payload = publish_parts(p)
                if qos:
                    w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
                if self.rewrite:
                    topic = topic.replace(".", "/")
                if self.deliver(n) and any(topic_matches(f, topic) for f in subs):
                    self.send(n, topic, payload)

    def send(self, n: int, topic: str, payload: bytes) -> None:
        self.mid = self.mid % 60000 + 1
        self.writers[n].write(publish(topic, payload, qos=1, mid=self.mid))


def test_readyz_is_never_200_while_the_shared_check_runs_at_start(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_module, "PROBE_S", 1.5)
    http = free_port()

    async def main() -> None:
        await flush(redis_url)
        async with ScriptedBroker(LoopBroker(deliver=lambda n: False)) as b:
            app = App(quick_config(redis_url, mqtt_url=b.url, metrics_port=http,
                                   consumer="deaf-a"))
            starting = asyncio.create_task(app.start(connect_timeout_s=5))
            seen: list[tuple[int, str]] = []
            try:
                while not starting.done():
                    seen.append(await readyz(http))
                    await asyncio.sleep(0.05)
                with pytest.raises(MqttUnsupported, match="delivered nothing"):
                    await starting
            finally:
                await app.aclose()
        assert seen and all(s != 200 for s, _ in seen), seen
        assert any("checking that the broker delivers through $share/sfc/" in t
                   for _, t in seen), seen
    run(main())


def test_readyz_is_never_200_after_a_reconnect_until_the_check_passes(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_module, "PROBE_S", 1.5)
    http = free_port()
    broker = LoopBroker(deliver=lambda n: n == 1)     # only the first connection hears

    async def main() -> None:
        await flush(redis_url)
        async with ScriptedBroker(broker) as b:
            app = App(quick_config(redis_url, mqtt_url=b.url, metrics_port=http,
                                   consumer="deaf-b"))
            await app.start(connect_timeout_s=5)
            try:
                assert await readyz(http) == (200, "ready\n")
                broker.writers[1].close()               # the broker drops the host
                seen: list[tuple[int, str]] = []
                loop = asyncio.get_running_loop()
                end = loop.time() + 6
                while loop.time() < end and not app.link.problem:
                    seen.append(await readyz(http))
                    await asyncio.sleep(0.05)
                seen.append(await readyz(http))
                assert app.link.problem, "the check after the reconnect never failed"
                assert all(s != 200 for s, _ in seen), seen
                assert "delivered nothing" in seen[-1][1]
            finally:
                await app.aclose()
    run(main())


def test_a_broker_that_rewrites_dots_refuses_a_dotted_scope_in_one_line(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        await flush(redis_url)
        async with ScriptedBroker(LoopBroker(rewrite=True)) as b:
            app = App(quick_config(redis_url, mqtt_url=b.url, consumer="dots-a",
                                   scopes=["plant.line1"]))
            try:
                with pytest.raises(MqttUnsupported) as e:
                    await app.start(connect_timeout_s=5)
            finally:
                await app.aclose()
        line = str(e.value)
        assert "\n" not in line
        assert "rewrote the topic mes/hosts/dots-a/probe/plant.line1 into " \
               "mes/hosts/dots-a/probe/plant/line1" in line
        assert "scope 'plant.line1'" in line
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())


def test_a_plain_scope_works_and_a_rewritten_topic_is_said_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    broker = LoopBroker(rewrite=True)

    async def main() -> None:
        await flush(redis_url)
        async with ScriptedBroker(broker) as b:
            metrics_port = free_port()
            app = App(quick_config(redis_url, mqtt_url=b.url, consumer="dots-b",
                                   scopes=["line1"], metrics_port=metrics_port))
            await app.start(connect_timeout_s=5)
            try:
                assert await readyz(metrics_port) == (200, "ready\n")
                # an answer a station sent on equipment/plant.line1/responses
                for _ in range(3):
                    broker.send(1, "equipment/plant/line1/responses", b"{}")
                await wait_until(lambda: app.metrics["mqtt_unrouted"] >= 3, 5,
                                 "the unrouted messages")
            finally:
                await app.aclose()
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        run(main())
    lines = [r.getMessage() for r in caplog.records
             if "matched no subscription" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "'equipment/plant/line1/responses'" in lines[0]
    assert "probably sent as 'equipment/plant.line1/responses'" in lines[0]


def test_an_mqtt5_connect_closed_without_connack_hints_at_version_3() -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        return

    async def main() -> None:
        # a 3.1.1-only broker: it reads the CONNECT and closes the connection
        async with ScriptedBroker(script, connack=lambda n: b"") as b:
            link = MqttLink(HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=b.url,
                                       consumer="v3"), Metrics(), once=True)
            await link.start()
            with pytest.raises(Exception):  # noqa: B017 (any refusal; the text is checked)
                await link.wait_connected(5)
            await link.aclose()
        assert "set mqtt_version = 3" in link.last_error
    run(main())


def test_the_hint_is_not_given_on_mqtt_311() -> None:
    async def main() -> None:
        async with ScriptedBroker(lambda n, r, w: asyncio.sleep(0),
                                  connack=lambda n: b"") as b:
            link = MqttLink(HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=b.url,
                                       consumer="v3", mqtt_version=3), Metrics(), once=True)
            await link.start()
            with pytest.raises(Exception):  # noqa: B017 (any refusal; the text is checked)
                await link.wait_connected(5)
            await link.aclose()
        assert "mqtt_version" not in link.last_error
    run(main())

