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
matching subscription once; a handler's fault is logged and counted, never raised. A
QoS 1 message whose handler is a coroutine is acknowledged once the handler is done,
and at most ``mqtt_receive_maximum`` handlers run at once (the Receive Maximum we
announce; past it the link stops reading), so what the host took and has not handled
stays bounded, and a broker that hands a dead client's unacknowledged messages of a
shared subscription to another member loses none of them.

What a broker says in its CONNACK is honoured (docs/operations.md, "Brokers"): its
Receive Maximum, Maximum Packet Size and Maximum QoS, its Server Keep Alive, Retain
Available (retained messages then go out unretained), and whether it supports
wildcard, shared subscriptions and subscription identifiers (a host that needs one it
lacks stops with ``MqttUnsupported``). The link never loops on the broker: a message
after which the broker closed the connection twice in a row is parked (dropped,
counted, logged), and the backoff between connections grows with jitter and starts
again only after a connection stayed up ``STABLE_S``.

The packets are read and written by our own compiled codec (``sfc_fast.wire.mqtt5``) over
an asyncio connection (``connection.py``): a socket read becomes the handlers' calls and
one write of their acknowledgements; what is queued in one event-loop pass goes out in
one write. Every session starts clean (the queue above is the session that matters).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from sfc_fast.wire.mqtt5 import (
    Message,
    Properties,
    encode_connect,
    encode_subscribe,
    encode_unsubscribe,
    publish_into,
)
from sfc_host.aio import reap
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import (
    REDIRECTS,
    TAKEN_OVER,
    Connection,
    MqttError,
    reason_text,
)
from sfc_host.mqtt.probe import PROBE_S, DeliveryProbe
from sfc_host.mqtt.settings import MqttSettings
from sfc_host.mqtt.topics import dotted_original, filter_problem, topic_matches
from sfc_host.tls import client_context

log = logging.getLogger("sfc_host.mqtt")

IN_FLIGHT = 256          # QoS 1 messages sent and not yet acknowledged
# CONNACK codes that no retry changes: bad credentials, not authorized, banned, bad
# authentication method (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135, 138, 140)
REFUSED_CODES = frozenset((4, 5, 134, 135, 138, 140))
# CONNACK codes about our will, which the next CONNECT changes: retain, QoS not supported
WILL_REFUSED = frozenset((0x9A, 0x9B))
# The waits between connection attempts, each taken at 50-100 % (jitter, so hosts that
# lost one broker do not all come back at once); the next attempt's wait is the next
# one, back to the first only after a connection stayed up STABLE_S
BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
STABLE_S = 30.0
# a connection the broker ends for another client with our id waits at least this
TAKEOVER_BACKOFF_S = 2.0
# connections that end this soon after their CONNACK without a word from the broker,
# twice in a row, read as taken over by a client with the same id, when no message of
# ours is to blame: MQTT 3.1.1 has no DISCONNECT to the client, and mosquitto 2.0 sends
# none on MQTT 5 either
TAKEOVER_S = 1.0
# A refused subscription is asked for again after these waits (the last one repeats)
RESUBSCRIBE_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# a broker closing the connection for these reasons says nothing of our last message
NOT_BLAMED = frozenset((0x89, 0x8B, 0x8D, 0x8E, 0x98, 0x9C, 0x9D, 0x9F, 0xA0))
ROUTES_MAX = 10_000      # topics whose handler is remembered (a scope's topics each)
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
DROP_WARNED_MAX = 10_000   # (topic, reason) pairs already logged once

Handler = Callable[[Message], Awaitable[None] | None]


