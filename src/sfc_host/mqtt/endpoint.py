"""Where the link connects and on what terms: the broker's address from ``mqtt_url``, the
client id, TLS, the CONNECT packet, and what the broker's CONNACK says.

What a broker says in its CONNACK is honoured (docs/operations.md, "Brokers"): its
Receive Maximum, Maximum Packet Size and Maximum QoS, its Server Keep Alive, Retain
Available (retained messages then go out unretained), and whether it supports
wildcard, shared subscriptions and subscription identifiers (a host that needs one it
lacks stops with ``MqttUnsupported``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

from sfc_fast.wire.mqtt5 import encode_connect
from sfc_host.errors import SfcHostError
from sfc_host.mqtt.connection import REDIRECTS, MqttError, reason_text
from sfc_host.mqtt.settings import MqttSettings
from sfc_host.mqtt.will import LastWill
from sfc_host.tls import client_context

log = logging.getLogger("sfc_host.mqtt")

# a packet the broker sends may be this much larger than the largest payload we take
# (topic, properties); a larger message is passed over as it arrives (never buffered
# whole), acknowledged, logged and counted (``mqtt_oversized``)
PACKET_HEADROOM = 1 << 16


class MqttRefused(SfcHostError, ConnectionError):
    """The broker refused the credentials before the link was ever connected."""


class MqttUnsupported(MqttRefused):
    """The broker lacks what the host needs (shared or wildcard subscriptions): no
    retry changes that."""


class Endpoint:
    """The settings the link connects with, and the broker's terms from its last
    CONNACK (what we ask for until the first one)."""

    def __init__(self, config: MqttSettings, client_id: str = "", max_packet: int = 0
                 ) -> None:
        self.config = config
        self.client_id = client_id or config.mqtt_client_id or f"sfc-{config.consumer_name}"
        u = urlparse(config.mqtt_url)
        if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"mqtt_url {config.mqtt_url!r}: use mqtt://host:port or "
                             "mqtts://host:port")
        self.tls = u.scheme in ("mqtts", "ssl")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (8883 if self.tls else 1883)
        self.v5 = config.mqtt_version == 5
        # the largest packet taken from the broker (0: mqtt_max_payload and headroom)
        self.max_packet = max_packet or config.mqtt_max_payload + PACKET_HEADROOM
        self.receive_max = config.mqtt_receive_maximum     # announced in our CONNECT
        self.keepalive_s = float(config.mqtt_keepalive_s)   # this connection's
        self.broker_receive_max = 0xFFFF
        self.broker_max_packet = 0                  # 0: no limit (MQTT 5 only says one)
        self.broker_max_qos = 2
        self.retain_ok = True                       # the broker keeps retained messages
        self.sub_ids_ok = True                      # ... and subscription identifiers

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        c = self.config
        return client_context(c.mqtt_ca_file, c.mqtt_cert_file, c.mqtt_key_file)

    def connect_packet(self, will: LastWill) -> bytes:
        c = self.config
        return encode_connect(self.client_id, c.mqtt_keepalive_s, self.v5,
                              c.mqtt_username or None, c.mqtt_password or None,
                              receive_max=self.receive_max if self.v5 else 0,
                              **will.fields(self.v5, self.retain_ok))

    def no_connack(self, e: MqttError) -> MqttError:
        """A connection closed before the CONNACK: on MQTT 5, what a broker that speaks
        only 3.1.1 does, so the error says what to try."""
        if not self.v5:
            return e
        return MqttError(f"{e}, before its CONNACK: a broker that speaks only MQTT 3.1.1 "
                         f"closes an MQTT 5 CONNECT so; if this one does, set "
                         f"mqtt_version = 3", e.rc)

    def refusal(self, code: int, props: dict[str, Any], will: LastWill) -> MqttError:
        """The error of a CONNACK that refused us; a will the broker cannot take is
        changed for the next attempt."""
        text = reason_text(code, self.v5)
        if props.get("ReasonString"):
            text += f": {props['ReasonString']}"
        if code in REDIRECTS:
            ref = props.get("ServerReference")
            text += (f" (the broker points to {ref!r}; the host keeps to mqtt_url: "
                     "change it to move)" if ref else "")
        if self.v5 and code == 0x9A and self.retain_ok:
            self.retain_ok = False
            log.warning("the broker at %s:%d keeps no retained messages (%s): the Last "
                        "Will and the retained MES state go out unretained", self.host,
                        self.port, text)
        else:
            will.refused(code, self.v5)
        return MqttError(text, code)

    def grant(self, props: dict[str, Any], filters: Iterable[str]) -> None:
        """Take the terms of an accepting CONNACK; ``MqttUnsupported`` when the broker
        lacks a kind of subscription among ``filters`` (as subscribed)."""
        if props.get("ReasonString"):
            log.info("MQTT broker at %s:%d: %s", self.host, self.port, props["ReasonString"])
        self.broker_receive_max = props.get("ReceiveMaximum", 0xFFFF)
        self.broker_max_packet = props.get("MaximumPacketSize", 0)
        self.broker_max_qos = props.get("MaximumQoS", 2)
        server_ka = props.get("ServerKeepAlive")
        ours = float(self.config.mqtt_keepalive_s)
        self.keepalive_s = float(min(ours, server_ka)) if server_ka else ours
        retain = bool(props.get("RetainAvailable", 1))
        if not retain and self.retain_ok:
            log.warning("the broker at %s:%d keeps no retained messages (Retain Available "
                        "0): the MES's retained state and the host's status go out "
                        "unretained, so a client that connects later does not get them",
                        self.host, self.port)
        self.retain_ok = retain and self.retain_ok
        self.sub_ids_ok = bool(props.get("SubscriptionIdentifierAvailable", 1))
        filters = list(filters)
        if not props.get("SharedSubscriptionAvailable", 1) and any(
                f.startswith("$share/") for f in filters):
            raise MqttUnsupported(
                "it does not support shared subscriptions (Shared Subscription Available "
                "0); set mqtt_shared_group = \"\" to run one host without them, or use a "
                "broker that supports them")
        if not props.get("WildcardSubscriptionAvailable", 1):
            wild = next((f for f in filters if "+" in f or "#" in f), None)
            if wild is not None:
                raise MqttUnsupported(
                    f"it does not support wildcard subscriptions (Wildcard Subscription "
                    f"Available 0), which the host needs ({wild})")
