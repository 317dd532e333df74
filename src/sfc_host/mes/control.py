"""Job control from the MES over MQTT: requests in, replies out (ISA-95 job control v2
and Machinery Jobs, as the Python original speaks them).

- Requests on ``{mes}/commands``, ``{mes}/+/commands`` … (``mes_topic_levels`` levels,
  shared subscriptions): the eleven job control methods, the two
  RequestJobResponseBy… queries and the config messages. The scope is the CloudEvent
  ``subject`` up to its first ``/``; without one, the topic levels.
- The reply (same type, ``{…, ReturnStatus}``, the request's correlation,
  ``causationid`` = request id) on the request's response topic, or
  ``{mes}/{scope levels}/replies`` without one.
- A request id (per source) answered within ``mes_dedupe_s`` is a repeat: it is not run
  again, its stored reply is sent again. The id is recorded after the request ran,
  never before, so a request that failed half-way runs again when it is redelivered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from sfc_host import isa95 as model
from sfc_host.equipment.capabilities import Capabilities, unserved
from sfc_host.execution.work import Recipes, Unusable
from sfc_host.mes import codec
from sfc_host.mes.catalog import ID_FIELD, Acceptance, config_id, max_orders
from sfc_host.mes.codec import Invalid
from sfc_host.mes.publishing import Publisher
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.cloudevents import CloudEvent, CloudEventError, decode
from sfc_host.names import check_job
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.orders import OrderError
from sfc_host.tracing.context import (
    InvalidTraceParent,
    TraceContext,
    context_of,
    job_carried,
    new_trace,
    stored,
)

if TYPE_CHECKING:
    from sfc_host.execution.host import Host

log = logging.getLogger("sfc_host.mes")

# a reply's JSON, and the trace attributes of the job it answers for (None: no job's)
Answer = tuple[bytes, dict[str, str] | None]

MAX_BY_STATE = 1000       # job responses in one ByJobOrderState reply
_STATUS_AT = b'"ReturnStatus":'


class RequestSpans(Protocol):
    """Where the spans of MES requests and job control calls go (``tracing.spans``)."""

    def request(self, event: Any, topic: str, method: str | None, scope: str | None,
                trace: TraceContext, *, root: bool, start_ns: int, end_ns: int,
                return_status: int | None, ok: bool, message: str = "",
                job: str | None = None, repeat: bool = False) -> None: ...

    def call(self, method: str, scope: str, job: str | None, trace: TraceContext, *,
             start_ns: int, end_ns: int, ok: bool, message: str = "") -> None: ...


def _return_status(body: bytes) -> tuple[int | None, str]:
    """A reply's ReturnStatus and Message (our bodies put ReturnStatus last but one)."""
    at = body.find(_STATUS_AT)
    if at < 0:
        return None, ""
    at += len(_STATUS_AT)
    end = at
    while end < len(body) and 48 <= body[end] <= 57:
        end += 1
    message = ""
    m = body.find(b'"Message":', end)
    if m >= 0:
        try:
            message = json.loads(body[m + 10:-1])
        except ValueError:
            message = ""
    return (int(body[at:end]) if end > at else None), message
NO_SCOPE = "the request names no scope (no CloudEvent subject, no scope in the topic)"


def _kept(trace: TraceContext | None, cause: CloudEvent | None) -> str:
    """What an order keeps of its request's context: the trace, with the host's handling
    of the request (the span the reply names) as the parent of the job's run."""
    if trace is None:
        return ""
    return stored(trace.under(f"mes:{cause.id}") if cause is not None else trace)


def _named_job(ev: CloudEvent) -> str | None:
    """The job order a request names, for its span: the JobOrderID of its data or of
    its JobOrder; None when it names none."""
    data = ev.data
    if not isinstance(data, dict):
        return None
    job = data.get("JobOrderID")
    if job is None and isinstance(data.get("JobOrder"), dict):
        job = data["JobOrder"].get("JobOrderID")
    return job if isinstance(job, str) and len(job) <= 256 else None


def _job_id(value: str | None) -> str:
    if value is None:
        raise Invalid("JobOrderID is missing")
    try:
        return check_job(value)
    except ValueError as e:
        raise Invalid(str(e)) from None


