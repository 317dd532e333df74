"""The MQTT link against real mosquitto configurations: what ``test_mqtt_session``
plays with scripted brokers, here with the broker the plant runs. A packet limit that
closes the connection (3.1.1) or is announced (MQTT 5), a Server Keep Alive, an ACL
that refuses the host's subscription, another client's retained message with a bad
property, two hosts with one client id, and a broker frozen under traffic: each test
starts its own mosquitto and counts the link's connections, so a loop shows."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import wait_until
from helpers.scripted_broker import (
    big_then_small,
    host_link,
    prop_byte,
    prop_str,
    props,
    publish,
    utf8,
    varint,
)
from helpers.servers import MosquittoServer, ServerMissing, in_ci

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink, MqttUnsupported
from sfc_host.mqtt import subscriber as subscriber_module

pytestmark = pytest.mark.servers

# Debian's mosquitto package puts its plugins beside its other libraries
DYNSEC = next(iter(sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))),
              Path("/usr/lib/mosquitto_dynamic_security.so"))
# as root, mosquitto drops to its own user before it reads an ACL or plugin file, which
# lies in the tests' private temp dir: it stays who started it (ignored when not root)
AS_STARTED = "user root"

MakeBroker = Callable[..., MosquittoServer]


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[MakeBroker]:
    """A mosquitto of the test's own, with extra mosquitto.conf lines."""
    started: list[MosquittoServer] = []

    def make(*extra: str) -> MosquittoServer:
        try:
            server = MosquittoServer(tmp_path / f"mosquitto{len(started)}", extra=list(extra))
        except ServerMissing as e:
            if in_ci():
                pytest.fail(str(e))
            pytest.skip(str(e))
        started.append(server)
        server.start()
        return server

    yield make
    for s in started:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.send_signal(signal.SIGCONT)     # a stopped one would not act on SIGTERM
        s.stop()


