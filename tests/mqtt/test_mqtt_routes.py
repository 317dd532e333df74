"""Which handler takes a message (``Routes``): the first matching filter, or with
``fan_out`` every matching subscription once (told apart by subscription identifiers
on MQTT 5); filters checked as registered; a message no filter matches counted and
said once, with the hint of a broker that split a dotted level. The messages are the
codec's, read from packets laid out by hand."""

from __future__ import annotations

import asyncio
import logging

import pytest
from helpers.scripted_broker import props, publish

from sfc_fast.wire.mqtt5 import Message, Reader
from sfc_host.metrics import Metrics
from sfc_host.mqtt.inbox import Inbox
from sfc_host.mqtt.probe import DeliveryProbe
from sfc_host.mqtt.routes import Routes


def message(topic: str, *sub_ids: int, v5: bool = True) -> Message:
    """A QoS 0 message as the codec reads it off the wire."""
    p = props(*(bytes((0x0B, i)) for i in sub_ids)) if v5 else None
    [m] = Reader(v5, 1 << 16).feed(publish(topic, b"x", properties=p))
    return m


def routes(group: str = "", fan_out: bool = False) -> tuple[Routes, Metrics]:
    metrics = Metrics()
    return Routes(group, Inbox(metrics, 10), metrics, fan_out=fan_out), metrics


def test_a_message_goes_to_the_first_matching_filter_only() -> None:
    r, metrics = routes()
    got: list[str] = []
    r.add("equipment/+/events", lambda m: got.append("events"), shared=False)
    r.add("equipment/#", lambda m: got.append("all"), shared=False)
    for topic in ("equipment/s1/events", "equipment/s1/responses", "equipment/s1/events"):
        assert r.dispatch(message(topic)) is False          # QoS 0: no ack to wait for
    assert got == ["events", "all", "events"]
    assert metrics["mqtt_received"] == 3


def test_a_filter_is_checked_and_shared_under_the_group() -> None:
    r, _ = routes("hosts")
    with pytest.raises(ValueError, match="stands alone"):
        r.add("equipment/a#", lambda m: None, shared=True)
    entry, new = r.add("mes/+/commands", lambda m: None, shared=True)
    assert entry[1] == "$share/hosts/mes/+/commands" and new
    _, new = r.add("mes/+/commands", lambda m: None, shared=True)
    assert not new                       # the broker has the filter already
    r.add("mes/+/commands", lambda m: None, shared=False)
    assert r.filters() == ["$share/hosts/mes/+/commands", "mes/+/commands"]
    assert r.shared()
    assert not routes("")[0].shared()    # no group: nothing is shared


def test_ending_a_subscription_says_whether_its_filter_is_left_empty() -> None:
    r, metrics = routes()
    got: list[str] = []
    a, _ = r.add("t/#", lambda m: got.append("a"), shared=False)
    b, _ = r.add("t/#", lambda m: got.append("b"), shared=False)
    r.dispatch(message("t/1"))
    assert not r.remove(a)               # b still on t/#
    assert not r.remove(a)               # ended already
    r.dispatch(message("t/1"))           # the remembered route went with it
    assert r.remove(b)
    r.dispatch(message("t/1"))
    assert got == ["a", "b"] and metrics["mqtt_unrouted"] == 1


def test_fan_out_hands_a_message_to_each_subscription_once() -> None:
    r, _ = routes(fan_out=True)
    got: list[str] = []
    r.add("scripts/#", lambda m: got.append("all"), shared=False)
    r.add("scripts/+/go", lambda m: got.append("go"), shared=False)
    assert r.sub_ids == {"scripts/#": 1, "scripts/+/go": 2}
    r.dispatch(message("scripts/a/go", 2))        # the broker's copy for "go" only
    assert got == ["go"]
    got.clear()
    r.dispatch(message("scripts/a/go", v5=False))  # MQTT 3.1.1: one copy, matched here
    assert got == ["all", "go"]


def test_an_unrouted_message_is_counted_and_said_once_with_a_hint(
        caplog: pytest.LogCaptureFixture) -> None:
    r, metrics = routes()
    r.add("equipment/plant.line1/responses", lambda m: None, shared=False)
    with caplog.at_level(logging.WARNING, "sfc_host.mqtt"):
        for _ in range(2):
            r.dispatch(message("equipment/plant/line1/responses"))
    assert metrics["mqtt_unrouted"] == 2
    [said] = caplog.records
    assert "probably sent as 'equipment/plant.line1/responses'" in said.getMessage()


def test_the_delivery_checks_messages_go_to_its_probe() -> None:
    async def main() -> None:
        r, metrics = routes()
        r.add("mes/#", lambda m: None, shared=False)
        probe = DeliveryProbe("mes/hosts/h1/probe")    # its future needs a loop
        r.probe = probe
        [(payload, topic)] = probe.sent.items()
        [m] = Reader(True, 1 << 16).feed(publish(topic, payload))
        r.dispatch(m)
        assert probe.done.done() and metrics["mqtt_received"] == 0
    asyncio.run(main())
