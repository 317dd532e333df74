"""The link's two outgoing lanes, against a real mosquitto: equipment commands do not
wait behind a backlog of MES status traffic, and status traffic is not stopped by a
flood of commands.

Found by the end-to-end benchmark: right after 4,000 jobs ended at once, some 6,000
status messages (status events, retained orders and results) stood in the link's one
queue, and every command of the next jobs waited behind them; the paced run's p99
answer-to-command was that backlog's drain (2-4 ms), not the host.
"""

from __future__ import annotations

import asyncio

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.outbox import IN_FLIGHT, STATUS_EVERY, status_share


async def _received(mqtt_url: str, send: object, total: int,
                    queue_size: int = 100_000) -> list[str]:
    """The topics a watcher receives, in order, of ``total`` messages that ``send``
    (given the link, with ``queue_size`` as ``mqtt_queue_size``) publishes."""
    got: list[str] = []
    all_in = asyncio.Event()

    def seen(m: Message) -> None:
        got.append(m.topic)
        if len(got) >= total:
            all_in.set()
    async with (MqttLink(HostConfig(mqtt_url=mqtt_url, consumer="watch"),
                         Metrics()) as watch,
                MqttLink(HostConfig(mqtt_url=mqtt_url, consumer="lanes",
                                    mqtt_queue_size=queue_size), Metrics()) as link):
        await watch.wait_connected()
        await watch.subscribed("lanes/#", seen, shared=False)
        await link.wait_connected()
        await send(link)  # type: ignore[operator]
        await asyncio.wait_for(all_in.wait(), 20)
        assert link.queued == 0
    return got


def test_a_command_does_not_wait_behind_a_backlog_of_status_messages(mqtt_url: str) -> None:
    async def send(link: MqttLink) -> None:
        for i in range(1000):
            assert link.publish_nowait(f"lanes/mes/order/J{i}", b"{}", retain=False,
                                       status=True)
        await asyncio.sleep(0)            # the status lane fills its share of the window
        # (the window: the broker's Receive Maximum, at most IN_FLIGHT)
        assert link.queued >= 1000 - status_share(IN_FLIGHT)
        assert link.publish_nowait("lanes/equipment/s1/commands", b"command")

    got = asyncio.run(_received(mqtt_url, send, 1001))
    where = got.index("lanes/equipment/s1/commands")
    # one queue sent it after the 1,000; now after at most the status messages already
    # in flight (a share of the window) and a few acknowledged meanwhile
    assert where <= status_share(IN_FLIGHT) + 1 < 1000, where
    # each lane keeps its own order
    assert [t for t in got if "/order/" in t] == [f"lanes/mes/order/J{i}" for i in range(1000)]


def test_status_messages_go_on_under_a_flood_of_commands(mqtt_url: str) -> None:
    async def send(link: MqttLink) -> None:
        for i in range(400):
            assert link.publish_nowait(f"lanes/equipment/s{i % 4}/commands", b"c%d" % i)
        for i in range(100):
            assert link.publish_nowait("lanes/mes/line1/events", b"s%d" % i, status=True)

    got = asyncio.run(_received(mqtt_url, send, 500))
    first = got[:100]
    status = sum(1 for t in first if t.endswith("/events"))
    # a status message after every STATUS_EVERY commands while both lanes wait
    assert status >= 100 // (STATUS_EVERY + 1) - 2, first


def test_under_a_lasting_overload_the_lanes_go_oldest_first(mqtt_url: str) -> None:
    """A status backlog of a tenth of the queue is no burst but an overload: one queue
    again, so the commands' wait slows the jobs (and their status traffic) down rather
    than the status messages being refused at 80 % of the queue. Below a tenth, the
    commands go first again."""
    async def send(link: MqttLink) -> None:
        for i in range(300):                   # a tenth of the queue is 100
            assert link.publish_nowait(f"lanes/mes/order/J{i}", b"{}", status=True)
        assert link.publish_nowait("lanes/equipment/s1/commands", b"command")

    got = asyncio.run(_received(mqtt_url, send, 301, queue_size=1000))
    where = got.index("lanes/equipment/s1/commands")
    # oldest first while the status lane holds 100 or more, the command first after
    assert 190 <= where <= 201, where


def test_status_messages_are_refused_once_they_fill_four_fifths_of_the_queue() -> None:
    """Commands in the queue do not count towards the status messages' limit, and the
    status messages never take the last fifth from the commands."""
    async def main() -> None:
        m = Metrics()
        link = MqttLink(HostConfig(mqtt_url="mqtt://127.0.0.1:1", consumer="q",
                                   mqtt_queue_size=100), m)    # never started: it queues
        for i in range(15):
            assert link.publish_nowait(f"lanes/equipment/s{i}/commands", b"c")
        for _ in range(80):
            assert link.publish_nowait("lanes/mes/line1/events", b"s", status=True)
        assert not link.publish_nowait("lanes/mes/line1/events", b"s", status=True)
        assert m["mqtt_status_dropped"] == 1
        for i in range(5):
            assert link.publish_nowait(f"lanes/equipment/t{i}/commands", b"c")
        assert not link.publish_nowait("lanes/equipment/u/commands", b"c")   # full
        assert m["mqtt_queue_full"] == 1
        assert link.queued == 100
    asyncio.run(main())


def test_the_status_share_leaves_commands_part_of_every_window() -> None:
    assert status_share(20) == 15          # mosquitto's default Receive Maximum
    assert status_share(IN_FLIGHT) < IN_FLIGHT
    assert status_share(2) == 1
    assert status_share(1) == 1            # one slot: shared, never none for status
