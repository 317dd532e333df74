"""Job order state out to the MES, in the original's shapes.

- A status event ``{JobOrder, JobState}`` on ``{mes}/{scope levels}/events`` at once for
  every change (the ``Orders.on_change`` hook), with the correlation of the MES request
  that caused it; the recipe's own Run, Complete and Abort carry none.
- Retained plain JSON, coalesced per scope and read fresh from Redis at most every
  ``INTERVAL_S`` (a burst of changes costs one message per order): ``order/{id}``
  (``{JobOrder, State}``), ``result/{id}`` (the job response, once the order is Ended
  or Aborted and a response exists), and ``state-index`` (``{seq, scope, published_at,
  jobs}``). Clear deletes ``order/{id}`` and ``result/{id}`` with empty retained
  messages. The retained topics keep the scope as one level, as the original's do.
- At least once, whichever host dies when: every change is stamped in the scope's
  outbox by the script that writes it (``outbox``). A batch of orders leaves the
  outbox once the broker acknowledged its retained order and result, the index read
  after them and the status events of their ends. What a host left there, any host
  publishes again (an order's end event with it): all of it at start, and what is older
  than ``LEFTOVER_S`` every ``SCAN_S``.
- The retained metadata message once at start, and every known scope's index.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
from typing import TYPE_CHECKING, Any

from sfc_fast.wire.mqtt5 import Properties
from sfc_host import isa95 as model
from sfc_host.aio import cancel_and_reap
from sfc_host.mes import codec
from sfc_host.mqtt.cloudevents import CloudEvent, CloudEventError, publish_properties
from sfc_host.store.client import REDIS_FAILURES
from sfc_host.store.keys import SCOPES, ScopeKeys
from sfc_host.store.orders import top_state
from sfc_host.store.outbox import OrderRow, Outbox
from sfc_host.tracing.context import job_carried

if TYPE_CHECKING:
    from sfc_host.execution.host import Host
    from sfc_host.mqtt import MqttLink

log = logging.getLogger("sfc_host.mes")

INTERVAL_S = 0.1
# The index script holds Redis for every order of the scope (measured in
# docs/benchmarks.md; every compare-and-set waits behind it) and its message grows with
# them (about 190 bytes an order): one index per INDEX_US_PER_ORDER per order keeps
# both a small share of Redis's and the host's time, out of the answer path's p99.
INDEX_US_PER_ORDER = 1000
START_BATCH = 64       # scopes whose index is republished at once at start
# The broker acknowledges within milliseconds; a batch still unacknowledged after this
# (the link resends it over reconnects meanwhile) stays in the outbox for the scan.
ACK_WAIT_S = 20.0
# A stamp this much older than its scope's index interval was not taken out by the
# host that wrote it: a live host takes its own out within INTERVAL_S, the index
# interval and the acknowledgements.
LEFTOVER_S = 30.0
SCAN_S = 10.0          # how often every scope's outbox is looked at for leftovers

_ENDED = ("Ended", "Aborted")

# (the outbox stamps a batch read, the acknowledgements they wait for)
Batch = tuple[list[tuple[str, bytes]], list[asyncio.Future[None]]]


def _published_at() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class Publisher:
    """Status events and retained state of one host's MES side."""

    def __init__(self, host: Host, link: MqttLink) -> None:
        c = link.config
        self.host = host
        self.link = link
        self.metrics = host.metrics
        self.prefix = c.mes_prefix
        self.source = c.mes_source
        self.expiry_s = c.mes_message_expiry_s
        self.outbox = Outbox(host.scripts)
        host.store.outbox = True                  # every change is stamped from now on
        self._retained_props = publish_properties(expiry_s=c.mes_retained_expiry_s)
        # scope -> job -> its end event goes out again (a leftover: its first copy may
        # have died with the host that sent it)
        self._dirty: dict[str, dict[str, bool]] = {}
        # scope -> acknowledgements of end events sent since its last batch
        self._ends: dict[str, list[asyncio.Future[None]]] = {}
        # scope -> batches published whose index is still to come
        self._unindexed: dict[str, list[Batch]] = {}
        self._forced: set[str] = set()            # scopes whose index must go out again
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._settling: set[asyncio.Task[None]] = set()
        self._changes: dict[str, int] = {}        # scope -> change count last published
        self._index_due: dict[str, float] = {}
        self._background: list[asyncio.Task[None]] = []

    # ---- start

    def start(self) -> None:
        """The metadata message, then every known scope's index in the background."""
        try:
            payload, props = codec.metadata(self.source, v5=self.link.v5,
                                            binary=self.link.config.mqtt_binary,
                                            expiry_s=self.expiry_s)
            self.link.publish_nowait(f"{self.prefix}/metadata", payload, props, retain=True,
                                     status=True)
        except CloudEventError as e:
            log.warning("metadata message could not be encoded: %s", e)
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._republish_all()),
                            loop.create_task(self._scan())]

    async def _republish_all(self) -> None:
        """Every scope's outbox (whatever its age: a host that died before this one
        started left it) and index."""
        try:
            scopes = await self._scopes()
            for i in range(0, len(scopes), START_BATCH):
                part = scopes[i:i + START_BATCH]
                await self._leftovers(part, None)
                await asyncio.gather(*(self._publish_index(s, self.host.store.keys(s),
                                                           force=True) for s in part))
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("state indexes not republished at start")

    async def _scopes(self) -> list[str]:
        return sorted(m.decode() for m in await self.host.client.smembers(SCOPES))

    async def _scan(self) -> None:
        """Every SCAN_S (a little less at random, so hosts drift apart): what another
        host left in the outboxes, published again by this one."""
        while True:
            await asyncio.sleep(SCAN_S * random.uniform(0.8, 1.0))
            if not self.link.connected.is_set():
                continue                 # the link would only queue them
            try:
                before = (await self.host.store.now_ms() - int(LEFTOVER_S * 1000)) * 1000
                scopes = await self._scopes()
                for i in range(0, len(scopes), START_BATCH * 4):
                    await self._leftovers(scopes[i:i + START_BATCH * 4], before)
            except Exception:
                self.metrics.inc("mes_index_errors")
                log.exception("the MES outboxes could not be read")

    async def _leftovers(self, scopes: list[str], before_us: int | None) -> None:
        found = await self.outbox.leftovers([self.host.store.keys(s) for s in scopes],
                                            before_us, INDEX_US_PER_ORDER)
        for scope, jobs in found.items():
            self.metrics.inc("mes_outbox_republished", len(jobs))
            log.info("%d job orders of %s published again: their last change may not "
                     "have reached the MES", len(jobs), scope, extra={"scope": scope})
            self._forced.add(scope)
            for job in jobs:
                self._mark(scope, job, end_again=True)

    # ---- changes

    def on_change(self, scope: str, job: str, old: str, new: str, order: dict[str, str],
                  cause: CloudEvent | None) -> None:
        """A status event now; the retained order, result and index in the next
        coalesced publish of the scope. An end's event is followed to the broker's
        acknowledgement: the order stays in the outbox until it is there."""
        body = order.get("order")
        ended = top_state(new) in _ENDED
        ack = self._status_event(scope, job, body.encode() if body else None, new, cause,
                                 followed=ended,
                                 trace=job_carried(order.get("tp"), job, order.get("token")))
        if ack is not None:
            self._ends.setdefault(scope, []).append(ack)
        self._mark(scope, job)

    def on_job_end(self, scope: str, job: str, decision: Any) -> None:
        """A job wrote its response: its order may have ended before it (an MES Abort),
        so the result and the index's ``has_result`` go out again."""
        self._forced.add(scope)
        self._mark(scope, job)

    def _status_event(self, scope: str, job: str, order: bytes | None, state: str,
                      cause: CloudEvent | None, *, followed: bool,
                      trace: dict[str, str] | None = None) -> asyncio.Future[None] | None:
        """Publish a status event; with ``followed``, its acknowledgement (done at once
        for one that cannot be encoded: sending it again would not help)."""
        ack = asyncio.get_running_loop().create_future() if followed else None
        try:
            payload, props = codec.status_event(
                scope, order, state, self.source, cause, v5=self.link.v5,
                binary=self.link.config.mqtt_binary, expiry_s=self.expiry_s, trace=trace)
        except (CloudEventError, KeyError) as e:
            log.warning("status event of %s/%s could not be encoded: %s", scope, job, e,
                        extra={"scope": scope, "job": job})
            if ack is not None:
                ack.set_result(None)
            return ack
        if not self.link.publish_nowait(f"{self.prefix}/{codec.levels(scope)}/events",
                                        payload, props, status=True, acked=ack) \
                and ack is not None:
            ack.cancel()
        return ack

    def _mark(self, scope: str, job: str, *, end_again: bool = False) -> None:
        jobs = self._dirty.setdefault(scope, {})
        jobs[job] = jobs.get(job, False) or end_again
        if scope not in self._tasks:
            self._tasks[scope] = asyncio.get_running_loop().create_task(self._run(scope))

    async def _run(self, scope: str) -> None:
        """Every INTERVAL_S while the scope has changed orders or an index still due."""
        k = self.host.store.keys(scope)
        try:
            while self._dirty.get(scope) or scope in self._index_due:
                await asyncio.sleep(INTERVAL_S)
                jobs = self._dirty.pop(scope, None)
                ends = self._ends.pop(scope, [])
                if jobs:
                    await self._publish_orders(scope, k, jobs, ends)
                await self._publish_index(scope, k, force=scope in self._forced)
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("retained state of %s not published", scope, extra={"scope": scope})
        finally:
            self._tasks.pop(scope, None)

    # ---- retained

    def _retained(self, topic: str, payload: bytes | None) -> asyncio.Future[None]:
        """Retained plain JSON (None: delete the retained message); its acknowledgement."""
        props: Properties | None = self._retained_props if self.link.v5 else None
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.link.publish_nowait(topic, payload or b"", props, retain=True,
                                        status=True, acked=ack):
            ack.cancel()
        return ack

    async def _publish_orders(self, scope: str, k: ScopeKeys, jobs: dict[str, bool],
                              acks: list[asyncio.Future[None]]) -> None:
        """The retained order and result of each order, as it is now; the batch then
        waits for the scope's next index (``_settle``)."""
        base = f"{self.prefix}/{scope}"
        stamps: list[tuple[str, bytes]] = []
        for row in await self.outbox.read(k, sorted(jobs)):
            if row.stamp is not None:
                stamps.append((row.job, row.stamp))
            acks += self._order_messages(base, scope, row, end_again=jobs[row.job])
        self._unindexed.setdefault(scope, []).append((stamps, acks))

    def _order_messages(self, base: str, scope: str, row: OrderRow, *, end_again: bool
                        ) -> list[asyncio.Future[None]]:
        job, state, order = row.job, row.state, row.order
        if row.cleared:
            return [self._retained(f"{base}/order/{job}", None),
                    self._retained(f"{base}/result/{job}", None)]
        if state not in model.STATE_JSON:
            return []
        head = b'{"JobOrder":' + order + b"," if order else b"{"
        acks = [self._retained(f"{base}/order/{job}",
                               head + b'"State":' + model.STATE_JSON[state] + b"}")]
        if top_state(state) in _ENDED:
            if row.response is not None:
                acks.append(self._retained(f"{base}/result/{job}",
                                           model.with_actuals(row.response, order)))
            if end_again:
                ack = self._status_event(scope, job, order, state, None, followed=True,
                                         trace=job_carried(row.trace, job, row.token))
                assert ack is not None
                acks.append(ack)
        return acks

    def _settle(self, scope: str, k: ScopeKeys, batches: list[Batch],
                index: asyncio.Future[None]) -> None:
        """The batches published before this index leave the outbox once all their
        messages and the index are acknowledged."""
        stamps = [s for b in batches for s in b[0]]
        acks = [a for b in batches for a in b[1]]
        acks.append(index)
        if stamps:
            task = asyncio.get_running_loop().create_task(self._take(scope, k, stamps, acks))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def _take(self, scope: str, k: ScopeKeys, stamps: list[tuple[str, bytes]],
                    acks: list[asyncio.Future[None]]) -> None:
        # The index went out last, and a broker acknowledges in order (MQTT 4.6), so
        # once it is acknowledged the others are settled too: one wait, not one a
        # message (a broker that reorders costs a second wait for the rest).
        end = asyncio.get_running_loop().time() + ACK_WAIT_S
        await asyncio.wait(acks[-1:], timeout=ACK_WAIT_S)
        rest = [a for a in acks if not a.done()]
        if rest and not any(a.cancelled() for a in acks):
            await asyncio.wait(rest, timeout=max(0.0, end - asyncio.get_running_loop().time()))
        if any(not a.done() or a.cancelled() for a in acks):
            return                       # left in the outbox: the scan sends it again
        try:
            await self.outbox.take(k, stamps)
        except REDIS_FAILURES:
            self.metrics.inc("mes_index_errors")
            log.exception("the MES outbox of %s could not be written", scope,
                          extra={"scope": scope})

    async def _publish_index(self, scope: str, k: ScopeKeys, *, force: bool = False) -> None:
        """The scope's index, at most every INTERVAL_S and, for a big one, at most once
        per INDEX_US_PER_ORDER per order: the index is the snapshot an MES reads on
        connect; each order's own retained topic carries its changes at once.

        Every order write keeps the order's entry (``orders.index_entry``) and its place
        (Priority, then id): the index is joined from them here, not built; plain reads
        hold Redis for less than a script that built it would (about 1 ms per 1,000
        orders, in docs/benchmarks.md)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._index_due.get(scope, 0.0):
            return                       # the loop publishes it when due
        # the batches published so far: this index is read after their orders were
        batches = self._unindexed.pop(scope, None)
        last = self._changes.get(scope, -1)
        self._forced.discard(scope)
        client = self.host.client
        changes = int(await client.get(k.seq) or 0)
        if changes == last and not force and not batches:
            self._index_due.pop(scope, None)
            return
        pipe = client.pipeline(transaction=False)
        pipe.zrange(k.index_order, 0, -1)
        pipe.hgetall(k.index_entries)
        pipe.smembers(k.results)
        pipe.incr(k.index_seq)
        jobs, entries, has, seq = await pipe.execute()
        # an order written between these reads is in the next index
        parts = [e + (b"true}" if job in has else b"false}")
                 for job in jobs if (e := entries.get(job)) is not None]
        body = (b'{"seq":%d,"scope":%s,"published_at":"%s","jobs":[' % (
            seq, codec.dumps(scope), _published_at().encode()) + b",".join(parts) + b"]}")
        self._changes[scope] = changes
        # the next index waits in proportion to this one's size
        self._index_due[scope] = loop.time() + max(INTERVAL_S,
                                                   len(parts) * INDEX_US_PER_ORDER / 1e6)
        ack = self._retained(f"{self.prefix}/{scope}/state-index", body)
        if batches:
            self._settle(scope, k, batches, ack)

    async def aclose(self) -> None:
        """Stop publishing. What is not acknowledged by now stays in the outbox, for
        the next start of a host (or another host's scan)."""
        tasks = [*self._tasks.values(), *self._background, *self._settling]
        await cancel_and_reap(tasks)