def status_share(window: int) -> int:
    """The in-flight slots status messages may fill: all but a quarter of the window
    (at least one kept for commands, where the window has two)."""
    return max(1, window - max(1, window // 4))


def backoff(fails: int) -> float:
    """The wait before attempt ``fails + 1`` of a connection, with jitter."""
    return BACKOFF_S[min(fails, len(BACKOFF_S) - 1)] * random.uniform(0.5, 1.0)


class MqttRefused(ConnectionError):
    """The broker refused the credentials before the link was ever connected."""


class MqttUnsupported(MqttRefused):
    """The broker lacks what the host needs (shared or wildcard subscriptions): no
    retry changes that."""


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
    sent_at: float = 0.0                        # loop time of its last write


class _Ack:
    """The deferred PUBACK of one message: sent once its last handler is done."""

    __slots__ = ("conn", "left", "mid")

    def __init__(self, conn: Connection, mid: int) -> None:
        self.conn = conn
        self.mid = mid
        self.left = 0


class MqttLink:
    def __init__(self, config: MqttSettings, metrics: Metrics, *, client_id: str = "",
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
        self.keepalive_s = float(config.mqtt_keepalive_s)   # this connection's, see CONNACK
        self.receive_max = config.mqtt_receive_maximum
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
        self._retain_ok = True                      # the broker keeps retained messages
        self._sub_ids_ok = True                     # ... and subscription identifiers
        self._mid = 0
        self._pump_soon = False
        self._subs: list[tuple[str, str, Handler]] = []   # (filter, subscribed as, handler)
        # topic -> its handler (None: unrouted), so a topic's filters are matched once;
        # emptied whenever the subscriptions change
        self._routes: dict[str, Handler | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._running = 0                            # handlers of messages not done
        # handlers not started yet: the backlog was full (reading stops meanwhile)
        self._waiting: deque[tuple[Awaitable[None], str, _Ack | None]] = deque()
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
        self.refused: dict[str, str] = {}     # filter as subscribed -> the broker's reason
        self._resubscribing: asyncio.Task[None] | None = None
        # What keeps the link from serving, in one line (a broker that lacks a feature
        # the host needs, shared subscriptions that deliver nothing); "" when nothing
        self.problem = ""
        # A topic no one else uses, under which a message of our own must come back
        # through a shared subscription before the link reports it listens (the host
        # sets it; None: no such check)
        self.probe_topic: str | None = None
        # dotted scopes whose topic shape the check sends too (a broker may rewrite it)
        self.probe_scopes: tuple[str, ...] = ()
        self._probe: DeliveryProbe | None = None
        self.checking = ""      # the check running now, for /readyz ("" none)
        self._unrouted_warned: set[str] = set()
        self._will: tuple[str, bytes, Properties | None] | None = None
        self._will_qos = 1
        self.on_connect: list[Callable[[], None]] = []   # after each (re)connect
        self._drop_warned: set[tuple[str, str]] = set()
        self._suspect: Outgoing | None = None   # the message the broker last closed on
        self._held = False                      # the running handler took its PUBACK
        self._guesses = 0                       # fresh connections ended unasked in a row

    @property
    def listening(self) -> bool:
        """Connected, and the broker granted every subscription, and the shared ones
        deliver (``/readyz``)."""
        return (self._acked and not self.refused and not self.problem
                and self.connected.is_set())

    def not_listening(self) -> list[str]:
        """Why the link does not listen, one line each (``/readyz``); empty when it does."""
        if not self.connected.is_set():
            return [f"not connected ({self.last_error})" if self.last_error
                    else "not connected"]
        why = [f"subscription {f} refused by the broker: {r}"
               for f, r in self.refused.items()]
        if self.problem:
            why.append(self.problem)
        if self.checking:
            why.append(self.checking)
        if not why and not self._acked:
            why.append("subscriptions not acknowledged yet")
        return why

    def set_will(self, topic: str, payload: bytes,
                 properties: Properties | None = None) -> None:
        """A retained Last Will: the broker publishes it when the connection ends
        without our DISCONNECT (from the next connection on)."""
        self._will = (topic, payload, properties)

    # ---- setup

    def subscribe(self, topic_filter: str, handler: Handler, *,
                  shared: bool = True) -> Callable[[], None]:
        """Shared: ``$share/{group}/{filter}``, so each message goes to one of the hosts.
        Before ``start`` or at any time after (scripts subscribe while they run); every
        reconnect subscribes again (on a link started with ``subscribe=False``, only from
        ``open_subscriptions`` on). Returns a function that ends the subscription.
        ``ValueError`` at once for what is no topic filter."""
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
        problem = filter_problem(topic_filter) or filter_problem(as_)
        if problem:
            raise ValueError(f"{str(topic_filter)[:200]!r}: {problem}")
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
            if any(s[1] == as_ for s in self._subs):
                return
            self.refused.pop(as_, None)
            conn = self._live
            if conn is not None and self.subscribing:
                mid = self._next_mid()
                self._later(conn.request(mid, encode_unsubscribe(mid, (as_,), self.v5),
                                         self.keepalive_s), as_)
        now = self._live if new and self.subscribing else None
        return as_, unsubscribe, now

    async def _subscribe(self, conn: Connection, as_: str) -> bool:
        """Subscribe one filter; False (logged, counted, kept in ``refused``) when the
        broker refuses it."""
        mid = self._next_mid()
        sub_id = self._sub_ids.get(as_, 0) if self.v5 and self._sub_ids_ok else 0
        codes = await conn.request(mid, encode_subscribe(
            mid, (as_,), self.config.mqtt_qos, sub_id, self.v5), self.keepalive_s)
        if all(c < 0x80 for c in codes):
            if self.refused.pop(as_, None) is not None:
                log.info("the broker granted the subscription to %s now", as_)
            return True
        reason = reason_text(max(codes), self.v5)
        self.metrics.inc("mqtt_subscribe_refused")
        if self.refused.get(as_) != reason:
            log.error("the broker refused the subscription to %s (%s): the host takes "
                      "nothing on it and is not ready; asked again with backoff (check "
                      "the broker's ACL for client %s)", as_, reason, self.client_id)
        self.refused[as_] = reason
        return False

    async def _subscribe_all(self, conn: Connection) -> None:
        """Every registered filter, then (for shared ones) the check that they deliver;
        what is refused is asked for again with backoff."""
        self._acked = False
        for as_ in dict.fromkeys(s[1] for s in self._subs):
            await self._subscribe(conn, as_)
        if self.refused:
            self._resubscribe(conn)
        await self._check_shared(conn)
        # only now: until the check passed, a request may reach a host that hears nothing
        self._acked = self._live is conn

    def _resubscribe(self, conn: Connection) -> None:
        if self._resubscribing is not None and not self._resubscribing.done():
            return

        async def again() -> None:
            for attempt in itertools.count():
                await asyncio.sleep(RESUBSCRIBE_S[min(attempt, len(RESUBSCRIBE_S) - 1)])
                if self._live is not conn:
                    return                # the reconnect subscribes them all anyway
                for as_ in list(self.refused):
                    if any(s[1] == as_ for s in self._subs):
                        await self._subscribe(conn, as_)
                    else:
                        self.refused.pop(as_, None)
                if not self.refused:
                    await self._check_shared(conn)
                    if not self.problem:
                        return
        self._resubscribing = asyncio.get_running_loop().create_task(self._guarded(again))

    async def _guarded(self, step: Callable[[], Awaitable[None]]) -> None:
        # the coroutine is made here: a task cancelled before it ran leaves none unawaited
        try:
            await step()
        except (MqttError, TimeoutError) as e:
            log.debug("MQTT subscribing again ended with the connection: %s", e)
        except Exception:
            log.exception("MQTT subscribing again failed")

    async def _check_shared(self, conn: Connection) -> None:
        """Messages of our own through a subscription of our own (``probe.py``): a
        broker that grants ``$share/…`` filters but delivers nothing through them, or
        that rewrites a dotted scope's topics, would leave a ready host deaf."""
        group = self.config.mqtt_shared_group
        shared = bool(group) and any(s[1].startswith("$share/") for s in self._subs)
        if self.probe_topic is None or not (shared or self.probe_scopes):
            return
        probe = DeliveryProbe(self.probe_topic, self.probe_scopes)
        flt = probe.topic_filter(group if shared else "")
        self._probe = probe
        self.checking = (f"checking that the broker delivers through {flt} (up to "
                         f"{PROBE_S:g} s)")
        try:
            mid = self._next_mid()
            codes = await conn.request(mid, encode_subscribe(mid, (flt,), 1, 0, self.v5),
                                       self.keepalive_s)
            if any(c >= 0x80 for c in codes):
                why = (f"the broker refused the subscription {flt} of the host's check "
                       f"({reason_text(max(codes), self.v5)})")
            else:
                self._send_probe(probe)
                await asyncio.wait((probe.done,), timeout=PROBE_S)
                why = probe.failure(flt, self.client_id, shared)
            mid = self._next_mid()
            with contextlib.suppress(MqttError, TimeoutError):
                await conn.request(mid, encode_unsubscribe(mid, (flt,), self.v5),
                                   self.keepalive_s)
        finally:
            self._probe = None
            self.checking = ""
        if why:
            if why != self.problem:
                log.error("%s", why)
            self.problem = why
            self._resubscribe(conn)
        elif self.problem:
            log.info("the broker delivers the host's check messages now")
            self.problem = ""

    def _send_probe(self, probe: DeliveryProbe) -> None:
        # ahead of whatever waits: the check must not time out behind a backlog; the
        # broker refusing a message ends the wait at once
        loop = asyncio.get_running_loop()
        for payload, topic in reversed(probe.sent.items()):
            sent: asyncio.Future[None] = loop.create_future()
            sent.add_done_callback(lambda f: f.cancelled() and probe.refused())
            self._seq += 1
            self._queue.appendleft(Outgoing(topic, payload, None, 1, False, sent,
                                            seq=self._seq))
        self._pump()

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
        reconnect subscribes them all). ``MqttUnsupported`` when the broker granted the
        shared subscriptions but delivers nothing through them."""
        if self.subscribing:
            return
        self.subscribing = True
        conn = self._live
        if conn is None:
            return
        try:
            await self._subscribe_all(conn)
        except (MqttError, TimeoutError) as e:
            log.warning("MQTT subscribe failed (%s); the reconnect subscribes again", e)
            return
        if self.problem:
            raise MqttUnsupported(f"the broker at {self.host}:{self.port}: {self.problem}")

    async def close_subscriptions(self, timeout: float = 2.0) -> bool:
        """Take no more messages: every filter unsubscribed (a stopping host, so that
        what comes next goes to the other hosts); no reconnect subscribes again. True
        once the broker acknowledged it: every message it sent us before is in our
        socket by then (a connection keeps its order)."""
        self.subscribing = False
        self._acked = False
        if self._resubscribing is not None:
            self._resubscribing.cancel()
        conn = self._live
        filters = tuple(dict.fromkeys(s[1] for s in self._subs))
        if conn is None or not filters:
            return conn is not None
        mid = self._next_mid()
        try:
            await asyncio.wait_for(conn.request(
                mid, encode_unsubscribe(mid, filters, self.v5), self.keepalive_s), timeout)
        except (MqttError, TimeoutError) as e:
            log.debug("MQTT unsubscribe on stopping not answered: %s", e)
            return False
        return True

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Until connected; ``MqttRefused`` at once when the broker refuses the
        credentials (retrying would wait out ``timeout`` for nothing) or lacks what the
        host needs (``MqttUnsupported``), ``TimeoutError`` when it cannot be reached."""
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
            if self.problem:
                raise MqttUnsupported(f"the broker at {self.host}:{self.port}: "
                                      f"{self.problem}")
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
        """Stop after the running handlers are done (their messages acknowledged) and
        what is queued is sent and acknowledged (up to ``drain_s`` in all)."""
        if self._task is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_s
        while ((self._running or self._waiting) and self.connected.is_set()
               and loop.time() < end):
            await asyncio.sleep(0.01)
        while ((self._queue or self._status or self._unacked) and self.connected.is_set()
               and loop.time() < end):
            await asyncio.sleep(0.01)
        self._closing = True
        self._task.cancel()
        await reap(self._task)
        self._task = None
        if self._resubscribing is not None:
            self._resubscribing.cancel()
        for t in list(self._handler_tasks):
            t.cancel()
        while self._waiting:
            aw = self._waiting.popleft()[0]
            if asyncio.iscoroutine(aw):
                aw.close()

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
        retain_ok = self._retain_ok
        limit = self._server_max_packet
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
            mid = self._next_mid() if qos else 0
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

    def _on_ack(self, mid: int, code: int) -> None:
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
            asyncio.get_running_loop().call_soon(self._pump)

    def _release(self, m: Outgoing) -> None:
        if m.key is not None and self._keyed.get(m.key) is m:
            del self._keyed[m.key]

    def _oldest_sent(self) -> float | None:
        """When the oldest message still unacknowledged was written, if any."""
        for m in self._unacked.values():
            return m.sent_at
        return None

    # ---- the connection

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        c = self.config
        return client_context(c.mqtt_ca_file, c.mqtt_cert_file, c.mqtt_key_file)

    def _connect_packet(self) -> bytes:
        c = self.config
        will: dict[str, Any] = {}
        if self._will is not None:
            topic, payload, props = self._will
            will = {"will_topic": topic, "will_payload": payload, "will_qos": self._will_qos,
                    "will_retain": self._retain_ok,
                    "will_properties": props if self.v5 else None}
        return encode_connect(self.client_id, self.config.mqtt_keepalive_s, self.v5,
                              c.mqtt_username or None, c.mqtt_password or None,
                              receive_max=self.receive_max if self.v5 else 0, **will)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        conn = Connection(v5=self.v5, max_packet=self.max_packet, metrics=self.metrics,
                          on_message=self._dispatch, on_ack=self._on_ack,
                          on_writable=self._pump, on_dropped=self._dropped)
        tls = self._tls_context()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await loop.create_connection(lambda: conn, self.host, self.port, ssl=tls,
                                         server_hostname=self.host if tls else None)
            conn.write(self._connect_packet())
            try:
                _, code, props = await conn.connack
            except MqttError as e:
                conn.abort(0, "")
                raise self._no_connack(e) from None
            except BaseException:
                conn.abort(0, "")
                raise
        if code:
            conn.abort(0, "")
            raise self._connack_refusal(code, props)
        try:
            self._settings(props)
        except BaseException:
            conn.close()
            raise
        return conn

    def _no_connack(self, e: MqttError) -> MqttError:
        """A connection closed before the CONNACK: on MQTT 5, what a broker that speaks
        only 3.1.1 does, so the error says what to try."""
        if not self.v5:
            return e
        return MqttError(f"{e}, before its CONNACK: a broker that speaks only MQTT 3.1.1 "
                         f"closes an MQTT 5 CONNECT so; if this one does, set "
                         f"mqtt_version = 3", e.rc)

    def _connack_refusal(self, code: int, props: dict[str, Any]) -> MqttError:
        """The error of a CONNACK that refused us; a will the broker cannot take is
        changed for the next attempt."""
        text = reason_text(code, self.v5)
        if props.get("ReasonString"):
            text += f": {props['ReasonString']}"
        if code in REDIRECTS:
            ref = props.get("ServerReference")
            text += (f" (the broker points to {ref!r}; the host keeps to mqtt_url: "
                     "change it to move)" if ref else "")
        if self.v5 and code == 0x9A and self._retain_ok:
            self._retain_ok = False
            log.warning("the broker at %s:%d keeps no retained messages (%s): the Last "
                        "Will and the retained MES state go out unretained", self.host,
                        self.port, text)
        elif self.v5 and code == 0x9B and self._will_qos:
            self._will_qos = 0
        return MqttError(text, code)

    def _settings(self, props: dict[str, Any]) -> None:
        """What the broker's CONNACK says of its limits and features."""
        if props.get("ReasonString"):
            log.info("MQTT broker at %s:%d: %s", self.host, self.port, props["ReasonString"])
        self._window = min(IN_FLIGHT, props.get("ReceiveMaximum", IN_FLIGHT))
        self._status_window = status_share(self._window)
        self._server_max_packet = props.get("MaximumPacketSize", 0)
        self._server_max_qos = props.get("MaximumQoS", 2)
        server_ka = props.get("ServerKeepAlive")
        ours = float(self.config.mqtt_keepalive_s)
        self.keepalive_s = float(min(ours, server_ka)) if server_ka else ours
        retain = bool(props.get("RetainAvailable", 1))
        if not retain and self._retain_ok:
            log.warning("the broker at %s:%d keeps no retained messages (Retain Available "
                        "0): the MES's retained state and the host's status go out "
                        "unretained, so a client that connects later does not get them",
                        self.host, self.port)
        self._retain_ok = retain and self._retain_ok
        self._sub_ids_ok = bool(props.get("SubscriptionIdentifierAvailable", 1))
        filters = [s[1] for s in self._subs]
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

    async def _run(self) -> None:
        fails = 0
        loop = asyncio.get_running_loop()
        while not self._closing:
            conn: Connection | None = None
            try:
                conn = await self._connect()
                self._live = conn     # from here subscribe() goes straight out
                if self.subscribing:
                    await self._subscribe_all(conn)
                self.connects += 1
                if fails or self.connects > 1:
                    log.info("MQTT connected again to %s:%d", self.host, self.port)
                self.connected.set()
                self._pump()
                self._connected_hooks()
                await self._watch(conn)
                raise MqttError(conn.why or "connection closed by the broker")
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()
                raise
            except MqttUnsupported as e:
                if conn is not None:
                    conn.abort(0, "")
                self.problem = str(e)
                self.last_error = f"the broker at {self.host}:{self.port}: {e}"
                if not self.connects:
                    self._refused.set()
                    self._gave_up.set()
                    return
                log.error("MQTT %s; the host is not ready, and tries again", self.last_error)
                self._lost(conn)
                await asyncio.sleep(BACKOFF_S[-1])
                fails += 1
            except (MqttError, OSError, TimeoutError, ssl.SSLError) as e:
                fails = await self._after(conn, e, fails, loop.time())
                if fails < 0:
                    return
            except Exception as e:
                # a fault of ours: the link must not end silently
                log.exception("the MQTT link failed; it connects again")
                if conn is not None:
                    conn.abort(0, "")
                self.last_error = f"{type(e).__name__}: {e}"
                self._lost(conn)
                await asyncio.sleep(backoff(fails))
                fails += 1
            finally:
                self._lost(conn)

    async def _after(self, conn: Connection | None, e: BaseException, fails: int,
                     now: float) -> int:
        """What a lost or refused connection leads to: the log, the blame of a message,
        the wait; returns the new count of failures (-1: the link gives up)."""
        up = now - conn.connected_at if conn is not None and conn.connected_at else 0.0
        if conn is not None:
            conn.shut()
        else:
            self._guesses = 0
        if up >= STABLE_S:
            fails = 0
        self.metrics.inc("mqtt_reconnects")
        self.last_error = str(e) or type(e).__name__
        code = getattr(e, "rc", None)
        if not self.connects and code in REFUSED_CODES:
            self._refused.set()
        if self.once and not self.connects:
            self._gave_up.set()
            return -1
        delay = backoff(fails)
        taken = conn is not None and self._taken_over(conn, up)
        if taken:
            delay = max(delay, TAKEOVER_BACKOFF_S * random.uniform(1.0, 1.5))
        elif conn is not None and conn.disconnect_code in REDIRECTS:
            log.error("MQTT broker at %s:%d redirects the host (%s); the host keeps to "
                      "mqtt_url and connects there again", self.host, self.port,
                      (f"to {conn.server_reference!r}" if conn.server_reference
                       else "without saying where"))
        if code in WILL_REFUSED:
            delay = 0.0                   # the next CONNECT asks for what the broker takes
        # The error names the broker, never the credentials.
        log.warning("MQTT connection to %s:%d lost or refused (%s); again in %.1f s",
                    self.host, self.port, self.last_error, delay)
        if conn is not None:
            self._blame(conn)
        self._lost(conn)
        await asyncio.sleep(delay)
        return fails + 1

    def _taken_over(self, conn: Connection, up: float) -> bool:
        """Whether the broker ended this connection for another client with our id:
        it says so (0x8E), or it closed a fresh connection unasked with no message of
        ours in flight, for the second time in a row."""
        said = conn.disconnect_code == TAKEN_OVER
        guessed = (not conn.ours and up < TAKEOVER_S and not self._unacked
                   and conn.disconnect_code is None)
        # a broker that restarts ends a fresh connection so too, once: a guess counts
        # from the second such end in a row (a failed connect in between starts over)
        self._guesses = self._guesses + 1 if guessed else 0
        if not (said or self._guesses >= 2):
            return False
        self.metrics.inc("mqtt_takeovers")
        log.error("MQTT broker at %s:%d ended the session of client id %r%s: another "
                  "client connected with the same client id; every host needs its own "
                  "(mqtt_client_id, default sfc-{consumer}); backing off", self.host,
                  self.port, self.client_id, "" if said else " right after accepting it")
        return True

    def _blame(self, conn: Connection) -> None:
        """The broker closed the connection: its oldest unacknowledged message is the
        likely cause (a broker acknowledges in order). Closed on twice in a row, it is
        parked, so the messages behind it go out."""
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

    async def _watch(self, conn: Connection) -> None:
        """Until the connection ends: pings on silence, the end on a broker gone quiet."""
        tick = max(0.05, self.keepalive_s / 8)
        while not conn.closed.done():
            await asyncio.wait((conn.closed,), timeout=tick)
            if not conn.closed.done():
                conn.keepalive(self.keepalive_s, self._oldest_sent())

    def _connected_hooks(self) -> None:
        for hook in self.on_connect:
            try:
                hook()
            except Exception:
                log.exception("an MQTT on-connect hook failed")

    def _lost(self, conn: Connection | None = None) -> None:
        """The connection is over: what was not acknowledged goes back to the front of
        the queue, in the order it was sent, marked DUP."""
        if conn is not None and self._live is not conn and self._live is not None:
            return
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

    def hold_ack(self, message: Message) -> tuple[Connection, int] | None:
        """Called by a handler while it runs: the message's PUBACK waits until the
        handler's owner passes the returned token to ``release_acks`` (once the
        message's effect is stored). None for a message that needs no acknowledgement."""
        conn = self._live
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

    def _dropped(self, topic: str, reason: str, why: str) -> None:
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

    def _dispatch(self, message: Message) -> bool:
        """Hand a message to its handler(s); True when its PUBACK waits for them."""
        topic = message.topic
        if self._probe is not None and self._probe.takes(topic):
            self._probe.feed(topic, message.payload)
            return False
        if self.fan_out:
            return self._fan_out(message, topic)
        routes = self._routes
        try:
            handler = routes[topic]
        except KeyError:
            handler = next((h for f, _, h in self._subs if topic_matches(f, topic)), None)
            if len(routes) < ROUTES_MAX:
                routes[topic] = handler
        if handler is None:
            self._unrouted(topic)
            return False
        return self._handle(handler, message, topic, None)

    def _unrouted(self, topic: str) -> None:
        """A message no subscription of ours matches: counted, and said once per topic
        with what probably happened (a broker that rewrote its topic, most often)."""
        self.metrics.inc("mqtt_unrouted")
        warned = self._unrouted_warned
        if topic in warned or len(warned) >= DROP_WARNED_MAX:
            return
        warned.add(topic)
        filters = [f for f, _, _ in self._subs]
        sent_as = dotted_original(topic, filters)
        if sent_as is not None:
            why = (f"it was probably sent as {sent_as!r}, which the host subscribes to, "
                   f"and the broker turned a '.' into a level break: scopes with '.' "
                   f"cannot work through this broker")
        else:
            why = ("probably a subscription ended while it was on its way, or a broker "
                   "that delivers what no subscription of this client asked for")
        log.warning("an MQTT message on %r matched no subscription of the host: %s "
                    "(logged once per topic; counted in sfc_mqtt_unrouted_total)",
                    topic[:200], why)

    def _fan_out(self, message: Message, topic: str) -> bool:
        p = message.properties
        ids = p.SubscriptionIdentifier if p is not None else None
        sub_ids = self._sub_ids
        handlers = [h for f, as_, h in self._subs
                    if (sub_ids.get(as_) in ids if ids else topic_matches(f, topic))]
        if not handlers:
            self._unrouted(topic)
            return False
        ack = _Ack(self._live, message.mid) if (
            message.qos == 1 and self._live is not None) else None
        for h in handlers:
            self._handle(h, message, topic, ack)
        return ack is not None and ack.left > 0

    def _handle(self, handler: Handler, message: Message, topic: str,
                ack: _Ack | None) -> bool:
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
        if ack is None and message.qos == 1 and self._live is not None:
            ack = _Ack(self._live, message.mid)
        if ack is not None:
            ack.left += 1
        if self._running >= self.receive_max:
            # the backlog is full: this one waits, and the broker with the rest
            self._waiting.append((res, topic, ack))
            if self._live is not None:
                self._live.pause_reading()
        else:
            self._start(res, topic, ack)
        return ack is not None

    def _start(self, aw: Awaitable[None], topic: str, ack: _Ack | None) -> None:
        t = asyncio.ensure_future(self._guard(aw, topic))
        self._handler_tasks.add(t)
        self._running += 1
        t.add_done_callback(lambda t: self._handled(t, ack))

    def _handled(self, t: asyncio.Task[None], ack: _Ack | None) -> None:
        self._handler_tasks.discard(t)
        self._running -= 1
        if ack is not None:
            ack.left -= 1
            if ack.left == 0 and not t.cancelled():
                ack.conn.ack(ack.mid)
        waiting = self._waiting
        while waiting and self._running < self.receive_max:
            self._start(*waiting.popleft())
        conn = self._live
        if (not waiting and conn is not None and conn.reading_paused
                and self._running <= self.receive_max // 2):
            conn.resume_reading()

    async def _guard(self, aw: Awaitable[None], topic: str) -> None:
        try:
            await aw
        except asyncio.CancelledError:
            raise
        except Exception:
            self.metrics.inc("mqtt_handler_errors")
            log.exception("handling a message on %s failed", topic)
