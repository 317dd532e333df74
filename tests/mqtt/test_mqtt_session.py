"""The MQTT link at the session layer, against scripted brokers that misbehave on
purpose: what a broker says in CONNACK is honoured, a bad message from another client
never costs the connection, no message or peer makes the link loop, a dead broker is
found idle or busy, refused subscriptions mean not ready, and a message is
acknowledged once its handler is done."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import wait_until
from helpers.scripted_broker import (
    ScriptedBroker,
    big_then_small,
    connack,
    disconnect,
    grant_all,
    host_link,
    prop_byte,
    prop_str,
    prop_u16,
    props,
    publish,
    publish_parts,
    read_packet,
    suback,
    subscribe_filters,
    unsuback,
)

from sfc_host.config import ConfigError, HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import Message, MqttLink, MqttUnsupported
from sfc_host.mqtt import subscriber as subscriber_module
from sfc_host.mqtt.subscriber import Subscriber
from sfc_host.mqtt.topics import topic_matches


def config(url: str, **kw: Any) -> HostConfig:
    return HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=url,
                      consumer=kw.pop("consumer", "s"), **kw)


# ---- bad messages are dropped, not fatal


BAD_PROPERTIES = {
    "payload format 2": props(prop_byte(0x01, 2)),
    "empty response topic": props(prop_str(0x08, "")),
    "wildcard response topic": props(prop_str(0x08, "reply/+")),
}


@pytest.mark.parametrize("bad", list(BAD_PROPERTIES))
def test_a_retained_message_with_a_bad_property_is_dropped_not_the_connection(
        bad: str, caplog: pytest.LogCaptureFixture) -> None:
    """A device's retained message with an invalid property comes again at every
    reconnect, so closing the link for it would close it forever: it is acknowledged,
    counted, logged once and dropped; the good message behind it is handled on the same
    connection."""
    acks: list[bytes] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        p = await read_packet(r)
        w.write(suback(p))
        for _ in range(2):    # the broker sends the retained message again: logged once
            w.write(publish("equipment/line1/events", b"{}", qos=1, mid=7, retain=True,
                            properties=BAD_PROPERTIES[bad]))
        w.write(publish("equipment/line1/events", b"good", qos=1, mid=8))
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 4:
                acks.append(p)

    async def main() -> None:
        got: list[bytes] = []
        async with ScriptedBroker(script) as b:
            metrics = Metrics()
            async with MqttLink(config(b.url), metrics) as link:
                link.subscribe("equipment/+/events", lambda m: got.append(m.payload),
                               shared=False)
                await wait_until(lambda: got and len(acks) == 3)
                await asyncio.sleep(0.2)
            assert got == [b"good"] and b.connections == 1
            assert acks == [b"\x40\x02\x00\x07"] * 2 + [b"\x40\x02\x00\x08"]
            assert metrics.by_label("mqtt_messages_dropped") == {"bad_properties": 2}
            assert metrics["mqtt_reconnects"] == 0
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        run(main())
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1 and "equipment/line1/events" in dropped[0].getMessage()


def test_a_bad_topic_is_dropped_and_acknowledged() -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        p = await read_packet(r)
        w.write(suback(p))
        w.write(publish("a/+/b", b"x", qos=1, mid=3))
        w.write(publish("a/1/b", b"y", qos=0))
        await grant_all(n, r, w)

    async def main() -> None:
        got: list[bytes] = []
        async with ScriptedBroker(script) as b:
            metrics = Metrics()
            async with MqttLink(config(b.url), metrics) as link:
                link.subscribe("a/#", lambda m: got.append(m.payload), shared=False)
                await wait_until(lambda: got)
            assert got == [b"y"] and b.connections == 1
            assert metrics.by_label("mqtt_messages_dropped") == {"bad_topic": 1}
    run(main())


# ---- the broker's limits


def test_retain_available_0_sends_retained_messages_unretained() -> None:
    firsts: list[int] = []

    def on_publish(n: int, p: bytes) -> None:
        firsts.append(p[0])

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w, on_publish)

    async def main() -> None:
        async with ScriptedBroker(script, connack(0, props(prop_byte(0x25, 0)))) as b:
            async with MqttLink(config(b.url), Metrics()) as link:
                await link.wait_connected()
                done = asyncio.get_running_loop().create_future()
                link.publish_nowait("mes/line1/state-index", b"{}", qos=1, retain=True,
                                    acked=done)
                await asyncio.wait_for(done, 5)
            assert firsts == [0x32] and b.connections == 1        # QoS 1, no retain
    run(main())


def test_a_will_the_broker_cannot_retain_is_sent_again_unretained() -> None:
    """A broker without retained messages refuses a CONNECT whose will is retained
    (0x9A): the next CONNECT, at once, asks for an unretained will."""
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w)

    def answer(n: int) -> bytes:
        return connack(0x9A) if n == 1 else connack(0, props(prop_byte(0x25, 0)))

    async def main() -> None:
        async with ScriptedBroker(script, answer) as b:
            link = MqttLink(config(b.url), Metrics())
            link.set_will("mes/hosts/s", b'{"online":false}')
            async with link:
                await link.wait_connected()
            flags = [p[9] for _, p in b.connects]        # CONNECT flags byte (v5)
            assert flags[0] & 0x24 == 0x24                   # will, will retain
            assert flags[1] & 0x24 == 0x04                   # will, not retained
            assert b.connects[1][0] - b.connects[0][0] < 0.5
    run(main())


@pytest.mark.parametrize("max_qos", [0, 1])
def test_maximum_qos_downgrades_and_never_marks_qos_0_dup(max_qos: int) -> None:
    """A QoS 1 message unacknowledged at a reconnect goes out again DUP, but on a broker
    that takes QoS 0 only it goes out as plain QoS 0 (0x30, never 0x38)."""
    firsts: list[tuple[int, int]] = []

    def on_publish(n: int, p: bytes) -> bool:
        firsts.append((n, p[0]))
        return n > 1                      # the first connection acknowledges nothing

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if n == 1:
            p = await read_packet(r)
            on_publish(n, p)
            return                        # gone before acknowledging
        await grant_all(n, r, w, on_publish)

    def answer(n: int) -> bytes:
        return connack() if n == 1 else connack(0, props(prop_byte(0x24, max_qos)))

    async def main() -> None:
        async with ScriptedBroker(script, answer) as b:
            async with MqttLink(config(b.url), Metrics()) as link:
                await link.wait_connected()
                done = asyncio.get_running_loop().create_future()
                link.publish_nowait("q", b"m", qos=1, acked=done)
                await asyncio.wait_for(done, 5)
            assert firsts[0] == (1, 0x32)
            assert firsts[1] == (2, 0x30 if max_qos == 0 else 0x3A)
    run(main())


def test_server_keep_alive_is_used() -> None:
    pings: list[float] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            if p[0] == 0xC0:
                pings.append(asyncio.get_running_loop().time())
                w.write(b"\xd0\x00")

    async def main() -> None:
        async with ScriptedBroker(script, connack(0, props(prop_u16(0x13, 2)))) as b:
            async with MqttLink(config(b.url), Metrics()) as link:
                await link.wait_connected()
                t0 = asyncio.get_running_loop().time()
                assert link.keepalive_s == 2
                await wait_until(lambda: len(pings) >= 2, 5)
            assert pings[0] - t0 < 1.5        # not the 30 s of our setting
    run(main())


def test_shared_subscriptions_unavailable_stop_the_host_with_one_line() -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w)

    async def main() -> None:
        async with ScriptedBroker(script, connack(0, props(prop_byte(0x2A, 0)))) as b:
            async with host_link(config(b.url)) as link:
                with pytest.raises(MqttUnsupported, match="mqtt_shared_group"):
                    await link.wait_connected(5)
            assert b.connections == 1
    run(main())


def test_subscription_identifiers_unavailable_are_not_sent() -> None:
    filters: list[bytes] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 8:
                filters.append(p)
                w.write(suback(p))

    async def main() -> None:
        async with ScriptedBroker(script, connack(0, props(prop_byte(0x29, 0)))) as b:
            link = MqttLink(config(b.url), Metrics(), fan_out=True)
            async with link:
                await link.wait_connected()
                await link.subscribed("a/#", lambda m: None, shared=False)
            assert filters and filters[0][4] == 0     # property length 0: no identifier
    run(main())


# ---- no poison loop


def test_a_message_the_broker_closes_on_twice_is_parked_and_the_rest_go_out(
        caplog: pytest.LogCaptureFixture) -> None:
    """Like mosquitto's max_packet_size on MQTT 3.1.1: the broker closes the connection
    on a message too large for it. Twice in a row: parked; the three behind it go out."""
    got: list[bytes] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 3:
                _, _, mid, payload = publish_parts(p, v5=False)
                if len(payload) > 1000:
                    return                        # closed on it
                got.append(payload)
                w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
            elif p[0] == 0xC0:
                w.write(b"\xd0\x00")

    async def main() -> None:
        async with ScriptedBroker(script, connack(v5=False)) as b:
            metrics = Metrics()
            async with MqttLink(config(b.url, mqtt_version=3), metrics) as link:
                await link.wait_connected()
                big, rest = big_then_small(link)
                await asyncio.wait_for(asyncio.gather(*rest), 10)
                assert big.cancelled()
            assert got == [b"small0", b"small1", b"small2"]
            assert b.connections == 3
            assert metrics.by_label("mqtt_messages_dropped") == {"broker_refused": 1}
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert any("t/big" in r.getMessage() and "2000 bytes" in r.getMessage()
               for r in caplog.records if r.levelno == logging.ERROR)


def test_a_broker_that_closes_every_connection_is_not_hammered() -> None:
    """Backoff grows with jitter and does not start again at every CONNACK (here a
    busy broker that accepts each connection and ends it at once)."""
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        w.write(disconnect(0x89))
        await w.drain()

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            async with MqttLink(config(b.url), Metrics()) as link:
                await link.wait_connected()
                await asyncio.sleep(3)
            # 0.1, 0.25, 0.5, 1, 2 s at most (each 50-100 %): at most seven in 3 s
            assert 3 <= b.connections <= 7
    run(main())


# ---- a dead broker is found, idle or busy


def test_a_broker_that_hangs_while_we_publish_is_found_within_one_and_a_half_keep_alives(
        ) -> None:
    """The broker reads on but answers nothing (no PUBACK, no PINGRESP) while the link
    publishes 5 messages a second: the link leaves it within 1.5 x keep alive."""
    hung = asyncio.Event()

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if n == 1:
            while not hung.is_set():
                p = await read_packet(r)
                if p[0] >> 4 == 3:
                    w.write(b"\x40\x02" + publish_parts(p)[2].to_bytes(2, "big"))
                elif p[0] == 0xC0:
                    w.write(b"\xd0\x00")
            while True:
                await read_packet(r)          # reads on, answers nothing
        await grant_all(n, r, w)

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            metrics = Metrics()
            async with MqttLink(config(b.url, mqtt_keepalive_s=2), metrics) as link:
                await link.wait_connected()
                loop = asyncio.get_running_loop()
                t_hang = loop.time() + 1.0
                while b.connections < 2 and loop.time() < t_hang + 6:
                    if loop.time() >= t_hang and not hung.is_set():
                        hung.set()
                    link.publish_nowait("t", b"x", qos=1)
                    await asyncio.sleep(0.2)
                assert b.connections == 2
                found = b.connects[1][0] - t_hang
                assert found <= 1.5 * 2 + 0.3, found
            assert metrics["mqtt_keepalive_timeouts"] == 1
    run(main())


def test_a_broker_that_delays_its_acknowledgements_is_not_left() -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        later_acks: set[asyncio.Task[None]] = set()
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 3:
                _, _, mid, _ = publish_parts(p)

                async def later(mid: int = mid) -> None:
                    await asyncio.sleep(0.7)
                    w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
                t = asyncio.ensure_future(later())
                later_acks.add(t)
                t.add_done_callback(later_acks.discard)
            elif p[0] == 0xC0:
                w.write(b"\xd0\x00")

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            async with MqttLink(config(b.url, mqtt_keepalive_s=1), Metrics()) as link:
                await link.wait_connected()
                loop = asyncio.get_running_loop()
                futs = []
                for _ in range(20):
                    f = loop.create_future()
                    futs.append(f)
                    link.publish_nowait("t", b"x", qos=1, acked=f)
                    await asyncio.sleep(0.1)
                await asyncio.wait_for(asyncio.gather(*futs), 5)
            assert b.connections == 1
    run(main())


# ---- readiness


def test_a_refused_subscription_means_not_ready_until_it_is_granted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(subscriber_module, "RESUBSCRIBE_S", (0.3,))
    asked: list[str] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 8:
                asked.extend(subscribe_filters(p))
                w.write(suback(p, b"\x87" if len(asked) < 3 else b"\x01"))

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            async with host_link(config(b.url)) as link:
                await link.wait_connected()
                await link.open_subscriptions()
                assert not link.listening
                why = link.not_listening()
                assert why == ["subscription $share/sfc/mes/+/commands refused by the "
                               "broker: [code:135] Not authorized"]
                await wait_until(lambda: link.listening, 5)
                assert link.not_listening() == []
            assert b.connections == 1 and asked.count("$share/sfc/mes/+/commands") == 3
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert sum("refused the subscription" in r.getMessage() for r in caplog.records) == 1


def test_shared_subscriptions_that_deliver_nothing_stop_the_start_with_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker (MQTT 3.1.1 has no way to say) that grants $share/… and delivers
    nothing through it: the host must not report ready and serve deaf."""
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w, v5=False)     # acknowledges, delivers nothing

    monkeypatch.setattr(subscriber_module, "PROBE_S", 0.5)

    async def main() -> None:
        async with ScriptedBroker(script, connack(v5=False)) as b, host_link(
                config(b.url, mqtt_version=3), probe_topic="mes/hosts/s/probe") as link:
            await link.wait_connected()
            with pytest.raises(MqttUnsupported, match='mqtt_shared_group = ""'):
                await link.open_subscriptions()
            assert not link.listening
    run(main())


