"""A command counts as sent (its sent marker is written) only once the broker has it:
``MqttSink.send`` waits for the PUBACKs (at most ``ACK_WAIT_S``); a command not
acknowledged by then is reported unsent (no marker: its entry is taken over if the host
dies first, or the deadline sends the same id again).

Were ``send`` to say True as soon as a command is in the host's own outgoing queue, the
dispatcher would write the marker and ack the entry while the command could still be
waiting for its turn (up to 256 QoS 1 messages unacknowledged at once) or in the socket.
A host killed then takes the command with it, and the marker keeps every other host from
sending it: the action times out (a retry with a new id, or an aborted job). ``kill -9``
fault runs showed it (seed 20 of ``benchmarks/reliability.py``, and every run of
``kill9_stalled_broker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import work_master
from helpers.servers import MosquittoServer, ServerMissing

from sfc_fast import Command, compile_recipe, evolve
from sfc_fast.events import Start
from sfc_host.config import HostConfig
from sfc_host.equipment import mqtt_transport as equipment_mqtt
from sfc_host.equipment.mqtt_transport import MqttSink
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Fresh
from sfc_host.metrics import Metrics
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt import outbox as mqtt_outbox
from sfc_host.mqtt.cloudevents import decode


def command(n: int) -> Command:
    """The first command (``load_part``) of job ``J{n}``."""
    wm = work_master("tighten_rework")
    d = evolve(compile_recipe(wm["data"], wm["dataschema"]), None, Start(f"J{n}", "line1"),
               1_000)
    return d.commands[0]


@pytest.fixture
def stalling_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                    ) -> Iterator[MosquittoServer]:
    """A mosquitto of the test's own (``stalled`` stops it), with the acknowledgement
    wait cut to 0.5 s."""
    try:
        broker = MosquittoServer(tmp_path / "mqtt")
    except ServerMissing as e:
        pytest.skip(str(e))
    broker.start()
    monkeypatch.setattr(equipment_mqtt, "ACK_WAIT_S", 0.5)
    try:
        yield broker
    finally:
        broker.stop()


@contextlib.contextmanager
def stalled(broker: MosquittoServer) -> Iterator[None]:
    """The broker stopped (SIGSTOP): no PUBACK comes until the block ends."""
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        broker.proc.send_signal(signal.SIGCONT)


def test_a_command_the_broker_has_not_acknowledged_is_not_sent(
        stalling_broker: MosquittoServer) -> None:
    broker = stalling_broker

    async def main() -> None:
        link = MqttLink(HostConfig(mqtt_url=broker.url, consumer="t"), Metrics())
        await link.start()
        try:
            await link.wait_connected()
            sink = MqttSink(link)
            assert await sink.send([command(1)]) == [True]       # acknowledged
            with stalled(broker):                                # no PUBACK comes
                assert await sink.send([command(2)]) == [False]
                assert link.metrics["mqtt_unacked_commands"] == 1
            assert await sink.send([command(3)]) == [True]
        finally:
            await link.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_command_this_host_is_sending_is_not_sent_again_when_its_entry_comes_back(
        redis_url: str, mqtt_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A send waits for the PUBACKs of its whole batch, so its entries sit idle and may
    be taken over, even back by the same host. There the entry finds no marker yet and,
    its command already acknowledged (the link holds no copy to join), must not publish
    the command again (``broker_restart`` fault runs showed one id four times at the
    station). With one message in flight at a time, the first command is acknowledged
    while the second still waits: its entry dispatched then adds no copy, and the send
    under way writes its marker."""
    monkeypatch.setattr(mqtt_outbox, "IN_FLIGHT", 1)
    ids = [f"J{n}:load_part#1" for n in (1, 2)]

    async def main() -> None:
        got: list[str] = []

        def seen(m: Message) -> None:
            got.append(decode(m.payload, m.properties).id)
        cfg = HostConfig(redis_url=redis_url, mqtt_url=mqtt_url, consumer="sending")
        async with (MqttLink(HostConfig(mqtt_url=mqtt_url, consumer="watch"),
                             Metrics()) as watch,
                    MqttLink(cfg, Metrics()) as link):
            await watch.wait_connected()
            await watch.subscribed("equipment/+/commands", seen, shared=False)
            await link.wait_connected()
            host = Host(cfg, MqttSink(link), loops=False, metrics=link.metrics)
            try:
                fresh = [Fresh("sending", c.job, c, b"1-1", None, None, 1)
                         for c in (command(1), command(2))]
                first = asyncio.ensure_future(host.dispatcher.send_fresh(fresh))
                while not link.metrics["mqtt_sent"]:
                    await asyncio.sleep(0)      # the first acknowledged, the second not yet
                await host.dispatcher.send_fresh(fresh[:1])    # its entry, back here
                await first
                while len(got) < 2:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)        # a third copy would have come by now
            finally:
                await host.aclose()
        assert got == ids
        assert link.metrics["dispatch_sending"] == 1
        assert link.metrics["mqtt_sent"] == link.metrics["commands_sent"] == 2

    asyncio.run(asyncio.wait_for(main(), 30))


