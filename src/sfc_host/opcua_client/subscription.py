"""Subscriptions and the publish loop that feeds them (IEC 62541 Part 4 §5.13).

The session keeps ``OUTSTANDING`` Publish requests at the server whenever it has a
subscription, so a notification never waits for a request to reach the server. Each
response's sequence number is acknowledged in the next request. One publish response
carries the changes of many monitored items: the client takes them in one call to the
handler per item, with no task per notification.

A handler has ``data_changed(handle, DataValue)`` for data changes and
``event(handle, fields)`` for events (the selected fields' values in the order the
filter selected them); ``status_changed(status)`` is called when the server says the
subscription ended (``BadTimeout``: the caller makes it anew). A handler's exception is
logged; it never stops the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from sfc_fast.wire.uabinary import ExtensionObject, NodeId, QualifiedName, Writer
from sfc_host.opcua_client import services
from sfc_host.opcua_client.errors import BadStatus, ChannelError
from sfc_host.opcua_client.services import MonitorRequest

log = logging.getLogger("sfc_host.opcua_client")

OUTSTANDING = 3
# a Publish may wait at the server for a keep-alive, and a server may hold the requests
# beyond the one it needs in a queue: a Publish's timeout is long, and one that ends
# unanswered is simply sent again (a dead server is found by the session's keep-alive)
PUBLISH_WAIT_S = 120.0
_BAD_TIMEOUT = 0x800A0000
_BAD_TOO_MANY_PUBLISH = 0x80780000
_BAD_NO_SUBSCRIPTION = 0x80790000
# BadSessionIdInvalid, BadSessionClosed, BadSessionNotActivated: the session must be
# made anew, on a new connection
_SESSION_GONE = frozenset((0x80250000, 0x80260000, 0x80270000))
RETRY_S = 0.5


class Publisher:
    """The session's Publish requests, shared by its subscriptions."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._acks: list[tuple[int, int]] = []
        self._in_flight = 0
        self._stopped = False
        self._wait_s = PUBLISH_WAIT_S

    def start(self, keepalive_s: float) -> None:
        self._wait_s = max(self._wait_s, 3 * keepalive_s)
        while self._in_flight < OUTSTANDING and not self._stopped:
            self._send()

    def stop(self) -> None:
        self._stopped = True

    def _send(self) -> None:
        ch = self.client.channel
        if ch is None:
            return
        acks, self._acks = self._acks, []
        w = Writer()
        services.write_publish(w, acks)
        self._in_flight += 1
        fut = ch.request(services.PUBLISH, w.getvalue(), self._wait_s)
        fut.add_done_callback(self._answered)

    def _answered(self, fut: asyncio.Future[Any]) -> None:
        self._in_flight -= 1
        if fut.cancelled():
            return
        e = fut.exception()
        if e is not None:
            self._failed(e)
            return
        n = services.read_publish(fut.result())
        if n.sequence:
            self._acks.append((n.subscription, n.sequence))
        if self.client.subscriptions and not self._stopped:
            self._send()
        sub = self.client.subscriptions.get(n.subscription)
        if sub is not None:
            sub.deliver(n)

    def _failed(self, e: BaseException) -> None:
        if isinstance(e, ChannelError) or self._stopped:
            return                      # the connection is gone: the session's owner acts
        code = e.code if isinstance(e, BadStatus) else 0
        if code == _BAD_TOO_MANY_PUBLISH or (code == _BAD_NO_SUBSCRIPTION
                                             and not self.client.subscriptions):
            return                      # the server holds enough, or wants none
        if code in _SESSION_GONE:
            log.warning("OPC UA %s: the session is gone (%s); connecting again",
                        self.client.url, e)
            if self.client.channel is not None:
                self.client.channel.abort(ChannelError(f"{self.client.url}: {e}"))
            return
        if isinstance(e, TimeoutError) or code == _BAD_TIMEOUT:
            log.debug("OPC UA %s: a publish ended unanswered: %s", self.client.url, e)
            if self.client.subscriptions:
                self._send()
            return
        log.warning("OPC UA %s: a publish failed: %s", self.client.url, e)
        if self.client.subscriptions and self._in_flight == 0:
            loop = asyncio.get_running_loop()
            loop.call_later(RETRY_S, self._retry)

    def _retry(self) -> None:
        if self.client.subscriptions and not self._stopped and self._in_flight == 0:
            self._send()