def config(url: str, name: str, **kw: Any) -> HostConfig:
    return HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=url, consumer=name, **kw)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def raw_connect(port: int, client_id: str) -> socket.socket:
    """A plain MQTT 5 client, written by hand: CONNECT, clean start, keep alive 60."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + utf8(client_id)
    s.sendall(b"\x10" + varint(len(body)) + body)
    assert s.recv(1) == b"\x20"                  # CONNACK
    rest = s.recv(64)
    assert rest[2] == 0, rest                    # accepted
    return s


# ---- max_packet_size


def test_a_message_over_max_packet_size_is_parked_on_3_1_1(
        make_broker: MakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    """MQTT 3.1.1 cannot say the limit: mosquitto closes the connection on the large
    message. After it did so twice, the message is parked, the three behind it arrive,
    and the link connected three times in all."""
    broker = make_broker("max_packet_size 1000")

    async def main() -> None:
        got: list[bytes] = []
        metrics = Metrics()
        async with MqttLink(config(broker.url, "sub", mqtt_version=3), Metrics()) as sub:
            await sub.wait_connected()
            await sub.subscribed("t/#", lambda m: got.append(m.payload), shared=False)
            async with MqttLink(config(broker.url, "pub", mqtt_version=3), metrics) as link:
                await link.wait_connected()
                big, rest = big_then_small(link)
                await asyncio.wait_for(asyncio.gather(*rest), 10)
                assert big.cancelled()
                await wait_until(lambda: len(got) == 3)
                assert link.connected.is_set()
                assert link.connects == 3 and metrics["mqtt_reconnects"] == 2
            assert got == [b"small0", b"small1", b"small2"]
            assert metrics.by_label("mqtt_messages_dropped") == {"broker_refused": 1}
            assert sub.connects == 1
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert any("t/big" in e and "2000 bytes" in e and "parked" in e
               for e in errors(caplog)), errors(caplog)


def test_max_packet_size_announced_on_mqtt_5_is_never_crossed(
        make_broker: MakeBroker) -> None:
    """On MQTT 5 mosquitto says Maximum Packet Size in its CONNACK: the large message
    is not sent at all, the connection stays, the rest arrive."""
    broker = make_broker("max_packet_size 1000")

    async def main() -> None:
        got: list[bytes] = []
        metrics = Metrics()
        async with MqttLink(config(broker.url, "sub"), Metrics()) as sub:
            await sub.wait_connected()
            await sub.subscribed("t/#", lambda m: got.append(m.payload), shared=False)
            async with MqttLink(config(broker.url, "pub"), metrics) as link:
                await link.wait_connected()
                big, rest = big_then_small(link)
                await asyncio.wait_for(asyncio.gather(*rest), 5)
                assert big.cancelled()
                await wait_until(lambda: len(got) == 3)
            assert got == [b"small0", b"small1", b"small2"]
            assert metrics["mqtt_unsendable"] == 1
            assert link.connects == 1 and metrics["mqtt_reconnects"] == 0
            assert not metrics.by_label("mqtt_messages_dropped")
    run(main())


# ---- max_keepalive


def test_server_keep_alive_from_max_keepalive_is_used(make_broker: MakeBroker) -> None:
    """mosquitto's max_keepalive 10 reaches an MQTT 5 link that asked for 30 s as
    Server Keep Alive: it pings after 5 s of silence, not 15 s (mosquitto would close
    the connection at 15 s)."""
    broker = make_broker("max_keepalive 10", "log_type all")

    async def main() -> None:
        metrics = Metrics()
        cfg = config(broker.url, "ka", mqtt_keepalive_s=30, mqtt_client_id="ka-host")
        async with MqttLink(cfg, metrics) as link:
            await link.wait_connected()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert link.keepalive_s == 10
            await wait_until(lambda: "Received PINGREQ from ka-host" in
                        broker.log.read_text(errors="replace"), 8)
            waited = loop.time() - t0
            assert 4.5 <= waited <= 6.8, waited
            await wait_until(lambda: "Sending PINGRESP to ka-host" in
                        broker.log.read_text(errors="replace"), 2)
            assert link.connects == 1 and metrics["mqtt_reconnects"] == 0
            assert metrics["mqtt_keepalive_timeouts"] == 0
    run(main())


# ---- a subscription the broker refuses


def dynsec_config(path: Path) -> None:
    """mosquitto's dynamic security plugin, whose ACLs cover subscriptions (the
    acl_file of mosquitto 2.0 grants every SUBSCRIBE and filters on delivery): anonymous
    clients may publish and subscribe to equipment/#, not to the host's commands."""
    anon = [{"acltype": "subscribePattern", "topic": "equipment/#", "allow": True},
            # the test's admin client changes the ACL through the plugin's topic
            {"acltype": "publishClientSend", "topic": "$CONTROL/dynamic-security/#",
             "allow": True}]
    path.write_text(json.dumps({
        "defaultACLAccess": {"publishClientSend": True, "publishClientReceive": True,
                             "subscribe": False, "unsubscribe": True},
        "clients": [],
        "groups": [{"groupname": "anonymous", "roles": [{"rolename": "anonymous"}]}],
        "roles": [{"rolename": "anonymous", "acls": anon}],
        "anonymousGroup": "anonymous"}))


def grant(port: int, topic_filter: str) -> None:
    """Add a subscribe ACL to the anonymous role (the plugin then disconnects its
    clients, so they connect again under the new ACL)."""
    cmd = {"commands": [{"command": "addRoleACL", "rolename": "anonymous",
                         "acltype": "subscribePattern", "topic": topic_filter,
                         "allow": True}]}
    with raw_connect(port, "acl-admin") as s:
        s.sendall(publish("$CONTROL/dynamic-security/v1", json.dumps(cmd).encode()))
        s.recv(64)                     # kicked too, once the ACL changed


