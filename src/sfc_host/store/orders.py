"""Job orders in Redis under the ISA-95 job order machine (``sfc_fast.JOB_ORDER``).

Every change goes through the order script: a compare-and-set on the order's version
that writes the new state and, in the same step, the work entry the change implies
(``start`` when the order becomes AllowedToStart, ``hold`` on Pause, ``release`` on
Resume, ``cancel`` on Abort and Stop). The MES side (MQTT) and the recipe's own
transitions (``job`` entries: Run, Complete, Abort) both come through here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from sfc_fast import JOB_ORDER, InvalidTransition
from sfc_host.errors import SfcHostError
from sfc_host.isa95 import (
    INVALID_JOB_ORDER_STATUS,
    INVALID_REQUEST,
    NO_ERROR,
    STATE_JSON,
    UNABLE_TO_ACCEPT_JOB_ORDER,
    UNKNOWN_JOB_ORDER_ID,
    JobOrderData,
)
from sfc_host.metrics import Metrics
from sfc_host.names import check_job, check_scope
from sfc_host.store.keys import SCOPES, ScopeKeys
from sfc_host.store.lua_scripts import Scripts
from sfc_host.store.states import Store
from sfc_host.times import timestamp

log = logging.getLogger("sfc_host.store.orders")

__all__ = ["INVALID_JOB_ORDER_STATUS", "INVALID_REQUEST", "NO_ERROR",
           "UNABLE_TO_ACCEPT_JOB_ORDER", "UNKNOWN_JOB_ORDER_ID", "OrderError", "Orders",
           "top_state"]

ROUNDS = 8
ENDED_TOPS = ("Ended", "Aborted", "EndState")
_ENCODE = msgspec.json.Encoder()

# on_change(scope, job, old state, new state, order hash after the write, cause): called
# after every successful order write; the hash is built from what was read and written,
# so the hook costs no extra read. ``cause`` is the MES request that made the change
# (None for the recipe's own transitions).
OnChange = Callable[[str, str, str, str, dict[str, str], Any], Awaitable[None] | None]


def times_for(new: str) -> dict[str, str]:
    """The order hash's ``started`` and ``ended`` times a new state sets (UTC,
    milliseconds, as events carry their time)."""
    if new == "Running":
        return {"started": timestamp()}
    if _top(new) in ("Ended", "Aborted"):
        return {"ended": timestamp()}
    return {}


class OrderError(SfcHostError):
    """A job control request that cannot be done; ``status`` is the return status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def top_state(state: str) -> str:
    """The top-level job order state (``Interrupted`` of ``Interrupted_Suspended``)."""
    return state.split("_", 1)[0]


_top = top_state
_DONE = frozenset(("Ended", "Aborted", "EndState"))


def implied_entries(trigger: str, old: str, new: str) -> list[str]:
    """The work entries a change of the order implies."""
    out = []
    if _top(new) == "AllowedToStart" and _top(old) != "AllowedToStart":
        out.append("start")
    if trigger == "Pause":
        out.append("hold")
    elif trigger == "Resume":
        out.append("release")
    elif trigger in ("Abort", "Stop"):
        out.append("cancel")
    return out


def _order_keys(k: ScopeKeys, job: str) -> list[str]:
    return [k.order(job), k.work, k.index, k.seq, k.live, k.index_order, k.results,
            k.index_entries, k.outbox]


def index_entry(job: str, state: str) -> bytes:
    """The job's entry of the published state index up to its ``has_result`` value
    (the original's ``StateIndexEntry``): written with every order write, so the index
    is joined, not built, when it is published."""
    return (b'{"job_order_id":' + _ENCODE.encode(job) + b',"state":' + STATE_JSON[state]
            + b',"has_result":')


# live orders whose hash this host read or wrote last, kept for the recipe's next
# transition (the order's version check catches one another host changed since)
KNOWN_MAX = 10_000


def written(cur: dict[str, str] | None, new: str, v: int, *, order: str = "",
            reason: str = "", extra: dict[str, str] | None = None) -> dict[str, str]:
    """The order hash as ``order.lua`` leaves it after writing ``new`` over ``cur``."""
    h = dict(cur or {})
    h.update(state=new, v=str(v))
    if order:
        h["order"] = order
    if reason:
        h["reason"] = reason
    if extra:
        h.update(extra)
    return h


