from collections.abc import Iterable
from typing import Any

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
OVERSIZED: int
MAX_REMAINING: int
MALFORMED: int
PROTOCOL_ERROR: int
PACKET_TOO_LARGE: int
TOPIC_NAME_INVALID: int
PINGREQ_PACKET: bytes

class MalformedPacket(ValueError):
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
                   receive_max: int = ...) -> bytes: ...
def encode_subscribe(mid: int, filters: Iterable[str], qos: int = ..., sub_id: int = ...,
                     v5: bool = ...) -> bytes: ...
def encode_unsubscribe(mid: int, filters: Iterable[str], v5: bool = ...) -> bytes: ...
def encode_disconnect(reason: int = ..., v5: bool = ...) -> bytes: ...
def plain_texts(values: Iterable[object], nonempty: bool = ..., max_chars: int = ...) -> bool: ...
