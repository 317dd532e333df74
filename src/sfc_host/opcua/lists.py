"""Each scope's ``JobOrderList`` and ``JobOrderResponseList``: every order not cleared,
with its state, and their job responses.

The lists cost the host a rewrite for each batch of changes, so they are kept only for
a client that asks: rewritten as orders change while a monitored item follows one of
them (asked once a rewrite is due, not per change), brought up to date before a read
otherwise (the server's ``before_read``), and made current for a monitored item when
it is made. Between full reads from Redis (every
``RELOAD_S``) they follow the status events, each change encoded once (by its OPC UA
event, when a client takes the events), so a rewrite is a list of encoded entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from sfc_fast.wire.uabinary import EXTENSION_OBJECT, ExtensionObject, NodeId, Variant
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.opcua.bodies import Bodies, Built, Change
from sfc_host.opcua.structures import Structures
from sfc_host.opcua_server import Server

if TYPE_CHECKING:
    from sfc_host.execution.host import Host

log = logging.getLogger("sfc_host.opcua")

COST_FACTOR = 10            # a rewrite is followed by 10x its time of rest
# how often the lists are read afresh from Redis: between, they follow the status events
# (a full read of 10,000 orders takes most of a second; an event the MQTT side dropped
# under overload is made good here)
RELOAD_S = 60.0
# changes kept for lists nobody watches or reads; past this, the next read loads the
# lists afresh instead (the changes are in Redis anyway)
PENDING_MAX = 5_000

Entry = tuple[ExtensionObject, ExtensionObject]


class ScopeLists:
    """One scope's two list variables and what they hold and lack."""

    def __init__(self, order_list: NodeId | None, response_list: NodeId | None) -> None:
        self.order_list = order_list
        self.response_list = response_list
        self.nodes = {n for n in (order_list, response_list) if n is not None}
        self.due = asyncio.Event()          # a rewrite is wanted
        self.lock = asyncio.Lock()          # one rewrite at a time: the loop's or a read's
        self.stale = True                   # changes (or a reload) the lists lack
        # a monitored item followed them at the last rewrite due: only then are bodies
        # an event built kept for the next one
        self.followed = True
        # the entries by job, encoded; the changes not yet in them, by job
        self.listed: dict[str, Entry] = {}
        self.changed: dict[str, Change] = {}
        # changes whose bodies their event built, until a rewrite takes them
        self.prebuilt: dict[str, tuple[Change, Built]] = {}
        self.loaded_at = -RELOAD_S
        self.task: asyncio.Task[None] | None = None


