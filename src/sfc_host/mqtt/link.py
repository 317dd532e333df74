"""The host's MQTT link: reconnects with backoff, an outgoing queue that loses nothing
across reconnects, and subscriptions (shared, so several hosts split the load).

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

Incoming messages go to the handler of the first matching filter (the host's link,
whose filters do not overlap) or, with ``fan_out`` (the script engine's link), to every
matching subscription once; a handler's fault is logged and counted, never raised.

The packets are read and written by our own compiled codec (``sfc_fast.mqtt5``) over
an asyncio connection (``connection.py``): a socket read becomes the handlers' calls and
one write of their acknowledgements; what is queued in one event-loop pass goes out in
one write. Every session starts clean (the queue above is the session that matters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from sfc_fast.mqtt5 import (
    Message,
    Properties,
    encode_connect,
    encode_subscribe,
    encode_unsubscribe,
    publish_into,
)
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection, MqttError, reason_text
from sfc_host.mqtt.topics import topic_matches
from sfc_host.tls import client_context

log = logging.getLogger("sfc_host.mqtt")

IN_FLIGHT = 256          # QoS 1 messages sent and not yet acknowledged
# CONNACK codes that no retry changes: bad credentials, not authorized, banned, bad
# authentication method (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135, 138, 140)
REFUSED_CODES = frozenset((4, 5, 134, 135, 138, 140))
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_HANDLER_TASKS = 256
ROUTES_MAX = 10_000      # topics whose handler is remembered (a scope's topics each)
KEEPALIVE_S = 30
CONNECT_TIMEOUT_S = 10.0
WRITE_CHUNK = 1 << 18    # bytes gathered before a write within one pass
# a packet the broker sends may be this much larger than the largest payload we take
# (topic, properties); a larger message is passed over as it arrives (never buffered
# whole), acknowledged, logged and counted (``mqtt_oversized``)
PACKET_HEADROOM = 1 << 16
# While both lanes wait, a status message goes after this many commands: a command
# waits for one status message at most, and the MES's news keeps a quarter of the link
# under a flood of commands (measured in docs/benchmarks.md)
STATUS_EVERY = 3

Handler = Callable[[Message], Awaitable[None] | None]


def status_share(window: int) -> int:
    """The in-flight slots status messages may fill: all but a quarter of the window
    (at least one kept for commands, where the window has two)."""
    return max(1, window - max(1, window // 4))


class MqttRefused(ConnectionError):
    """The broker refused the credentials before the link was ever connected."""


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


class MqttLink:
    def __init__(self, config: HostConfig, metrics: Metrics, *, client_id: str = "",
                 fan_out: bool = False, once: bool = False, max_packet: int = 0) -> None:
        self.config = config
        self.metrics = metrics
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
        self._window = IN_FLIGHT
        self._status_window = status_share(IN_FLIGHT)
        self._server_max_packet = 0                 # the broker's limit (MQTT 5), 0: none
        self._server_max_qos = 2
        self._mid = 0
        self._pump_soon = False
        self._subs: list[tuple[str, str, Handler]] = []   # (filter, subscribed as, handler)
        # topic -> its handler (None: unrouted), so a topic's filters are matched once;
        # emptied whenever the subscriptions change
        self._routes: dict[str, Handler | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self._handler_slots = asyncio.Semaphore(MAX_HANDLER_TASKS)
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self.connects = 0
        self.last_error = ""         # why the last connection failed or ended (no secrets)
        self._refused = asyncio.Event()   # the first connect was refused (credentials)
        # once (a command-line client): a first connect that fails ends the link, with
        # no retries and nothing logged; the caller says what went wrong in one line
        self.once = once
        self._gave_up = asyncio.Event()
        self._live: Connection | None = None     # the connected connection, if any
        # fan_out (the script engine's link): a message goes to every subscription it
        # matches, once each. On MQTT 5 the broker sends one copy per matching
        # subscription, told apart by subscription identifiers; on 3.1.1 one copy.
        self.fan_out = fan_out
        self._sub_ids: dict[str, int] = {}
        # False until ``open_subscriptions``: a host connects to publish first and takes
        # messages only once it is ready (a host failing its start-up takes none)
        self.subscribing = True
        # every registered filter acknowledged by the broker on the live connection:
        # until then a request sent to a shared subscription may reach no host at all
        self._acked = False

    @property
    def listening(self) -> bool:
        """Connected, and the broker acknowledged every subscription (``/readyz``)."""
        return self._acked and self.connected.is_set()

    # ---- setup

    def subscribe(self, topic_filter: str, handler: Handler, *,
                  shared: bool = True) -> Callable[[], None]:
        """Shared: ``$share/{group}/{filter}``, so each message goes to one of the hosts.
        Before ``start`` or at any time after (scripts subscribe while they run); every
        reconnect subscribes again (on a link started with ``subscribe=False``, only from
        ``open_subscriptions`` on). Returns a function that ends the subscription."""
        as_, end, conn = self._register(topic_filter, handler, shared)
        if conn is not None:
            self._later(self._subscribe(conn, as_), as_)
        return end

    async def subscribed(self, topic_filter: str, handler: Handler, *,
                         shared: bool = True) -> Callable[[], None]:
        """``subscribe``, returning once the broker acknowledged the subscription (a
        client that publishes a request next must not miss its reply)."""
        as_, end, conn = self._register(topic_filter, handler, shared)
        if conn is not None:
            await self._subscribe(conn, as_)
        return end

    def _register(self, topic_filter: str, handler: Handler, shared: bool
                  ) -> tuple[str, Callable[[], None], Connection | None]:
        """The filter as subscribed, the function that ends it, and the connection to
        send its SUBSCRIBE on now (None: not connected, or the filter is already on)."""
        group = self.config.mqtt_shared_group
        as_ = f"$share/{group}/{topic_filter}" if shared and group else topic_filter
        new = not any(s[1] == as_ for s in self._subs)
        entry = (topic_filter, as_, handler)
        self._subs.append(entry)
        self._routes.clear()
        if self.fan_out and as_ not in self._sub_ids:
            self._sub_ids[as_] = len(self._sub_ids) + 1

        def unsubscribe() -> None:
            if entry not in self._subs:
                return
            self._subs.remove(entry)
            self._routes.clear()
            conn = self._live
            if (conn is not None and self.subscribing
                    and not any(s[1] == as_ for s in self._subs)):
                mid = self._next_mid()
                self._later(conn.request(mid, encode_unsubscribe(mid, (as_,), self.v5)), as_)
        now = self._live if new and self.subscribing else None
        return as_, unsubscribe, now

    async def _subscribe(self, conn: Connection, as_: str) -> None:
        mid = self._next_mid()
        codes = await conn.request(mid, encode_subscribe(
            mid, (as_,), self.config.mqtt_qos, self._sub_ids.get(as_, 0) if self.v5 else 0,
            self.v5))
        if any(c >= 0x80 for c in codes):
            self.metrics.inc("mqtt_subscribe_refused")
            log.warning("the broker refused the subscription to %s (%s)", as_,
                        reason_text(max(codes)))

    def _later(self, aw: Awaitable[Any], what: str) -> None:
        # a (un)subscribe on the live connection; if the connection drops first, the
        # reconnect subscribes from _subs anyway (and an unsubscribe needs none then):
        # no warning for that, as when the broker stops under a closing script engine
        async def run() -> None:
            try:
                await aw
            except MqttError as e:
                log.debug("MQTT (un)subscribe %s not answered: %s", what, e)
            except Exception as e:
                log.warning("MQTT (un)subscribe %s failed: %s", what, e)
        t = asyncio.get_running_loop().create_task(run())
        self._handler_tasks.add(t)
        t.add_done_callback(self._handler_tasks.discard)

    async def start(self, *, subscribe: bool = True) -> MqttLink:
        """Connect (and keep connecting). ``subscribe=False``: publishing only, the
        registered filters wait for ``open_subscriptions``."""
        self.subscribing = subscribe
        self._task = asyncio.create_task(self._run(), name="sfc-mqtt")
        return self

    async def open_subscriptions(self) -> None:
        """Subscribe every registered filter now (if connected) and on every reconnect.
        Returns once the broker acknowledged them, or once the connection dropped (the
        reconnect subscribes them all)."""
        if self.subscribing:
            return
        self.subscribing = True
        conn = self._live
        if conn is None:
            return
        try:
            for as_ in dict.fromkeys(s[1] for s in self._subs):
                await self._subscribe(conn, as_)
            self._acked = self._live is conn
        except (MqttError, TimeoutError) as e:
            log.warning("MQTT subscribe failed (%s); the reconnect subscribes again", e)

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Until connected; ``MqttRefused`` at once when the broker refuses the
        credentials (retrying would wait out ``timeout`` for nothing), ``TimeoutError``
        when it cannot be reached."""
        waits = [asyncio.ensure_future(e.wait())
                 for e in (self.connected, self._refused, self._gave_up)]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.connected.is_set():
            return
        if self._refused.is_set():
            raise MqttRefused(f"the broker at {self.host}:{self.port} refused the "
                              f"connection ({self.last_error})")
        if self._gave_up.is_set():
            raise MqttError(self.last_error)
        raise TimeoutError(f"no connection to {self.host}:{self.port} within {timeout} s")

    async def __aenter__(self) -> MqttLink:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_s: float = 2.0) -> None:
        """Stop after sending what is queued and having it acknowledged (up to
        ``drain_s``)."""
        if self._task is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_s
        while ((self._queue or self._status or self._unacked) and self.connected.is_set()
               and loop.time() < end):
            await asyncio.sleep(0.01)
        self._closing = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._task = None
        for t in list(self._handler_tasks):
            t.cancel()

    # ---- sending

    def publish_nowait(self, topic: str, payload: bytes, properties: Properties | None = None,
                       *, qos: int | None = None, retain: bool = False,
                       status: bool = False,
                       acked: asyncio.Future[None] | None = None,
                       key: str | None = None) -> bool:
        """Queue a message; False (counted) when the queue is full. A ``status`` message
        (MES status events and retained state) is refused once status messages fill 80 %
        of the queue, so they never crowd out equipment commands and replies. ``acked`` is
        set once the broker has the message (QoS 1: its PUBACK; QoS 0: written), and
        cancelled when the broker refuses it (a PUBACK with an error code). A ``key``
        already queued or in flight is not queued again: ``acked`` follows that copy."""
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
        if not self._pump_soon and self._live is not None:
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pump)
        return True

    @property
    def queued(self) -> int:
        return len(self._queue) + len(self._status)

    def _next_mid(self) -> int:
        conn = self._live
        while True:
            self._mid = self._mid % 0xFFFF + 1
            if self._mid not in self._unacked and (conn is None
                                                   or self._mid not in conn.waiters):
                return self._mid

    def _pump(self) -> None:
        """Move queued messages onto the connection, up to the in-flight window; all of
        this pass's packets go out in one write (or a few, for many large ones)."""
        self._pump_soon = False
        conn = self._live
        if conn is None or conn.paused:
            return
        q = self._queue
        sq = self._status
        unacked = self._unacked
        window = self._window
        status_window = self._status_window
        out = conn.out
        v5 = self.v5
        max_qos = self._server_max_qos
        limit = self._server_max_packet
        metrics = self.metrics
        run = self._commands_run
        crowded = self.config.mqtt_queue_size // 10
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
            mid = self._next_mid() if qos else 0
            before = len(out)
            try:
                publish_into(out, m.topic, m.payload, qos, m.retain, mid, m.properties, v5,
                             m.dup)
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

    def _on_ack(self, mid: int, code: int) -> None:
        m = self._unacked.pop(mid, None)
        if m is None:
            return
        if m.status:
            self._status_flight -= 1
        self._release(m)
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
            asyncio.get_running_loop().call_soon(self._pump)

    def _release(self, m: Outgoing) -> None:
        if m.key is not None and self._keyed.get(m.key) is m:
            del self._keyed[m.key]

    # ---- the connection

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        c = self.config
        return client_context(c.mqtt_ca_file, c.mqtt_cert_file, c.mqtt_key_file)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        c = self.config
        conn = Connection(v5=self.v5, max_packet=self.max_packet, metrics=self.metrics,
                          on_message=self._dispatch, on_ack=self._on_ack,
                          on_writable=self._pump)
        tls = self._tls_context()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await loop.create_connection(lambda: conn, self.host, self.port, ssl=tls,
                                         server_hostname=self.host if tls else None)
            conn.write(encode_connect(
                self.client_id, KEEPALIVE_S, self.v5, c.mqtt_username or None,
                c.mqtt_password or None))
            try:
                _, code, props = await conn.connack
            except BaseException:
                conn.abort(0, "")
                raise
        if code:
            conn.abort(0, "")
            raise MqttError(reason_text(code), code)
        self._window = min(IN_FLIGHT, props.get("ReceiveMaximum", IN_FLIGHT))
        self._status_window = status_share(self._window)
        self._server_max_packet = props.get("MaximumPacketSize", 0)
        self._server_max_qos = props.get("MaximumQoS", 2)
        return conn

    async def _run(self) -> None:
        fails = 0
        while not self._closing:
            conn: Connection | None = None
            try:
                conn = await self._connect()
                self._live = conn     # from here subscribe() goes straight out
                if self.subscribing:
                    for as_ in dict.fromkeys(s[1] for s in self._subs):
                        await self._subscribe(conn, as_)
                    self._acked = True
                self.connects += 1
                if fails or self.connects > 1:
                    log.info("MQTT connected again to %s:%d", self.host, self.port)
                fails = 0
                self.connected.set()
                self._pump()
                while not conn.closed.done():
                    # keepalive: a ping when idle, the end when it goes unanswered
                    await asyncio.wait((conn.closed,), timeout=KEEPALIVE_S / 2)
                    if not conn.closed.done():
                        conn.keepalive(KEEPALIVE_S)
                raise MqttError(conn.why or "connection closed by the broker")
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()
                raise
            except (MqttError, OSError, TimeoutError, ssl.SSLError) as e:
                if conn is not None:
                    conn.abort(0, "")
                delay = BACKOFF_S[min(fails, len(BACKOFF_S) - 1)]
                fails += 1
                self.metrics.inc("mqtt_reconnects")
                self.last_error = str(e) or type(e).__name__
                code = getattr(e, "rc", None)
                if not self.connects and code in REFUSED_CODES:
                    self._refused.set()
                if self.once and not self.connects:
                    self._gave_up.set()
                    return
                # The error names the broker, never the credentials.
                log.warning("MQTT connection to %s:%d lost or refused (%s); again in %.1f s",
                            self.host, self.port, self.last_error, delay)
                self._lost()
                await asyncio.sleep(delay)
            finally:
                self._lost()

    def _lost(self) -> None:
        """The connection is over: what was not acknowledged goes back to the front of
        the queue, in the order it was sent, marked DUP."""
        self._live = None
        self._acked = False
        self.connected.clear()
        if self._unacked:
            for m in reversed(self._unacked.values()):
                m.dup = True
                (self._status if m.status else self._queue).appendleft(m)
            self._unacked.clear()
            self._status_flight = 0

    # ---- receiving

    def _dispatch(self, message: Message) -> None:
        topic = message.topic
        if self.fan_out:
            self._fan_out(message, topic)
            return
        routes = self._routes
        try:
            handler = routes[topic]
        except KeyError:
            handler = next((h for f, _, h in self._subs if topic_matches(f, topic)), None)
            if len(routes) < ROUTES_MAX:
                routes[topic] = handler
        if handler is None:
            self.metrics.inc("mqtt_unrouted")
            return
        self._handle(handler, message, topic)

    def _fan_out(self, message: Message, topic: str) -> None:
        p = message.properties
        ids = p.SubscriptionIdentifier if p is not None else None
        sub_ids = self._sub_ids
        handlers = [h for f, as_, h in self._subs
                    if (sub_ids.get(as_) in ids if ids else topic_matches(f, topic))]
        if not handlers:
            self.metrics.inc("mqtt_unrouted")
        for h in handlers:
            self._handle(h, message, topic)

    def _handle(self, handler: Handler, message: Message, topic: str) -> None:
        self.metrics.inc("mqtt_received")
        try:
            res = handler(message)
        except Exception:
            self.metrics.inc("mqtt_handler_errors")
            log.exception("handling a message on %s failed", topic)
            return
        if res is not None:
            t = asyncio.ensure_future(self._guard(res, topic))
            self._handler_tasks.add(t)
            t.add_done_callback(self._handler_tasks.discard)

    async def _guard(self, aw: Awaitable[None], topic: str) -> None:
        async with self._handler_slots:
            try:
                await aw
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.inc("mqtt_handler_errors")
                log.exception("handling a message on %s failed", topic)

