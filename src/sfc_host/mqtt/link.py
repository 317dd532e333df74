"""The host's MQTT link: reconnects with backoff, an outgoing queue that loses nothing
across reconnects, and subscriptions (shared, so several hosts split the load).

The link keeps the connection and composes what outlives it:

- ``endpoint`` (``Endpoint``): the URL, the client id, TLS, the CONNECT, and what the
  broker's CONNACK granted;
- ``outbox`` (``Outbox``): the bounded queue in two lanes, the in-flight window, the
  packet ids, a message the broker keeps closing on parked;
- ``routes`` (``Routes``): which handler takes an incoming message;
- ``inbox`` (``Inbox``): the handlers running, the backlog bounded by the Receive Maximum
  we announce, the acknowledgements deferred until the handlers are done;
- ``subscriber`` (``Subscriber``): the SUBSCRIBEs on each connection, refusals asked for
  again, and the delivery check (``probe``, ``DeliveryProbe``) before the link listens;
- ``will`` (``LastWill``): the will of the next CONNECT.

The link never loops on the broker: a message after which the broker closed the
connection twice in a row is parked, and the backoff between connections grows with
jitter and starts again only after a connection stayed up ``STABLE_S``. A connection
the broker ends for another client with our id backs off longer, and says why.

The packets are read and written by our own compiled codec (``sfc_fast.wire.mqtt5``) over
an asyncio connection (``connection.py``): a socket read becomes the handlers' calls and
one write of their acknowledgements; what is queued in one event-loop pass goes out in
one write. Every session starts clean (the queue is the session that matters).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable

from sfc_fast.wire.mqtt5 import Message, Properties
from sfc_host.aio import reap
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import REDIRECTS, TAKEN_OVER, Connection, MqttError
from sfc_host.mqtt.endpoint import Endpoint, MqttRefused, MqttUnsupported
from sfc_host.mqtt.inbox import Handler, Inbox
from sfc_host.mqtt.outbox import Outbox
from sfc_host.mqtt.routes import Routes
from sfc_host.mqtt.settings import MqttSettings
from sfc_host.mqtt.subscriber import Subscriber
from sfc_host.mqtt.will import WILL_REFUSED, LastWill

log = logging.getLogger("sfc_host.mqtt")

# CONNACK codes that no retry changes: bad credentials, not authorized, banned, bad
# authentication method (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135, 138, 140)
REFUSED_CODES = frozenset((4, 5, 134, 135, 138, 140))
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
CONNECT_TIMEOUT_S = 10.0


def backoff(fails: int) -> float:
    """The wait before attempt ``fails + 1`` of a connection, with jitter."""
    return BACKOFF_S[min(fails, len(BACKOFF_S) - 1)] * random.uniform(0.5, 1.0)


class MqttLink:
    """One client's connection to the broker, kept up for as long as the link runs,
    and the face the host, the MES side and the script engine use."""

    def __init__(self, config: MqttSettings, metrics: Metrics, *, client_id: str = "",
                 fan_out: bool = False, once: bool = False, max_packet: int = 0) -> None:
        self.config = config
        self.metrics = metrics
        self._endpoint = ep = Endpoint(config, client_id, max_packet)
        self.client_id = ep.client_id
        self.tls, self.host, self.port, self.v5 = ep.tls, ep.host, ep.port, ep.v5
        self.max_packet = ep.max_packet
        self.receive_max = ep.receive_max
        self.fan_out = fan_out
        self._will = LastWill()
        self._outbox = Outbox(config, metrics)
        self._inbox = Inbox(metrics, ep.receive_max)
        self._routes = Routes(config.mqtt_shared_group, self._inbox, metrics,
                              fan_out=fan_out)
        self._subscriber = Subscriber(ep, self._routes, self._outbox, metrics)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self.connects = 0
        self.last_error = ""         # why the last connection failed or ended (no secrets)
        self._refused = asyncio.Event()   # the first connect was refused (credentials)
        # once (a command-line client): a first connect that fails ends the link, with
        # no retries and nothing logged; the caller says what went wrong in one line
        self.once = once
        self._gave_up = asyncio.Event()
        self._live: Connection | None = None     # the connected connection, if any
        self.on_connect: list[Callable[[], None]] = []   # after each (re)connect
        self._guesses = 0                       # fresh connections ended unasked in a row

    # what its parts keep, read where the host and its tests read it

    @property
    def keepalive_s(self) -> float:
        """This connection's keep alive (the broker's, when it says a shorter one)."""
        return self._endpoint.keepalive_s

    @property
    def subscribing(self) -> bool:
        """False while a link started with ``subscribe=False`` waits for
        ``open_subscriptions``, and after ``close_subscriptions``."""
        return self._subscriber.subscribing

    @property
    def refused(self) -> dict[str, str]:
        """Filter as subscribed -> why the broker refused it."""
        return self._subscriber.refused

    @property
    def problem(self) -> str:
        """What keeps the link from serving, in one line; "" when nothing."""
        return self._subscriber.problem

    @property
    def checking(self) -> str:
        """The delivery check running now ("" none)."""
        return self._subscriber.checking

    @property
    def probe_topic(self) -> str | None:
        """A topic no one else uses, under which a message of our own must come back
        through a shared subscription before the link reports it listens (the host
        sets it; None: no such check)."""
        return self._subscriber.probe_topic

    @probe_topic.setter
    def probe_topic(self, topic: str | None) -> None:
        self._subscriber.probe_topic = topic

    @property
    def probe_scopes(self) -> tuple[str, ...]:
        """Dotted scopes whose topic shape the check sends too (a broker may rewrite
        it)."""
        return self._subscriber.probe_scopes

    @probe_scopes.setter
    def probe_scopes(self, scopes: tuple[str, ...]) -> None:
        self._subscriber.probe_scopes = scopes

    @property
    def listening(self) -> bool:
        """Connected, and the broker granted every subscription, and the shared ones
        deliver (``/readyz``)."""
        s = self._subscriber
        return s.acked and not s.refused and not s.problem and self.connected.is_set()

    def not_listening(self) -> list[str]:
        """Why the link does not listen, one line each (``/readyz``); empty when it does."""
        if not self.connected.is_set():
            return [f"not connected ({self.last_error})" if self.last_error
                    else "not connected"]
        s = self._subscriber
        why = [f"subscription {f} refused by the broker: {r}" for f, r in s.refused.items()]
        if s.problem:
            why.append(s.problem)
        if s.checking:
            why.append(s.checking)
        if not why and not s.acked:
            why.append("subscriptions not acknowledged yet")
        return why

    def set_will(self, topic: str, payload: bytes,
                 properties: Properties | None = None) -> None:
        """A retained Last Will: the broker publishes it when the connection ends
        without our DISCONNECT (from the next connection on)."""
        self._will.set(topic, payload, properties)

    # ---- setup

    def subscribe(self, topic_filter: str, handler: Handler, *,
                  shared: bool = True) -> Callable[[], None]:
        """Shared: ``$share/{group}/{filter}``, so each message goes to one of the hosts.
        Before ``start`` or at any time after (scripts subscribe while they run); every
        reconnect subscribes again (on a link started with ``subscribe=False``, only from
        ``open_subscriptions`` on). Returns a function that ends the subscription.
        ``ValueError`` at once for what is no topic filter."""
        return self._subscriber.subscribe(topic_filter, handler, shared)

    async def subscribed(self, topic_filter: str, handler: Handler, *,
                         shared: bool = True) -> Callable[[], None]:
        """``subscribe``, returning once the broker acknowledged the subscription (a
        client that publishes a request next must not miss its reply)."""
        return await self._subscriber.subscribed(topic_filter, handler, shared)

    async def start(self, *, subscribe: bool = True) -> MqttLink:
        """Connect (and keep connecting). ``subscribe=False``: publishing only, the
        registered filters wait for ``open_subscriptions``."""
        self._subscriber.subscribing = subscribe
        self._task = asyncio.create_task(self._run(), name="sfc-mqtt")
        return self

    async def open_subscriptions(self) -> None:
        """Subscribe every registered filter now (if connected) and on every reconnect.
        Returns once the broker acknowledged them, or once the connection dropped (the
        reconnect subscribes them all). ``MqttUnsupported`` when the broker granted the
        shared subscriptions but delivers nothing through them."""
        await self._subscriber.open()

    async def close_subscriptions(self, timeout: float = 2.0) -> bool:
        """Take no more messages: every filter unsubscribed (a stopping host, so that
        what comes next goes to the other hosts); no reconnect subscribes again. True
        once the broker acknowledged it: every message it sent us before is in our
        socket by then (a connection keeps its order)."""
        return await self._subscriber.close(timeout)

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
        inbox, outbox = self._inbox, self._outbox
        while ((inbox.running or inbox.waiting) and self.connected.is_set()
               and loop.time() < end):
            await asyncio.sleep(0.01)
        while ((outbox.queued or outbox.in_flight) and self.connected.is_set()
               and loop.time() < end):
            await asyncio.sleep(0.01)
        self._closing = True
        self._task.cancel()
        await reap(self._task)
        self._task = None
        self._subscriber.stop()
        inbox.close()

    # ---- sending and receiving

    def publish_nowait(self, topic: str, payload: bytes, properties: Properties | None = None,
                       *, qos: int | None = None, retain: bool = False,
                       status: bool = False,
                       acked: asyncio.Future[None] | None = None,
                       key: str | None = None) -> bool:
        """Queue a message (``Outbox.publish_nowait``); False (counted) when the queue
        is full. ``status``: the MES's status lane; ``acked``: set once the broker has
        it, cancelled when the broker refuses it; a ``key`` already queued or in flight
        is not queued again."""
        return self._outbox.publish_nowait(topic, payload, properties, qos=qos,
                                           retain=retain, status=status, acked=acked,
                                           key=key)

    @property
    def queued(self) -> int:
        return self._outbox.queued

    @property
    def writes(self) -> int:
        """Socket writes on the current connection (benchmarks count them an action)."""
        conn = self._outbox.conn
        return conn.writes if conn is not None else 0

    def hold_ack(self, message: Message) -> tuple[Connection, int] | None:
        """Called by a handler while it runs: the message's PUBACK waits until the
        handler's owner passes the returned token to ``release_acks`` (once the
        message's effect is stored). None for a message that needs no acknowledgement."""
        return self._inbox.hold_ack(message)

    release_acks = staticmethod(Inbox.release_acks)

    # ---- the connection

    async def _connect(self) -> Connection:
        ep = self._endpoint
        conn = Connection(v5=ep.v5, max_packet=ep.max_packet, metrics=self.metrics,
                          on_message=self._routes.dispatch, on_ack=self._outbox.on_ack,
                          on_writable=self._outbox.pump, on_dropped=self._inbox.dropped)
        tls = ep.tls_context()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await asyncio.get_running_loop().create_connection(
                lambda: conn, ep.host, ep.port, ssl=tls,
                server_hostname=ep.host if tls else None)
            conn.write(ep.connect_packet(self._will))
            try:
                _, code, props = await conn.connack
            except MqttError as e:
                conn.abort(0, "")
                raise ep.no_connack(e) from None
            except BaseException:
                conn.abort(0, "")
                raise
        if code:
            conn.abort(0, "")
            raise ep.refusal(code, props, self._will)
        try:
            ep.grant(props, self._routes.filters())
        except BaseException:
            conn.close()
            raise
        return conn

    def _attach(self, conn: Connection) -> None:
        """``conn`` is live: from here subscribe() and publish_nowait() go straight out."""
        self._live = conn
        self._outbox.attach(conn, self._endpoint)
        self._inbox.conn = conn
        self._subscriber.conn = conn

    async def _run(self) -> None:
        fails = 0
        loop = asyncio.get_running_loop()
        while not self._closing:
            conn: Connection | None = None
            try:
                conn = await self._connect()
                self._attach(conn)
                if self.subscribing:
                    await self._subscriber.subscribe_all(conn)
                self.connects += 1
                if fails or self.connects > 1:
                    log.info("MQTT connected again to %s:%d", self.host, self.port)
                self.connected.set()
                self._outbox.pump()
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
                self._subscriber.problem = str(e)
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
            self._outbox.blame(conn)
        self._lost(conn)
        await asyncio.sleep(delay)
        return fails + 1

    def _taken_over(self, conn: Connection, up: float) -> bool:
        """Whether the broker ended this connection for another client with our id:
        it says so (0x8E), or it closed a fresh connection unasked with no message of
        ours in flight, for the second time in a row."""
        said = conn.disconnect_code == TAKEN_OVER
        guessed = (not conn.ours and up < TAKEOVER_S and not self._outbox.in_flight
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

    async def _watch(self, conn: Connection) -> None:
        """Until the connection ends: pings on silence, the end on a broker gone quiet."""
        keepalive_s = self._endpoint.keepalive_s
        tick = max(0.05, keepalive_s / 8)
        while not conn.closed.done():
            await asyncio.wait((conn.closed,), timeout=tick)
            if not conn.closed.done():
                conn.keepalive(keepalive_s, self._outbox.oldest_sent())

    def _connected_hooks(self) -> None:
        for hook in self.on_connect:
            try:
                hook()
            except Exception:
                log.exception("an MQTT on-connect hook failed")

    def _lost(self, conn: Connection | None = None) -> None:
        """The connection is over: what was not acknowledged goes back to the front of
        the queue (``Outbox.detach``)."""
        if conn is not None and self._live is not conn and self._live is not None:
            return
        self._live = None
        self.connected.clear()
        self._subscriber.detach()
        self._inbox.conn = None
        self._outbox.detach()