def test_shared_subscriptions_that_deliver_pass_the_check() -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        subs: list[str] = []
        while True:
            p = await read_packet(r)
            kind = p[0] >> 4
            if kind == 8:
                subs.extend(subscribe_filters(p))
                w.write(suback(p))
            elif kind == 10:
                w.write(unsuback(p))
            elif kind == 3:
                _, topic, mid, payload = publish_parts(p)
                w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
                if any(topic_matches(s.split("/", 2)[2], topic) for s in subs):
                    w.write(publish(topic, payload, qos=1, mid=99))

    async def main() -> None:
        async with ScriptedBroker(script) as b, host_link(
                config(b.url), probe_topic="mes/hosts/s/probe") as link:
            await link.wait_connected()
            await link.open_subscriptions()
            assert link.listening
    run(main())


# ---- takeover, redirect, reasons


def test_a_session_taken_over_backs_off_and_names_the_client_id(
        caplog: pytest.LogCaptureFixture) -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        w.write(disconnect(0x8E))
        await w.drain()

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            metrics = Metrics()
            async with MqttLink(config(b.url, mqtt_client_id="line-host"), metrics) as link:
                await link.wait_connected()
                await asyncio.sleep(3)
            assert b.connections <= 2          # not 15 in 3 s
            assert metrics["mqtt_takeovers"] >= 1
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'line-host'" in e and "same client id" in e for e in errors)


