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
  ``{mes}/{scope}/events`` and retained plain JSON on ``{mes}/{scope}/order/{id}``,
  ``{mes}/{scope}/result/{id}`` (once a job response exists) and
  ``{mes}/{scope}/state-index`` (id -> state, ``Seq`` + 1 per change). Clear deletes the
  retained order and result with empty retained messages.

Live job orders (the ``max_job_orders`` limit) are counted with a per-scope set
``sfc:{scope}:live`` kept by the same hook: every state but Ended, Aborted and EndState.
It only sees orders written while a ``MesControl`` is attached to the host's ``Orders``;
the limit is checked before the store, so racing Stores may pass it by a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode_binary,
    encode_structured,
    structured_properties,
)
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

# The index, live set and per-job versions change together; a write older than the one
# already recorded (two writers' hooks ran out of order) changes nothing and returns 0.
# KEYS: index hash, seq counter, versions hash, live set. ARGV: job, state, version,
# live (1/0), drop (1/0: Clear). Returns the new Seq, or 0 for a stale write.
_INDEX_LUA = """
local seen = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if tonumber(ARGV[3]) <= seen then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
if ARGV[5] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
if ARGV[4] == '1' then
  redis.call('SADD', KEYS[4], ARGV[1])
else
  redis.call('SREM', KEYS[4], ARGV[1])
end
return redis.call('INCR', KEYS[2])
"""
# Seq and the map read together (a script, not MULTI: cluster pipelines have no MULTI).
_READ_INDEX_LUA = """
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2])}
"""


class Invalid(Exception):
    """A request that is well-formed as a CloudEvent but not as a job control request."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
        self._index_script = host.client.register_script(_INDEX_LUA)
        self._read_index = host.client.register_script(_READ_INDEX_LUA)
        # state-index publishing is coalesced per scope: bursts send the newest map once
        self._index_dirty: set[str] = set()
        self._index_tasks: dict[str, asyncio.Task[None]] = {}
        self._index_seq: dict[str, int] = {}
        link.subscribe(f"{self.prefix}/+/commands", self.on_request)
        host.orders.on_change = self.on_change

    # ---- keys (all carry the scope's hash tag, like the host's own)

    def _key(self, scope: str, name: str) -> str:
        return self.host.store.keys(scope).base + name

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
            log.warning("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e)
            status, data = INVALID_REQUEST, {"Message": str(e)}
        except OrderError as e:
            self.metrics.inc("mes_requests_refused")
            log.info("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e)
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
            live = int(await self.host.client.scard(self._key(scope, "live")))
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
        index = await self.host.client.hgetall(self._key(scope, "state-index"))
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
        await store.put_work_master(scope, data)
        return NO_ERROR, {"ID": wm_id}

    # ---- replies

    def reply(self, req: CloudEvent, scope: str | None, status: int, **data: Any) -> None:
        ext = {"causationid": req.id}
        if req.correlationid is not None:
            ext["correlationid"] = req.correlationid
        ev = CloudEvent(id=uuid.uuid4().hex, source=SOURCE, type=req.type, subject=scope,
                        time=_now(), data={"ReturnStatus": status, **data}, extensions=ext)
        ev.correlation_data = req.correlation_data
        topic = req.response_topic or f"{self.prefix}/{scope}/replies"
        try:
            payload, props = self._encode(ev)
            self.link.publish_nowait(topic, payload, props)
        except (CloudEventError, ValueError) as e:
            self.metrics.inc("bad_mes_replies")
            log.warning("reply to %s could not be encoded: %s", req.id, e)

    def _encode(self, ev: CloudEvent) -> tuple[bytes, Properties | None]:
        """Binary mode on MQTT 5 unless ``mqtt_binary`` is off; structured otherwise."""
        if self.link.v5 and self.link.config.mqtt_binary:
            return encode_binary(ev)
        if self.link.v5:
            return encode_structured(ev), structured_properties(ev)
        return encode_structured(ev), None

    # ---- state publishing (Orders.on_change)

    def _retained(self, topic: str, body: Any) -> None:
        props = None
        if self.link.v5:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = RETAIN_EXPIRY_S
            if body is not None:
                props.ContentType = "application/json"
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        self.link.publish_nowait(topic, payload, props, retain=True, status=True)

    async def on_change(self, scope: str, job: str, old: str, new: str,
                        order: dict[str, str]) -> None:
        k = self.host.store.keys(scope)
        drop = new == "EndState"
        live = "0" if _top(new) in ENDED else "1"
        seq = int(await self._index_script(
            keys=[self._key(scope, "state-index"), self._key(scope, "state-seq"),
                  self._key(scope, "state-v"), self._key(scope, "live")],
            args=[job, new, order.get("v", "0"), live, "1" if drop else "0"]))
        reason = order.get("reason") or None
        ev = CloudEvent(id=uuid.uuid4().hex, source=SOURCE, type=STATUS_EVENT, subject=scope,
                        time=_now(), extensions={"correlationid": job},
                        data={"JobOrderID": job, "JobState": new, "PreviousJobState": old,
                              "Time": _now(), "Reason": reason})
        base = f"{self.prefix}/{scope}"
        try:
            payload, props = self._encode(ev)
            self.link.publish_nowait(f"{base}/events", payload, props, status=True)
        except CloudEventError as e:
            log.warning("status event of %s/%s could not be encoded: %s", scope, job, e)
        if not seq:
            return      # a newer write's hook already published the retained state
        if drop:
            self._retained(f"{base}/order/{job}", None)
            self._retained(f"{base}/result/{job}", None)
        else:
            self._retained(f"{base}/order/{job}",
                           {"JobOrderID": job, "JobState": new, "Reason": reason,
                            "JobOrder": _loads(order.get("order")),
                            "Version": int(order.get("v", "0"))})
            if new == "Ended_Completed":
                response = _loads(await self.host.client.get(k.response(job)))
                if response is not None:
                    self._retained(f"{base}/result/{job}", response)
        self._index_dirty.add(scope)
        if scope not in self._index_tasks:
            t = asyncio.get_running_loop().create_task(self._publish_index(scope))
            self._index_tasks[scope] = t

    async def _publish_index(self, scope: str) -> None:
        try:
            while scope in self._index_dirty:
                self._index_dirty.discard(scope)
                # The index is the scope's whole map: publish it at most every
                # INDEX_INTERVAL_S, so a burst of changes costs one map, not one each.
                await asyncio.sleep(INDEX_INTERVAL_S)
                seq_raw, flat = await self._read_index(
                    keys=[self._key(scope, "state-seq"), self._key(scope, "state-index")])
                seq = int(seq_raw)
                if seq <= self._index_seq.get(scope, 0):
                    continue
                self._index_seq[scope] = seq
                states = {flat[i].decode(): flat[i + 1].decode()
                          for i in range(0, len(flat), 2)}
                self._retained(f"{self.prefix}/{scope}/state-index",
                               {"Seq": seq, "States": states})
        except Exception:
            self.metrics.inc("mes_index_errors")
            log.exception("state index of %s not published", scope)
        finally:
            self._index_tasks.pop(scope, None)

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