def _status_body(status: int, message: str = "", head: bytes = b"") -> bytes:
    """``{…head, ReturnStatus[, Message]}``: the reply's JSON; ``Message`` (one line, our
    addition) says why a request was refused."""
    body = b"{" + head + b'"ReturnStatus":' + str(status).encode()
    if message:
        body += b',"Message":' + codec.dumps(" ".join(message.split())[:500])
    return body + b"}"


class MesControl:
    """The MES side of one host: requests in, replies and job order state out."""

    def __init__(self, host: Host, link: MqttLink) -> None:
        c = link.config     # checked by HostConfig (mes_prefix, levels, acceptance)
        self.host = host
        self.link = link
        self.metrics = host.metrics
        self.config = c
        self.prefix = c.mes_prefix
        self.max_bytes = c.mqtt_max_payload
        self.publisher = Publisher(host, link)
        self.acceptance = Acceptance(self.reads, c.mes_acceptance, c.max_job_orders)
        for f in codec.request_filters(self.prefix, c.mes_topic_levels):
            link.subscribe(f, self.on_request)
        self.capabilities = Capabilities(host.client, host.store.keys, link, host.metrics)
        # stations bound over OPC UA (``equipment.opcua``): ``types(scope)`` and
        # ``problems(scope, graph)`` for a Work Master PUT; None when there are none
        self.bound_equipment: Any = None
        # the spans of requests and calls (setting otel; None: the context still flows)
        self.spans: RequestSpans | None = None
        host.orders.on_change = self.publisher.on_change
        host.settler.end_listeners.append(self.publisher.on_job_end)

    def trace_with(self, spans: Any) -> None:
        """Record the spans of requests and calls (``tracing.spans``)."""
        self.spans = spans

    async def start(self) -> None:
        """Once connected: the retained metadata message and every scope's index."""
        self.publisher.start()

    async def aclose(self) -> None:
        await self.publisher.aclose()

    # ---- requests

    async def on_request(self, message: Message) -> None:
        topic = message.topic
        start_ns = time.time_ns()
        try:
            ev = decode(message.payload, message.properties, max_bytes=self.max_bytes)
        except CloudEventError as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request on %s refused (no reply possible): %s", topic, e)
            return
        method = model.method_of(ev.type)
        trace = self._trace(ev)
        root = trace is None and self.spans is not None
        if root:
            trace = new_trace()     # traced: a request without a context starts a trace
        body = b""
        repeat = False
        try:
            body, repeat = await self._request(ev, topic, method, trace)
        finally:
            if self.spans is not None and trace is not None:
                status, text = _return_status(body)
                self.spans.request(ev, topic, method, self._scope_or_none(ev, topic),
                                   trace, root=root, start_ns=start_ns,
                                   end_ns=time.time_ns(), return_status=status,
                                   ok=status == model.NO_ERROR, message=text or "no reply",
                                   job=_named_job(ev), repeat=repeat)

    def _scope_or_none(self, ev: CloudEvent, topic: str) -> str | None:
        try:
            return codec.scope_of(ev, topic, self.prefix)
        except Invalid:
            return None

    async def _request(self, ev: CloudEvent, topic: str, method: str | None,
                       trace: TraceContext | None) -> tuple[bytes, bool]:
        """Handle one decoded request and send its reply: the reply's JSON and whether
        the request was a repeat."""
        scope: str | None = None
        try:
            scope = codec.scope_of(ev, topic, self.prefix)
            if method is None:
                raise Invalid(f"unknown request type {ev.type[:120]!r}")
            if scope is None:
                # the original's answer to a request it cannot file under a scope
                raise Invalid(NO_SCOPE, model.UNABLE_TO_ACCEPT_JOB_ORDER
                              if method in ("Store", "StoreAndStart")
                              else model.INVALID_JOB_ORDER_STATUS)
        except Invalid as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request %s (%s) on %s refused: %s", ev.id, ev.type, topic, e)
            body = _status_body(e.status, str(e))
            self._reply(ev, method, scope, body, trace)
            return body, False
        assert method is not None
        k = self.host.store.keys(scope)
        seen = k.seen(hashlib.blake2b(f"{ev.source}\x00{ev.id}".encode(),
                                      digest_size=16).hexdigest())
        if self.config.mes_dedupe_s:
            before = await self.host.client.get(seen)
            if before is not None:
                self.metrics.inc("mes_duplicates")
                log.info("MES request %s from %s is a repeat: its reply is sent again",
                         ev.id, ev.source, extra={"scope": scope})
                self._reply(ev, method, scope, bytes(before), trace)
                return bytes(before), True
        body, job_trace = await self._answer(scope, ev, method, trace)
        self._reply(ev, method, scope, body, trace, job_trace)
        if self.config.mes_dedupe_s:
            await self.host.client.set(seen, body, ex=self.config.mes_dedupe_s)
        return body, False

    def _trace(self, ev: CloudEvent) -> TraceContext | None:
        """The request's trace context; a broken one is counted, logged and ignored."""
        try:
            return context_of(ev.extensions)
        except InvalidTraceParent as e:
            self.metrics.inc_labeled("trace_contexts_invalid", "source", "mes")
            log.info("MES request %s from %s: traceparent ignored: %s", ev.id, ev.source, e)
            return None

    async def _answer(self, scope: str, ev: CloudEvent, method: str,
                      trace: TraceContext | None = None) -> Answer:
        job_trace = None
        try:
            body, job_trace = await self.handle(scope, ev, method, trace)
        except Invalid as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e,
                        extra={"scope": scope})
            body = _status_body(e.status, str(e))
        except OrderError as e:
            self.metrics.inc("mes_requests_refused")
            log.info("MES request %s (%s) in %s refused: %s", ev.id, ev.type, scope, e,
                     extra={"scope": scope})
            body = _status_body(e.status, str(e))
        self.metrics.inc("mes_requests")
        return body, job_trace

    async def handle(self, scope: str, ev: CloudEvent, method: str,
                     trace: TraceContext | None = None) -> Answer:
        """The reply's JSON for one request, and the trace attributes of the job it
        answers for (a job response's); ``Invalid`` or ``OrderError`` to refuse."""
        data = codec.data_of(ev)
        if method in model.METHODS:
            await self.job_control(scope, method, data, cause=ev, trace=trace)
            return _status_body(model.NO_ERROR), None
        if method == "RequestJobResponseByJobOrderID":
            return await self._by_id(scope, data)
        if method == "RequestJobResponseByJobOrderState":
            return await self._by_state(scope, data), None
        kind = method.removeprefix("config.")
        delete = ev.extensions.get("method", "PUT").upper() == "DELETE"
        await self._config(scope, kind, data, delete=delete)
        return _status_body(model.NO_ERROR), None

    async def job_control(self, scope: str, method: str, data: Any, *,
                          cause: CloudEvent | None = None,
                          trace: TraceContext | None = None) -> dict[str, str]:
        """Run one job control method (also for scripts' ``api.jobs``): the job order id
        and its new state; ``Invalid`` or ``OrderError`` when refused. A stored order
        keeps ``trace``, the context of the request that stored it, for its job."""
        if trace is None and cause is None and self.spans is not None \
                and method in ("Store", "StoreAndStart"):
            return await self._traced_call(scope, method, data)
        orders = self.host.orders
        k = self.host.store.keys(scope)
        if method in model.STORE_METHODS:
            call = codec.typed(data, model.StoreCall)
            order = call.JobOrder
            if order is None:
                raise Invalid("JobOrder is missing")
            if order.JobOrderID is None:
                if method == "Update":
                    raise Invalid("JobOrder.JobOrderID is missing")
                raise Invalid("JobOrder.JobOrderID is missing",
                              model.UNABLE_TO_ACCEPT_JOB_ORDER)
            job = _job_id(order.JobOrderID)
            codec.check_order(order, codec.dumps(order), self.max_bytes)
            wm = await self.acceptance.check(k, order, new=method != "Update")
            if method == "Update":
                state = await orders.trigger(scope, job, "Update", order=order, work_master=wm,
                                             reason=model.text_of(call.Comment), cause=cause)
            else:
                # "" when the scope knows none of them: stored, and its start aborts it
                state = await orders.store_order(scope, order, start=method == "StoreAndStart",
                                                 work_master=wm or "", cause=cause,
                                                 trace=_kept(trace, cause))
            return {"JobOrderID": job, "JobState": state}
        id_call = codec.typed(data, model.IdCall)
        job = _job_id(id_call.JobOrderID)
        state = await orders.trigger(scope, job, method, reason=model.text_of(id_call.Comment),
                                     cause=cause)
        return {"JobOrderID": job, "JobState": state}

    async def _traced_call(self, scope: str, method: str, data: Any) -> dict[str, str]:
        """A Store with no request behind it (a script's ``api.jobs``): the job gets a
        trace of its own, rooted in a span of the call."""
        trace = new_trace()
        start_ns = time.time_ns()
        ok, message, job = False, "", None
        try:
            out = await self.job_control(scope, method, data, trace=trace)
            ok, job = True, out.get("JobOrderID")
            return out
        except (Invalid, OrderError) as e:
            message = str(e)
            raise
        finally:
            assert self.spans is not None
            self.spans.call(method, scope, job, trace, start_ns=start_ns,
                            end_ns=time.time_ns(), ok=ok, message=message)

    # ---- queries

    async def _by_id(self, scope: str, data: Any) -> Answer:
        job = _job_id(codec.typed(data, model.IdCall).JobOrderID)
        served, trace = await self.job_response(scope, job)
        return (_status_body(model.NO_ERROR, head=b'"JobResponse":' + served + b","),
                trace)

    async def reads(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Several Redis reads in one round trip, their replies in order (an error reply
        raises): on the host's own pipelined connection when it has one, which costs a
        fraction of a redis-py pipeline (every face's requests read through here)."""
        channel = self.host.channel
        if channel is None:
            pipe = self.host.client.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            return await pipe.execute()     # type: ignore[no-any-return]
        got = await channel.execute_many(commands)
        for r in got:
            if isinstance(r, Exception):
                raise r
        return got

    async def job_response(self, scope: str, job: str) -> tuple[bytes, dict[str, str] | None]:
        """RequestJobResponseByJobOrderID, for every face: the job response's JSON
        with the order's actuals, and the trace attributes of its job;
        ``OrderError(UNKNOWN_JOB_ORDER_ID)`` while there is none."""
        k = self.host.store.keys(scope)
        response, (order, tp, token) = await self.reads([
            ("GET", k.response(job)), ("HMGET", k.order(job), "order", "tp", "token")])
        if response is None:
            raise OrderError(model.UNKNOWN_JOB_ORDER_ID,
                             f"no job response for {job!r} in {scope!r} (yet)")
        return model.with_actuals(bytes(response), order), job_carried(tp, job, token)

    async def _by_state(self, scope: str, data: Any) -> bytes:
        call = codec.typed(data, model.StateCall)
        if not call.JobOrderState:
            raise Invalid("JobOrderState is missing or empty")
        try:
            want = model.state_name(call.JobOrderState)
        except ValueError as e:
            raise Invalid(str(e)) from None
        responses = await self.responses_in(scope, want)
        if not responses:
            return _status_body(model.NO_ERROR)
        return _status_body(model.NO_ERROR,
                            head=b'"JobResponses":[' + b",".join(responses) + b"],")

    async def responses_in(self, scope: str, state: str) -> list[bytes]:
        """RequestJobResponseByJobOrderState, for every face: the job responses of
        the scope's orders in ``state`` (at most ``MAX_BY_STATE``, by id)."""
        k = self.host.store.keys(scope)
        index = await self.host.client.hgetall(k.index)
        jobs = sorted(j.decode() for j, s in index.items() if s.decode() == state)
        return await self.responses(k, jobs[:MAX_BY_STATE])

    async def responses(self, k: ScopeKeys, jobs: list[str]) -> list[bytes]:
        """Per job its job response: the stored one (an ended job's), else one made from
        the order as it is now (state, start and end)."""
        raw = await self.reads([c for job in jobs for c in (
            ("GET", k.response(job)), ("HMGET", k.order(job), "state", "started", "ended",
                                        "order"))])
        out: list[bytes] = []
        for i, job in enumerate(jobs):
            stored, (state, started, ended, order) = raw[2 * i], raw[2 * i + 1]
            if stored is not None:
                out.append(model.with_actuals(bytes(stored), order))
                continue
            if state is None or state.decode() not in model.STATE_JSON:
                continue
            made: dict[str, Any] = {"JobResponseID": f"{job}-response", "JobOrderID": job}
            if started:
                made["StartTime"] = started.decode()
            if ended:
                made["EndTime"] = ended.decode()
            made["JobState"] = model.state_list(state.decode())
            out.append(codec.dumps(made))
        return out

    async def views(self, scope: str, jobs: list[str]) -> list[dict[str, Any] | None]:
        """Per job: order, state, reason and job response (None: no such order), one
        pipeline (scripts' ``api.jobs.query``)."""
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
            resp = raw[2 * i + 1]
            out.append({"JobOrderID": job, "JobState": h.get("state"),
                        "JobOrder": json.loads(h["order"]) if h.get("order") else None,
                        "Reason": h.get("reason") or None,
                        "JobResponse": json.loads(resp) if resp else None})
        return out

    # ---- configuration

    async def _config(self, scope: str, kind: str, data: Any, *, delete: bool) -> None:
        k = self.host.store.keys(scope)
        client = self.host.client
        await self.host.orders.register_scope(scope)
        if kind == "workmaster":
            await self._work_master(scope, data, delete=delete)
        elif kind == "jobacceptance":
            if delete:
                await client.delete(k.acceptance)
            else:
                await client.set(k.acceptance, max_orders(data))
        else:
            assert kind in ID_FIELD
            item = config_id(kind, data)
            if delete:
                await client.srem(k.catalog(kind), item)
            else:
                await client.sadd(k.catalog(kind), item)
        log.info("MES config %s %s in %s", kind, "deleted" if delete else "stored", scope,
                 extra={"scope": scope})

    async def _work_master(self, scope: str, data: Any, *, delete: bool) -> None:
        if not isinstance(data, dict):
            raise Invalid("data is not an object")
        wm_id = data.get("ID")
        if not isinstance(wm_id, str) or not wm_id or len(wm_id) > 256:
            raise Invalid("the Work Master needs an ID of 1-256 characters")
        store = self.host.store
        if delete:
            await store.delete_work_master(scope, wm_id)
            return
        # refuse a recipe that would abort every job started from it
        compiled = Recipes._compile(codec.dumps(data))
        if isinstance(compiled, Unusable):
            raise Invalid(f"the Work Master cannot be used: {compiled}")
        served = await self.capabilities.served(scope)
        problems = []
        bound = self.bound_equipment
        if bound is not None:
            # the OPC UA bindings are the scope's announced capabilities too, and their
            # methods' and units' declared types check the action's parameters
            types = bound.types(scope)
            if types:
                served = (served or set()) | types
            problems = bound.problems(scope, compiled)
        if served is not None:
            problems = unserved(compiled, served) + problems
        if problems:
            raise Invalid("the Work Master cannot be used: " + "; ".join(
                f"{p.code} {p.path}: {p.message}" for p in problems))
        await store.put_work_master(scope, data)

    # ---- replies

    def _reply(self, req: CloudEvent, method: str | None, scope: str | None,
               body: bytes, trace: TraceContext | None = None,
               carry: dict[str, str] | None = None) -> None:
        """Send the reply; it carries the request's trace context on (as the span that
        handled the request), else ``carry`` (a job response's: its job's)."""
        topic = req.response_topic or (
            f"{self.prefix}/{codec.levels(scope)}/replies" if scope else None)
        if topic is None:
            return
        try:
            payload, props = codec.reply(req, method, self.config.mes_source, body,
                                         v5=self.link.v5, binary=self.config.mqtt_binary,
                                         expiry_s=self.config.mes_message_expiry_s,
                                         trace=trace.attributes(f"mes:{req.id}")
                                         if trace else carry)
        except (CloudEventError, ValueError) as e:
            self.metrics.inc("bad_mes_replies")
            log.warning("reply to %s could not be encoded: %s", req.id, e)
            return
        self.link.publish_nowait(topic, payload, props)
