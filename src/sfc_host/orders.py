"""Job orders in Redis under the ISA-95 job order machine (``sfc_fast.JOB_ORDER``).

Every change goes through the order script: a compare-and-set on the order's version
that writes the new state and, in the same step, the work entry the change implies
(``start`` when the order becomes AllowedToStart, ``hold`` on Pause, ``release`` on
Resume, ``cancel`` on Abort and Stop). The MES side (MQTT) and the recipe's own
transitions (``job`` entries: Run, Complete, Abort) both come through here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sfc_fast import JOB_ORDER, InvalidTransition
from sfc_host.keys import SCOPES, ScopeKeys, check_job, check_scope
from sfc_host.metrics import Metrics
from sfc_host.scripts import Scripts
from sfc_host.store import Store

log = logging.getLogger("sfc_host.orders")

# OPC UA method return status bits (ISA-95 job control)
NO_ERROR = 1
UNKNOWN_JOB_ORDER_ID = 2
INVALID_JOB_ORDER_STATUS = 8
UNABLE_TO_ACCEPT_JOB_ORDER = 16
INVALID_REQUEST = 2 ** 32

ROUNDS = 8

# on_change(scope, job, old state, new state, order hash after the write): called after
# every successful order write; the hash is built from what was read and written, so
# the hook costs no extra read.
OnChange = Callable[[str, str, str, str, dict[str, str]], Awaitable[None] | None]


class OrderError(Exception):
    """A job control request that cannot be done; ``status`` is the return status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def top_state(state: str) -> str:
    """The top-level job order state (``Interrupted`` of ``Interrupted_Suspended``)."""
    return state.split("_", 1)[0]


_top = top_state


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
    return [k.order(job), k.work, k.index, k.seq, k.live]


class Orders:
    def __init__(self, store: Store, scripts: Scripts, metrics: Metrics, *,
                 ended_retention_s: int = 0) -> None:
        self.store = store
        self.scripts = scripts
        self.metrics = metrics
        self.ended_retention_s = ended_retention_s
        self.on_change: OnChange | None = None
        self._registered: set[str] = set()

    async def _changed(self, scope: str, job: str, cur: dict[str, str] | None, new: str,
                       v: int, *, order: str = "", reason: str = "") -> None:
        """Tell ``on_change`` about a write that succeeded. Its faults are logged and
        counted, never raised: the order is already written."""
        hook = self.on_change
        if hook is None:
            return
        h = dict(cur or {})
        h.update(state=new, v=str(v))
        if order:
            h["order"] = order
        if reason:
            h["reason"] = reason
        old = (cur or {}).get("state") or "InitialState"
        try:
            res = hook(scope, job, old, new, h)
            if res is not None:
                await res
        except Exception:
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

    async def _write(self, scope: str, job: str, expected: str, state: str,
                     entries: list[str], *, order: str = "", reason: str = "",
                     extra: dict[str, str] | None = None, must_exist: str = "") -> int:
        k = self.store.keys(scope)
        args: list[Any] = [expected, state, order, reason, job, len(entries), *entries]
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
        return int(await self.scripts.call(self.scripts["order"], keys, args))

    async def store_order(self, scope: str, order: dict[str, Any], *, start: bool) -> str:
        """Store (or StoreAndStart) a job order; its new state. An id whose order is
        still there (not cleared) is refused."""
        check_scope(scope)
        job = order.get("ID")
        try:
            check_job(job)  # type: ignore[arg-type]
        except ValueError as e:
            raise OrderError(INVALID_REQUEST, str(e)) from None
        assert isinstance(job, str)
        wm_id = order.get("WorkMasterID")
        if not isinstance(wm_id, str) or not wm_id:
            raise OrderError(INVALID_REQUEST, "the job order names no WorkMasterID")
        await self.register_scope(scope)
        trigger = "StoreAndStart" if start else "Store"
        k = self.store.keys(scope)
        new = JOB_ORDER.fire(JOB_ORDER.initial_name, trigger)
        entries = implied_entries(trigger, "InitialState", new)
        body = json.dumps(order)
        cur: dict[str, str] | None = None
        for round_ in range(ROUNDS):
            if round_ > 0:
                # the id was taken: stored again only once its order was cleared
                cur = await self.store.order(scope, job)
                if cur is not None and cur.get("state") != "EndState":
                    raise OrderError(INVALID_JOB_ORDER_STATUS,
                                     f"job order {job!r} exists ({cur.get('state')})")
                if cur is not None:
                    # A cleared id stored again must not show its last run's response.
                    await self.store.client.delete(k.response(job))
            # a new id (the usual case) costs one round trip: the Work Master check and
            # the write are one script call
            token = uuid.uuid4().hex[:16]
            v = await self._write(scope, job, cur["v"] if cur else "0", new, entries,
                                  order=body, reason="",
                                  extra={"token": token, "reason": ""},
                                  must_exist=k.work_master(wm_id))
            if v < 0:
                raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER,
                                 f"Work Master {wm_id!r} is not known in scope {scope!r}")
            if v:
                # a re-stored id starts afresh: its old state is InitialState
                await self._changed(scope, job, {"token": token, "reason": ""}, new, v,
                                    order=body)
                return new
        raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER, f"job order {job!r} is contended")

    async def trigger(self, scope: str, job: str, trigger: str, *, reason: str = "",
                      order: dict[str, Any] | None = None) -> str:
        """Fire an MES trigger (Start, RevokeStart, Update, Pause, Resume, Stop, Abort,
        Cancel, Clear) on a stored order; its new state."""
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
            if trigger == "Update" and order is not None and order.get("ID") not in (None, job):
                raise OrderError(INVALID_REQUEST, "Update cannot change the job order ID")
            body = json.dumps(order) if order is not None else ""
            why = reason or (f"{trigger} by the MES" if trigger in ("Abort", "Stop") else "")
            v = await self._write(scope, job, cur["v"], new,
                                  implied_entries(trigger, old, new), order=body, reason=why)
            if v:
                await self._changed(scope, job, cur, new, v, order=body, reason=why)
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
        for scope, job, transition, reason, cur in items:
            new = self.next_for_recipe(cur, transition)
            out.append(new)
            if new is not None:
                k = self.store.keys(scope)
                assert cur is not None
                calls.append((self.scripts["order"], _order_keys(k, job),
                              [cur["v"], new, "", reason, job, 0]))
        results = iter(await self.scripts.run(calls))
        hooks = []
        for i, new in enumerate(out):
            if new is not None:
                r = next(results)
                if isinstance(r, Exception):
                    raise r
                if int(r) and self.on_change is not None:
                    scope, job, _, reason, cur = items[i]
                    hooks.append(self._changed(scope, job, cur, new, int(r), reason=reason))
                if not int(r) or (items[i][2] == "Complete" and new == "Running"):
                    out[i] = False   # lost a race, or half done: one by one
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
            if transition == "Complete" and new == "Running":
                v = await self._write(scope, job, cur["v"], new, [], reason=reason)
                if v:
                    await self._changed(scope, job, cur, new, v, reason=reason)
                continue   # read again, then Running -> Ended_Completed
            v = await self._write(scope, job, cur["v"], new, [], reason=reason)
            if v:
                await self._changed(scope, job, cur, new, v, reason=reason)
                return new
        raise RuntimeError(f"job order {job!r} is contended")
