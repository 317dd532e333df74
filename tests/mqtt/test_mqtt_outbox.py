"""The link's outgoing side on its own (``Outbox``), on a bare connection to a scripted
broker: the window the broker grants, the copy a repeated command joins, what was in
flight sent again first and marked DUP, a message the broker closes on twice parked,
the broker's limits. The lanes' order against mosquitto is in test_mqtt_lanes.py."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.aio import run
from helpers.scripted_broker import (
    ScriptedBroker,
    connack,
    open_connection,
    prop_byte,
    prop_u16,
    prop_u32,
    props,
    publish_parts,
    read_packet,
)

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection
from sfc_host.mqtt.endpoint import Endpoint
from sfc_host.mqtt.outbox import Outbox


def config(url: str = "mqtt://127.0.0.1:1", **kw: Any) -> HostConfig:
    return HostConfig(mqtt_url=url, consumer="outbox", mqtt_qos=1, **kw)


def puback(mid: int, code: int = 0) -> bytes:
    return b"\x40\x03" + mid.to_bytes(2, "big") + bytes((code,))


class Taker:
    """A broker that reads PUBLISHes into ``got`` (first byte, topic, packet id,
    payload) and acknowledges them only when told (``ack``)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str, int, bytes]] = []
        self.writer: asyncio.StreamWriter | None = None
        self.arrived = asyncio.Event()

    async def script(self, n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.writer = w
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 3:
                self.got.append(publish_parts(p))
                self.arrived.set()

    def ack(self, *mids: int) -> None:
        assert self.writer is not None
        self.writer.write(b"".join(puback(m) for m in mids))

    async def until(self, count: int) -> None:
        while len(self.got) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)


async def attached(outbox: Outbox, url: str, cfg: HostConfig,
                   metrics: Metrics) -> Connection:
    conn, granted = await open_connection(url, metrics, on_ack=outbox.on_ack,
                                          on_writable=outbox.pump)
    endpoint = Endpoint(cfg)
    endpoint.grant(granted, [])
    outbox.attach(conn, endpoint)
    return conn


def test_no_more_than_the_brokers_receive_maximum_is_in_flight() -> None:
    taker = Taker()

    async def main() -> None:
        async with ScriptedBroker(taker.script, connack(0, props(prop_u16(0x21, 2)))) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            await attached(outbox, b.url, cfg, m)
            assert outbox.window == 2
            for i in range(5):
                assert outbox.publish_nowait(f"t/{i}", b"x")
            await taker.until(2)
            await asyncio.sleep(0.2)
            assert len(taker.got) == 2 and outbox.in_flight == 2 and outbox.queued == 3
            taker.ack(taker.got[0][2])
            await taker.until(3)
            assert [t for _, t, _, _ in taker.got] == ["t/0", "t/1", "t/2"]
    run(main())


def test_a_repeated_key_joins_the_copy_still_held() -> None:
    """A command sent again by its entry while the first copy waits for its PUBACK
    adds no second copy: both senders learn of the one acknowledgement."""
    taker = Taker()

    async def main() -> None:
        async with ScriptedBroker(taker.script) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            await attached(outbox, b.url, cfg, m)
            loop = asyncio.get_running_loop()
            first: asyncio.Future[None] = loop.create_future()
            again: asyncio.Future[None] = loop.create_future()
            assert outbox.publish_nowait("equipment/s1/commands", b"c", key="J1#1",
                                         acked=first)
            await taker.until(1)
            assert outbox.publish_nowait("equipment/s1/commands", b"c", key="J1#1",
                                         acked=again)
            assert m["mqtt_repeats_joined"] == 1 and outbox.queued == 0
            taker.ack(taker.got[0][2])
            await asyncio.wait_for(asyncio.gather(first, again), 5)
            # acknowledged, the key is free again
            assert outbox.publish_nowait("equipment/s1/commands", b"c", key="J1#1")
            await taker.until(2)
    run(main())


def test_what_was_in_flight_goes_out_again_first_marked_dup() -> None:
    taker = Taker()

    async def main() -> None:
        async with ScriptedBroker(taker.script) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            conn = await attached(outbox, b.url, cfg, m)
            for i in range(3):
                outbox.publish_nowait(f"t/{i}", b"x")
            await taker.until(3)
            conn.shut()
            outbox.detach()
            outbox.publish_nowait("t/after", b"y")          # queued behind them
            assert outbox.in_flight == 0 and outbox.queued == 4
            await attached(outbox, b.url, cfg, m)
            outbox.pump()
            await taker.until(7)
            again = taker.got[3:]
            assert [t for _, t, _, _ in again] == ["t/0", "t/1", "t/2", "t/after"]
            assert [first & 0x08 for first, _, _, _ in again] == [8, 8, 8, 0]   # DUP
    run(main())