class OrderLists:
    """The lists of every scope of the face."""

    server: Server | None = None
    structures: Structures          # both set once the face's server is made

    def __init__(self, config: HostConfig, host: Host, metrics: Metrics,
                 bodies: Bodies) -> None:
        self.config = config
        self.host = host
        self.metrics = metrics
        self.bodies = bodies
        self.scopes: dict[str, ScopeLists] = {}
        self._by_node: dict[NodeId, str] = {}       # a list variable's scope
        self._closed = asyncio.Event()

    def add(self, scope: str, order_list: NodeId | None,
            response_list: NodeId | None) -> None:
        lists = self.scopes[scope] = ScopeLists(order_list, response_list)
        for node in lists.nodes:
            self._by_node[node] = scope
            if self.server is not None:
                self.server.before_read(node, self.up_to_date)
        lists.task = asyncio.get_running_loop().create_task(self._keep(scope))
        lists.due.set()

    async def aclose(self) -> list[asyncio.Task[None]]:
        """Let the loops end; their tasks, for the face to wait for."""
        self._closed.set()
        for lists in self.scopes.values():
            lists.due.set()
        return [s.task for s in self.scopes.values() if s.task is not None]

    # ---- what changed

    def noted(self, scope: str, job: str, change: Change) -> None:
        """An order's change, from its status event: the rewrite loop asks whether a
        client follows the lists."""
        lists = self.scopes.get(scope)
        if lists is None:
            return
        lists.changed[job] = change
        lists.stale = True
        lists.due.set()
        if len(lists.changed) > PENDING_MAX:    # nobody follows or reads them
            lists.changed.clear()
            lists.prebuilt.clear()
            lists.loaded_at = -RELOAD_S

    def built(self, scope: str, job: str, change: Change, entry: Built) -> None:
        """A change's bodies its event built, kept for the next rewrite to take while a
        client follows the lists."""
        lists = self.scopes.get(scope)
        if lists is not None and lists.followed and lists.changed.get(job) is change:
            lists.prebuilt[job] = (change, entry)

    # ---- the server's hooks: a client asks for a list

    def item_made(self, node: NodeId, attribute: int) -> None:
        """A monitored item made on a list: the lists brought up to date, so it gets
        the current ones next (they were left while nobody followed)."""
        scope = self._by_node.get(node)
        if scope is not None:
            lists = self.scopes[scope]
            lists.stale = True
            lists.due.set()

    async def up_to_date(self, node: NodeId) -> None:
        """A read of a list that lacks changes waits for them to be written first."""
        scope = self._by_node.get(node)
        if scope is None:
            return
        lists = self.scopes[scope]
        if not lists.stale and time.monotonic() - lists.loaded_at < RELOAD_S:
            return
        try:
            await self.rewrite(scope)
        except Exception:
            # the client goes on with the lists as they were
            self.metrics.inc("opcua_events_failed")
            log.exception("JobOrderList of %s not brought up to date for a client", scope,
                          extra={"scope": scope})

    # ---- rewrites

    async def _keep(self, scope: str) -> None:
        """Rewrite the lists when they are due and a client follows them: at most every
        ``opcua_list_interval_ms``, and never more than a tenth of the time."""
        lists = self.scopes[scope]
        interval = self.config.opcua_list_interval_ms / 1000
        while True:
            await lists.due.wait()
            if self._closed.is_set():
                return
            lists.due.clear()
            assert self.server is not None
            watched = self.server.subscriptions
            lists.followed = watched is None or any(watched.watches_value(n)
                                                    for n in lists.nodes)
            if not lists.followed:
                lists.prebuilt.clear()      # a read builds what it needs
                took = 0.0
            else:
                try:
                    took = await self.rewrite(scope)
                except Exception:
                    if self._closed.is_set():
                        return
                    took = 0.0
                    self.metrics.inc("opcua_events_failed")
                    log.exception("JobOrderList of %s not written", scope,
                                  extra={"scope": scope})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), max(interval, COST_FACTOR * took))

    async def rewrite(self, scope: str) -> float:
        """The scope's lists brought up to date and written; the seconds it took."""
        lists = self.scopes[scope]
        async with lists.lock:
            t0 = time.perf_counter()
            lists.stale = False
            try:
                await self._follow(scope, lists)
                entries = [lists.listed[j] for j in sorted(lists.listed)]
                assert self.server is not None
                for node, value in ((lists.order_list, [e[0] for e in entries]),
                                    (lists.response_list, [e[1] for e in entries])):
                    if node is not None:
                        self.server.space.set_value(node, Variant(EXTENSION_OBJECT, value))
            except BaseException:
                lists.stale = True          # the next read or watch tries again
                raise
            took = time.perf_counter() - t0
            self.metrics.observe("opcua_list_seconds", took)
            return took

    async def _follow(self, scope: str, lists: ScopeLists) -> None:
        """The entries brought up to date: read afresh, or the changes since."""
        if time.monotonic() - lists.loaded_at >= RELOAD_S:
            lists.changed.clear()           # what is read now is newer
            lists.prebuilt.clear()
            lists.loaded_at = time.monotonic()
            lists.listed = await self.read_all(scope)
            if lists.changed:               # a change while reading: written next
                lists.stale = True
                lists.due.set()
            return
        pending, lists.changed = lists.changed, {}
        todo = []
        for job, change in pending.items():
            kept = lists.prebuilt.pop(job, None)
            if change[0] == "EndState":
                lists.listed.pop(job, None)
            elif kept is not None and kept[0] is change:
                lists.listed[job] = self._entry(change[0], kept[1])
            else:
                todo.append((scope, job, change))
        for (_, job, change), entry in zip(todo, await self.bodies.build(todo), strict=True):
            if entry is not None:
                lists.listed[job] = self._entry(change[0], entry)

    def _entry(self, state: str, built: Built) -> Entry:
        """A list entry: the order with its state, and its job response."""
        order, response = built
        st = self.structures
        return (ExtensionObject(st.type_id("JobOrderAndState"),
                                order + st.state_array(state)), response)

    async def read_all(self, scope: str) -> dict[str, Entry]:
        """Every order of the scope not cleared, with its state and job response (the
        stored one with the order's actuals once the job wrote it, else one made from
        the order), as RequestJobResponseByJobOrderState gives them; by id."""
        k = self.host.store.keys(scope)
        client = self.host.client
        index = await client.hgetall(k.index)
        jobs = sorted((j.decode(), s.decode()) for j, s in index.items()
                      if s != b"EndState")
        pipe = client.pipeline(transaction=False)
        for job, _ in jobs:
            pipe.hget(k.order(job), "order")
        bodies = await pipe.execute() if jobs else []
        changes = [(scope, job, (state, body))
                   for (job, state), body in zip(jobs, bodies, strict=True)]
        built = await self.bodies.build(changes)
        return {job: self._entry(change[0], entry) for (_, job, change), entry
                in zip(changes, built, strict=True) if entry is not None}