class Subscription:
    """One subscription of the session and its monitored items."""

    def __init__(self, client: Any, publisher: Publisher, sid: int, interval_ms: float,
                 handler: Any) -> None:
        self.client = client
        self.publisher = publisher
        self.id = sid
        self.interval_ms = interval_ms
        self.handler = handler
        self.items: dict[int, int] = {}         # client handle: monitored item id
        self._handles = itertools.count(1)
        self.deleted = False

    @classmethod
    async def create(cls, client: Any, publisher: Publisher, interval_ms: float,
                     handler: Any, *, keepalive: int = 100, lifetime: int = 0) -> Subscription:
        w = Writer()
        services.write_create_subscription(w, interval_ms, lifetime or keepalive * 3,
                                           keepalive)
        sid, revised, _life, keep = services.read_create_subscription(
            await client.request(services.CREATE_SUBSCRIPTION, w))
        sub = cls(client, publisher, sid, revised, handler)
        client.subscriptions[sid] = sub
        publisher.start(revised * keep / 1000)
        return sub

    async def watch(self, nodes: list[NodeId], *, attribute: int = services.VALUE,
                    queue: int = 1, sampling_ms: float = 0.0) -> list[int]:
        """Monitor the nodes' values; their client handles, in order (a Bad status
        raises ``BadStatus`` naming the node; those before it stay monitored)."""
        reqs = [MonitorRequest(n, next(self._handles), attribute, sampling_ms, queue)
                for n in nodes]
        return await self._monitor(reqs)

    async def watch_events(self, notifier: NodeId,
                           select: list[tuple[NodeId, list[QualifiedName]]],
                           types: list[NodeId] | None = None, *, queue: int = 100) -> int:
        """Monitor the events ``notifier`` reports whose type is one of ``types`` (all
        when None); the fields at the browse paths ``select`` (each from the event type
        that declares it: BaseEventType, i=2041, for its own fields) arrive in that
        order."""
        flt: ExtensionObject = services.event_filter(select, types)
        req = MonitorRequest(notifier, next(self._handles), services.EVENT_NOTIFIER, 0.0,
                             queue, flt)
        [handle] = await self._monitor([req])
        return handle

    async def _monitor(self, reqs: list[MonitorRequest]) -> list[int]:
        w = Writer()
        services.write_create_monitored_items(w, self.id, reqs)
        results = services.read_create_monitored_items(
            await self.client.request(services.CREATE_MONITORED_ITEMS, w))
        out = []
        for req, (status, mid) in zip(reqs, results, strict=True):
            if status & 0x80000000:
                raise BadStatus(status, f"monitor {req.node}")
            self.items[req.handle] = mid
            out.append(req.handle)
        return out

    def deliver(self, n: services.Notification) -> None:
        h = self.handler
        for handle, value in n.data_changes:
            try:
                h.data_changed(handle, value)
            except Exception:
                log.exception("OPC UA %s: a data change handler failed", self.client.url)
        for handle, fields in n.events:
            try:
                h.event(handle, fields)
            except Exception:
                log.exception("OPC UA %s: an event handler failed", self.client.url)
        if n.status is not None:
            self.client.subscriptions.pop(self.id, None)
            self.deleted = True
            status_changed = getattr(h, "status_changed", None)
            if status_changed is not None:
                status_changed(n.status)

    async def delete(self) -> None:
        if self.deleted:
            return
        self.deleted = True
        self.client.subscriptions.pop(self.id, None)
        w = Writer()
        services.write_delete_subscriptions(w, [self.id])
        try:
            await self.client.request(services.DELETE_SUBSCRIPTIONS, w)
        except (ChannelError, BadStatus, TimeoutError) as e:
            log.debug("OPC UA %s: subscription %d not deleted: %s", self.client.url,
                      self.id, e)