def test_a_message_the_broker_closes_on_twice_is_parked() -> None:
    """The oldest unacknowledged message when the broker closed the connection is the
    suspect; closed on again, it is dropped so that the messages behind it go out."""
    got: list[str] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 3:
                _, topic, mid, _ = publish_parts(p)
                got.append(topic)
                if topic == "t/poison":
                    return                           # the broker closes on it
                w.write(puback(mid))

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            outbox.publish_nowait("t/poison", b"x" * 100, acked=acked)
            outbox.publish_nowait("t/next", b"y")
            for _ in range(2):
                conn = await attached(outbox, b.url, cfg, m)
                outbox.pump()
                await asyncio.wait_for(conn.closed, 5)
                outbox.blame(conn)
                outbox.detach()
            assert acked.cancelled()
            assert m.by_label("mqtt_messages_dropped") == {"broker_refused": 1}
            await attached(outbox, b.url, cfg, m)
            outbox.pump()
            while outbox.in_flight or outbox.queued:
                await asyncio.sleep(0.01)
            assert got == ["t/poison", "t/poison", "t/next"]
    run(main())


def test_the_brokers_maximum_qos_and_packet_size_are_kept() -> None:
    """A QoS 1 message goes at QoS 0 to a broker whose Maximum QoS is 0; a message
    larger than its Maximum Packet Size is not sent, its sender told at once."""
    taker = Taker()
    limits = props(prop_byte(0x24, 0), prop_u32(0x27, 200))

    async def main() -> None:
        async with ScriptedBroker(taker.script, connack(0, limits)) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            await attached(outbox, b.url, cfg, m)
            loop = asyncio.get_running_loop()
            big: asyncio.Future[None] = loop.create_future()
            small: asyncio.Future[None] = loop.create_future()
            outbox.publish_nowait("t/big", b"x" * 500, acked=big)
            outbox.publish_nowait("t/small", b"y", acked=small)
            await asyncio.wait_for(small, 5)            # QoS 0: done once written
            assert big.cancelled() and m["mqtt_unsendable"] == 1
            await taker.until(1)
            assert [(f >> 1 & 3, t) for f, t, _, _ in taker.got] == [(0, "t/small")]
    run(main())


def test_send_first_goes_ahead_of_what_waits() -> None:
    taker = Taker()

    async def main() -> None:
        async with ScriptedBroker(taker.script, connack(0, props(prop_u16(0x21, 1)))) as b:
            cfg, m = config(b.url), Metrics()
            outbox = Outbox(cfg, m)
            await attached(outbox, b.url, cfg, m)
            for i in range(3):
                outbox.publish_nowait(f"t/{i}", b"x")
            await taker.until(1)
            loop = asyncio.get_running_loop()
            outbox.send_first([("check/a", b"1", loop.create_future()),
                               ("check/b", b"2", loop.create_future())])
            for n in range(2, 5):
                taker.ack(taker.got[-1][2])
                await taker.until(n)
            assert [t for _, t, _, _ in taker.got] == ["t/0", "check/a", "check/b", "t/1"]
    run(main())


def test_packet_ids_skip_those_in_flight_and_wrap() -> None:
    async def main() -> None:
        outbox = Outbox(config(), Metrics())
        ids = [outbox.next_mid() for _ in range(3)]
        assert ids == [1, 2, 3]
        outbox._mid = 0xFFFE
        assert [outbox.next_mid(), outbox.next_mid()] == [0xFFFF, 1]
    run(main())


def test_a_bad_topic_or_a_full_queue_is_refused_and_counted() -> None:
    async def main() -> None:
        m = Metrics()
        outbox = Outbox(config(mqtt_queue_size=2), m)      # never attached: it queues
        assert not outbox.publish_nowait("t/+", b"x")
        assert not outbox.publish_nowait("", b"x")
        assert m["mqtt_bad_topic"] == 2
        assert outbox.publish_nowait("t/1", b"x") and outbox.publish_nowait("t/2", b"x")
        assert not outbox.publish_nowait("t/3", b"x")
        assert m["mqtt_queue_full"] == 1 and outbox.queued == 2
    run(main())
