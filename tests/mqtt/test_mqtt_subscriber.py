"""The link's subscriptions on the broker (``Subscriber``) with its routes and outbox but
without the link, on a bare connection to a scripted broker: each filter asked for
once, a refused one asked for again until granted, a filter ended on the broker only
with its last subscription, one UNSUBSCRIBE of everything on stopping, and the delivery
check that keeps a host whose broker delivers nothing from saying it listens."""

from __future__ import annotations

import asyncio

import pytest
from helpers.aio import run
from helpers.scripted_broker import (
    ScriptedBroker,
    open_connection,
    publish,
    publish_parts,
    read_packet,
    suback,
    subscribe_filters,
    unsuback,
    unsubscribe_filters,
)

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import subscriber as subscriber_module
from sfc_host.mqtt.endpoint import Endpoint, MqttUnsupported
from sfc_host.mqtt.inbox import Inbox
from sfc_host.mqtt.outbox import Outbox
from sfc_host.mqtt.routes import Routes
from sfc_host.mqtt.subscriber import Subscriber


class Broker:
    """Grants every SUBSCRIBE but those of ``refuse`` (each refused once), acknowledges
    UNSUBSCRIBE and QoS 1 PUBLISH, and with ``echo`` sends each PUBLISH back (as a
    broker delivering through our own subscription does)."""

    def __init__(self, refuse: set[str] = frozenset(), echo: bool = True) -> None:
        self.refuse = set(refuse)
        self.echo = echo
        self.subscribed: list[str] = []
        self.unsubscribed: list[list[str]] = []

    async def script(self, n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            kind = p[0] >> 4
            if kind == 8:
                [flt] = subscribe_filters(p)
                self.subscribed.append(flt)
                refused = flt in self.refuse
                self.refuse.discard(flt)
                w.write(suback(p, b"\x87" if refused else b"\x01"))
            elif kind == 10:
                self.unsubscribed.append(unsubscribe_filters(p))
                w.write(unsuback(p))
            elif kind == 3:
                _, topic, mid, payload = publish_parts(p)
                w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
                if self.echo:
                    w.write(publish(topic, payload))


async def subscriber(url: str, group: str = "", probe_topic: str | None = None
                     ) -> Subscriber:
    """A subscriber on a live connection, its parts wired as the link wires them."""
    cfg = HostConfig(mqtt_url=url, consumer="sub", mqtt_shared_group=group)
    metrics = Metrics()
    endpoint, outbox, inbox = Endpoint(cfg), Outbox(cfg, metrics), Inbox(metrics, 10)
    routes = Routes(group, inbox, metrics)
    sub = Subscriber(endpoint, routes, outbox, metrics)
    sub.probe_topic = probe_topic
    conn, granted = await open_connection(url, metrics, on_message=routes.dispatch,
                                          on_ack=outbox.on_ack, on_writable=outbox.pump)
    endpoint.grant(granted, [])
    outbox.attach(conn, endpoint)
    inbox.conn = sub.conn = conn
    return sub


def test_each_filter_is_asked_for_once_and_a_refused_one_again_until_granted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_module, "RESUBSCRIBE_S", (0.1,))
    broker = Broker(refuse={"b/#"})

    async def main() -> None:
        async with ScriptedBroker(broker.script) as b:
            sub = await subscriber(b.url)
            for flt in ("a/#", "a/#", "b/#"):
                sub.routes.add(flt, lambda m: None, shared=False)
            assert sub.conn is not None
            await sub.subscribe_all(sub.conn)
            assert broker.subscribed == ["a/#", "b/#"]
            assert sub.refused == {"b/#": "[code:135] Not authorized"}
            assert sub.acked and sub.metrics["mqtt_subscribe_refused"] == 1
            while sub.refused:
                await asyncio.sleep(0.02)
            assert broker.subscribed == ["a/#", "b/#", "b/#"]
            sub.stop()
    run(main())


def test_a_filter_ends_on_the_broker_with_its_last_subscription() -> None:
    broker = Broker()

    async def main() -> None:
        async with ScriptedBroker(broker.script) as b:
            sub = await subscriber(b.url)
            end_a = sub.subscribe("t/#", lambda m: None, shared=False)
            end_b = await sub.subscribed("t/#", lambda m: None, shared=False)
            await asyncio.sleep(0.05)
            assert broker.subscribed == ["t/#"]
            end_a()
            await asyncio.sleep(0.05)
            assert broker.unsubscribed == []
            end_b()
            while not broker.unsubscribed:
                await asyncio.sleep(0.01)
            assert broker.unsubscribed == [["t/#"]]
    run(main())


def test_stopping_unsubscribes_every_filter_in_one_packet_and_for_good() -> None:
    broker = Broker()

    async def main() -> None:
        async with ScriptedBroker(broker.script) as b:
            sub = await subscriber(b.url, group="hosts")
            sub.subscribe("mes/+/commands", lambda m: None, shared=True)
            sub.subscribe("equipment/+/events", lambda m: None, shared=False)
            assert await sub.close()
            assert broker.unsubscribed == [["$share/hosts/mes/+/commands",
                                            "equipment/+/events"]]
            assert not sub.subscribing and not sub.acked
            sub.subscribe("late/#", lambda m: None, shared=False)
            await asyncio.sleep(0.05)
            assert "late/#" not in broker.subscribed        # not on a stopping host
            sub.conn = None
            assert not await sub.close()                    # no connection to tell
    run(main())


def test_the_delivery_check_passes_where_the_broker_delivers() -> None:
    broker = Broker(echo=True)

    async def main() -> None:
        async with ScriptedBroker(broker.script) as b:
            sub = await subscriber(b.url, group="hosts", probe_topic="mes/hosts/h/probe")
            sub.routes.add("mes/+/commands", lambda m: None, shared=True)
            assert sub.conn is not None
            await sub.subscribe_all(sub.conn)
            assert sub.acked and sub.problem == "" and sub.checking == ""
            assert broker.subscribed == ["$share/hosts/mes/+/commands",
                                         "$share/hosts/mes/hosts/h/probe/#"]
            assert broker.unsubscribed == [["$share/hosts/mes/hosts/h/probe/#"]]
    run(main())


def test_a_broker_that_delivers_nothing_keeps_the_host_from_listening(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_module, "PROBE_S", 0.3)
    broker = Broker(echo=False)

    async def main() -> None:
        async with ScriptedBroker(broker.script) as b:
            sub = await subscriber(b.url, group="hosts", probe_topic="mes/hosts/h/probe")
            sub.routes.add("mes/+/commands", lambda m: None, shared=True)
            sub.subscribing = False              # a host not ready to take messages yet
            with pytest.raises(MqttUnsupported, match="delivered nothing"):
                await sub.open()
            assert "does not serve shared subscriptions" in sub.problem
            sub.stop()                           # its retry, under way
    run(main())