def test_markers_are_written_off_the_sending_path_and_hold_their_commands_till_then(
        redis_url: str) -> None:
    """The settle that sent a command does not wait for its marker: the marker writer
    writes it in the background, and until then the command counts as this host's
    "sending" one (a second dispatch adds no copy). A write that fails is counted and
    lets the command go: its deadline sends it again."""
    async def main() -> None:
        sink = InProcessSink()
        host = Host(HostConfig(redis_url=redis_url, consumer="mk"), sink, loops=False)
        try:
            r = host.client
            base = host.store.keys("mk").base
            await r.delete(base + "job:J1", base + "job:J2")
            await r.hset(base + "job:J1", "s", "x")         # a job whose state exists
            c = command(1)
            f = Fresh("mk", "J1", c, b"", None, None, 7)
            d = host.dispatcher
            await d._send([f], {})
            assert sink.sent == 1 and d.markers.pending
            assert ("mk", c.command_id) in d._sending
            await d._send([f], {})                          # its marker not written yet
            assert sink.sent == 1 and host.metrics["dispatch_sending"] == 1
            await d.markers.drain()
            assert await r.hget(base + "job:J1", f"sent:{c.action}") == \
                f"7:{c.command_id}".encode()
            assert not d._sending and not d.markers.pending

            await r.set(base + "job:J2", "not a hash")      # the marker script fails
            c2 = command(2)
            await d._send([Fresh("mk", "J2", c2, b"", None, None, 7)], {})
            await d.markers.drain()
            assert host.metrics["marker_errors"] == 1 and not d._sending
            await d._send([Fresh("mk", "J2", c2, b"", None, None, 7)], {})
            assert sink.sent == 3                           # sent again: no marker
        finally:
            await host.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_settle_goes_on_while_its_commands_wait_for_their_acknowledgements(
        stalling_broker: MosquittoServer, redis_url: str) -> None:
    """The dispatcher follows a batch's PUBACKs instead of awaiting them: the send
    returns at once, the commands stay this host's "sending" ones, and a marker is
    written only once the broker has acknowledged its command. Not acknowledged within
    ``ACK_WAIT_S``: no marker, counted, and the command is let go (its deadline sends
    it again)."""
    broker = stalling_broker

    async def main() -> None:
        cfg = HostConfig(redis_url=redis_url, mqtt_url=broker.url, consumer="follow")
        async with MqttLink(cfg, Metrics()) as link:
            await link.wait_connected()
            host = Host(cfg, MqttSink(link), loops=False, metrics=link.metrics)
            try:
                r = host.client
                base = host.store.keys("follow").base
                await r.delete(base + "job:J1", base + "job:J2")
                await r.hset(base + "job:J1", "s", "x")
                await r.hset(base + "job:J2", "s", "x")
                d = host.dispatcher
                c1 = command(1)
                with stalled(broker):                          # no PUBACK for now
                    await asyncio.wait_for(
                        d.send_fresh([Fresh("follow", "J1", c1, b"", None, None, 7)]), 0.2)
                    assert ("follow", c1.command_id) in d._sending
                    await asyncio.sleep(0.1)
                    assert await r.hget(base + "job:J1", f"sent:{c1.action}") is None
                await asyncio.wait_for(d.drain(), 5)
                assert await r.hget(base + "job:J1", f"sent:{c1.action}") == \
                    f"7:{c1.command_id}".encode()
                assert not d._sending and link.metrics["commands_sent"] == 1

                c2 = command(2)
                with stalled(broker):
                    await d.send_fresh([Fresh("follow", "J2", c2, b"", None, None, 7)])
                    await asyncio.wait_for(d.drain(), 5)       # the wait of 0.5 s ends it
                    assert link.metrics["mqtt_unacked_commands"] == 1
                    assert await r.hget(base + "job:J2", f"sent:{c2.action}") is None
                    assert not d._sending
            finally:
                await host.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
