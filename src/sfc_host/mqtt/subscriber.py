"""The link's subscriptions on the broker: SUBSCRIBE and UNSUBSCRIBE on the live
connection, a refused filter asked for again with backoff, and the delivery check
(``probe.py``) before the link says it listens.

Every reconnect subscribes every registered filter again (the session starts clean). A
refused subscription keeps the host not ready (``refused``), as does a broker whose
shared subscriptions deliver nothing or that rewrites a dotted scope's topics
(``problem``); a request sent meanwhile might reach no host at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sfc_fast.wire.mqtt5 import encode_subscribe, encode_unsubscribe
from sfc_host.metrics import Metrics
from sfc_host.mqtt.connection import Connection, MqttError, reason_text
from sfc_host.mqtt.endpoint import Endpoint, MqttUnsupported
from sfc_host.mqtt.inbox import Handler
from sfc_host.mqtt.outbox import Outbox
from sfc_host.mqtt.probe import PROBE_S, DeliveryProbe
from sfc_host.mqtt.routes import Routes

log = logging.getLogger("sfc_host.mqtt")

# A refused subscription is asked for again after these waits (the last one repeats)
RESUBSCRIBE_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class Subscriber:
    """What the broker granted of ``routes``' filters on the live connection (``conn``),
    and why the link does not listen yet."""

    def __init__(self, endpoint: Endpoint, routes: Routes, outbox: Outbox,
                 metrics: Metrics) -> None:
        self.endpoint = endpoint
        self.routes = routes
        self.outbox = outbox
        self.metrics = metrics
        self.conn: Connection | None = None
        # False until ``open``: a host connects to publish first and takes messages
        # only once it is ready (a host failing its start-up takes none)
        self.subscribing = True
        # every registered filter acknowledged by the broker on the live connection:
        # until then a request sent to a shared subscription may reach no host at all
        self.acked = False
        self.refused: dict[str, str] = {}     # filter as subscribed -> the broker's reason
        # What keeps the link from serving, in one line (a broker that lacks a feature
        # the host needs, shared subscriptions that deliver nothing); "" when nothing
        self.problem = ""
        # A topic no one else uses, under which a message of our own must come back
        # through a shared subscription before the link reports it listens (None: no
        # such check), and the dotted scopes whose topic shape the check sends too (a
        # broker may rewrite it)
        self.probe_topic: str | None = None
        self.probe_scopes: tuple[str, ...] = ()
        self.checking = ""      # the check running now, for /readyz ("" none)
        self._resubscribing: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    def detach(self) -> None:
        self.conn = None
        self.acked = False

    def subscribe(self, topic_filter: str, handler: Handler, shared: bool
                  ) -> Callable[[], None]:
        """Register, and subscribe now if connected (in the background)."""
        as_, end, conn = self._register(topic_filter, handler, shared)
        if conn is not None:
            self._later(self._subscribe(conn, as_), as_)
        return end

    async def subscribed(self, topic_filter: str, handler: Handler, shared: bool
                         ) -> Callable[[], None]:
        """Register, and return once the broker acknowledged it (if connected)."""
        as_, end, conn = self._register(topic_filter, handler, shared)
        if conn is not None:
            await self._subscribe(conn, as_)
        return end

    def _register(self, topic_filter: str, handler: Handler, shared: bool
                  ) -> tuple[str, Callable[[], None], Connection | None]:
        """The filter as subscribed, the function that ends it, and the connection to
        send its SUBSCRIBE on now (None: not connected, or the filter is already on)."""
        entry, new = self.routes.add(topic_filter, handler, shared)
        as_ = entry[1]

        def unsubscribe() -> None:
            if not self.routes.remove(entry):
                return
            self.refused.pop(as_, None)
            conn = self.conn
            if conn is not None and self.subscribing:
                ep = self.endpoint
                mid = self.outbox.next_mid()
                self._later(conn.request(mid, encode_unsubscribe(mid, (as_,), ep.v5),
                                         ep.keepalive_s), as_)
        now = self.conn if new and self.subscribing else None
        return as_, unsubscribe, now

    async def _subscribe(self, conn: Connection, as_: str) -> bool:
        """Subscribe one filter; False (logged, counted, kept in ``refused``) when the
        broker refuses it."""
        ep = self.endpoint
        mid = self.outbox.next_mid()
        sub_id = self.routes.sub_ids.get(as_, 0) if ep.v5 and ep.sub_ids_ok else 0
        codes = await conn.request(mid, encode_subscribe(
            mid, (as_,), ep.config.mqtt_qos, sub_id, ep.v5), ep.keepalive_s)
        if all(c < 0x80 for c in codes):
            if self.refused.pop(as_, None) is not None:
                log.info("the broker granted the subscription to %s now", as_)
            return True
        reason = reason_text(max(codes), ep.v5)
        self.metrics.inc("mqtt_subscribe_refused")
        if self.refused.get(as_) != reason:
            log.error("the broker refused the subscription to %s (%s): the host takes "
                      "nothing on it and is not ready; asked again with backoff (check "
                      "the broker's ACL for client %s)", as_, reason, ep.client_id)
        self.refused[as_] = reason
        return False

    async def subscribe_all(self, conn: Connection) -> None:
        """Every registered filter, then (for shared ones) the check that they deliver;
        what is refused is asked for again with backoff."""
        self.acked = False
        for as_ in self.routes.filters():
            await self._subscribe(conn, as_)
        if self.refused:
            self._resubscribe(conn)
        await self._check_delivery(conn)
        # only now: until the check passed, a request may reach a host that hears nothing
        self.acked = self.conn is conn

    def _resubscribe(self, conn: Connection) -> None:
        if self._resubscribing is not None and not self._resubscribing.done():
            return

        async def again() -> None:
            for attempt in itertools.count():
                await asyncio.sleep(RESUBSCRIBE_S[min(attempt, len(RESUBSCRIBE_S) - 1)])
                if self.conn is not conn:
                    return                # the reconnect subscribes them all anyway
                for as_ in list(self.refused):
                    if self.routes.has(as_):
                        await self._subscribe(conn, as_)
                    else:
                        self.refused.pop(as_, None)
                if not self.refused:
                    await self._check_delivery(conn)
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

    async def _check_delivery(self, conn: Connection) -> None:
        """Messages of our own through a subscription of our own (``probe.py``): a
        broker that grants ``$share/…`` filters but delivers nothing through them, or
        that rewrites a dotted scope's topics, would leave a ready host deaf."""
        shared = self.routes.shared()
        if self.probe_topic is None or not (shared or self.probe_scopes):
            return
        probe = DeliveryProbe(self.probe_topic, self.probe_scopes)
        flt = probe.topic_filter(self.routes.group if shared else "")
        self.routes.probe = probe
        self.checking = (f"checking that the broker delivers through {flt} (up to "
                         f"{PROBE_S:g} s)")
        try:
            why = await self._probe(conn, probe, flt, shared)
        finally:
            self.routes.probe = None
            self.checking = ""
        if why:
            if why != self.problem:
                log.error("%s", why)
            self.problem = why
            self._resubscribe(conn)
        elif self.problem:
            log.info("the broker delivers the host's check messages now")
            self.problem = ""

    async def _probe(self, conn: Connection, probe: DeliveryProbe, flt: str,
                     shared: bool) -> str:
        """One run of the check on ``flt``: why it failed, "" when it passed."""
        ep = self.endpoint
        mid = self.outbox.next_mid()
        codes = await conn.request(mid, encode_subscribe(mid, (flt,), 1, 0, ep.v5),
                                   ep.keepalive_s)
        if any(c >= 0x80 for c in codes):
            why = (f"the broker refused the subscription {flt} of the host's check "
                   f"({reason_text(max(codes), ep.v5)})")
        else:
            self._send_probe(probe)
            await asyncio.wait((probe.done,), timeout=PROBE_S)
            why = probe.failure(flt, ep.client_id, shared)
        mid = self.outbox.next_mid()
        with contextlib.suppress(MqttError, TimeoutError):
            await conn.request(mid, encode_unsubscribe(mid, (flt,), ep.v5), ep.keepalive_s)
        return why

    def _send_probe(self, probe: DeliveryProbe) -> None:
        # ahead of whatever waits; the broker refusing a message ends the wait at once
        loop = asyncio.get_running_loop()
        messages = []
        for payload, topic in probe.sent.items():
            sent: asyncio.Future[None] = loop.create_future()
            sent.add_done_callback(lambda f: f.cancelled() and probe.refused())
            messages.append((topic, payload, sent))
        self.outbox.send_first(messages)

    def _later(self, aw: Awaitable[Any], what: str) -> None:
        # a (un)subscribe on the live connection; if the connection drops first, the
        # reconnect subscribes from the routes anyway (and an unsubscribe needs none
        # then): no warning for that, as when the broker stops under a closing script
        # engine
        async def run() -> None:
            try:
                await aw
            except MqttError as e:
                log.debug("MQTT (un)subscribe %s not answered: %s", what, e)
            except Exception as e:
                log.warning("MQTT (un)subscribe %s failed: %s", what, e)
        t = asyncio.get_running_loop().create_task(run())
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def open(self) -> None:
        """Subscribe every registered filter now (if connected) and on every reconnect.
        Returns once the broker acknowledged them, or once the connection dropped (the
        reconnect subscribes them all). ``MqttUnsupported`` when the check failed."""
        if self.subscribing:
            return
        self.subscribing = True
        conn = self.conn
        if conn is None:
            return
        try:
            await self.subscribe_all(conn)
        except (MqttError, TimeoutError) as e:
            log.warning("MQTT subscribe failed (%s); the reconnect subscribes again", e)
            return
        if self.problem:
            ep = self.endpoint
            raise MqttUnsupported(f"the broker at {ep.host}:{ep.port}: {self.problem}")

    async def close(self, timeout: float = 2.0) -> bool:
        """Take no more messages: every filter unsubscribed; no reconnect subscribes
        again. True once the broker acknowledged it."""
        self.subscribing = False
        self.acked = False
        if self._resubscribing is not None:
            self._resubscribing.cancel()
        conn = self.conn
        filters = tuple(self.routes.filters())
        if conn is None or not filters:
            return conn is not None
        mid = self.outbox.next_mid()
        try:
            await asyncio.wait_for(conn.request(
                mid, encode_unsubscribe(mid, filters, self.endpoint.v5),
                self.endpoint.keepalive_s), timeout)
        except (MqttError, TimeoutError) as e:
            log.debug("MQTT unsubscribe on stopping not answered: %s", e)
            return False
        return True

    def stop(self) -> None:
        """The link closes: the retries and the (un)subscribes under way end."""
        if self._resubscribing is not None:
            self._resubscribing.cancel()
        for t in list(self.tasks):
            t.cancel()
