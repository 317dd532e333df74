"""The link's Last Will (``LastWill``): nothing in the CONNECT until one is set, then
at QoS 1, retained as far as the broker keeps retained messages, with its properties on
MQTT 5 only; a broker that takes no QoS 1 will gets one at QoS 0 on the next CONNECT.
The CONNECTs are read as a broker reads them."""

from __future__ import annotations

from sfc_fast.wire.mqtt5 import Properties
from sfc_host.config import HostConfig
from sfc_host.mqtt.endpoint import Endpoint
from sfc_host.mqtt.will import WILL_REFUSED, LastWill


def connect_flags(will: LastWill, version: int = 5) -> int:
    """The flags byte of the CONNECT the link would send (right after the protocol name
    and level, in a packet shorter than 128 bytes)."""
    e = Endpoint(HostConfig(mqtt_url="mqtt://b", consumer="line1", mqtt_version=version))
    return e.connect_packet(will)[9]


def test_no_will_until_one_is_set() -> None:
    will = LastWill()
    assert will.fields(True, True) == {}
    assert connect_flags(will) & 0x04 == 0


def test_a_will_goes_at_qos_1_retained_where_the_broker_keeps_it() -> None:
    will = LastWill()
    props = Properties(ContentType="application/json")
    will.set("mes/hosts/line1", b'{"online":false}', props)
    f = will.fields(True, True)
    assert (f["will_topic"], f["will_qos"], f["will_retain"]) == ("mes/hosts/line1", 1, True)
    assert f["will_properties"] is props
    assert will.fields(False, False)["will_properties"] is None     # MQTT 3.1.1
    assert not will.fields(True, False)["will_retain"]
    assert connect_flags(will) & 0x3C == 0x2C          # a will, QoS 1, retained
    assert connect_flags(will, 3) & 0x3C == 0x2C


def test_a_broker_that_takes_no_qos_1_will_gets_one_at_qos_0() -> None:
    will = LastWill()
    will.set("mes/hosts/line1", b"{}")
    assert 0x9B in WILL_REFUSED and 0x9A in WILL_REFUSED
    assert not will.refused(0x9B, v5=False)            # no such code on MQTT 3.1.1
    assert not will.refused(0x87, v5=True)
    assert will.refused(0x9B, v5=True) and will.qos == 0
    assert not will.refused(0x9B, v5=True)             # nothing left to lower
    assert connect_flags(will) & 0x3C == 0x24          # a will, QoS 0, retained
