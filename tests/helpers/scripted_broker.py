"""A broker that misbehaves on purpose: it accepts connections, answers each CONNECT
with the CONNACK a test asks for, then plays the test's script on the connection.
Packets are written out by hand here, from the spec, not by the codec under test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sfc_fast.wire.mqtt5 import Message, encode_connect
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink
from sfc_host.mqtt.connection import Connection

Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return len(b).to_bytes(2, "big") + b


def props(*items: bytes) -> bytes:
    """A property section from encoded properties (``prop_byte`` and friends)."""
    body = b"".join(items)
    return varint(len(body)) + body


def prop_byte(ident: int, value: int) -> bytes:
    return bytes((ident, value))


def prop_u16(ident: int, value: int) -> bytes:
    return bytes((ident,)) + value.to_bytes(2, "big")


def prop_u32(ident: int, value: int) -> bytes:
    return bytes((ident,)) + value.to_bytes(4, "big")


def prop_str(ident: int, value: str | bytes) -> bytes:
    return bytes((ident,)) + utf8(value)


def connack(code: int = 0, properties: bytes | None = None, v5: bool = True) -> bytes:
    body = b"\x00" + bytes((code,))
    if v5:
        body += properties if properties is not None else b"\x00"
    return b"\x20" + varint(len(body)) + body


CONNACK_OK = connack()


def publish(topic: str | bytes, payload: bytes, *, qos: int = 0, retain: bool = False,
            mid: int = 0, properties: bytes | None = b"\x00", dup: bool = False) -> bytes:
    """A PUBLISH as the spec lays it out; ``properties=None`` for MQTT 3.1.1."""
    body = utf8(topic)
    if qos:
        body += mid.to_bytes(2, "big")
    if properties is not None:
        body += properties
    body += payload
    first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    return bytes((first,)) + varint(len(body)) + body


def suback(packet: bytes, codes: bytes = b"\x01", v5: bool = True) -> bytes:
    """The SUBACK of a SUBSCRIBE ``packet`` (its packet id) with ``codes``."""
    mid = packet_id(packet)
    body = mid + (b"\x00" if v5 else b"") + codes
    return b"\x90" + varint(len(body)) + body


def unsuback(packet: bytes, v5: bool = True) -> bytes:
    body = packet_id(packet) + (b"\x00\x00" if v5 else b"")
    return b"\xb0" + varint(len(body)) + body


def disconnect(code: int, properties: bytes = b"\x00") -> bytes:
    body = bytes((code,)) + properties
    return b"\xe0" + varint(len(body)) + body


def packet_id(packet: bytes) -> bytes:
    """The packet id of a SUBSCRIBE/UNSUBSCRIBE (right after the fixed header)."""
    i = 1
    while packet[i] & 0x80:
        i += 1
    return packet[i + 1:i + 3]


def body_of(packet: bytes) -> bytes:
    i = 1
    while packet[i] & 0x80:
        i += 1
    return packet[i + 1:]


def _skip_properties(body: bytes, i: int) -> int:
    """The index after the property section that starts at ``i``."""
    n, shift = 0, 0
    while True:
        b = body[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return i + n


def publish_parts(packet: bytes, v5: bool = True) -> tuple[int, str, int, bytes]:
    """(first byte, topic, packet id or 0, payload) of a PUBLISH a client sent."""
    body = body_of(packet)
    n = int.from_bytes(body[:2], "big")
    topic = body[2:2 + n].decode()
    i = 2 + n
    mid = 0
    if (packet[0] >> 1) & 3:
        mid = int.from_bytes(body[i:i + 2], "big")
        i += 2
    if v5:
        i = _skip_properties(body, i)
    return packet[0], topic, mid, body[i:]


def subscribe_filters(packet: bytes, v5: bool = True) -> list[str]:
    return _filters(packet, v5, options=1)


def unsubscribe_filters(packet: bytes, v5: bool = True) -> list[str]:
    return _filters(packet, v5, options=0)


def _filters(packet: bytes, v5: bool, options: int) -> list[str]:
    """The filters of a SUBSCRIBE (each followed by ``options`` bytes) or UNSUBSCRIBE."""
    body = body_of(packet)[2:]
    if v5:
        body = body[_skip_properties(body, 0):]
    out = []
    while body:
        n = int.from_bytes(body[:2], "big")
        out.append(body[2:2 + n].decode())
        body = body[2 + n + options:]
    return out


async def read_packet(r: asyncio.StreamReader) -> bytes:
    first = await r.readexactly(1)
    n, shift, raw = 0, 0, b""
    while True:
        b = await r.readexactly(1)
        raw += b
        n |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            break
    return first + raw + await r.readexactly(n)


class ScriptedBroker:
    """Answers each CONNECT with ``connack(n)`` (n counts connections from 1; bytes, or
    None to answer nothing), then runs ``script(n, reader, writer)``. Every CONNECT is
    kept in ``connects``, with the loop time it came."""

    def __init__(self, script: Script,
                 connack: Callable[[int], bytes | None] | bytes | None = None) -> None:
        self.script = script
        self.connack = connack if connack is not None else CONNACK_OK
        self.connections = 0
        self.connects: list[tuple[float, bytes]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedBroker:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"mqtt://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = self.connections
        try:
            packet = await read_packet(r)                      # CONNECT
            self.connects.append((asyncio.get_running_loop().time(), packet))
            ack = self.connack(n) if callable(self.connack) else self.connack
            if ack is None:
                await asyncio.sleep(3600)
            w.write(ack)
            await self.script(n, r, w)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


async def grant_all(n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    on_publish: Callable[[int, bytes], Any] | None = None,
                    v5: bool = True) -> None:
    """A well-behaved broker's loop: SUBSCRIBE granted, UNSUBSCRIBE acknowledged,
    PINGREQ answered, QoS 1 PUBLISH acknowledged (after ``on_publish``, which may
    return False to leave it unacknowledged)."""
    while True:
        p = await read_packet(r)
        kind = p[0] >> 4
        if kind == 8:
            w.write(suback(p, b"\x01", v5))
        elif kind == 10:
            w.write(unsuback(p, v5))
        elif kind == 12:
            w.write(b"\xd0\x00")
        elif kind == 3:
            keep = on_publish(n, p) if on_publish is not None else None
            if keep is False:
                continue
            _, _, mid, _ = publish_parts(p, v5)
            if mid:
                w.write(b"\x40\x02" + mid.to_bytes(2, "big"))
        elif kind == 14:
            return


def big_then_small(link: Any) -> tuple[asyncio.Future[None], list[asyncio.Future[None]]]:
    """Queue a 2,000-byte QoS 1 message on ``t/big``, then three small ones on ``t/0``
    to ``t/2`` (payloads ``small0`` …): the acknowledgement futures of the big one and
    of the rest."""
    loop = asyncio.get_running_loop()
    big: asyncio.Future[None] = loop.create_future()
    rest: list[asyncio.Future[None]] = [loop.create_future() for _ in range(3)]
    link.publish_nowait("t/big", b"x" * 2000, qos=1, acked=big)
    for i, f in enumerate(rest):
        link.publish_nowait(f"t/{i}", b"small%d" % i, qos=1, acked=f)
    return big, rest


@contextlib.asynccontextmanager
async def host_link(config: HostConfig, metrics: Metrics | None = None,
                    probe_topic: str | None = None) -> AsyncIterator[MqttLink]:
    """A link as a host starts one: its MES request filter registered (shared), only
    publishing until ``open_subscriptions``; closed at the end."""
    link = MqttLink(config, metrics if metrics is not None else Metrics())
    link.probe_topic = probe_topic
    link.subscribe("mes/+/commands", lambda m: None)
    await link.start(subscribe=False)
    try:
        yield link
    finally:
        await link.aclose()


async def open_connection(url: str, metrics: Metrics | None = None, *, v5: bool = True,
                          on_message: Callable[[Message], bool] = lambda m: False,
                          on_ack: Callable[[int, int], None] = lambda mid, code: None,
                          on_writable: Callable[[], None] = lambda: None,
                          ) -> tuple[Connection, dict[str, Any]]:
    """A bare ``Connection`` to a broker at ``url`` past its CONNECT and CONNACK, and
    the CONNACK's properties: one of the link's parts tested on the wire without the
    link (the test wires the callbacks to it)."""
    host, _, port = url.removeprefix("mqtt://").rpartition(":")
    conn = Connection(v5=v5, max_packet=1 << 20,
                      metrics=metrics if metrics is not None else Metrics(),
                      on_message=on_message, on_ack=on_ack, on_writable=on_writable,
                      on_dropped=lambda topic, reason, why: None)
    await asyncio.get_running_loop().create_connection(lambda: conn, host, int(port))
    conn.write(encode_connect("part", 60, v5))
    _, code, properties = await asyncio.wait_for(conn.connack, 5)
    assert code == 0, code
    return conn, properties
