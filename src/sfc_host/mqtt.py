"""The host's MQTT connection: reconnects with backoff, an outgoing queue that loses
nothing across reconnects, and subscriptions (shared, so several hosts split the load).

Outgoing messages wait in a bounded queue; ``publish_nowait`` says whether one was
queued (a full queue is counted; for a command the action's deadline sends it again).
Up to ``IN_FLIGHT`` QoS 1 messages wait for their acknowledgement at once; what was not
acknowledged when the connection ends goes back to the front of the queue and out again
after the reconnect.
Incoming messages go to the handler of the first matching filter (the host's link,
whose filters do not overlap) or, with ``fan_out`` (the script engine's link), to every
matching subscription once; a handler's fault is logged and counted, never raised.

At thousands of messages a second the per-message cost of the client matters: incoming
messages are handed to the handlers straight from paho's read (not through aiomqtt's
queue, a task and a wait each), and what paho has to send goes out in one write per
event loop pass (``_write_soon``), not one per packet with a writer registered each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiomqtt
import paho.mqtt.client as mqtt_client
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host import paho_fast
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics

paho_fast.install()

log = logging.getLogger("sfc_host.mqtt")
# aiomqtt warns when many calls wait at once; its logger only passes errors
# (connection faults still show).
_client_log = logging.getLogger("sfc_host.mqtt.client")
_client_log.setLevel(logging.ERROR)

# Nagle's algorithm holds a small packet until the last one is acknowledged: with the
# peer's delayed ACK that is up to 40 ms per hop. Commands and answers are small.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
IN_FLIGHT = 256          # QoS 1 messages sent and not yet acknowledged
# CONNACK codes that no retry changes: bad credentials, not authorized, banned, bad
# authentication method (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135, 138, 140)
REFUSED_CODES = frozenset((4, 5, 134, 135, 138, 140))
WRITE_BURST = 64         # messages handed to paho before the loop gets a turn
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_HANDLER_TASKS = 256

Handler = Callable[[aiomqtt.Message], Awaitable[None] | None]


class MqttRefused(ConnectionError):
    """The broker refused the credentials before the link was ever connected."""


@dataclass(slots=True)
class Outgoing:
    topic: str
    payload: bytes
    properties: Properties | None
    qos: int
    retain: bool
    acked: asyncio.Future[None] | None = None   # done once the broker has it


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching (``+`` one level, ``#`` the rest; a wildcard first
    level does not match ``$`` topics)."""
    f = topic_filter.split("/")
    t = topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, part in enumerate(f):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(f) == len(t)


