"""Where the link connects and on what terms (``Endpoint``): the URL read, the client id
chosen, and a CONNACK's terms taken as the codec reads them from packets laid out by
hand: the window, the packet size, the QoS and keep alive the broker allows, retained
messages off for good once it says so, and the kinds of subscription it lacks."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.scripted_broker import connack, prop_byte, prop_u16, prop_u32, props

from sfc_fast.wire.mqtt5 import Reader
from sfc_host.config import HostConfig
from sfc_host.mqtt.connection import MqttError
from sfc_host.mqtt.endpoint import PACKET_HEADROOM, Endpoint, MqttUnsupported
from sfc_host.mqtt.will import LastWill


def endpoint(url: str = "mqtt://broker:1884", **kw: Any) -> Endpoint:
    return Endpoint(HostConfig(mqtt_url=url, consumer="line1", **kw))


def granted(*properties: bytes) -> dict[str, Any]:
    """The properties of a CONNACK as the codec reads them."""
    [(_, _, code, p)] = Reader(True, 1 << 16).feed(connack(0, props(*properties)))
    assert code == 0
    return p


@pytest.mark.parametrize(("url", "tls", "host", "port"), [
    ("mqtt://broker:1884", False, "broker", 1884),
    ("tcp://broker", False, "broker", 1883),
    ("mqtts://broker", True, "broker", 8883),
    ("ssl://10.0.0.1:9883", True, "10.0.0.1", 9883),
])
def test_the_url_says_where_and_whether_over_tls(url: str, tls: bool, host: str,
                                                 port: int) -> None:
    e = endpoint(url)
    assert (e.tls, e.host, e.port) == (tls, host, port)
    assert (e.tls_context() is not None) == tls


def test_a_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="use mqtt://host:port"):
        endpoint("http://broker:1883")


def test_the_client_id_and_the_largest_packet_taken() -> None:
    assert endpoint().client_id == "sfc-line1"
    assert endpoint(mqtt_client_id="mine").client_id == "mine"
    cfg = HostConfig(mqtt_url="mqtt://b", consumer="line1", mqtt_client_id="mine")
    assert Endpoint(cfg, client_id="scripts").client_id == "scripts"
    assert endpoint().max_packet == HostConfig().mqtt_max_payload + PACKET_HEADROOM
    assert Endpoint(cfg, max_packet=4096).max_packet == 4096


def test_the_terms_of_a_connack_are_taken() -> None:
    e = endpoint(mqtt_keepalive_s=30)
    assert (e.broker_receive_max, e.broker_max_qos, e.keepalive_s) == (0xFFFF, 2, 30.0)
    e.grant(granted(prop_u16(0x21, 20), prop_u32(0x27, 5000), prop_byte(0x24, 1),
                    prop_u16(0x13, 10), prop_byte(0x29, 0)), [])
    assert (e.broker_receive_max, e.broker_max_packet, e.broker_max_qos) == (20, 5000, 1)
    assert e.keepalive_s == 10.0 and not e.sub_ids_ok
    e.grant(granted(prop_u16(0x13, 60)), [])          # a longer one: ours stays
    assert e.keepalive_s == 30.0 and e.sub_ids_ok and e.broker_receive_max == 0xFFFF


def test_a_broker_without_retained_messages_is_remembered() -> None:
    e = endpoint()
    e.grant(granted(prop_byte(0x25, 0)), [])
    assert not e.retain_ok
    e.grant(granted(), [])             # a broker that stops saying so has not changed
    assert not e.retain_ok


def test_a_broker_lacking_a_kind_of_subscription_the_host_needs_is_unsupported() -> None:
    no_shared = granted(prop_byte(0x2A, 0))
    endpoint().grant(no_shared, ["mes/+/commands"])          # not needed: fine
    with pytest.raises(MqttUnsupported, match="shared subscriptions"):
        endpoint().grant(no_shared, ["$share/hosts/mes/+/commands"])
    with pytest.raises(MqttUnsupported, match=r"wildcard .*\(mes/\+/commands\)"):
        endpoint().grant(granted(prop_byte(0x28, 0)), ["mes/line1/x", "mes/+/commands"])


def test_a_refusing_connack_becomes_an_error_that_says_why() -> None:
    e, will = endpoint(), LastWill()
    err = e.refusal(0x87, {"ReasonString": "acl"}, will)
    assert isinstance(err, MqttError) and err.rc == 0x87
    assert str(err) == "[code:135] Not authorized: acl"
    moved = e.refusal(0x9D, {"ServerReference": "other:1883"}, will)
    assert "the broker points to 'other:1883'" in str(moved)


def test_a_refused_will_changes_the_next_connect() -> None:
    e, will = endpoint(), LastWill()
    e.refusal(0x9A, {}, will)
    assert not e.retain_ok and will.qos == 1
    e.refusal(0x9B, {}, will)
    assert will.qos == 0
    will.set("mes/hosts/line1", b"{}")
    flags = e.connect_packet(will)[9]                 # CONNECT flags (MQTT 5)
    assert flags & 0x3C == 0x04                       # a will, QoS 0, not retained


def test_a_connection_closed_before_its_connack_hints_at_mqtt_311() -> None:
    closed = MqttError("connection closed by the broker")
    assert "set mqtt_version = 3" in str(endpoint().no_connack(closed))
    assert endpoint(mqtt_version=3).no_connack(closed) is closed
