"""What each kind of work entry does. Entries that change job states are settled
together (one read and one write call per scope); dispatch entries go out after them,
against the states just written."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec

from sfc_fast import Graph, RecipeError, compile_recipe
from sfc_fast.events import Cancel, Event, Hold, Release, Resume, Start
from sfc_host.config import HostConfig
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

log = logging.getLogger("sfc_host.execution.work")

ALIGN_ROUNDS = 4
MAX_EVENT_CANDIDATES = 64
EVENT_ARRIVED_MAX = 10_000


class Unusable(Exception):
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


class WorkHandler:
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

    def event_queued(self, entry_id: bytes, arrived: float) -> None:
        self.event_arrived[entry_id] = arrived
        if len(self.event_arrived) > EVENT_ARRIVED_MAX:  # read by another host, or never
            self.event_arrived.popitem(last=False)

    async def handle(self, raws: Sequence[Raw]
                     ) -> tuple[dict[str, list[bytes]], dict[str, list[tuple[bytes, str]]]]:
        """Handle a batch; ``(done ids, failed ids with reasons)`` per scope. Failed
        entries stay pending (redelivered after the claim idle time)."""
        done: dict[str, list[bytes]] = {}
        failed: dict[str, list[tuple[bytes, str]]] = {}

        def ok(e: Entry) -> None:
            done.setdefault(e.scope, []).append(e.id)

        def fail(e: Entry, reason: str) -> None:
            failed.setdefault(e.scope, []).append((e.id, reason))
            self.metrics.inc("entry_failures")

        entries: list[Entry] = []
        for scope, eid, fields in raws:
            try:
                entries.append(parse_entry(scope, eid, fields))
            except (InvalidEntry, ValueError) as ex:
                self.metrics.inc("invalid_entries")
                log.warning("invalid entry %s in scope %s acked: %s", eid.decode(), scope, ex,
                            extra={"scope": scope})
                done.setdefault(scope, []).append(eid)
        self.metrics.inc("entries", len(entries))

        # One pipeline reads the orders of every start, cancel and job entry (and, in the
        # same write, the starts' jobs), one more the Work Masters of the starts: a batch
        # costs the same round trips at any size.
        need = [e for e in entries if e.kind in ("start", "cancel", "job")]
        orders: dict[int, dict[str, str] | None] = {}
        # A job entry (the recipe's Run, Complete, Abort) tries the order as this host
        # last read or wrote it: its write checks the version, and a stale one is read.
        known: set[int] = set()
        for e in need:
            if e.kind == "job":
                o = self.orders.known(e.scope, e.job)
                if o is not None:
                    orders[id(e)] = o
                    known.add(id(e))
        if known:
            need = [e for e in need if id(e) not in known]
        wms: dict[int, bytes | None] = {}
        starting: dict[str, dict[str, None]] = {}     # scope -> its starts' jobs, once
        for e in need:
            if e.kind == "start":
                starting.setdefault(e.scope, {})[e.job] = None
        read: dict[str, tuple[int, dict[str, JobRow]]] = {}
        try:
            if starting:
                got, read = await self.store.orders_and_jobs(
                    [(e.scope, e.job) for e in need],
                    {s: list(jobs) for s, jobs in starting.items()})
            else:
                got = await self.store.orders_many([(e.scope, e.job) for e in need])
            orders.update({id(e): o for e, o in zip(need, got, strict=True)})
            for e in need:
                if e.kind == "start":
                    self.orders.remember(e.scope, e.job, orders[id(e)])
            starts = [(e, _wm_id(orders[id(e)])) for e in need if e.kind == "start"]
            starts = [(e, w) for e, w in starts if w]
            raw = await self.store.work_masters_many([(e.scope, w) for e, w in starts])
            wms = {id(e): r for (e, _), r in zip(starts, raw, strict=True)}
        except Exception as ex:
            log.exception("reading %d job orders failed", len(need))
            for e in need:
                fail(e, f"{type(ex).__name__}: {ex}")
            entries = [e for e in entries if e not in need]
            need = []
        jobs_done = await self._jobs([e for e in entries if e.kind == "job"
                                      and id(e) in orders], orders, fail, known)
        for e in jobs_done:
            ok(e)

        batch: list[tuple[Entry, Item]] = []
        dispatch: list[Entry] = []
        for e in entries:
            try:
                if e.kind == "tick":
                    batch.extend((e, Item(e.scope, j, tick_events, putback=True, fresh=True))
                                 for j in e.jobs or ())
                elif e.kind == "resume":
                    batch.append((e, Item(e.scope, e.job, [Resume()])))
                elif e.kind == "dispatch":
                    dispatch.append(e)
                elif e.kind == "start":
                    it = await self._start_item(e, orders[id(e)], wms.get(id(e)))
                    if it is None:
                        ok(e)
                    else:
                        now, rows = read.get(e.scope, (0, {}))
                        row = rows.get(e.job)
                        if row is not None:
                            it.read = (now, row)
                        batch.append((e, it))
                elif e.kind == "cancel":
                    it = self._cancel_item(e, orders[id(e)])
                    if it is None:
                        ok(e)
                    else:
                        batch.append((e, it))
                elif e.kind in ("hold", "release"):
                    await self._align(e)
                    ok(e)
                elif e.kind == "event":
                    await self._event(e)
                    ok(e)
            except Exception as ex:
                log.exception("entry %s (%s) of job %s/%s failed", e.id.decode(), e.kind,
                              e.scope, e.job, extra=_fields(e))
                fail(e, f"{type(ex).__name__}: {ex}")

        if batch:
            by_id = {id(e): e for e, _ in batch}
            try:
                await self.settler.settle([it for _, it in batch])
            except Exception as ex:
                log.exception("settling %d entries failed", len(by_id))
                for e in by_id.values():
                    fail(e, f"{type(ex).__name__}: {ex}")
                batch = []
            # an entry of several jobs (a sweep's tick) is done when each of them is
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
                    ok(e)
                else:
                    fail(e, reason)
        if dispatch:
            try:
                await self.dispatcher.dispatch([(e.scope, e.job, e.action, e.cid)
                                                for e in dispatch])
                for e in dispatch:
                    ok(e)
            except Exception as ex:
                log.exception("dispatching %d entries failed", len(dispatch))
                for e in dispatch:
                    fail(e, f"{type(ex).__name__}: {ex}")
        return done, failed

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
                    graph=graph)

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
                    fail: Any, known: set[int]) -> list[Entry]:
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