class MqttLink:
    def __init__(self, config: HostConfig, metrics: Metrics, *, client_id: str = "",
                 fan_out: bool = False) -> None:
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
        self._queue: deque[Outgoing] = deque()
        self._queued = asyncio.Event()
        self._subs: list[tuple[str, str, Handler]] = []   # (filter, subscribed as, handler)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self._handler_slots = asyncio.Semaphore(MAX_HANDLER_TASKS)
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self.connects = 0
        self.last_error = ""         # why the last connection failed or ended (no secrets)
        self._refused = asyncio.Event()   # the first connect was refused (credentials)
        self._live: aiomqtt.Client | None = None     # the connected client, if any
        # fan_out (the script engine's link): a message goes to every subscription it
        # matches, once each. On MQTT 5 the broker sends one copy per matching
        # subscription, told apart by subscription identifiers; on 3.1.1 one copy.
        self.fan_out = fan_out
        self._sub_ids: dict[str, int] = {}
        # False until ``open_subscriptions``: a host connects to publish first and takes
        # messages only once it is ready (a host failing its start-up takes none)
        self.subscribing = True

    # ---- setup

    def subscribe(self, topic_filter: str, handler: Handler, *,
                  shared: bool = True) -> Callable[[], None]:
        """Shared: ``$share/{group}/{filter}``, so each message goes to one of the hosts.
        Before ``start`` or at any time after (scripts subscribe while they run); every
        reconnect subscribes again (on a link started with ``subscribe=False``, only from
        ``open_subscriptions`` on). Returns a function that ends the subscription."""
        group = self.config.mqtt_shared_group
        as_ = f"$share/{group}/{topic_filter}" if shared and group else topic_filter
        entry = (topic_filter, as_, handler)
        self._subs.append(entry)
        if self.fan_out and as_ not in self._sub_ids:
            self._sub_ids[as_] = len(self._sub_ids) + 1
        if (self._live is not None and self.subscribing
                and sum(1 for s in self._subs if s[1] == as_) == 1):
            self._later(self._subscribe(self._live, as_), as_)

        def unsubscribe() -> None:
            if entry not in self._subs:
                return
            self._subs.remove(entry)
            if (self._live is not None and self.subscribing
                    and not any(s[1] == as_ for s in self._subs)):
                self._later(self._live.unsubscribe(as_), as_)
        return unsubscribe

    async def _subscribe(self, client: aiomqtt.Client, as_: str) -> None:
        props = None
        if self.v5 and as_ in self._sub_ids:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = self._sub_ids[as_]
        await client.subscribe(as_, qos=self.config.mqtt_qos, properties=props)

    def _later(self, aw: Awaitable[Any], what: str) -> None:
        # a (un)subscribe on the live connection; if the connection drops first, the
        # reconnect subscribes from _subs anyway
        async def run() -> None:
            try:
                await aw
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
        client = self._live
        if client is None:
            return
        try:
            for as_ in dict.fromkeys(s[1] for s in self._subs):
                await self._subscribe(client, as_)
        except aiomqtt.MqttError as e:
            log.warning("MQTT subscribe failed (%s); the reconnect subscribes again", e)

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Until connected; ``MqttRefused`` at once when the broker refuses the
        credentials (retrying would wait out ``timeout`` for nothing), ``TimeoutError``
        when it cannot be reached."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self.connected, self._refused)]
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
        raise TimeoutError(f"no connection to {self.host}:{self.port} within {timeout} s")

    async def __aenter__(self) -> MqttLink:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_s: float = 2.0) -> None:
        """Stop after sending what is queued (up to ``drain_s``)."""
        if self._task is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_s
        while self._queue and self.connected.is_set() and loop.time() < end:
            await asyncio.sleep(0.01)
        self._closing = True
        self._queued.set()
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
                       acked: asyncio.Future[None] | None = None) -> bool:
        """Queue a message; False (counted) when the queue is full. A ``status`` message
        (MES status events and retained state) is refused from 80 % of the queue on, so
        a burst of them never crowds out equipment commands and replies. ``acked`` is
        set once the broker has the message (QoS 1: its PUBACK; QoS 0: written), and
        cancelled when the broker refuses it (a PUBACK with an error code)."""
        if not topic or "+" in topic or "#" in topic or len(topic) > 16_000:
            # paho would refuse it in the writer (a reply to a request's response
            # topic, say): refused here, the writer never stops for one message
            self.metrics.inc("mqtt_bad_topic")
            log.warning("not published: %r is no topic to publish to", topic[:200])
            return False
        n = len(self._queue)
        size = self.config.mqtt_queue_size
        if n >= size or (status and n >= size * 4 // 5):
            self.metrics.inc("mqtt_status_dropped" if status else "mqtt_queue_full")
            return False
        self._queue.append(Outgoing(topic, payload, properties,
                                    self.config.mqtt_qos if qos is None else qos, retain,
                                    acked))
        self._queued.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ---- the connection

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        c = self.config
        ctx = ssl.create_default_context(cafile=c.mqtt_ca_file or None)
        if c.mqtt_cert_file:
            ctx.load_cert_chain(c.mqtt_cert_file, c.mqtt_key_file or None)
        return ctx

    def _client(self) -> aiomqtt.Client:
        c = self.config
        client = aiomqtt.Client(
            self.host, self.port, identifier=self.client_id,
            username=c.mqtt_username or None, password=c.mqtt_password or None,
            protocol=aiomqtt.ProtocolVersion.V5 if self.v5 else aiomqtt.ProtocolVersion.V311,
            tls_context=self._tls_context(), keepalive=30, timeout=10,
            max_inflight_messages=IN_FLIGHT, logger=_client_log,
            socket_options=NO_DELAY)
        _write_soon(client)
        # before connecting: a persistent session's messages may follow the CONNACK
        client._client.on_message = self._on_paho_message
        return client

    def _on_paho_message(self, c: Any, userdata: Any, msg: mqtt_client.MQTTMessage) -> None:
        try:
            message = aiomqtt.Message._from_paho_message(msg)
        except Exception:      # a topic aiomqtt refuses: this message only, not the link
            self.metrics.inc("mqtt_handler_errors")
            log.exception("an incoming message could not be read")
            return
        self._dispatch(message)

    async def _run(self) -> None:
        fails = 0
        while not self._closing:
            client = self._client()
            try:
                async with client:
                    self._live = client      # from here subscribe() goes straight out
                    if self.subscribing:
                        for as_ in dict.fromkeys(s[1] for s in self._subs):
                            await self._subscribe(client, as_)
                    self.connects += 1
                    if fails or self.connects > 1:
                        log.info("MQTT connected again to %s:%d", self.host, self.port)
                    fails = 0
                    self.connected.set()
                    writers = [asyncio.create_task(self._writer(client))]
                    try:
                        await _disconnection(client)
                    finally:
                        self._live = None
                        self.connected.clear()
                        for w in writers:
                            w.cancel()
                        for w in writers:
                            with contextlib.suppress(asyncio.CancelledError, Exception):
                                await w
            except asyncio.CancelledError:
                raise
            except aiomqtt.MqttError as e:
                retrieve_disconnect(client)
                self.connected.clear()
                delay = BACKOFF_S[min(fails, len(BACKOFF_S) - 1)]
                fails += 1
                self.metrics.inc("mqtt_reconnects")
                self.last_error = str(e)
                code = getattr(getattr(e, "rc", None), "value", getattr(e, "rc", None))
                if not self.connects and code in REFUSED_CODES:
                    self._refused.set()
                # The error names the broker, never the credentials.
                log.warning("MQTT connection to %s:%d lost or refused (%s); again in %.1f s",
                            self.host, self.port, e, delay)
                await asyncio.sleep(delay)

    async def _writer(self, client: aiomqtt.Client) -> None:
        """One task takes messages off the queue and hands them to paho directly: a
        QoS 1 message stays in ``unacked`` until its PUBACK, with up to ``IN_FLIGHT``
        unacknowledged at once. aiomqtt's ``publish`` would cost a task, an event and a
        timeout per message, most of the sending cost at thousands a second; paho's own
        a message object with a lock and a condition, so QoS 1 messages are queued on
        its connection as packets (``paho_fast.queue_publish``). When the
        connection ends, what was not acknowledged goes back to the front of the queue
        (in order) and out again after the reconnect: at least once, never lost."""
        q = self._queue
        paho = client._client
        unacked: dict[int, Outgoing] = {}
        aiomqtt_on_publish = paho.on_publish
        wake = self._queued
        metrics = self.metrics

        def acked(mid: int, code: int = 0) -> bool:
            m = unacked.pop(mid, None)
            if m is None:
                return False
            if code >= 0x80:
                # refused (quota, not authorized, ...): not sent; a command's sender
                # sees it as unacknowledged and its deadline sends it again
                metrics.inc("mqtt_refused")
                log.warning("the broker refused a message on %s (reason code %d)",
                            m.topic, code)
                if m.acked is not None:
                    m.acked.cancel()
            else:
                metrics.inc("mqtt_sent")
                if m.acked is not None and not m.acked.done():
                    m.acked.set_result(None)
            if len(unacked) == IN_FLIGHT - 1:
                wake.set()
            return True

        def on_publish(c: Any, userdata: Any, mid: int, *rest: Any) -> None:
            # paho's own publishes: QoS 0 written, QoS 2 complete, aiomqtt's
            if not acked(mid) and aiomqtt_on_publish is not None:
                aiomqtt_on_publish(c, userdata, mid, *rest)

        paho.on_publish = on_publish
        paho._sfc_puback = acked         # QoS 1: their PUBACKs (paho_fast)
        out_messages = paho._out_messages
        try:
            while True:
                if not q or len(unacked) >= IN_FLIGHT:
                    wake.clear()
                    await wake.wait()
                    continue
                n = 0
                while q and len(unacked) < IN_FLIGHT and n < WRITE_BURST:
                    m = q.popleft()
                    if m.qos == 1:
                        mid = paho._mid_generate()
                        while mid in unacked or mid in out_messages:
                            mid = paho._mid_generate()
                        rc = paho_fast.queue_publish(paho, mid, m.topic.encode(), m.payload,
                                                     m.retain, m.properties)
                    else:
                        info = paho.publish(m.topic, m.payload, m.qos, m.retain, m.properties)
                        mid, rc = info.mid, info.rc
                    if rc != mqtt_client.MQTT_ERR_SUCCESS:
                        q.appendleft(m)
                        raise aiomqtt.MqttCodeError(rc, "could not publish")
                    n += 1
                    if m.qos:
                        unacked[mid] = m
                    else:
                        metrics.inc("mqtt_sent")
                        if m.acked is not None and not m.acked.done():
                            m.acked.set_result(None)
                await asyncio.sleep(0)     # let the loop read (PUBACKs, answers)
        finally:
            if paho.on_publish is on_publish:
                paho.on_publish = aiomqtt_on_publish
            paho.__dict__.pop("_sfc_puback", None)
            if unacked:   # back in the order they were sent
                q.extendleft(reversed(list(unacked.values())))
                unacked.clear()
                wake.set()

    def _dispatch(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        if self.fan_out:
            self._fan_out(message, topic)
            return
        handler = next((h for f, _, h in self._subs if topic_matches(f, topic)), None)
        if handler is None:
            self.metrics.inc("mqtt_unrouted")
            return
        self._handle(handler, message, topic)

    def _fan_out(self, message: aiomqtt.Message, topic: str) -> None:
        ids = getattr(message.properties, "SubscriptionIdentifier", None) if self.v5 else None
        if ids is not None and not isinstance(ids, list):
            ids = [ids]
        sub_ids = self._sub_ids
        handlers = [h for f, as_, h in self._subs
                    if (sub_ids.get(as_) in ids if ids else topic_matches(f, topic))]
        if not handlers:
            self.metrics.inc("mqtt_unrouted")
        for h in handlers:
            self._handle(h, message, topic)

    def _handle(self, handler: Handler, message: aiomqtt.Message, topic: str) -> None:
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


async def _disconnection(client: aiomqtt.Client) -> None:
    """Until the connection ends; then ``MqttError`` (as aiomqtt's message iterator)."""
    fut: asyncio.Future[Any] = client._disconnected
    await asyncio.wait((fut,))      # not awaited directly: a cancel must not cancel it
    exc = None if fut.cancelled() else fut.exception()
    raise aiomqtt.MqttError("Disconnected during message iteration") from exc


def _write_soon(client: aiomqtt.Client) -> None:
    """paho asks to write whenever it queues a packet to an idle socket; aiomqtt then
    registers a writer (from any thread, so through the loop's self-pipe) and removes it
    after paho's write. Instead the write runs once in this loop pass (all that was
    queued meanwhile goes out in one ``send``, see ``paho_fast``), and a writer is
    registered only when the socket has no room for everything."""
    paho = client._client
    loop = client._loop
    loop_thread = threading.get_ident()
    fd = -1      # the socket waited on for room, if any

    def write() -> None:
        nonlocal fd
        try:
            paho.loop_write()
        except Exception as exc:     # as aiomqtt's writer: the connection is over
            if not client._disconnected.done():
                client._disconnected.set_exception(exc)
            return
        sock = paho._sock
        if paho._registered_write and fd < 0 and sock is not None:
            fd = sock.fileno()       # a partial write: again when there is room
            loop.add_writer(fd, write)

    def register(c: Any, userdata: Any, sock: Any) -> None:
        if threading.get_ident() == loop_thread:
            loop.call_soon(write)
        else:                        # paho connects in an executor thread
            loop.call_soon_threadsafe(write)

    def unregister(c: Any, userdata: Any, sock: Any) -> None:
        nonlocal fd
        if fd >= 0:
            loop.remove_writer(fd)
            fd = -1

    paho.on_socket_register_write = register
    paho.on_socket_unregister_write = unregister


def retrieve_disconnect(client: aiomqtt.Client) -> None:
    # aiomqtt keeps the disconnection's error in a future nobody awaits after the
    # context exits; reading it keeps asyncio from printing it as never retrieved.
    fut = getattr(client, "_disconnected", None)
    if isinstance(fut, asyncio.Future) and fut.done() and not fut.cancelled():
        fut.exception()


def payload_bytes(message: aiomqtt.Message) -> bytes:
    p: Any = message.payload
    if isinstance(p, bytes):
        return p
    if isinstance(p, bytearray):
        return bytes(p)
    if isinstance(p, str):
        return p.encode()
    return b"" if p is None else str(p).encode()
