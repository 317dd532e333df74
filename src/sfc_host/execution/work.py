"""What each kind of work entry does. Entries that change job states are settled
together (one read and one write call per scope); dispatch entries go out after them,
against the states just written."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from sfc_fast import Graph, RecipeError, compile_recipe
from sfc_fast.events import Cancel, Event, Hold, Release, Resume, Start
from sfc_host.config import HostConfig
from sfc_host.errors import SfcHostError
from sfc_host.execution.dispatch import Dispatcher
from sfc_host.execution.settle import APPLIED, CONFLICT, ERROR, Item, Settler, tick_events
from sfc_host.execution.workmaster import resolve_schema
from sfc_host.isa95 import JobOrderData, parameters
from sfc_host.metrics import Metrics
from sfc_host.store.orders import Orders
from sfc_host.store.orders import top_state as _top
from sfc_host.store.states import JobRow, Store
from sfc_host.store.streams import Entry, InvalidEntry, Raw, parse_entry
from sfc_host.store.streams import log_fields as _fields
from sfc_host.tracing.context import job_trace

log = logging.getLogger("sfc_host.execution.work")

ALIGN_ROUNDS = 4
MAX_EVENT_CANDIDATES = 64
EVENT_ARRIVED_MAX = 10_000

Done = dict[str, list[bytes]]                       # per scope: the entries done
Failed = dict[str, list[tuple[bytes, str]]]         # per scope: the entries failed, why


class Unusable(SfcHostError):
    """The job's recipe cannot be used: the job is aborted with this reason."""


def _wm_id(order: dict[str, str] | None) -> str | None:
    """The Work Master that runs: the one chosen when the order was stored (the first
    one it lists that the scope knew)."""
    if order is None:
        return None
    return order.get("wm") or None


def order_params(body: str | None, wm_id: str | None) -> dict[str, Any] | None:
    """Job parameters of a stored ISA-95 job order (``job.param`` in conditions): the
    chosen Work Master entry's ``Parameters``, then ``JobOrderParameters``."""
    try:
        order = msgspec.json.decode(body or "{}", type=JobOrderData)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    wm = next((w for w in order.WorkMasterID or () if wm_id == w.ID), None)
    return parameters(order, wm) or None


