"""Job control from the MES over MQTT (ISA-95 job control v2, as CloudEvents).

- Requests on ``{mes}/{scope}/commands``: the job order methods
  ``org.opcfoundation.ISA95-JOBCONTROL_V2.{Method}.v2``, the request-job-response
  methods (by job order id, by state) and Work Masters
  (``com.github.aschamberger.ISA95-JOBCONTROL_V2.config.workmaster.v1``, CE extension
  ``method`` ``PUT`` or ``DELETE``). PascalCase payloads as the Python original.
- Every request gets a reply of the same type, data ``{ReturnStatus, ...}`` (OPC UA
  return status bits), ``correlationid`` copied, ``causationid`` = request id, on the
  request's response topic or ``{mes}/{scope}/replies``. A message that is not a
  CloudEvent at all cannot be answered: it is logged and counted (``bad_mes_requests``).
- Every job order change (the ``Orders.on_change`` hook) publishes a status event on
  ``{mes}/{scope}/events`` at once. Retained plain JSON on ``{mes}/{scope}/order/{id}``,
  ``{mes}/{scope}/result/{id}`` (once a job response exists) and
  ``{mes}/{scope}/state-index`` (id -> state, ``Seq`` + 1 per change) follows within
  ``INDEX_INTERVAL_S``, read fresh from Redis: the newest state of each changed order
  once per interval. Clear deletes the retained order and result with empty retained
  messages.

Live job orders (the ``max_job_orders`` limit) are counted with the per-scope set
``sfc:{scope}:live``, which the order script keeps with every write (every state but
Ended, Aborted and EndState), like the index. The limit is checked before the store,
so racing Stores may pass it by a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.properties import Properties

from sfc_host.capabilities import Capabilities, unserved
from sfc_host.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode,
    publish_properties,
    timestamp,
)
from sfc_host.cloudevents import new as new_event
from sfc_host.keys import check_job, check_scope
from sfc_host.mqtt import MqttLink, payload_bytes
from sfc_host.orders import (
    INVALID_REQUEST,
    NO_ERROR,
    UNABLE_TO_ACCEPT_JOB_ORDER,
    UNKNOWN_JOB_ORDER_ID,
    OrderError,
)
from sfc_host.orders import top_state as _top
from sfc_host.work import Recipes, Unusable

if TYPE_CHECKING:
    from sfc_host.host import Host

INDEX_INTERVAL_S = 0.1
# The snapshot script holds Redis about 0.9 µs per order (6,000 orders: 5 ms, every
# compare-and-set waits behind it): one map per 500 µs per order keeps it near 0.2 % of
# Redis's time, out of the answer path's p99.
INDEX_US_PER_ORDER = 500

log = logging.getLogger("sfc_host.mes")

SOURCE = "sfc-host"
JOB_CONTROL = "org.opcfoundation.ISA95-JOBCONTROL_V2."
METHODS = frozenset(("Store", "StoreAndStart", "Start", "RevokeStart", "Update", "Pause",
                     "Resume", "Stop", "Abort", "Cancel", "Clear"))
BY_ID = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderID.v1"
BY_STATE = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderState.v1"
WORK_MASTER = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config.workmaster.v1"
STATUS_EVENT = JOB_CONTROL + "ISA95JobOrderStatusEventType.v2"
RETAIN_EXPIRY_S = 48 * 3600
MAX_BY_STATE = 1000       # orders in one ByJobOrderState reply
ENDED = ("Ended", "Aborted", "EndState")
# the same properties on every retained message: made and packed once
_RETAINED_JSON = publish_properties(content_type="application/json",
                                    expiry_s=RETAIN_EXPIRY_S)
_RETAINED_EMPTY = publish_properties(expiry_s=RETAIN_EXPIRY_S)

# The index snapshot, built as JSON inside Redis: the host never decodes and re-encodes a
# map of every order (10,000 orders cost it about 8 ms of its loop per publish).
# KEYS: seq counter, index hash. ARGV: the Seq last published. Returns {seq} when
# nothing changed, else {seq, json, number of orders}.
_SNAPSHOT_LUA = """
local seq = redis.call('GET', KEYS[1]) or '0'
if seq == ARGV[1] then return {seq} end
local flat = redis.call('HGETALL', KEYS[2])
local states = {}
for i = 1, #flat, 2 do states[flat[i]] = flat[i + 1] end
local body
if #flat == 0 then
  body = '{"Seq":' .. seq .. ',"States":{}}'
else
  body = cjson.encode({Seq = tonumber(seq), States = states})