def test_a_close_right_after_connack_on_3_1_1_reads_as_a_takeover(
        caplog: pytest.LogCaptureFixture) -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)

    async def main() -> None:
        async with ScriptedBroker(script, connack(v5=False)) as b:
            async with MqttLink(config(b.url, mqtt_version=3), Metrics()) as link:
                await link.wait_connected()
                await asyncio.sleep(2.5)
            assert b.connections <= 3
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert any("same client id" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("code", [0x9C, 0x9D])
def test_a_redirect_is_logged_with_its_server_reference(
        code: int, caplog: pytest.LogCaptureFixture) -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if n == 1:
            w.write(disconnect(code, props(prop_str(0x1C, "broker2.plant:1883"))))
            await w.drain()
            return
        await grant_all(n, r, w)

    async def main() -> None:
        async with ScriptedBroker(script) as b, MqttLink(config(b.url), Metrics()) as link:
            await link.wait_connected()
            await wait_until(lambda: b.connections == 2)
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        run(main())
    assert any("broker2.plant:1883" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)


def test_reason_strings_and_names_of_a_refusal_and_a_disconnect_are_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(disconnect(0x98, props(prop_str(0x1F, "kicked by the operator"))))
        await w.drain()

    def answer(n: int) -> bytes:
        if n == 1:
            return connack(0x89, props(prop_str(0x1F, "too many clients now")))
        return connack()

    async def main() -> None:
        async with ScriptedBroker(script, answer) as b, MqttLink(config(b.url),
                                                                Metrics()) as link:
            await link.wait_connected()
            await wait_until(lambda: b.connections >= 3)
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        run(main())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "[code:137] Server busy: too many clients now" in text
    assert "[code:152] Administrative action: kicked by the operator" in text
    assert "Unknown reason" not in text


# ---- flow control


def test_a_message_is_acknowledged_once_its_handler_is_done() -> None:
    events: list[str] = []
    release = asyncio.Event()

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        p = await read_packet(r)
        w.write(suback(p))
        w.write(publish("mes/line1/commands", b"req", qos=1, mid=5))
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 4:
                events.append("puback")

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            async def handler(m: Message) -> None:
                events.append("handling")
                await release.wait()
                events.append("stored")

            async with MqttLink(config(b.url), Metrics()) as link:
                link.subscribe("mes/+/commands", handler)
                await wait_until(lambda: events)
                await asyncio.sleep(0.3)
                assert events == ["handling"]          # no PUBACK while it runs
                release.set()
                await wait_until(lambda: "puback" in events)
            assert events == ["handling", "stored", "puback"]
            connect = b.connects[0][1]
            assert b"\x21\x01\x00" in connect[:40]     # Receive Maximum 256 announced
    run(main())


def test_the_backlog_of_unhandled_messages_is_bounded() -> None:
    """2,000 requests arrive at once; handlers are slow: at most the Receive Maximum run
    at once (the rest of the read waits unstarted, and the link stops reading), and all
    are handled in the end."""
    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        p = await read_packet(r)
        w.write(suback(p))
        w.write(b"".join(publish("mes/line1/commands", b"%d" % i) for i in range(2000)))
        await grant_all(n, r, w)

    async def main() -> None:
        peak = 0
        running = 0
        done = 0

        async def handler(m: Message) -> None:
            nonlocal peak, running, done
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            done += 1

        async with ScriptedBroker(script) as b, MqttLink(
                config(b.url, mqtt_receive_maximum=50), Metrics()) as link:
            link.subscribe("mes/+/commands", handler)
            await wait_until(lambda: done == 2000, 30)
        assert peak == 50
    run(main())


# ---- settings


def test_qos_2_and_a_3_1_1_password_alone_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="mqtt_qos: 2 is not offered"):
        config("mqtt://127.0.0.1:1", mqtt_qos=2)
    with pytest.raises(ConfigError, match="only with a user name"):
        config("mqtt://127.0.0.1:1", mqtt_version=3, mqtt_password="secret")
    with pytest.raises(ConfigError, match="mqtt_keepalive_s"):
        config("mqtt://127.0.0.1:1", mqtt_keepalive_s=0)
    with pytest.raises(ConfigError, match="mqtt_receive_maximum"):
        config("mqtt://127.0.0.1:1", mqtt_receive_maximum=70000)


