"""One connection to the broker: an asyncio ``Protocol`` over the event loop's transport
(uvloop's in the host; TLS through ``loop.create_connection(ssl=...)``).

Packets are framed by the compiled codec (``sfc_fast.wire.mqtt5``): every packet of one
socket read in one call, each PUBLISH handed to ``on_message`` as the handler's
``Message``, and the acknowledgements of one read written together, with the first
publish that follows within ``ACK_DELAY_S``. What the link sends in one event-loop pass
collects in ``out`` and goes out in one write.

A packet that cannot be framed, or a broken packet other than a PUBLISH, closes the
connection (with its reason code on MQTT 5, as the spec demands); it is logged and
counted (``mqtt_malformed``) and the link connects again. A PUBLISH that is framed but
invalid (its topic, its properties) is acknowledged as its QoS asks and handed to the
link as dropped: another client's bad message must not cost us the connection (a
retained one would cost it again at every reconnect). A QoS 1 message whose handler
runs on is acknowledged when the handler is done (``ack``), so the broker holds what
we have not handled yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from sfc_fast.wire.mqtt5 import (
    CONNACK,
    DISCONNECT,
    DROPPED,
    IGNORED,
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
from sfc_host.errors import SfcHostError
from sfc_host.metrics import Metrics

log = logging.getLogger("sfc_host.mqtt")

# Acknowledgements of a read wait this long for the work they start (a settle, then the
# next command) to go out in the same write: one write per answer rather than two. An
# answer that starts no command (a job's last) goes with the next one's, below
# saturation a few milliseconds later. The broker's in-flight window to us is far wider
# than what arrives in this time.
ACK_DELAY_S = 0.005

# MQTT 5 reason codes in words (MQTT 5, 2.4), for the log
REASONS = {0x00: "Success", 0x01: "Granted QoS 1", 0x02: "Granted QoS 2",
           0x04: "Disconnect with will message", 0x10: "No matching subscribers",
           0x11: "No subscription existed", 0x18: "Continue authentication",
           0x19: "Re-authenticate", 0x80: "Unspecified error", 0x81: "Malformed packet",
           0x82: "Protocol error", 0x83: "Implementation specific error",
           0x84: "Unsupported protocol version", 0x85: "Client identifier not valid",
           0x86: "Bad user name or password", 0x87: "Not authorized",
           0x88: "Server unavailable", 0x89: "Server busy", 0x8A: "Banned",
           0x8B: "Server shutting down", 0x8C: "Bad authentication method",
           0x8D: "Keep alive timeout", 0x8E: "Session taken over",
           0x8F: "Topic filter invalid", 0x90: "Topic name invalid",
           0x91: "Packet identifier in use", 0x92: "Packet identifier not found",
           0x93: "Receive maximum exceeded", 0x94: "Topic alias invalid",
           0x95: "Packet too large", 0x96: "Message rate too high", 0x97: "Quota exceeded",
           0x98: "Administrative action", 0x99: "Payload format invalid",
           0x9A: "Retain not supported", 0x9B: "QoS not supported",
           0x9C: "Use another server", 0x9D: "Server moved",
           0x9E: "Shared subscriptions not supported", 0x9F: "Connection rate exceeded",
           0xA0: "Maximum connect time", 0xA1: "Subscription identifiers not supported",
           0xA2: "Wildcard subscriptions not supported"}
# CONNACK return codes of MQTT 3.1.1 (3.2.2.3) and its SUBACK failure
REASONS_V3 = {0: "Connection accepted", 1: "Unacceptable protocol version",
              2: "Client identifier rejected", 3: "Server unavailable",
              4: "Bad user name or password", 5: "Not authorized", 0x80: "Failure"}
TAKEN_OVER = 0x8E
REDIRECTS = (0x9C, 0x9D)


class MqttError(SfcHostError, ConnectionError):
    """The connection could not be made or ended; ``rc`` is the broker's reason code
    when it gave one."""

    def __init__(self, message: str, rc: int | None = None) -> None:
        super().__init__(message)
        self.rc = rc


def reason_text(code: int, v5: bool = True) -> str:
    """A reason code as the log shows it: ``[code:135] Not authorized``."""
    name = (REASONS if v5 else REASONS_V3).get(code)
    if name is None:
        name = "a code MQTT 5 does not define" if v5 else "a code MQTT 3.1.1 does not define"
    return f"[code:{code}] {name}"


class Connection(asyncio.Protocol):
    """The protocol object of one connection; the link owns what outlives it."""

    def __init__(self, *, v5: bool, max_packet: int, metrics: Metrics,
                 on_message: Callable[[Message], bool],
                 on_ack: Callable[[int, int], None],
                 on_writable: Callable[[], None],
                 on_dropped: Callable[[str, str, str], None]) -> None:
        self.v5 = v5
        self.reader = Reader(v5, max_packet)
        self.metrics = metrics
        # a QoS 1 message whose on_message says True is acknowledged later (``ack``),
        # once its handler is done
        self.on_message = on_message
        self.on_ack = on_ack                  # (mid, reason) of our QoS 1 / 2 publishes
        self.on_writable = on_writable        # the transport takes writes again
        self.on_dropped = on_dropped          # (topic, reason, why) of a message passed over
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
        self.reading_paused = False       # we stopped reading: the handlers' backlog is full
        self.last_write = self.last_read = loop.time()
        self.writes = 0                   # socket writes (benchmarks count them)
        self.connected_at = 0.0           # loop time of the CONNACK
        self.ping_sent: float | None = None
        self._qos2_in: set[int] = set()   # QoS 2 messages delivered, PUBREL not yet seen
        self.why = ""                     # why it ended, when we know better than the OS
        self.disconnect_code: int | None = None     # the broker's DISCONNECT, if it sent one
        self.server_reference = ""        # where a redirecting broker sends us
        self.ours = False                 # we ended it (ping, overdue ack, malformed)
        self._warned: set[str] = set()

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]   # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # small packets must not wait for the peer's delayed ACK (Nagle)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
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
                if qos == 1:
                    if not on_message(item):
                        ack_into(out, PUBACK, item.mid)
                elif qos == 2:
                    mid = item.mid
                    ack_into(out, PUBREC, mid)
                    if mid in self._qos2_in:   # sent again before our PUBREC arrived
                        continue
                    self._qos2_in.add(mid)
                    on_message(item)
                else:
                    on_message(item)
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
        elif kind == DROPPED:
            _, topic, qos, mid, reason, why = item
            self._ack_passed_over(qos, mid)
            self.on_dropped(topic, reason, why)
        elif kind == IGNORED:
            self.metrics.inc("mqtt_ignored_properties")
            if item[2] not in self._warned:
                self._warned.add(item[2])
                log.warning("the broker sent an acknowledgement with invalid properties "
                            "(%s); it is used without them", item[2])
        elif kind == CONNACK:
            if self.connack.done():
                self.abort(0x82, "a second CONNACK")
            else:
                self.connected_at = self.loop.time()
                self.connack.set_result((item[1], item[2], item[3]))
        elif kind == OVERSIZED:
            _, topic, qos, mid, size = item
            self.metrics.inc("mqtt_oversized")
            log.warning("a message of %d bytes on %s passed over: larger than the link "
                        "takes (mqtt_max_payload)", size, topic[:200])
            self._ack_passed_over(qos, mid)
        elif kind == DISCONNECT:
            code, props = item[1], item[2]
            self.disconnect_code = code
            self.server_reference = props.get("ServerReference", "")
            text = reason_text(code)
            if props.get("ReasonString"):
                text += f": {props['ReasonString']}"
            self.why = f"the broker disconnected: {text}"

    def _ack_passed_over(self, qos: int, mid: int) -> None:
        if mid and qos == 1:
            ack_into(self.out, PUBACK, mid)
        elif mid and qos == 2:
            ack_into(self.out, PUBREC, mid)
            self._qos2_in.add(mid)

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

    def pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self.reading_paused:
            self.reading_paused = False
            self.last_read = self.loop.time()     # the silence was ours
            self.transport.resume_reading()

    # ---- writing

    def write(self, packet: bytes) -> None:
        self.out += packet
        self.flush_soon()

    def ack(self, mid: int) -> None:
        """The PUBACK of a message whose handler is done: with the next write (the
        command its answer started, as a rule), or alone after ``ACK_DELAY_S``."""
        if self.transport is not None:
            ack_into(self.out, PUBACK, mid)
            if not self._flush_soon and self._ack_timer is None:
                self._ack_timer = self.loop.call_later(ACK_DELAY_S, self.flush)

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
        self.writes += 1

    async def request(self, mid: int, packet: bytes, timeout: float = 10.0) -> list[int]:
        """Send a SUBSCRIBE or UNSUBSCRIBE; its acknowledgement's reason codes."""
        fut: asyncio.Future[list[int]] = self.loop.create_future()
        self.waiters[mid] = fut
        self.write(packet)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.abort(0x8D if self.v5 else 0,
                       f"no answer to a (un)subscribe within {timeout:g} s: the broker is gone")
            raise MqttError(self.why) from None
        finally:
            self.waiters.pop(mid, None)

    def keepalive(self, period: float, oldest: float | None) -> bool:
        """A keepalive tick; False when the broker is gone (the connection is then
        closed): a ping unanswered, with nothing else read, for half the keep alive, or
        ``oldest`` (when our oldest unacknowledged message was sent) more than the keep
        alive ago. A ping goes out after half the keep alive without a write or without
        a read, so a broker that hangs while we publish is found too."""
        now = self.loop.time()
        if self.reading_paused:
            return True                   # our own backpressure, not the broker's silence
        half = period / 2
        if self.ping_sent is not None and now - max(self.ping_sent, self.last_read) > half:
            self.metrics.inc("mqtt_keepalive_timeouts")
            self.abort(0x8D if self.v5 else 0,
                       f"no answer to a ping within {half:g} s: the broker is gone")
            return False
        if oldest is not None and now - oldest > period:
            self.metrics.inc("mqtt_keepalive_timeouts")
            self.abort(0x8D if self.v5 else 0,
                       f"a message unacknowledged for more than the keep alive "
                       f"({period:g} s): the broker is gone")
            return False
        if self.ping_sent is None and (now - self.last_write >= half
                                       or now - self.last_read >= half):
            self.ping_sent = now
            self.write(PINGREQ_PACKET)
        return True

    def close(self, reason: int = 0) -> None:
        """End it politely: DISCONNECT, then close."""
        if self.transport is not None:
            self.flush()
            self.transport.write(encode_disconnect(reason, self.v5))
            self.transport.close()

    def shut(self) -> None:
        """Close what is left of a connection already over (no word to the broker)."""
        if self.transport is not None:
            self.transport.close()

    def abort(self, reason: int, why: str) -> None:
        self.why = why
        self.ours = True
        if self.transport is not None:
            if self.v5 and reason:
                self.transport.write(encode_disconnect(reason, True))
            self.transport.close()
