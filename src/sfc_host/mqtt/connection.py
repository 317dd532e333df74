"""One connection to the broker: an asyncio ``Protocol`` over the event loop's transport
(uvloop's in the host; TLS through ``loop.create_connection(ssl=...)``).

Packets are framed by the compiled codec (``sfc_fast.mqtt5``): every packet of one
socket read in one call, each PUBLISH handed to ``on_message`` as the handler's
``Message``, and the acknowledgements of one read written together, with the first
publish that follows within ``ACK_DELAY_S``. What the link sends in one event-loop pass
collects in ``out`` and goes out in one write.

A malformed packet closes the connection (with its reason code on MQTT 5, as the spec
demands); it is logged and counted (``mqtt_malformed``) and the link connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from sfc_fast.mqtt5 import (
    CONNACK,
    DISCONNECT,
    OVERSIZED,
    PINGREQ_PACKET,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    MalformedPacket,
    Message,
    Reader,
    ack_into,
    encode_disconnect,
)
from sfc_host.metrics import Metrics

log = logging.getLogger("sfc_host.mqtt")

# Acknowledgements of a read wait this long for the work they start (a settle, then the
# next command) to go out in the same write: one write per answer rather than two. The
# broker's in-flight window to us is far wider than what arrives in this time.
ACK_DELAY_S = 0.001

# reason codes in words (CONNACK of MQTT 3.1.1: 1-5; MQTT 5: 0x80 on), for the log
REASONS = {1: "Unacceptable protocol version", 2: "Client identifier rejected",
           3: "Server unavailable", 4: "Bad user name or password", 5: "Not authorized",
           0x80: "Unspecified error", 0x81: "Malformed packet", 0x82: "Protocol error",
           0x84: "Unsupported protocol version", 0x85: "Client identifier not valid",
           0x86: "Bad user name or password", 0x87: "Not authorized",
           0x88: "Server unavailable", 0x89: "Server busy", 0x8A: "Banned",
           0x8B: "Server shutting down", 0x8C: "Bad authentication method",
           0x8D: "Keep alive timeout", 0x8E: "Session taken over",
           0x90: "Topic name invalid", 0x93: "Receive maximum exceeded",
           0x95: "Packet too large", 0x97: "Quota exceeded",
           0x9C: "Use another server", 0x9D: "Server moved",
           0x9F: "Connection rate exceeded"}


class MqttError(ConnectionError):
    """The connection could not be made or ended; ``rc`` is the broker's reason code
    when it gave one."""

    def __init__(self, message: str, rc: int | None = None) -> None:
        super().__init__(message)
        self.rc = rc


def reason_text(code: int) -> str:
    """A reason code as the log shows it: ``[code:135] Not authorized``."""
    return f"[code:{code}] {REASONS.get(code, 'Unknown reason')}"


class Connection(asyncio.Protocol):
    """The protocol object of one connection; the link owns what outlives it."""

    def __init__(self, *, v5: bool, max_packet: int, metrics: Metrics,
                 on_message: Callable[[Message], None],
                 on_ack: Callable[[int, int], None],
                 on_writable: Callable[[], None]) -> None:
        self.v5 = v5
        self.reader = Reader(v5, max_packet)
        self.metrics = metrics
        self.on_message = on_message
        self.on_ack = on_ack                  # (mid, reason) of our QoS 1 / 2 publishes
        self.on_writable = on_writable        # the transport takes writes again
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[tuple[bool, int, dict[str, Any]]] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.waiters: dict[int, asyncio.Future[list[int]]] = {}   # SUBACK, UNSUBACK
        self.out = bytearray()            # packets of this loop pass, written in one go
        self._flush_soon = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self.paused = False               # the transport's buffer is full
        self.last_write = loop.time()
        self.ping_sent: float | None = None
        self._qos2_in: set[int] = set()   # QoS 2 messages delivered, PUBREL not yet seen
        self.why = ""                     # why it ended, when we know better than the OS

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]   # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # small packets must not wait for the peer's delayed ACK (Nagle)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            items = self.reader.feed(data)
        except MalformedPacket as e:
            self.metrics.inc("mqtt_malformed")
            log.warning("the broker sent a malformed packet (%s); the connection is closed",
                        e)
            self.abort(e.reason, f"malformed packet from the broker: {e}")
            return
        out = self.out
        on_message = self.on_message
        for item in items:
            if type(item) is Message:
                qos = item.qos
                if qos == 2:
                    mid = item.mid
                    ack_into(out, PUBREC, mid)
                    if mid in self._qos2_in:   # sent again before our PUBREC arrived
                        continue
                    self._qos2_in.add(mid)
                on_message(item)
                if qos == 1:
                    ack_into(out, PUBACK, item.mid)
            else:
                self._control(item)
        if out and not self._flush_soon and self._ack_timer is None:
            self._ack_timer = self.loop.call_later(ACK_DELAY_S, self.flush)

    def _control(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind in (PUBACK, PUBCOMP):
            self.on_ack(item[1], item[2])
        elif kind == PUBREC:
            if item[2] >= 0x80:           # refused: the exchange ends here
                self.on_ack(item[1], item[2])
            else:
                ack_into(self.out, PUBREL, item[1])
        elif kind == PUBREL:
            self._qos2_in.discard(item[1])
            ack_into(self.out, PUBCOMP, item[1])
        elif kind in (SUBACK, UNSUBACK):
            fut = self.waiters.pop(item[1], None)
            if fut is not None and not fut.done():
                fut.set_result(item[2])
        elif kind == PINGRESP:
            self.ping_sent = None
        elif kind == CONNACK:
            if self.connack.done():
                self.abort(0x82, "a second CONNACK")
            else:
                self.connack.set_result((item[1], item[2], item[3]))
        elif kind == OVERSIZED:
            _, topic, qos, mid, size = item
            self.metrics.inc("mqtt_oversized")
            log.warning("a message of %d bytes on %s passed over: larger than the link "
                        "takes (mqtt_max_payload)", size, topic[:200])
            if qos == 1:
                ack_into(self.out, PUBACK, mid)
            elif qos == 2:
                ack_into(self.out, PUBREC, mid)
        elif kind == DISCONNECT:
            why = item[2].get("ReasonString") or reason_text(item[1])
            self.why = f"the broker disconnected: {why}"
            log.warning("MQTT broker disconnected the link: %s", why)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        why = self.why or (str(exc) if exc else "connection closed by the broker")
        err = MqttError(why)
        if not self.connack.done():
            self.connack.set_exception(err)
            self.connack.exception()      # retrieved: the connect step reports it
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()
        self.waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.on_writable()

    # ---- writing

    def write(self, packet: bytes) -> None:
        self.out += packet
        self.flush_soon()

    def flush_soon(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_soon = False
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        out = self.out
        if not out or self.transport is None:
            return
        self.transport.write(bytes(out))
        out.clear()
        self.last_write = self.loop.time()

    async def request(self, mid: int, packet: bytes, timeout: float = 10.0) -> list[int]:
        """Send a SUBSCRIBE or UNSUBSCRIBE; its acknowledgement's reason codes."""
        fut: asyncio.Future[list[int]] = self.loop.create_future()
        self.waiters[mid] = fut
        self.write(packet)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.waiters.pop(mid, None)

    def keepalive(self, period: float) -> bool:
        """A keepalive tick; False when the broker has not answered a ping within
        ``period`` (the connection is then closed)."""
        now = self.loop.time()
        if self.ping_sent is not None and now - self.ping_sent > period:
            self.abort(0x8D if self.v5 else 0, "no answer to a ping: the broker is gone")
            return False
        if self.ping_sent is None and now - self.last_write >= period / 2:
            self.ping_sent = now
            self.write(PINGREQ_PACKET)
        return True

    def close(self, reason: int = 0) -> None:
        """End it politely: DISCONNECT, then close."""
        if self.transport is not None:
            self.flush()
            self.transport.write(encode_disconnect(reason, self.v5))
            self.transport.close()

    def abort(self, reason: int, why: str) -> None:
        self.why = why
        if self.transport is not None:
            if self.v5 and reason:
                self.transport.write(encode_disconnect(reason, True))
            self.transport.close()
