"""The link's outgoing side: a bounded queue that loses nothing across reconnects, and
the in-flight window.

Outgoing messages wait in a bounded queue; ``publish_nowait`` says whether one was
queued (a full queue is counted; for a command the action's deadline sends it again).
Up to ``IN_FLIGHT`` QoS 1 / 2 messages (fewer if the broker's Receive Maximum says so)
wait for their acknowledgement at once; what was not acknowledged when the connection
ends goes back to the front of the queue and out again, marked DUP, after the reconnect.

The queue has two lanes: commands and replies, and the MES's status traffic (status
events, retained state). While both wait, a status message goes after every
``STATUS_EVERY`` commands, and status messages leave a quarter of the in-flight window
to the other lane. So a burst of status messages (thousands of orders ending at once)
does not sit in front of the equipment's commands, and a flood of commands does not
stop the MES's news. Under a lasting overload (more messages than the broker takes),
once the status lane holds a tenth of the queue, both lanes go oldest first, as one
queue with the whole window: the commands' wait slows the jobs down, and with them the
status traffic, which would otherwise be refused once it fills 80 % of the queue. Each
topic keeps to one lane, so a topic's messages stay in order.

What is queued in one event-loop pass goes out in one write. A message after which the
broker closed the connection twice in a row is parked (dropped, counted, logged), so the
link never loops on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sfc_fast.wire.mqtt5 import Properties, publish_into
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection, reason_text
from sfc_host.mqtt.endpoint import Endpoint
from sfc_host.mqtt.settings import MqttSettings

log = logging.getLogger("sfc_host.mqtt")

IN_FLIGHT = 256          # QoS 1 messages sent and not yet acknowledged
WRITE_CHUNK = 1 << 18    # bytes gathered before a write within one pass
# While both lanes wait, a status message goes after this many commands: a command
# waits for one status message at most, and the MES's news keeps a quarter of the link
# under a flood of commands (measured in docs/benchmarks.md)
STATUS_EVERY = 3
# A status message alone waits this long for company (the next command's write, as a
# rule) before it starts a write of its own: the MES's news is not on a job's path,
# and below saturation most of them would otherwise cost the host a write each
STATUS_WAIT_S = 0.005
# a broker closing the connection for these reasons says nothing of our last message
NOT_BLAMED = frozenset((0x89, 0x8B, 0x8D, 0x8E, 0x98, 0x9C, 0x9D, 0x9F, 0xA0))


def status_share(window: int) -> int:
    """The in-flight slots status messages may fill: all but a quarter of the window
    (at least one kept for commands, where the window has two)."""
    return max(1, window - max(1, window // 4))


@dataclass(slots=True)
class Outgoing:
    topic: str
    payload: bytes
    properties: Properties | None
    qos: int
    retain: bool
    acked: asyncio.Future[None] | None = None   # done once the broker has it
    dup: bool = False                           # sent before, not acknowledged
    key: str | None = None                      # a command's id: one copy in the link
    status: bool = False                        # the status lane's (publish_nowait)
    seq: int = 0                                # order of queueing, over both lanes
    sent_at: float = 0.0                        # loop time of its last write


def _follow(m: Outgoing, acked: asyncio.Future[None]) -> None:
    """``acked`` ends as ``m``'s acknowledgement does."""
    if m.acked is None:
        m.acked = acked
        return

    def done(f: asyncio.Future[None]) -> None:
        if acked.done():
            return
        if f.cancelled():
            acked.cancel()
        else:
            acked.set_result(None)
    m.acked.add_done_callback(done)