@pytest.mark.parametrize("version", [5, 3])
def test_a_subscription_the_acl_refuses_means_not_listening_without_a_loop(
        version: int, make_broker: MakeBroker, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The ACL refuses ``$share/sfc/mes/+/commands`` (SUBACK 0x87 on MQTT 5, 0x80 on
    3.1.1): the link stays connected, is not listening and says why, asks again with
    backoff and logs the refusal once. Once the ACL grants it, the link listens and
    takes the commands."""
    if not DYNSEC.is_file():
        pytest.skip(f"mosquitto's dynamic security plugin is not at {DYNSEC}")
    monkeypatch.setattr(subscriber_module, "RESUBSCRIBE_S", (0.2,))
    conf = tmp_path / "dynsec.json"
    dynsec_config(conf)
    broker = make_broker(AS_STARTED, f"plugin {DYNSEC}", f"plugin_opt_config_file {conf}")
    reason = "[code:135] Not authorized" if version == 5 else "[code:128] Failure"
    flt = "$share/sfc/mes/+/commands"

    async def main() -> None:
        got: list[bytes] = []
        metrics = Metrics()
        link = MqttLink(config(broker.url, "acl", mqtt_version=version), metrics)
        link.subscribe("mes/+/commands", lambda m: got.append(m.payload))
        await link.start()
        try:
            await link.wait_connected()
            assert not link.listening
            assert link.not_listening() == [
                f"subscription {flt} refused by the broker: {reason}"]
            # longer than a takeover's second: the 3.1.1 kick below is not read as one
            await asyncio.sleep(1.5)
            assert metrics["mqtt_subscribe_refused"] >= 4       # asked again meanwhile
            assert link.connects == 1 and metrics["mqtt_reconnects"] == 0
            assert not link.listening

            await asyncio.to_thread(grant, broker.port, "$share/sfc/mes/#")
            await wait_until(lambda: link.listening, 5)
            assert link.not_listening() == []
            # the plugin disconnected its clients once, to apply the new ACL
            assert link.connects == 2 and metrics["mqtt_reconnects"] == 1
            assert metrics["mqtt_takeovers"] == 0
            with raw_connect(broker.port, "mes") as s:
                s.sendall(publish("mes/line1/commands", b"go"))
                await wait_until(lambda: got == [b"go"])
        finally:
            await link.aclose()
    with caplog.at_level(logging.INFO, "sfc_host.mqtt"):
        run(main())
    refused = [e for e in errors(caplog) if "refused the subscription" in e]
    assert len(refused) == 1 and flt in refused[0] and reason in refused[0], errors(caplog)
    assert any("granted the subscription" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("version", [5, 3])
def test_an_acl_file_that_denies_the_host_keeps_it_from_ready(
        version: int, make_broker: MakeBroker, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """mosquitto's acl_file grants every SUBSCRIBE and drops what the client may not
    read or write, so the SUBACK says nothing: the message of our own that must come
    back through the shared subscription does not, and the host is not ready (no
    reconnect either)."""
    monkeypatch.setattr(subscriber_module, "PROBE_S", 0.5)
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite equipment/#\n")
    broker = make_broker(AS_STARTED, f"acl_file {acl}")

    async def main() -> None:
        metrics = Metrics()
        async with host_link(config(broker.url, "acl", mqtt_version=version), metrics,
                             probe_topic="mes/hosts/acl/probe") as link:
            await link.wait_connected()
            with pytest.raises(MqttUnsupported, match="mes/hosts/acl/probe"):
                await link.open_subscriptions()
            assert not link.refused                  # granted, as far as SUBACK goes
            assert not link.listening
            assert link.connects == 1 and metrics["mqtt_reconnects"] == 0
    run(main())


# ---- another client's bad retained message


BAD_PROPERTIES = {
    "line1": props(prop_byte(0x01, 2)),           # payload format indicator 2
    "line2": props(prop_str(0x08, "")),           # empty response topic
    "line3": props(prop_str(0x08, "reply/+")),    # a wildcard in the response topic
}


def test_retained_messages_with_bad_properties_are_dropped_not_the_connection(
        make_broker: MakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    """mosquitto takes and retains a device's message whose properties MQTT 5 forbids,
    and hands them to every subscriber: the link acknowledges and drops each, logs it,
    stays connected and handles the good message that follows."""
    broker = make_broker("log_type all")
    with raw_connect(broker.port, "device") as s:
        for mid, (line, bad) in enumerate(BAD_PROPERTIES.items(), 1):
            s.sendall(publish(f"equipment/{line}/events", b"{}", qos=1, mid=mid,
                              retain=True, properties=bad))
            puback = s.recv(16)
            assert puback[:1] == b"\x40" and puback[2:4] == mid.to_bytes(2, "big")
            assert len(puback) < 5 or puback[4] < 0x80, puback      # taken

    async def main() -> None:
        got: list[tuple[str, bytes]] = []
        metrics = Metrics()
        cfg = config(broker.url, "events", mqtt_client_id="events-host")
        async with MqttLink(cfg, metrics) as link:
            await link.subscribed("equipment/+/events",
                                  lambda m: got.append((m.topic, m.payload)), shared=False)
            await wait_until(lambda: metrics.by_label("mqtt_messages_dropped") ==
                        {"bad_properties": 3})
            await asyncio.sleep(2)
            assert link.connected.is_set() and link.connects == 1
            assert metrics["mqtt_reconnects"] == 0 and got == []
            with raw_connect(broker.port, "device") as s:
                s.sendall(publish("equipment/line1/events", b"good", qos=0))
                await wait_until(lambda: got == [("equipment/line1/events", b"good")])
            assert link.connects == 1
        log = broker.log.read_text(errors="replace")
        assert log.count("Received PUBACK from events-host") == 3   # none left to resend
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        run(main())
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 3
    assert all(any(f"equipment/{line}/events" in d for d in dropped)
               for line in BAD_PROPERTIES)


# ---- two hosts with one client id


@pytest.mark.parametrize("version", [5, 3])
def test_two_links_with_one_client_id_back_off_and_say_so(
        version: int, make_broker: MakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    """mosquitto ends the older connection whenever the other connects (2.0 closes it
    without a word, also on MQTT 5). Each link backs off (a few connections in 3 s, not
    ten) and an ERROR names the client id."""
    broker = make_broker()

    async def main() -> None:
        ma, mb = Metrics(), Metrics()
        cfg = config(broker.url, "dup", mqtt_version=version, mqtt_client_id="dup")
        async with MqttLink(cfg, ma) as a, MqttLink(cfg, mb) as b:
            await a.wait_connected()
            await b.wait_connected()
            await asyncio.sleep(3)
            counts = (a.connects, b.connects, ma["mqtt_reconnects"], mb["mqtt_reconnects"])
        assert max(counts) <= 3, counts
        assert ma["mqtt_takeovers"] + mb["mqtt_takeovers"] >= 1
    with caplog.at_level(logging.ERROR, "sfc_host.mqtt"):
        run(main())
    assert any("'dup'" in e and "same client id" in e for e in errors(caplog)), \
        errors(caplog)


# ---- a broker frozen under traffic


def test_a_frozen_broker_is_left_within_one_and_a_half_keep_alives_and_nothing_is_lost(
        make_broker: MakeBroker) -> None:
    """SIGSTOP freezes mosquitto (its socket still takes our writes) while the link
    publishes 5 QoS 1 messages a second with a 2 s keep alive: the link leaves the
    connection within 3 s. After SIGCONT it connects again, and every message it
    accepted is acknowledged and reaches the subscriber."""
    broker = make_broker()
    assert broker.proc is not None
    pid = broker.proc.pid

    async def main() -> None:
        got: set[bytes] = set()
        metrics = Metrics()
        loop = asyncio.get_running_loop()
        async with MqttLink(config(broker.url, "frozen-sub"), Metrics()) as sub:
            await sub.subscribed("t/frozen", lambda m: got.add(m.payload), shared=False)
            cfg = config(broker.url, "frozen-pub", mqtt_keepalive_s=2)
            async with MqttLink(cfg, metrics) as link:
                await link.wait_connected()
                sent: dict[bytes, asyncio.Future[None]] = {}
                stop = asyncio.Event()

                async def traffic() -> None:
                    i = 0
                    while not stop.is_set():
                        payload = b"%d" % i
                        sent[payload] = loop.create_future()
                        assert link.publish_nowait("t/frozen", payload, qos=1,
                                                   acked=sent[payload])
                        i += 1
                        await asyncio.sleep(0.2)

                task = asyncio.create_task(traffic())
                try:
                    await asyncio.sleep(1)
                    os.kill(pid, signal.SIGSTOP)
                    t_stop = loop.time()
                    await wait_until(lambda: not link.connected.is_set(), 5)
                    noticed = loop.time() - t_stop
                    assert noticed <= 1.5 * 2 + 0.3, noticed
                    assert metrics["mqtt_keepalive_timeouts"] == 1
                    await asyncio.sleep(0.5)
                    os.kill(pid, signal.SIGCONT)
                    await wait_until(link.connected.is_set, 10)
                    await asyncio.sleep(1)
                finally:
                    stop.set()
                    os.kill(pid, signal.SIGCONT)
                    await task
                await asyncio.wait_for(asyncio.gather(*sent.values()), 10)
                await wait_until(lambda: got >= set(sent), 5)
                assert link.connects == 2 and metrics["mqtt_reconnects"] == 1
                assert metrics["mqtt_keepalive_timeouts"] == 1
            assert sub.connects == 1
            assert len(sent) >= 15
    run(main())