class Orders:
    def __init__(self, store: Store, scripts: Scripts, metrics: Metrics, *,
                 ended_retention_s: int = 0) -> None:
        self.store = store
        self.scripts = scripts
        self.metrics = metrics
        self.ended_retention_s = ended_retention_s
        self.on_change: OnChange | None = None
        # a write appended work entries to the scope's stream (the host reads it next)
        self.on_work: Callable[[str], None] | None = None
        self._registered: set[str] = set()
        self._known: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
        # the Work Master of each order this host stored, until its start is read: the
        # start's reader asks for it in the same round trip as the order (a hint only:
        # what the order read says wins)
        self._stored_wm: OrderedDict[tuple[str, str], str] = OrderedDict()

    def known(self, scope: str, job: str) -> dict[str, str] | None:
        """The live order as this host last read or wrote it (maybe stale), or None."""
        return self._known.get((scope, job))

    def stored_work_master(self, scope: str, job: str) -> str | None:
        """The Work Master this host stored the order with, once (None: not known)."""
        return self._stored_wm.pop((scope, job), None)

    def remember(self, scope: str, job: str, order: dict[str, str] | None) -> None:
        """Keep a live order just read or written; an ended or missing one goes."""
        key = (scope, job)
        known = self._known
        if order is None or _top(order.get("state", "")) in _DONE:
            known.pop(key, None)
            return
        known[key] = order
        known.move_to_end(key)
        if len(known) > KNOWN_MAX:
            known.popitem(last=False)

    async def _changed(self, scope: str, job: str, cur: dict[str, str] | None, new: str,
                       v: int, *, order: str = "", reason: str = "",
                       extra: dict[str, str] | None = None, cause: Any = None) -> None:
        """Tell ``on_change`` about a write that succeeded. Its faults are logged and
        counted, never raised: the order is already written."""
        if self.on_change is not None:
            await self._notify(scope, job, cur, written(cur, new, v, order=order,
                                                        reason=reason, extra=extra), cause)

    async def _notify(self, scope: str, job: str, cur: dict[str, str] | None,
                      h: dict[str, str], cause: Any = None) -> None:
        """``on_change`` of a write that left the order hash ``h``."""
        res = self._call_hook(scope, job, cur, h, cause)
        if res is not None:
            await res

    def _call_hook(self, scope: str, job: str, cur: dict[str, str] | None,
                   h: dict[str, str], cause: Any = None) -> Awaitable[None] | None:
        """Call ``on_change`` now; what is left to await of an asynchronous hook, else
        None. The usual hook (the MES publisher's) is synchronous: a batch of order
        writes then costs no task per write."""
        hook = self.on_change
        if hook is None:
            return None
        old = (cur or {}).get("state") or "InitialState"
        try:
            res = hook(scope, job, old, h["state"], h, cause)
        except Exception:   # the order is written already: a hook's fault must not undo that
            self._hook_failed(scope, job)
            return None
        return None if res is None else self._await_hook(res, scope, job)

    async def _await_hook(self, res: Awaitable[None], scope: str, job: str) -> None:
        try:
            await res
        except Exception:
            self._hook_failed(scope, job)

    def _hook_failed(self, scope: str, job: str) -> None:
        self.metrics.inc("order_hook_errors")
        log.exception("order change hook for %s/%s failed", scope, job,
                      extra={"scope": scope, "job": job})

    async def register_scope(self, scope: str) -> None:
        # the registry only grows: once per scope and process is enough
        if scope not in self._registered:
            await self.store.client.sadd(SCOPES, check_scope(scope))
            self._registered.add(scope)

    async def get(self, scope: str, job: str) -> dict[str, str] | None:
        return await self.store.order(scope, job)

    def _call(self, scope: str, job: str, expected: str, state: str, entries: list[str], *,
              order: str = "", reason: str = "", extra: dict[str, str] | None = None,
              priority: int | None = None, must_exist: str = ""
              ) -> tuple[Any, list[str], list[Any]]:
        """The order script's call for one write (``lua/order.lua``)."""
        k = self.store.keys(scope)
        args: list[Any] = [expected, state, order, reason, job,
                           b"" if state == "EndState" else index_entry(job, state),
                           "" if priority is None else priority,
                           b"1" if self.store.outbox else b"", len(entries), *entries]
        keys = _order_keys(k, job)
        if state == "EndState":
            # the order, its job state and job response expire together after the
            # retention (cleared and cancelled orders would otherwise pile up in Redis)
            args.append(self.ended_retention_s)
            keys += (k.job(job), k.response(job))
        for f, v in (extra or {}).items():
            args += (f, v)
        if must_exist:
            keys.append(must_exist)
        return self.scripts["order"], keys, args

    async def _write(self, scope: str, job: str, expected: str, state: str,
                     entries: list[str], **kw: Any) -> int:
        script, keys, args = self._call(scope, job, expected, state, entries, **kw)
        self._known.pop((scope, job), None)     # changed here or elsewhere: read it next
        v = int(await self.scripts.call_together(script, keys, args))
        if v > 0 and entries and self.on_work is not None:
            self.on_work(scope)
        return v

    async def store_order(self, scope: str, order: dict[str, Any] | JobOrderData, *,
                          start: bool, work_master: str | None = None,
                          cause: Any = None, trace: str = "") -> str:
        """Store (or StoreAndStart) an ISA-95 job order; its new state.

        ``work_master`` is the Work Master that runs (default: the first one the order
        lists; "": none); it must exist in the scope when the order is written. ``trace``
        (``tracing.stored``) is the trace context its job carries on. An id whose
        order is live is refused unless the order is the same (an MES repeating a Store
        whose reply it lost: success, nothing changes); an ended or cleared id is
        stored afresh.
        """
        check_scope(scope)
        if isinstance(order, dict):
            try:
                order = msgspec.convert(order, JobOrderData)
            except msgspec.ValidationError as e:
                raise OrderError(INVALID_REQUEST, f"the job order: {e}") from None
        job = order.JobOrderID
        try:
            check_job(job)  # type: ignore[arg-type]
        except ValueError as e:
            raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER, str(e)) from None
        assert job is not None
        if work_master is None:
            work_master = next((w.ID for w in order.WorkMasterID or () if w.ID), None)
        await self.register_scope(scope)
        trigger = "StoreAndStart" if start else "Store"
        k = self.store.keys(scope)
        new = JOB_ORDER.fire(JOB_ORDER.initial_name, trigger)
        entries = implied_entries(trigger, "InitialState", new)
        body = _ENCODE.encode(order).decode()
        extra = {"wm": work_master or "", "tp": trace}
        cur: dict[str, str] | None = None
        for round_ in range(ROUNDS):
            if round_ > 0:
                cur = await self.store.order(scope, job)
                if cur is not None and cur.get("state") != "EndState":
                    if cur.get("order") == body:
                        return cur.get("state") or new     # the same order again
                    if _top(cur.get("state", "")) not in ENDED_TOPS:
                        raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER,
                                         f"job order {job!r} exists ({cur.get('state')}) "
                                         "with other content")
                if cur is not None:
                    # An id stored again must not show its last run's response.
                    pipe = self.store.client.pipeline(transaction=False)
                    pipe.delete(k.response(job))
                    pipe.srem(k.results, job)
                    await pipe.execute()
            # a new id (the usual case) costs one round trip: the Work Master check and
            # the write are one script call
            token = os.urandom(8).hex()    # 64 random bits, as uuid4's first half
            fields = {"token": token, "reason": "", "started": "", "ended": "", **extra}
            v = await self._write(scope, job, cur["v"] if cur else "0", new, entries,
                                  order=body, reason="", extra=fields,
                                  priority=order.Priority or 0,
                                  must_exist=k.work_master(work_master) if work_master
                                  else k.order(job))
            if v < 0:
                raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER,
                                 f"Work Master {work_master!r} is not known in scope "
                                 f"{scope!r}")
            if v:
                if start and work_master:
                    hints = self._stored_wm
                    hints[(scope, job)] = work_master
                    if len(hints) > KNOWN_MAX:
                        hints.popitem(last=False)
                # a re-stored id starts afresh: its old state is InitialState
                await self._changed(scope, job, fields, new, v, order=body, cause=cause)
                return new
        raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER, f"job order {job!r} is contended")

    async def trigger(self, scope: str, job: str, trigger: str, *, reason: str = "",
                      order: JobOrderData | None = None, work_master: str | None = None,
                      cause: Any = None) -> str:
        """Fire an MES trigger (Start, RevokeStart, Update, Pause, Resume, Stop, Abort,
        Cancel, Clear) on a stored order; its new state. Update replaces the whole job
        order (as the original: fields it leaves out are gone)."""
        check_scope(scope)
        for _ in range(ROUNDS):
            cur = await self.store.order(scope, job)
            if cur is None or cur.get("state") == "EndState":
                raise OrderError(UNKNOWN_JOB_ORDER_ID, f"no job order {job!r} in {scope!r}")
            old = cur["state"]
            try:
                new = JOB_ORDER.fire(old, trigger)
            except InvalidTransition as e:
                raise OrderError(INVALID_JOB_ORDER_STATUS,
                                 f"{trigger} is not allowed in {old} (allowed: "
                                 f"{', '.join(e.permitted) or 'none'})") from None
            body = ""
            extra = times_for(new) if _top(new) != _top(old) else {}
            if order is not None:
                if order.JobOrderID not in (None, job):
                    raise OrderError(INVALID_REQUEST, "Update cannot change the job order ID")
                body = _ENCODE.encode(order).decode()
                extra["wm"] = work_master or ""
            why = reason or (f"{trigger} by the MES" if trigger in ("Abort", "Stop") else "")
            v = await self._write(scope, job, cur["v"], new,
                                  implied_entries(trigger, old, new), order=body, reason=why,
                                  extra=extra,
                                  priority=None if order is None else order.Priority or 0)
            if v:
                await self._changed(scope, job, cur, new, v, order=body, reason=why,
                                    extra=extra, cause=cause)
                return new
            self.metrics.inc("order_retries")
        raise OrderError(INVALID_JOB_ORDER_STATUS, f"job order {job!r} is contended")

    def next_for_recipe(self, cur: dict[str, str] | None, transition: str) -> str | None:
        """The order state a recipe transition leads to, or None when it does not
        apply (no order, or the order has moved on)."""
        old = cur.get("state") if cur is not None else None
        if not old or not cur or "v" not in cur:
            return None
        if transition == "Complete":
            if _top(old) == "AllowedToStart":
                # The recipe ran and completed while its Run is still behind in the
                # stream: the order goes through Running first (two writes).
                return "Running"
            return "Ended_Completed" if _top(old) in ("Running", "Interrupted") else None
        try:
            return str(JOB_ORDER.fire(old, transition))
        except (InvalidTransition, ValueError):   # ValueError: an unknown stored state
            return None

    async def recipe_transitions(self,
                                 items: list[tuple[str, str, str, str, dict[str, str] | None]]
                                 ) -> list[str | bool | None]:
        """Apply recipe transitions ``(scope, job, transition, reason, current order)``
        in one pipeline: per item the new state, None (not applicable) or False (lost
        a race: call ``recipe_transition`` for it)."""
        calls = []
        out: list[str | bool | None] = []
        # the times written are the ones the hook reports (taken once per item)
        extras: list[dict[str, str]] = []
        for scope, job, transition, reason, cur in items:
            new = self.next_for_recipe(cur, transition)
            out.append(new)
            extras.append(times_for(new) if new is not None else {})
            if new is not None:
                assert cur is not None
                calls.append(self._call(scope, job, cur["v"], new, [], reason=reason,
                                        extra=extras[-1]))
        # lazy: a recipe's transition of its order is on no job's path, so it waits
        # for the channel's next write (a compare-and-set, as a rule) instead of
        # paying a write and a wake-up of its own
        results = iter(await self.scripts.run(calls, lazy=True))
        hooks: list[Awaitable[None]] = []
        try:
            for i, new in enumerate(out):
                if new is not None:
                    r = next(results)
                    if isinstance(r, Exception):
                        raise r
                    scope, job, _, reason, cur = items[i]
                    h = written(cur, new, int(r), reason=reason, extra=extras[i]) \
                        if int(r) else None
                    self.remember(scope, job, h)
                    if h is not None and self.on_change is not None:
                        res = self._call_hook(scope, job, cur, h)
                        if res is not None:
                            hooks.append(res)
                    if not int(r) or (items[i][2] == "Complete" and new == "Running"):
                        out[i] = False   # lost a race, or half done: one by one
        finally:
            # the writes before a failed one stand: an asynchronous hook told of them
            # is awaited all the same
            if hooks:
                await asyncio.gather(*hooks)
        return out

    async def recipe_transition(self, scope: str, job: str, transition: str,
                                reason: str = "") -> str | None:
        """Apply the recipe's own transition (``Run``, ``Complete``, ``Abort``) to the
        order. None when there is no order or the order has moved on (an MES Abort
        won the race): the caller then ends the job."""
        for _ in range(ROUNDS):
            cur = await self.store.order(scope, job)
            new = self.next_for_recipe(cur, transition)
            if cur is None or new is None:
                return None
            extra = times_for(new)
            v = await self._write(scope, job, cur["v"], new, [], reason=reason, extra=extra)
            if v:
                await self._changed(scope, job, cur, new, v, reason=reason, extra=extra)
            if transition == "Complete" and new == "Running":
                continue   # read again, then Running -> Ended_Completed
            if v:
                return new
        raise RuntimeError(f"job order {job!r} is contended")