class Outbox:
    """The two lanes, the messages in flight on the live connection, and the packet
    ids (SUBSCRIBE and UNSUBSCRIBE take theirs here too, so no two collide)."""

    def __init__(self, config: MqttSettings, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.conn: Connection | None = None          # the live connection, if any
        self._queue: deque[Outgoing] = deque()       # commands, replies: first
        self._status: deque[Outgoing] = deque()      # MES status traffic: after them
        self._unacked: dict[int, Outgoing] = {}      # packet id -> message in flight
        self._status_flight = 0                      # status messages among those
        self._commands_run = 0                       # commands since a status message
        self._seq = 0
        # key -> its message while queued or in flight: a command sent again by its entry
        # (its first send not acknowledged in time, e.g. the broker away) joins the copy
        # the link still holds, which goes out again (DUP) on the reconnect anyway
        self._keyed: dict[str, Outgoing] = {}
        # the broker's terms, taken from its CONNACK at each attach
        self.window = IN_FLIGHT
        self._status_window = status_share(IN_FLIGHT)
        self._v5 = True
        self._max_packet = 0                         # 0: no limit
        self._max_qos = 2
        self._retain_ok = True
        self._mid = 0
        self._pump_soon = False
        self._status_timer: asyncio.TimerHandle | None = None
        self._suspect: Outgoing | None = None   # the message the broker last closed on

    @property
    def queued(self) -> int:
        return len(self._queue) + len(self._status)

    @property
    def in_flight(self) -> int:
        return len(self._unacked)

    def attach(self, conn: Connection, endpoint: Endpoint) -> None:
        """A connection is live: the window and limits its broker granted apply."""
        self.window = min(IN_FLIGHT, endpoint.broker_receive_max)
        self._status_window = status_share(self.window)
        self._v5 = endpoint.v5
        self._max_packet = endpoint.broker_max_packet
        self._max_qos = endpoint.broker_max_qos
        self._retain_ok = endpoint.retain_ok
        self.conn = conn

    def detach(self) -> None:
        """The connection is over: what was not acknowledged goes back to the front of
        the queue, in the order it was sent, marked DUP."""
        self.conn = None
        if self._unacked:
            for m in reversed(self._unacked.values()):
                m.dup = True
                (self._status if m.status else self._queue).appendleft(m)
            self._unacked.clear()
            self._status_flight = 0

    def publish_nowait(self, topic: str, payload: bytes, properties: Properties | None = None,
                       *, qos: int | None = None, retain: bool = False,
                       status: bool = False,
                       acked: asyncio.Future[None] | None = None,
                       key: str | None = None) -> bool:
        """Queue a message; False (counted) when the queue is full. A ``status`` message
        (MES status events and retained state) is refused once status messages fill 80 %
        of the queue, so they never crowd out equipment commands and replies. ``acked`` is
        set once the broker has the message (QoS 1: its PUBACK; QoS 0: written), and
        cancelled when the broker refuses it (a PUBACK with an error code, or the
        connection closed on it twice). A ``key`` already queued or in flight is not
        queued again: ``acked`` follows that copy."""
        if not topic or "+" in topic or "#" in topic or len(topic) > 16_000:
            # a reply to a request's response topic, say: refused here, never on the wire
            self.metrics.inc("mqtt_bad_topic")
            log.warning("not published: %r is no topic to publish to", topic[:200])
            return False
        if key is not None:
            held = self._keyed.get(key)
            if held is not None and held.topic == topic:
                self.metrics.inc("mqtt_repeats_joined")
                if acked is not None:
                    _follow(held, acked)
                return True
        n = len(self._queue) + len(self._status)
        size = self.config.mqtt_queue_size
        if n >= size or (status and len(self._status) >= size * 4 // 5):
            self.metrics.inc("mqtt_status_dropped" if status else "mqtt_queue_full")
            return False
        self._seq += 1
        m = Outgoing(topic, payload, properties, self.config.mqtt_qos if qos is None else qos,
                     retain, acked, key=key, status=status, seq=self._seq)
        (self._status if status else self._queue).append(m)
        if key is not None:
            self._keyed[key] = m
        if not self._pump_soon and self.conn is not None:
            if not status:
                self._pump_soon = True
                asyncio.get_running_loop().call_soon(self.pump)
            elif self._status_timer is None:
                self._status_timer = asyncio.get_running_loop().call_later(
                    STATUS_WAIT_S, self._pump_status)
        return True

    def _pump_status(self) -> None:
        self._status_timer = None
        self.pump()

    def send_first(self, messages: Sequence[tuple[str, bytes, asyncio.Future[None]]]) -> None:
        """QoS 1 messages ahead of whatever waits (the delivery check's, which must not
        time out behind a backlog), in the order given."""
        for topic, payload, acked in reversed(messages):
            self._seq += 1
            self._queue.appendleft(Outgoing(topic, payload, None, 1, False, acked,
                                            seq=self._seq))
        self.pump()

    def next_mid(self) -> int:
        conn = self.conn
        while True:
            self._mid = self._mid % 0xFFFF + 1
            if self._mid not in self._unacked and (conn is None
                                                   or self._mid not in conn.waiters):
                return self._mid

    def pump(self) -> None:
        """Move queued messages onto the connection, up to the in-flight window; all of
        this pass's packets go out in one write (or a few, for many large ones)."""
        self._pump_soon = False
        if self._status_timer is not None:
            self._status_timer.cancel()
            self._status_timer = None
        conn = self.conn
        if conn is None or conn.paused:
            return
        q = self._queue
        sq = self._status
        unacked = self._unacked
        window = self.window
        status_window = self._status_window
        out = conn.out
        v5 = self._v5
        max_qos = self._max_qos
        retain_ok = self._retain_ok
        limit = self._max_packet
        metrics = self.metrics
        run = self._commands_run
        crowded = self.config.mqtt_queue_size // 10
        now = conn.loop.time()
        while len(unacked) < window:
            if q and sq and len(sq) >= crowded:
                # a lasting overload: one queue again, oldest first (status messages
                # are refused at 80 % of the queue; slower jobs make fewer of them)
                status = sq[0].seq < q[0].seq
            else:
                status = bool(sq) and (run >= STATUS_EVERY or not q) and \
                    self._status_flight < status_window
            if status:
                m = sq.popleft()
                run = 0
            elif q:
                m = q.popleft()
                run += 1
            else:
                break
            qos = m.qos if m.qos <= max_qos else max_qos
            mid = self.next_mid() if qos else 0
            before = len(out)
            try:
                publish_into(out, m.topic, m.payload, qos, m.retain and retain_ok, mid,
                             m.properties, v5, m.dup and qos > 0)
                if limit and len(out) - before > limit:
                    del out[before:]
                    raise ValueError(f"{len(m.payload)} bytes: larger than the broker takes")
            except (ValueError, TypeError) as e:
                metrics.inc("mqtt_unsendable")
                log.warning("not published on %s: %s", m.topic[:200], e)
                self._release(m)
                if m.acked is not None:
                    m.acked.cancel()
                continue
            if qos:
                m.sent_at = now
                unacked[mid] = m
                if m.status:
                    self._status_flight += 1
            else:
                metrics.inc("mqtt_sent")
                self._release(m)
                if m.acked is not None and not m.acked.done():
                    m.acked.set_result(None)
            if len(out) >= WRITE_CHUNK:
                conn.flush()
                if conn.paused:
                    break
        self._commands_run = run
        conn.flush()

    def on_ack(self, mid: int, code: int) -> None:
        """The broker's PUBACK (or PUBCOMP, or a refusing PUBREC) of packet ``mid``."""
        m = self._unacked.pop(mid, None)
        if m is None:
            return
        if m.status:
            self._status_flight -= 1
        self._release(m)
        if self._suspect is m:
            self._suspect = None
        if code >= 0x80:
            # refused (quota, not authorized, ...): not sent; a command's sender sees it
            # as unacknowledged and its deadline sends it again
            self.metrics.inc("mqtt_refused")
            log.warning("the broker refused a message on %s (%s)", m.topic,
                        reason_text(code))
            if m.acked is not None:
                m.acked.cancel()
        else:
            self.metrics.inc("mqtt_sent")
            if m.acked is not None and not m.acked.done():
                m.acked.set_result(None)
        if (self._queue or self._status) and not self._pump_soon:
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self.pump)

    def _release(self, m: Outgoing) -> None:
        if m.key is not None and self._keyed.get(m.key) is m:
            del self._keyed[m.key]

    def oldest_sent(self) -> float | None:
        """When the oldest message still unacknowledged was written, if any."""
        for m in self._unacked.values():
            return m.sent_at
        return None

    def blame(self, conn: Connection) -> None:
        """The broker closed ``conn``: its oldest unacknowledged message is the likely
        cause (a broker acknowledges in order). Closed on twice in a row, it is parked,
        so the messages behind it go out."""
        if conn.ours or conn.disconnect_code in NOT_BLAMED or not self._unacked:
            self._suspect = None
            return
        mid, m = next(iter(self._unacked.items()))
        if self._suspect is not m:
            self._suspect = m
            return
        del self._unacked[mid]
        if m.status:
            self._status_flight -= 1
        self._suspect = None
        self._release(m)
        self.metrics.inc_labeled("mqtt_messages_dropped", "reason", "broker_refused")
        why = conn.why or "closed"
        log.error("MQTT message on %s (%d bytes) parked: the broker closed the "
                  "connection on it twice in a row (%s); the messages behind it go out",
                  m.topic[:200], len(m.payload), why)
        if m.acked is not None:
            m.acked.cancel()
