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
- The retained metadata message once at start, and every known scope's index.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from typing import TYPE_CHECKING, Any

from sfc_fast.mqtt5 import Properties
from sfc_host.cloudevents import CloudEvent, CloudEventError, publish_properties
from sfc_host.keys import SCOPES, ScopeKeys
from sfc_host.mes import codec, model
from sfc_host.orders import top_state

if TYPE_CHECKING:
    from sfc_host.host import Host
    from sfc_host.mqtt import MqttLink

log = logging.getLogger("sfc_host.mes")

INTERVAL_S = 0.1
# The index script holds Redis for every order of the scope (measured in
# docs/benchmarks.md; every compare-and-set waits behind it) and its message grows with
# them (about 190 bytes an order): one index per INDEX_US_PER_ORDER per order keeps
# both a small share of Redis's and the host's time, out of the answer path's p99.
INDEX_US_PER_ORDER = 1000
START_BATCH = 64       # scopes whose index is republished at once at start

# The retained state of changed orders, in one call. KEYS: each order's hash and
# response key, in pairs. Returns four values an order: whether the hash exists, its
# state, its order JSON, the job response.
_ORDERS_LUA = """
local out = {}
for i = 1, #KEYS, 2 do
  local f = redis.call('HMGET', KEYS[i], 'state', 'order')
  out[#out + 1] = redis.call('EXISTS', KEYS[i])
  out[#out + 1] = f[1]
  out[#out + 1] = f[2]
  out[#out + 1] = redis.call('GET', KEYS[i + 1])
end
return out
"""

_ENDED = ("Ended", "Aborted")


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
        self._orders = host.client.register_script(_ORDERS_LUA)
        self._retained_props = publish_properties(expiry_s=c.mes_retained_expiry_s)
        # scope -> job -> cleared (a Clear deletes the retained topics)
        self._dirty: dict[str, dict[str, bool]] = {}
        self._forced: set[str] = set()            # scopes whose index must go out again
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changes: dict[str, int] = {}        # scope -> change count last published
        self._index_due: dict[str, float] = {}
        self._start_task: asyncio.Task[None] | None = None

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
        self._start_task = asyncio.get_running_loop().create_task(self._republish_all())

    async def _republish_all(self) -> None:
        try:
            scopes = sorted(m.decode() for m in await self.host.client.smembers(SCOPES))
            for i in range(0, len(scopes), START_BATCH):
                await asyncio.gather(*(self._publish_index(s, self.host.store.keys(s),
                                                           force=True)
                                       for s in scopes[i:i + START_BATCH]))
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("state indexes not republished at start")

    # ---- changes

    def on_change(self, scope: str, job: str, old: str, new: str, order: dict[str, str],
                  cause: CloudEvent | None) -> None:
        """A status event now; the retained order, result and index in the next
        coalesced publish of the scope."""
        body = order.get("order")
        try:
            payload, props = codec.status_event(
                scope, body.encode() if body else None, new, self.source, cause,
                v5=self.link.v5, binary=self.link.config.mqtt_binary, expiry_s=self.expiry_s)
            self.link.publish_nowait(f"{self.prefix}/{codec.levels(scope)}/events", payload,
                                     props, status=True)
        except (CloudEventError, KeyError) as e:
            log.warning("status event of %s/%s could not be encoded: %s", scope, job, e,
                        extra={"scope": scope, "job": job})
        self._mark(scope, job, cleared=new == "EndState" and top_state(old) in _ENDED)

    def on_job_end(self, scope: str, job: str, decision: Any) -> None:
        """A job wrote its response: its order may have ended before it (an MES Abort),
        so the result and the index's ``has_result`` go out again."""
        self._forced.add(scope)
        self._mark(scope, job, cleared=False)

    def _mark(self, scope: str, job: str, *, cleared: bool) -> None:
        jobs = self._dirty.setdefault(scope, {})
        jobs[job] = jobs.get(job, False) or cleared
        if scope not in self._tasks:
            self._tasks[scope] = asyncio.get_running_loop().create_task(self._run(scope))

    async def _run(self, scope: str) -> None:
        """Every INTERVAL_S while the scope has changed orders or an index still due."""
        k = self.host.store.keys(scope)
        try:
            while self._dirty.get(scope) or scope in self._index_due:
                await asyncio.sleep(INTERVAL_S)
                jobs = self._dirty.pop(scope, None)
                if jobs:
                    await self._publish_orders(scope, k, jobs)
                await self._publish_index(scope, k, force=scope in self._forced)
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("retained state of %s not published", scope, extra={"scope": scope})
        finally:
            self._tasks.pop(scope, None)

    # ---- retained

    def _retained(self, topic: str, payload: bytes | None) -> None:
        """Retained plain JSON (None: delete the retained message)."""
        props: Properties | None = self._retained_props if self.link.v5 else None
        self.link.publish_nowait(topic, payload or b"", props, retain=True, status=True)

    async def _publish_orders(self, scope: str, k: ScopeKeys, jobs: dict[str, bool]) -> None:
        base = f"{self.prefix}/{scope}"
        names = sorted(jobs)
        keys: list[str] = []
        for job in names:
            keys += (k.order(job), k.response(job))
        raw = await self._orders(keys=keys)
        for i, job in enumerate(names):
            exists, state, order, response = raw[4 * i:4 * i + 4]
            state = state.decode() if state is not None else None
            if not exists or (state == "EndState" and jobs[job]):
                self._retained(f"{base}/order/{job}", None)
                self._retained(f"{base}/result/{job}", None)
                continue
            if state not in model.STATE_JSON:
                continue
            head = b'{"JobOrder":' + order + b"," if order else b"{"
            self._retained(f"{base}/order/{job}",
                           head + b'"State":' + model.STATE_JSON[state] + b"}")
            if response is not None and top_state(state) in _ENDED:
                self._retained(f"{base}/result/{job}", model.with_actuals(bytes(response),
                                                                          order))

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
        last = self._changes.get(scope, -1)
        self._forced.discard(scope)
        client = self.host.client
        changes = int(await client.get(k.seq) or 0)
        if changes == last and not force:
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
        self._retained(f"{self.prefix}/{scope}/state-index", body)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        if self._start_task is not None:
            tasks.append(self._start_task)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