class Recipes:
    """Compiled Work Masters, keyed by the hash of their stored bytes: a start never
    compiles a recipe it compiled before."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cache: OrderedDict[bytes, Graph | Unusable] = OrderedDict()

    def compile(self, raw: bytes) -> Graph:
        key = hashlib.blake2b(raw, digest_size=16).digest()
        hit = self._cache.get(key)
        if hit is None:
            hit = self._compile(raw)
            self._cache[key] = hit
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        if isinstance(hit, Unusable):
            raise hit
        return hit

    @staticmethod
    def _compile(raw: bytes) -> Graph | Unusable:
        try:
            wm = json.loads(raw)
        except (ValueError, RecursionError):
            return Unusable("the Work Master is not JSON")
        if not isinstance(wm, dict) or wm.get("data") in (None, "", {}):
            return Unusable("the Work Master has no recipe data")
        schema = wm.get("dataschema")
        if not isinstance(schema, str) or not schema:
            return Unusable("the Work Master has no dataschema")
        try:
            return compile_recipe(wm["data"], resolve_schema(schema))
        except RecipeError as e:
            first = "; ".join(f"{p.code} {p.path}: {p.message}" for p in e.problems[:3])
            more = f" (and {len(e.problems) - 3} more)" if len(e.problems) > 3 else ""
            return Unusable(f"the recipe does not compile: {first}{more}")


class _Batch:
    """What the phases of one ``handle`` call share: its outcomes per scope, the orders,
    Work Masters and jobs read for its entries, and the entries kept for the two calls
    after the handlers (the items to settle together, the dispatch entries)."""

    __slots__ = ("dispatch", "done", "failed", "items", "known", "metrics", "orders", "read",
                 "wms")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.done: Done = {}
        self.failed: Failed = {}
        self.orders: dict[int, dict[str, str] | None] = {}     # by id(entry)
        # job entries whose order is the one this host last read or wrote
        self.known: set[int] = set()
        self.wms: dict[int, bytes | None] = {}                 # a start's Work Master
        # per scope: the server time and rows of its starts' jobs
        self.read: dict[str, tuple[int, dict[str, JobRow]]] = {}
        self.items: list[tuple[Entry, Item]] = []
        self.dispatch: list[Entry] = []

    def ok(self, e: Entry) -> None:
        self.done.setdefault(e.scope, []).append(e.id)

    def fail(self, e: Entry, reason: str) -> None:
        self.failed.setdefault(e.scope, []).append((e.id, reason))
        self.metrics.inc("entry_failures")


# An entry's handler: one that must wait (on Redis, on a settle) returns the awaitable to
# wait on, one that only files the entry returns None, as most entries of a batch need
# no coroutine of their own.
_Handler = Callable[[Entry, _Batch], Awaitable[None] | None]


class WorkHandler:
    """Handles batches of work entries: each entry through the handler of its kind."""

    def __init__(self, store: Store, settler: Settler, dispatcher: Dispatcher,
                 orders: Orders, config: HostConfig, metrics: Metrics) -> None:
        self.store = store
        self.settler = settler
        self.dispatcher = dispatcher
        self.orders = orders
        self.config = config
        self.metrics = metrics
        self.recipes = Recipes(config.graph_cache_size)
        # event entry id -> when this host received the pull event (perf_counter); an
        # entry another host added is not here, and its latency is not measured
        self.event_arrived: OrderedDict[bytes, float] = OrderedDict()
        # the handler of each kind a parsed entry can have, job entries aside: they take
        # their order transitions in one pipeline before any handler runs
        self._handlers: dict[str, _Handler] = {
            "tick": self._on_tick,
            "resume": self._on_resume,
            "dispatch": self._on_dispatch,
            "start": self._on_start,
            "cancel": self._on_cancel,
            "hold": self._on_align,
            "release": self._on_align,
            "event": self._on_event,
        }

    def event_queued(self, entry_id: bytes, arrived: float) -> None:
        self.event_arrived[entry_id] = arrived
        if len(self.event_arrived) > EVENT_ARRIVED_MAX:  # read by another host, or never
            self.event_arrived.popitem(last=False)

    async def handle(self, raws: Sequence[Raw]) -> tuple[Done, Failed]:
        """Handle a batch; ``(done ids, failed ids with reasons)`` per scope. Failed
        entries stay pending (redelivered after the claim idle time)."""
        b = _Batch(self.metrics)
        entries = self._parse(raws, b)
        entries = await self._read_orders(entries, b)
        for e in await self._jobs([e for e in entries if e.kind == "job" and id(e) in b.orders],
                                  b.orders, b.fail, b.known):
            b.ok(e)
        await self._run_handlers(entries, b)
        if b.items:
            await self._settle_items(b)
        if b.dispatch:
            await self._dispatch_entries(b)
        return b.done, b.failed

    def _parse(self, raws: Sequence[Raw], b: _Batch) -> list[Entry]:
        """The usable entries; an invalid one is logged, counted and acked, as no
        handler could ever use it. First, as every later phase works on parsed
        entries."""
        entries: list[Entry] = []
        for scope, eid, fields in raws:
            try:
                entries.append(parse_entry(scope, eid, fields))
            except (InvalidEntry, ValueError) as ex:
                self.metrics.inc("invalid_entries")
                log.warning("invalid entry %s in scope %s acked: %s", eid.decode(), scope, ex,
                            extra={"scope": scope})
                b.done.setdefault(scope, []).append(eid)
        self.metrics.inc("entries", len(entries))
        return entries

    async def _read_orders(self, entries: list[Entry], b: _Batch) -> list[Entry]:
        """The orders of every start, cancel and job entry (and, in the same call, the
        starts' jobs) in one pipeline, the Work Masters of the starts in one more: a
        batch costs the same round trips at any size. A job entry (the recipe's Run,
        Complete, Abort) tries the order as this host last read or wrote it: its write
        checks the version, and a stale one is read. If the reads fail, the entries that
        needed them fail and drop out of the batch (returned: the entries left). Before
        the handlers, which decide on what was read."""
        need = [e for e in entries if e.kind in ("start", "cancel", "job")]
        orders, known = b.orders, b.known
        for e in need:
            if e.kind == "job":
                o = self.orders.known(e.scope, e.job)
                if o is not None:
                    orders[id(e)] = o
                    known.add(id(e))
        if known:
            need = [e for e in need if id(e) not in known]
        starting: dict[str, dict[str, None]] = {}     # scope -> its starts' jobs, once
        for e in need:
            if e.kind == "start":
                starting.setdefault(e.scope, {})[e.job] = None
        try:
            early: dict[int, tuple[str, bytes | None]] = {}
            if starting:
                got, early = await self._orders_and_hinted(need, starting, b)
            else:
                got = await self.store.orders_many([(e.scope, e.job) for e in need])
            orders.update({id(e): o for e, o in zip(need, got, strict=True)})
            for e in need:
                if e.kind == "start":
                    self.orders.remember(e.scope, e.job, orders[id(e)])
            starts = [(e, _wm_id(orders[id(e)])) for e in need if e.kind == "start"]
            starts = [(e, w) for e, w in starts if w]
            b.wms = {id(e): early[id(e)][1] for e, w in starts
                     if id(e) in early and early[id(e)][0] == w}
            late = [(e, w) for e, w in starts if id(e) not in b.wms]
            raw = await self.store.work_masters_many([(e.scope, w) for e, w in late])
            b.wms.update({id(e): r for (e, _), r in zip(late, raw, strict=True)})
        except Exception as ex:
            log.exception("reading %d job orders failed", len(need))
            for e in need:
                b.fail(e, f"{type(ex).__name__}: {ex}")
            return [e for e in entries if e not in need]
        return entries

    async def _orders_and_hinted(self, need: list[Entry], starting: dict[str, dict[str, None]],
                                 b: _Batch) -> tuple[list[dict[str, str] | None],
                                                     dict[int, tuple[str, bytes | None]]]:
        """The orders and the starts' jobs, and in the same round trip the Work Masters
        of the starts whose orders this host stored (the usual case with one host): a
        start then costs one round trip, not two. A hint the order read contradicts is
        read again by the caller."""
        hinted = [(e, self.orders.stored_work_master(e.scope, e.job)) for e in need
                  if e.kind == "start"]
        hinted = [(e, w) for e, w in hinted if w]
        reads = self.store.orders_and_jobs([(e.scope, e.job) for e in need],
                                           {s: list(jobs) for s, jobs in starting.items()})
        if not hinted:
            got, b.read = await reads
            return got, {}
        (got, b.read), raw = await asyncio.gather(
            reads, self.store.work_masters_many([(e.scope, w) for e, w in hinted]))
        return got, {id(e): (w, r) for (e, w), r in zip(hinted, raw, strict=True)}

    async def _run_handlers(self, entries: list[Entry], b: _Batch) -> None:
        """Each entry through the handler of its kind, in order; one that raises fails
        alone. Job entries have no handler: their transitions were taken before (any
        other kind is refused by ``parse_entry``). After the orders are read, before
        the settle and the dispatch the handlers fill."""
        handlers = self._handlers
        for e in entries:
            handler = handlers.get(e.kind)
            if handler is None:
                continue
            try:
                pending = handler(e, b)
                if pending is not None:
                    await pending
            except Exception as ex:   # one entry's fault, whatever it is, stays with it
                log.exception("entry %s (%s) of job %s/%s failed", e.id.decode(), e.kind,
                              e.scope, e.job, extra=_fields(e))
                b.fail(e, f"{type(ex).__name__}: {ex}")

    async def _settle_items(self, b: _Batch) -> None:
        """The items of every entry that changes job states, settled together (one read
        and one write call per scope); an entry of several jobs (a sweep's tick) is done
        when each of them is. Before the dispatch entries, which go out against the
        states just written."""
        batch = b.items
        by_id = {id(e): e for e, _ in batch}
        try:
            await self.settler.settle([it for _, it in batch])
        except Exception as ex:
            log.exception("settling %d entries failed", len(by_id))
            for e in by_id.values():
                b.fail(e, f"{type(ex).__name__}: {ex}")
            batch = []
        why: dict[int, str | None] = {}
        for e, it in batch:
            if it.outcome == CONFLICT:
                why[id(e)] = why.get(id(e)) or "lost the compare-and-set race repeatedly"
            elif it.outcome == ERROR:
                why[id(e)] = why.get(id(e)) or it.error or "the job cannot be evaluated"
            else:
                why.setdefault(id(e), None)
        for key, reason in why.items():
            e = by_id[key]
            if reason is None:
                b.ok(e)
            else:
                b.fail(e, reason)

    async def _dispatch_entries(self, b: _Batch) -> None:
        """The dispatch entries' commands in one call; they all fail together if it
        raises. Last, against the states the settle just wrote."""
        dispatch = b.dispatch
        try:
            await self.dispatcher.dispatch([(e.scope, e.job, e.action, e.cid)
                                            for e in dispatch])
            for e in dispatch:
                b.ok(e)
        except Exception as ex:
            log.exception("dispatching %d entries failed", len(dispatch))
            for e in dispatch:
                b.fail(e, f"{type(ex).__name__}: {ex}")

    # ---- the handlers, one a kind

    def _on_tick(self, e: Entry, b: _Batch) -> None:
        """A sweep's tick: each of its jobs read whole (the sent markers) and put back
        if nothing is written."""
        b.items.extend((e, Item(e.scope, j, tick_events, putback=True, fresh=True))
                       for j in e.jobs or ())

    def _on_resume(self, e: Entry, b: _Batch) -> None:
        """A resume: settled with the batch."""
        b.items.append((e, Item(e.scope, e.job, [Resume()])))

    def _on_dispatch(self, e: Entry, b: _Batch) -> None:
        """A command to send: kept for the dispatch after the settle."""
        b.dispatch.append(e)

    async def _on_start(self, e: Entry, b: _Batch) -> None:
        """A start whose order allows it, evolved from the job read with its order; a
        skipped or aborted one is done."""
        it = await self._start_item(e, b.orders[id(e)], b.wms.get(id(e)))
        if it is None:
            b.ok(e)
            return
        now, rows = b.read.get(e.scope, (0, {}))
        row = rows.get(e.job)
        if row is not None:
            it.read = (now, row)
        b.items.append((e, it))

    def _on_cancel(self, e: Entry, b: _Batch) -> None:
        """A cancel of an order that ended or is gone: settled with the batch; else done."""
        it = self._cancel_item(e, b.orders[id(e)])
        if it is None:
            b.ok(e)
        else:
            b.items.append((e, it))

    async def _on_align(self, e: Entry, b: _Batch) -> None:
        """A hold or release, settled on its own: it reads the order until it stays."""
        await self._align(e)
        b.ok(e)

    async def _on_event(self, e: Entry, b: _Batch) -> None:
        """A pull event, given to the oldest waiting job that takes it."""
        await self._event(e)
        b.ok(e)

    # ---- start and cancel

    async def _start_item(self, e: Entry, order: dict[str, str] | None,
                          raw: bytes | None) -> Item | None:
        if order is None or _top(order.get("state", "")) != "AllowedToStart":
            log.info("start of %s/%s skipped: the job order is %s", e.scope, e.job,
                     order.get("state") if order else "missing", extra=_fields(e))
            return None
        wm_id = _wm_id(order)
        try:
            if not wm_id:
                raise Unusable("the job order names no Work Master known in the scope")
            if raw is None:
                raise Unusable(f"Work Master {wm_id!r} is not known in scope {e.scope!r}")
            graph = self.recipes.compile(raw)
        except Unusable as u:
            self.metrics.inc("unusable_recipes")
            log.error("job %s/%s aborted: %s", e.scope, e.job, u, extra=_fields(e))
            await self.orders.recipe_transition(e.scope, e.job, "Abort", str(u))
            return None
        params = order_params(order.get("order"), wm_id)
        return Item(e.scope, e.job, [Start(e.job, e.scope, params, order.get("token") or None)],
                    graph=graph,
                    trace=job_trace(order.get("tp"), e.job, order.get("token"), wm_id))

    def _cancel_item(self, e: Entry, order: dict[str, str] | None) -> Item | None:
        state = order.get("state", "") if order else "EndState"
        top = _top(state)
        if top not in ("Aborted", "Ended", "EndState"):
            log.info("cancel of %s/%s skipped: the job order is %s", e.scope, e.job, state,
                     extra=_fields(e))
            return None
        reason = (order or {}).get("reason") or "cancelled by the MES"
        return Item(e.scope, e.job, [Cancel(reason, top == "Ended")])

    # ---- hold and release: align the recipe with the order

    async def _align(self, e: Entry) -> None:
        for _ in range(ALIGN_ROUNDS):
            order = await self.store.order(e.scope, e.job)
            if order is None:
                return
            version = order.get("v")
            held = _top(order.get("state", "")) == "Interrupted"
            it = Item(e.scope, e.job, [Hold() if held else Release()])
            await self.settler.settle([it])
            if it.outcome == CONFLICT:
                raise RuntimeError("lost the compare-and-set race repeatedly")
            if it.outcome == ERROR:
                raise RuntimeError(it.error or "the job cannot be evaluated")
            again = await self.store.order(e.scope, e.job)
            if again is None or again.get("v") == version:
                return
        raise RuntimeError(f"the job order kept changing over {ALIGN_ROUNDS} rounds")

    # ---- pull events

    async def _event(self, e: Entry) -> None:
        k = self.store.keys(e.scope)
        jobs = await self.store.client.zrange(k.waits(e.type_id), 0, MAX_EVENT_CANDIDATES - 1)
        ev = Event(e.type_id, e.subject, e.correlation, e.data)
        taker = await self.settler.match_event(e.scope, ev, [j.decode() for j in jobs],
                                               self.event_arrived.pop(e.id, None))
        if taker is None:
            self.metrics.inc("events_unmatched")
        else:
            self.metrics.inc("events_matched")

    # ---- the recipe's job order transitions

    async def _jobs(self, entries: list[Entry], orders: dict[int, dict[str, str] | None],
                    fail: Callable[[Entry, str], None], known: set[int]) -> list[Entry]:
        """Job entries in one pipeline; the ones that lost a race go one by one, as do
        those whose remembered order (``known``) did not take the transition."""
        if not entries:
            return []
        done: list[Entry] = []
        try:
            res = await self.orders.recipe_transitions(
                [(e.scope, e.job, e.action, e.cid, orders.get(id(e))) for e in entries])
        except Exception as ex:
            log.exception("%d job entries failed", len(entries))
            for e in entries:
                fail(e, f"{type(ex).__name__}: {ex}")
            return []
        for e, new in zip(entries, res, strict=True):
            try:
                if new is False or (new is None and id(e) in known):
                    await self._job(e)
                elif new is None and e.action == "Run" and orders.get(id(e)) is not None:
                    await self._orphan_run(e)
                done.append(e)
            except Exception as ex:
                log.exception("job entry %s of %s/%s failed", e.id.decode(), e.scope, e.job,
                              extra=_fields(e))
                fail(e, f"{type(ex).__name__}: {ex}")
        return done

    async def _job(self, e: Entry) -> None:
        new = await self.orders.recipe_transition(e.scope, e.job, e.action, e.cid)
        if new is None and e.action == "Run":
            await self._orphan_run(e)

    async def _orphan_run(self, e: Entry) -> None:
        # The order moved on before the recipe ran (an MES Abort or Stop won the race):
        # the job must not keep running. A job with no order at all was started by an
        # embedding program, not the MES: it is left alone.
        order = await self.store.order(e.scope, e.job)
        if order is None:
            return
        state = order.get("state", "EndState")
        if _top(state) in ("Aborted", "Ended", "EndState"):
            reason = order.get("reason") or f"the job order is {state}"
            it = Item(e.scope, e.job, [Cancel(reason, _top(state) == "Ended")])
            await self.settler.settle([it])
            if it.outcome == APPLIED:
                log.info("job %s/%s ended: its order is %s", e.scope, e.job, state,
                         extra=_fields(e))
