"""The link's handlers on their own (``Inbox``), on a bare connection to a scripted
broker: a coroutine handler's message acknowledged once it is done, a held
acknowledgement sent once released, the backlog bounded by the Receive Maximum we
announce (reading stops past it), a handler's fault counted and never raised."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers.aio import run
from helpers.scripted_broker import ScriptedBroker, open_connection, publish, read_packet

from sfc_fast.wire.mqtt5 import Message
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection
from sfc_host.mqtt.inbox import Handler, Inbox


class Sender:
    """A broker that sends ``count`` QoS 1 messages on ``t/{i}`` (packet id i + 1) once
    ``ready`` is set, and keeps the packet ids of the PUBACKs it gets in ``acked``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.acked: list[int] = []
        self.arrived = asyncio.Event()
        self.ready = asyncio.Event()

    async def script(self, n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await self.ready.wait()
        w.write(b"".join(publish(f"t/{i}", b"x", qos=1, mid=i + 1)
                         for i in range(self.count)))
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 4:
                self.acked.append(int.from_bytes(p[2:4], "big"))
                self.arrived.set()

    async def until(self, count: int) -> None:
        while len(self.acked) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)


async def handling(inbox: Inbox, handler: Handler, sender: Sender,
                   url: str) -> Connection:
    """A connection whose every message goes to ``handler`` through ``inbox``."""
    conn, _ = await open_connection(
        url, inbox.metrics, on_message=lambda m: inbox.handle(handler, m, m.topic, None))
    inbox.conn = conn                 # as the link does once the CONNACK is in
    sender.ready.set()
    return conn


def test_a_coroutine_handlers_message_is_acknowledged_once_it_is_done() -> None:
    sender = Sender(1)

    async def main() -> None:
        go = asyncio.Event()

        async def handler(m: Message) -> None:
            await go.wait()
        async with ScriptedBroker(sender.script) as b:
            inbox = Inbox(Metrics(), 10)
            await handling(inbox, handler, sender, b.url)
            while not inbox.running:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert sender.acked == []
            go.set()
            await sender.until(1)
            assert sender.acked == [1] and inbox.running == 0
    run(main())


def test_a_held_acknowledgement_goes_when_released() -> None:
    sender = Sender(2)

    async def main() -> None:
        held: list[Any] = []

        def handler(m: Message) -> None:
            if m.topic == "t/0":
                held.append(inbox.hold_ack(m))
        async with ScriptedBroker(sender.script) as b:
            inbox = Inbox(Metrics(), 10)
            await handling(inbox, handler, sender, b.url)
            await sender.until(1)
            await asyncio.sleep(0.1)
            assert sender.acked == [2] and len(held) == 1    # t/0 waits for its owner
            Inbox.release_acks(held)
            await sender.until(2)
            assert sender.acked == [2, 1]
    run(main())


def test_past_the_receive_maximum_handlers_wait_and_reading_stops() -> None:
    sender = Sender(5)

    async def main() -> None:
        go = asyncio.Event()

        async def handler(m: Message) -> None:
            await go.wait()
        async with ScriptedBroker(sender.script) as b:
            inbox = Inbox(Metrics(), 2)
            conn = await handling(inbox, handler, sender, b.url)
            while len(inbox.waiting) < 3:
                await asyncio.sleep(0.01)
            assert inbox.running == 2 and conn.reading_paused
            go.set()
            await sender.until(5)
            assert sorted(sender.acked) == [1, 2, 3, 4, 5]
            assert not inbox.waiting and not conn.reading_paused
    run(main())


def test_a_handlers_fault_is_counted_and_logged_never_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    sender = Sender(2)

    async def main() -> None:
        def handler(m: Message) -> Any:
            if m.topic == "t/0":
                raise ValueError("sync")
            return failing()

        async def failing() -> None:
            raise ValueError("async")
        async with ScriptedBroker(sender.script) as b:
            metrics = Metrics()
            inbox = Inbox(metrics, 10)
            await handling(inbox, handler, sender, b.url)
            await sender.until(2)              # both acknowledged all the same
            assert metrics["mqtt_handler_errors"] == 2
            assert metrics["mqtt_received"] == 2
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert sum("handling a message on t/" in r.getMessage() for r in caplog.records) == 2


def test_a_message_passed_over_is_counted_and_said_once_per_topic_and_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    inbox = Inbox(metrics, 10)
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        for _ in range(3):
            inbox.dropped("t/a", "bad_properties", "payload format 2")
        inbox.dropped("t/b", "bad_properties", "payload format 2")
    assert metrics.by_label("mqtt_messages_dropped") == {"bad_properties": 4}
    assert len(caplog.records) == 2


def test_close_cancels_the_running_and_never_starts_the_waiting() -> None:
    sender = Sender(3)

    async def main() -> None:
        started: list[str] = []

        async def handler(m: Message) -> None:
            started.append(m.topic)
            await asyncio.sleep(3600)
        async with ScriptedBroker(sender.script) as b:
            inbox = Inbox(Metrics(), 1)
            await handling(inbox, handler, sender, b.url)
            while len(inbox.waiting) < 2:
                await asyncio.sleep(0.01)
            inbox.close()
            await asyncio.sleep(0.05)
            assert started == ["t/0"] and inbox.running == 0 and not inbox.waiting
            assert sender.acked == []         # nothing handled: the broker sends again
    run(main())
