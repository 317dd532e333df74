"""MQTT 5 and 3.1.1 client packets, sans I/O (``sfc_fast/wire/mqtt5.pyx``).

``Reader.feed`` raises ``MalformedPacket`` only for a stream that cannot be framed or a
packet other than PUBLISH that breaks the rules; a PUBLISH that breaks them comes out as
a ``DROPPED`` item and an acknowledgement's bad properties as an ``IGNORED`` item, and
the reader reads on.
"""

from collections.abc import Iterable
from typing import Any

from sfc_fast.errors import SfcError

CONNECT: int
CONNACK: int
PUBLISH: int
PUBACK: int
PUBREC: int
PUBREL: int
PUBCOMP: int
SUBSCRIBE: int
SUBACK: int
UNSUBSCRIBE: int
UNSUBACK: int
PINGREQ: int
PINGRESP: int
DISCONNECT: int
AUTH: int
OVERSIZED: int          # (OVERSIZED, topic, qos, mid, size): a PUBLISH over max_packet
DROPPED: int            # (DROPPED, topic, qos, mid, reason, why): a PUBLISH breaking the rules
IGNORED: int            # (IGNORED, ptype, why): an acknowledgement's bad properties
MAX_REMAINING: int
MALFORMED: int
PROTOCOL_ERROR: int
PACKET_TOO_LARGE: int
TOPIC_NAME_INVALID: int
PINGREQ_PACKET: bytes

class MalformedPacket(SfcError, ValueError):
    reason: int
    def __init__(self, message: str, reason: int = ...) -> None: ...

class Properties:
    PayloadFormatIndicator: int | None
    MessageExpiryInterval: int | None
    ContentType: str | None
    ResponseTopic: str | None
    CorrelationData: bytes | None
    SubscriptionIdentifier: list[int] | None
    UserProperty: list[tuple[str, str]] | None
    def __init__(self, *, PayloadFormatIndicator: int | None = ...,
                 MessageExpiryInterval: int | None = ..., ContentType: str | None = ...,
                 ResponseTopic: str | None = ..., CorrelationData: bytes | None = ...,
                 UserProperty: list[tuple[str, str]] | None = ...) -> None: ...
    def pack(self) -> bytes: ...
    def freeze(self) -> Properties: ...

class Message:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    mid: int
    properties: Properties | None
    def __init__(self, topic: str, payload: bytes = ..., qos: int = ..., retain: bool = ...,
                 properties: Properties | None = ..., dup: bool = ..., mid: int = ...) -> None: ...

class Reader:
    """Frames what a broker sends. ``feed`` returns, in order, a ``Message`` per PUBLISH
    and a tuple per other packet: ``(CONNACK, session_present, reason, props)``,
    ``(PUBACK|PUBREC|PUBREL|PUBCOMP, mid, reason)``, ``(SUBACK|UNSUBACK, mid,
    [reasons])``, ``(PINGRESP,)``, ``(DISCONNECT, reason, props)``; and
    ``(OVERSIZED, topic, qos, mid, size)`` for a PUBLISH over ``max_packet`` (passed
    over), ``(DROPPED, topic, qos, mid, reason, why)`` for a PUBLISH that breaks the
    rules (``topic`` "" when unreadable; acknowledge with ``qos``/``mid`` unless ``mid``
    is 0), ``(IGNORED, ptype, why)`` just before an acknowledgement whose properties were
    bad. Raises ``MalformedPacket`` for a stream that cannot be framed and for any other
    packet that breaks the rules (a CONNACK or DISCONNECT with bad properties among
    them); the reader is spent then."""

    v5: bool
    max_packet: int
    def __init__(self, v5: bool = ..., max_packet: int = ...) -> None: ...
    @property
    def buffered(self) -> int: ...
    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]: ...

def publish_into(out: bytearray, topic: str, payload: bytes, qos: int = ...,
                 retain: bool = ..., mid: int = ..., properties: Properties | None = ...,
                 v5: bool = ..., dup: bool = ...) -> None: ...
def ack_into(out: bytearray, ptype: int, mid: int, reason: int = ...) -> None: ...
def encode_connect(client_id: str, keepalive: int, v5: bool = ..., username: str | None = ...,
                   password: str | bytes | None = ..., max_packet: int = ...,
                   receive_max: int = ..., *, will_topic: str | None = ...,
                   will_payload: bytes = ..., will_qos: int = ..., will_retain: bool = ...,
                   will_properties: Properties | None = ...) -> bytes: ...
def encode_subscribe(mid: int, filters: Iterable[str], qos: int = ..., sub_id: int = ...,
                     v5: bool = ...) -> bytes: ...
def encode_unsubscribe(mid: int, filters: Iterable[str], v5: bool = ...) -> bytes: ...
def encode_disconnect(reason: int = ..., v5: bool = ...) -> bytes: ...
def plain_texts(values: Iterable[object], nonempty: bool = ..., max_chars: int = ...) -> bool: ...