def test_a_filter_that_is_no_filter_is_refused_at_once() -> None:
    async def main() -> None:
        link = MqttLink(config("mqtt://127.0.0.1:1"), Metrics())
        for bad in ("", "a\0b", "a/#/b", "a+/b", "x" * 70_000):
            with pytest.raises(ValueError):
                link.subscribe(bad, lambda m: None, shared=False)
    run(main())


def test_the_link_task_survives_a_fault_of_its_own(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Any exception in the link's task is logged and the link connects again."""
    calls = 0
    real = Subscriber.subscribe_all

    async def broken(self: Subscriber, conn: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        await real(self, conn)

    monkeypatch.setattr(Subscriber, "subscribe_all", broken)

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w)

    async def main() -> None:
        async with ScriptedBroker(script) as b:
            async with MqttLink(config(b.url), Metrics()) as link:
                await link.wait_connected()
            assert b.connections == 2
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert any("the MQTT link failed" in r.getMessage() for r in caplog.records)


def test_an_answer_is_acknowledged_once_its_owner_releases_it() -> None:
    """A synchronous handler (equipment answers) holds its message's PUBACK until the
    answer is settled in Redis: ``hold_ack`` in the handler, ``release_acks`` after."""
    acks: list[bytes] = []

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        p = await read_packet(r)
        w.write(suback(p))
        w.write(publish("equipment/line1/responses", b"a", qos=1, mid=11)
                + publish("equipment/line1/responses", b"b", qos=0))
        while True:
            p = await read_packet(r)
            if p[0] >> 4 == 4:
                acks.append(p)

    async def main() -> None:
        held: list[Any] = []
        async with ScriptedBroker(script) as b, MqttLink(config(b.url), Metrics()) as link:
            def on_answer(m: Message) -> None:
                held.append(link.hold_ack(m))
            link.subscribe("equipment/+/responses", on_answer)
            await wait_until(lambda: len(held) == 2)
            await asyncio.sleep(0.2)
            assert acks == [] and held[1] is None          # QoS 0: nothing to hold
            link.release_acks([held[0]])
            await wait_until(lambda: acks)
            assert acks == [b"\x40\x02\x00\x0b"]
    run(main())


@pytest.mark.parametrize("case", ["unavailable", "deaf"])
def test_sfc_host_run_stops_with_one_line_naming_the_setting(
        case: str, redis_url: str, tmp_path: Any) -> None:
    """A broker that says it lacks shared subscriptions, or (MQTT 3.1.1) grants them and
    delivers nothing: ``sfc-host run`` exits 1 with one line naming mqtt_shared_group."""
    import sys

    v5 = case == "unavailable"

    async def script(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await grant_all(n, r, w, v5=v5)

    answer = connack(0, props(prop_byte(0x2A, 0))) if v5 else connack(v5=False)

    async def main() -> None:
        async with ScriptedBroker(script, answer) as b:
            conf = tmp_path / "host.toml"
            conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{b.url}"\n'
                            f'mqtt_version = {5 if v5 else 3}\nconsumer = "deaf"\n')
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sfc_host", "run", "--config", str(conf),
                stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 40)
        assert proc.returncode == 1, err
        last = err.decode().strip().splitlines()[-1]
        assert last.startswith("sfc-host: error: ") and 'mqtt_shared_group = ""' in last, last
        assert "Traceback" not in err.decode()
    run(main())
