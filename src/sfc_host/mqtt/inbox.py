"""The link's incoming side once a message is routed: its handlers run, their faults
logged and counted (never raised), the backlog bounded and the acknowledgements
deferred.

A QoS 1 message whose handler is a coroutine is acknowledged once the handler is done,
and at most ``mqtt_receive_maximum`` handlers run at once (the Receive Maximum we
announce; past it the link stops reading), so what the host took and has not handled
stays bounded, and a broker that hands a dead client's unacknowledged messages of a
shared subscription to another member loses none of them. A handler may hold its
message's acknowledgement longer (``hold_ack``), until what the message caused is
stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from sfc_fast.wire.mqtt5 import Message
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection

log = logging.getLogger("sfc_host.mqtt")

DROP_WARNED_MAX = 10_000   # (topic, reason) pairs already logged once

Handler = Callable[[Message], Awaitable[None] | None]


class Ack:
    """The deferred PUBACK of one message: sent once its last handler is done."""

    __slots__ = ("conn", "left", "mid")

    def __init__(self, conn: Connection, mid: int) -> None:
        self.conn = conn
        self.mid = mid
        self.left = 0


class Inbox:
    """The handlers running and waiting, on the live connection (``conn``) whose
    reading stops while the backlog is full."""

    def __init__(self, metrics: Metrics, receive_max: int) -> None:
        self.metrics = metrics
        self.receive_max = receive_max
        self.conn: Connection | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.running = 0                             # handlers of messages not done
        # handlers not started yet: the backlog was full (reading stops meanwhile)
        self.waiting: deque[tuple[Awaitable[None], str, Ack | None]] = deque()
        self._held = False                           # the running handler took its PUBACK
        self._drop_warned: set[tuple[str, str]] = set()

    def hold_ack(self, message: Message) -> tuple[Connection, int] | None:
        """Called by a handler while it runs: the message's PUBACK waits until the
        handler's owner passes the returned token to ``release_acks`` (once the
        message's effect is stored). None for a message that needs no acknowledgement."""
        conn = self.conn
        if message.qos != 1 or conn is None:
            return None
        self._held = True
        return conn, message.mid

    @staticmethod
    def release_acks(tokens: list[tuple[Connection, int]]) -> None:
        """Send the PUBACKs ``hold_ack`` held (on the connection that took each message:
        one that has ended takes none, and the broker redelivers or gives it up)."""
        for conn, mid in tokens:
            conn.ack(mid)

    def shared_ack(self, message: Message) -> Ack | None:
        """One deferred acknowledgement for the several handlers of ``message``."""
        if message.qos == 1 and self.conn is not None:
            return Ack(self.conn, message.mid)
        return None

    def dropped(self, topic: str, reason: str, why: str) -> None:
        """A message from the broker passed over (acknowledged, not handled)."""
        self.metrics.inc_labeled("mqtt_messages_dropped", "reason", reason)
        key = (topic, reason)
        if key in self._drop_warned:
            return
        if len(self._drop_warned) < DROP_WARNED_MAX:
            self._drop_warned.add(key)
        log.warning("an MQTT message on %r dropped: %s (logged once per topic and reason; "
                    "counted in sfc_mqtt_messages_dropped_total{reason=%r})", topic[:200],
                    why, reason)

    def handle(self, handler: Handler, message: Message, topic: str,
               ack: Ack | None) -> bool:
        """Run one handler; True when it runs on (a coroutine) and the message's
        acknowledgement waits for it."""
        self.metrics.inc("mqtt_received")
        self._held = False
        try:
            res = handler(message)
        except Exception:
            self.metrics.inc("mqtt_handler_errors")
            log.exception("handling a message on %s failed", topic)
            return self._held
        if res is None:
            return self._held
        if ack is None and message.qos == 1 and self.conn is not None:
            ack = Ack(self.conn, message.mid)
        if ack is not None:
            ack.left += 1
        if self.running >= self.receive_max:
            # the backlog is full: this one waits, and the broker with the rest
            self.waiting.append((res, topic, ack))
            if self.conn is not None:
                self.conn.pause_reading()
        else:
            self._start(res, topic, ack)
        return ack is not None

    def _start(self, aw: Awaitable[None], topic: str, ack: Ack | None) -> None:
        t = asyncio.ensure_future(self._guard(aw, topic))
        self.tasks.add(t)
        self.running += 1
        t.add_done_callback(lambda t: self._handled(t, ack))

    def _handled(self, t: asyncio.Task[None], ack: Ack | None) -> None:
        self.tasks.discard(t)
        self.running -= 1
        if ack is not None:
            ack.left -= 1
            if ack.left == 0 and not t.cancelled():
                ack.conn.ack(ack.mid)
        waiting = self.waiting
        while waiting and self.running < self.receive_max:
            self._start(*waiting.popleft())
        conn = self.conn
        if (not waiting and conn is not None and conn.reading_paused
                and self.running <= self.receive_max // 2):
            conn.resume_reading()

    async def _guard(self, aw: Awaitable[None], topic: str) -> None:
        try:
            await aw
        except asyncio.CancelledError:
            raise
        except Exception:
            self.metrics.inc("mqtt_handler_errors")
            log.exception("handling a message on %s failed", topic)

    def close(self) -> None:
        """Cancel the running handlers; the waiting ones never start."""
        for t in list(self.tasks):
            t.cancel()
        while self.waiting:
            aw = self.waiting.popleft()[0]
            if asyncio.iscoroutine(aw):
                aw.close()