end
return {seq, body, #flat / 2}
"""

# The retained state of changed orders, in one call: redis-py's per-command cost in a
# pipeline (two commands an order) was most of publishing them. KEYS: each order's hash
# and response key, in pairs. Returns six values an order: whether the hash exists, its
# state, reason, order JSON and version, and the job response.
_ORDERS_LUA = """
local out = {}
for i = 1, #KEYS, 2 do
  local f = redis.call('HMGET', KEYS[i], 'state', 'reason', 'order', 'v')
  out[#out + 1] = redis.call('EXISTS', KEYS[i])
  for j = 1, 4 do out[#out + 1] = f[j] end
  out[#out + 1] = redis.call('GET', KEYS[i + 1])
end
return out
"""


class Invalid(Exception):
    """A request that is well-formed as a CloudEvent but not as a job control request."""


def _loads(raw: str | bytes | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


class MesControl:
    """The MES side of one host: requests in, replies and job order state out."""

    def __init__(self, host: Host, link: MqttLink) -> None:
        self.host = host
        self.link = link
        self.metrics = host.metrics
        self.config = link.config
        self.prefix = link.config.mes_prefix
        self.max_bytes = link.config.mqtt_max_payload
        self._snapshot = host.client.register_script(_SNAPSHOT_LUA)
        self._orders = host.client.register_script(_ORDERS_LUA)
        # Retained state is coalesced per scope: the orders changed since the last
        # publish, and the index, go out at most every INDEX_INTERVAL_S, read fresh
        # from Redis, so a burst of changes costs one message per order and one map.
        self._dirty: dict[str, set[str]] = {}
        self._index_tasks: dict[str, asyncio.Task[None]] = {}
        self._index_seq: dict[str, int] = {}
        self._index_due: dict[str, float] = {}     # scope -> loop time of the next map
        link.subscribe(f"{self.prefix}/+/commands", self.on_request)
        self.capabilities = Capabilities(host.client, host.store.keys, link, host.metrics)
        host.orders.on_change = self.on_change

    # ---- requests

    def _scope_of(self, topic: str) -> str | None:
        parts = topic.split("/")
        if len(parts) != 3 or parts[0] != self.prefix or parts[2] != "commands":
            return None
        try:
            return check_scope(parts[1])
        except ValueError:
            return None

    async def on_request(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        try:
            ev = decode(payload_bytes(message), message.properties, max_bytes=self.max_bytes)
        except CloudEventError as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request on %s refused (no reply possible): %s", topic, e)
            return
        scope = self._scope_of(topic)
        if scope is None:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request %s on %s: not a scope's command topic", ev.id, topic)
            if ev.response_topic:
                self.reply(ev, None, INVALID_REQUEST, Message=f"invalid scope topic {topic!r}")
            return
        try:
            status, data = await self.handle(scope, ev)
        except Invalid as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e,
                        extra={"scope": scope})
            status, data = INVALID_REQUEST, {"Message": str(e)}
        except OrderError as e:
            self.metrics.inc("mes_requests_refused")
            log.info("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e,
                     extra={"scope": scope})
            status, data = e.status, {"Message": str(e)}
        self.metrics.inc("mes_requests")
        self.reply(ev, scope, status, **data)

    async def handle(self, scope: str, ev: CloudEvent) -> tuple[int, dict[str, Any]]:
        """Return status and reply data of one request; ``Invalid`` or ``OrderError``
        for a refusal."""
        data = ev.data
        if not isinstance(data, dict):
            raise Invalid("data is not a JSON object")
        t = ev.type
        if t.startswith(JOB_CONTROL) and t.endswith(".v2"):
            method = t[len(JOB_CONTROL):-3]
            if method in METHODS:
                return await self.job_control(scope, method, data)
        elif t == BY_ID:
            job = _job_id(data.get("JobOrderID"))
            view = (await self.views(scope, [job]))[0]
            if view is None:
                raise OrderError(UNKNOWN_JOB_ORDER_ID, f"no job order {job!r} in {scope!r}")
            return NO_ERROR, view
        elif t == BY_STATE:
            return NO_ERROR, {"JobResponses": await self._by_state(scope, data)}
        elif t == WORK_MASTER:
            return await self._work_master(scope, ev, data)
        raise Invalid(f"unknown request type {t!r}")

    async def job_control(self, scope: str, method: str,
                           data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        orders = self.host.orders
        comment = data.get("Comment")
        reason = comment if isinstance(comment, str) else ""
        if method in ("Store", "StoreAndStart", "Update"):
            order = data.get("JobOrder")
            if not isinstance(order, dict):
                raise Invalid("JobOrder is not an object")
            job = _job_id(order.get("ID"))
            if method == "Update":
                state = await orders.trigger(scope, job, "Update", reason=reason, order=order)
                return NO_ERROR, {"JobOrderID": job, "JobState": state}
            limit = self.config.max_job_orders
            live = int(await self.host.client.scard(self.host.store.keys(scope).live))
            if live >= limit:
                raise OrderError(UNABLE_TO_ACCEPT_JOB_ORDER,
                                 f"scope {scope!r} holds the maximum of {limit} live job orders")
            state = await orders.store_order(scope, order, start=method == "StoreAndStart")
            return NO_ERROR, {"JobOrderID": job, "JobState": state}
        job = _job_id(data.get("JobOrderID"))
        state = await orders.trigger(scope, job, method, reason=reason)
        return NO_ERROR, {"JobOrderID": job, "JobState": state}

    async def views(self, scope: str, jobs: list[str]) -> list[dict[str, Any] | None]:
        """Per job: order, state and job response (None: no such order), one pipeline."""
        k = self.host.store.keys(scope)
        pipe = self.host.client.pipeline(transaction=False)
        for job in jobs:
            pipe.hgetall(k.order(job))
            pipe.get(k.response(job))
        raw = await pipe.execute()
        out: list[dict[str, Any] | None] = []
        for i, job in enumerate(jobs):
            h = {a.decode(): b.decode() for a, b in (raw[2 * i] or {}).items()}
            if not h or h.get("state") == "EndState":
                out.append(None)
                continue
            out.append({"JobOrderID": job, "JobState": h.get("state"),
                        "JobOrder": _loads(h.get("order")), "Reason": h.get("reason") or None,
                        "JobResponse": _loads(raw[2 * i + 1])})
        return out

    async def _by_state(self, scope: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        want = data.get("JobOrderState")
        if not isinstance(want, str) or not want:
            raise Invalid("JobOrderState is not a non-empty string")
        # the state index names every order not cleared; a top state (Ended) matches
        # its sub-states (Ended_Completed)
        index = await self.host.client.hgetall(self.host.store.keys(scope).index)
        jobs = sorted(j.decode() for j, s in index.items()
                      if s.decode() == want or _top(s.decode()) == want)[:MAX_BY_STATE]
        return [v for v in await self.views(scope, jobs) if v is not None]

    async def _work_master(self, scope: str, ev: CloudEvent,
                           data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        method = ev.extensions.get("method", "PUT").upper()
        wm_id = data.get("ID")
        if not isinstance(wm_id, str) or not wm_id or len(wm_id) > 256:
            raise Invalid("the Work Master needs a string ID")
        store = self.host.store
        if method == "DELETE":
            deleted = await store.delete_work_master(scope, wm_id)
            return NO_ERROR, {"ID": wm_id, "Deleted": deleted}
        if method != "PUT":
            raise Invalid(f"unknown method {method!r} (PUT or DELETE)")
        # refuse a recipe that would abort every job started from it
        compiled = Recipes._compile(json.dumps(data).encode())
        if isinstance(compiled, Unusable):
            raise Invalid(f"the Work Master cannot be used: {compiled}")
        served = await self.capabilities.served(scope)
        if served is not None:
            problems = unserved(compiled, served)
            if problems:
                raise Invalid("the Work Master cannot be used: " + "; ".join(
                    f"{p.code} {p.path}: {p.message}" for p in problems))
        await store.put_work_master(scope, data)
        return NO_ERROR, {"ID": wm_id}

    # ---- replies

    def reply(self, req: CloudEvent, scope: str | None, status: int, **data: Any) -> None:
        ext = {"causationid": req.id}
        if req.correlationid is not None:
            ext["correlationid"] = req.correlationid
        ev = new_event(req.type, SOURCE, {"ReturnStatus": status, **data}, subject=scope,
                       extensions=ext)
        ev.correlation_data = req.correlation_data
        topic = req.response_topic or f"{self.prefix}/{scope}/replies"
        try:
            payload, props = self._encode(ev)
            self.link.publish_nowait(topic, payload, props)
        except (CloudEventError, ValueError) as e:
            self.metrics.inc("bad_mes_replies")
            log.warning("reply to %s could not be encoded: %s", req.id, e)

    def _encode(self, ev: CloudEvent) -> tuple[bytes, Properties | None]:
        return encode(ev, v5=self.link.v5, binary=self.link.config.mqtt_binary)

    # ---- state publishing (Orders.on_change)

    def _retained(self, topic: str, body: Any) -> None:
        self._retained_raw(topic, None if body is None else
                           json.dumps(body, separators=(",", ":")).encode())

    def _retained_raw(self, topic: str, payload: bytes | None) -> None:
        """Retained JSON (None: delete the retained message)."""
        props = None
        if self.link.v5:
            props = _RETAINED_EMPTY if payload is None else _RETAINED_JSON
        self.link.publish_nowait(topic, payload or b"", props, retain=True, status=True)

    async def on_change(self, scope: str, job: str, old: str, new: str,
                        order: dict[str, str]) -> None:
        """A status event now; the retained order, result and index in the next
        coalesced publish of the scope."""
        reason = order.get("reason") or None
        now = timestamp()
        ev = new_event(STATUS_EVENT, SOURCE, {"JobOrderID": job, "JobState": new,
                                              "PreviousJobState": old, "Time": now,
                                              "Reason": reason},
                       subject=scope, time=now, correlationid=job)
        try:
            payload, props = self._encode(ev)
            self.link.publish_nowait(f"{self.prefix}/{scope}/events", payload, props,
                                     status=True)
        except CloudEventError as e:
            log.warning("status event of %s/%s could not be encoded: %s", scope, job, e,
                        extra={"scope": scope, "job": job})
        self._dirty.setdefault(scope, set()).add(job)
        if scope not in self._index_tasks:
            t = asyncio.get_running_loop().create_task(self._publish_retained(scope))
            self._index_tasks[scope] = t

    async def _publish_retained(self, scope: str) -> None:
        """Every INDEX_INTERVAL_S while the scope has changed orders or an index map
        still due: the changed orders' retained topics, then the map."""
        k = self.host.store.keys(scope)
        try:
            while self._dirty.get(scope) or scope in self._index_due:
                await asyncio.sleep(INDEX_INTERVAL_S)
                jobs = sorted(self._dirty.pop(scope, ()))
                if jobs:
                    await self._publish_orders(scope, k, jobs)
                await self._publish_index(scope, k)
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("retained state of %s not published", scope, extra={"scope": scope})
        finally:
            self._index_tasks.pop(scope, None)

    async def _publish_orders(self, scope: str, k: Any, jobs: list[str]) -> None:
        """Each order's newest state (and result), read fresh: one message per order
        however many changes it went through; a cleared order's topics deleted."""
        base = f"{self.prefix}/{scope}"
        keys: list[str] = []
        for job in jobs:
            keys += (k.order(job), k.response(job))
        raw = await self._orders(keys=keys)
        for i, job in enumerate(jobs):
            exists, state, reason, order, v, response = raw[6 * i:6 * i + 6]
            state = state.decode() if state is not None else None
            if not exists or state == "EndState":
                self._retained(f"{base}/order/{job}", None)
                self._retained(f"{base}/result/{job}", None)
                continue
            self._retained(f"{base}/order/{job}",
                           {"JobOrderID": job, "JobState": state,
                            "Reason": reason.decode() if reason else None,
                            "JobOrder": _loads(order),
                            "Version": int(v or b"0")})
            if state == "Ended_Completed" and response is not None:
                self._retained(f"{base}/result/{job}", _loads(response))

    async def _publish_index(self, scope: str, k: Any) -> None:
        """The scope's index map, at most every INDEX_INTERVAL_S and, for a big map, at
        most once per INDEX_US_PER_ORDER per order (a map of 10,000 orders every 5 s):
        the map is the snapshot a client reads on connect; each order's own retained
        topic carries its changes at once."""
        loop = asyncio.get_running_loop()
        due = self._index_due.get(scope, 0.0)
        if loop.time() < due:
            return                       # the loop publishes it when due
        last = self._index_seq.get(scope, 0)
        res = await self._snapshot(keys=[k.seq, k.index], args=[last])
        if len(res) == 1:
            self._index_due.pop(scope, None)
            return
        seq, body, n = int(res[0]), res[1], int(res[2])
        if seq <= last:
            self._index_due.pop(scope, None)
            return
        self._index_seq[scope] = seq
        # the next map waits in proportion to this one's size
        self._index_due[scope] = loop.time() + max(INDEX_INTERVAL_S, n * INDEX_US_PER_ORDER / 1e6)
        self._retained_raw(f"{self.prefix}/{scope}/state-index", body)

    async def aclose(self) -> None:
        for t in list(self._index_tasks.values()):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def _job_id(value: Any) -> str:
    try:
        return check_job(value)
    except ValueError as e:
        raise Invalid(str(e)) from None
