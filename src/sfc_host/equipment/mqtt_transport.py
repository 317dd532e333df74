"""Equipment over MQTT: commands out as CloudEvents, answers and pull events in.

- Commands go to ``{eq}/{scope}/commands``: CE ``id`` = command id, ``type`` = the
  action's ``TypeId`` (hold and restart types for those commands), ``subject`` = scope,
  ``correlationid`` = job id, response topic ``{eq}/{scope}/responses``; data
  ``{"Parameters": {...}, "Context": {JobOrderID, Action, Attempt, Hold, Restart,
  DeadlineMs}}``.
- Answers on ``{eq}/{scope}/responses`` name their command by ``causationid`` (or MQTT
  correlation data); data ``{Outcome, Result, Reason}``, ``Outcome`` one of
  ``completed`` (default), ``failed``, ``held``, ``not_held``. Any host instance routes
  any answer: the command id names the job.
- Pull events on ``{eq}/{scope}/events`` (type = the action's ``TypeId``, ``subject``,
  ``correlationid``; data = the result fields) become ``event`` entries only while a job
  of the scope waits for that type.

A fault on this path (a malformed message, a wrong scope, an unknown id) is logged and
counted, never raised: the action's deadline settles what an answer could not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sfc_fast import Command, job_of_command
from sfc_fast.events import BaseEvent, Completed, Failed, Held, NotHeld
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode,
    encode_binary_plain,
)
from sfc_host.names import check_scope
from sfc_host.tracing.context import InvalidTraceParent, TraceContext, carried, context_of

if TYPE_CHECKING:
    from sfc_host.execution.host import Host

log = logging.getLogger("sfc_host.execution.dispatch")

SOURCE = "sfc-host"
ACK_WAIT_S = 2.0        # longest wait for the broker's PUBACKs of one send


def _scope_of(topic: str, prefix: str, leaf: str) -> str | None:
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != prefix or parts[2] != leaf:
        return None
    try:
        return check_scope(parts[1])
    except ValueError:
        return None


class MqttSink:
    """The host's command sink over MQTT; ``send`` returns once the broker has the
    commands (their PUBACKs), or after ``ACK_WAIT_S``.

    The caller writes a command's sent marker when ``send`` says True. A command only
    in this process's outgoing queue dies with the process, and a marker written for it
    would keep every other host from sending it: the action would time out instead.
    So True means the broker acknowledged it; a command still waiting is False (no
    marker: if it never arrives, the action's deadline sends the same id again,
    spending no retry)."""

    def __init__(self, link: MqttLink) -> None:
        self.link = link
        self.prefix = link.config.equipment_prefix
        # job -> when its last answer arrived: the answer-to-command latency histogram
        self.arrived: dict[str, float] = {}

    def message(self, c: Command, trace: str = "", *,
                plain: bool = True) -> tuple[str, bytes, Any]:
        """Topic, payload and properties of a command; ``trace``, its job's stored trace
        context, goes on as the command's ``traceparent`` (a span of its own: the
        attempt). In binary mode its attributes, plain ASCII as a rule, are encoded
        without building the CloudEvent (``plain`` off: always built; the tests compare
        the two)."""
        data = {"Parameters": c.parameters or {},
                "Context": {"JobOrderID": c.job, "Action": c.action, "Attempt": c.attempt,
                            "Hold": c.hold, "Restart": c.restart,
                            "DeadlineMs": c.deadline_ms}}
        cid, scope = c.command_id, c.scope
        reply_to = f"{self.prefix}/{scope}/responses"
        correlation = cid.encode()
        link = self.link
        ext = {"correlationid": c.job}
        if trace:
            ext.update(carried(trace, cid))
        if plain and link.v5 and link.config.mqtt_binary:
            got = encode_binary_plain(cid, SOURCE, c.type_id, scope, data, ext, reply_to,
                                      correlation)
            if got is not None:
                return f"{self.prefix}/{scope}/commands", got[0], got[1]
        ev = CloudEvent(id=cid, source=SOURCE, type=c.type_id, subject=scope,
                        data=data, extensions=ext)
        ev.response_topic = reply_to
        ev.correlation_data = correlation
        payload, props = encode(ev, v5=link.v5, binary=link.config.mqtt_binary)
        return f"{self.prefix}/{scope}/commands", payload, props

    def publish(self, commands: Sequence[Command],
                traces: Sequence[str] = ()) -> list[asyncio.Future[None] | None]:
        """Queue the commands; per command the future its PUBACK sets (cancelled: the
        broker refused it), or None when the link's queue was full. The dispatcher
        follows the futures (``Dispatcher``): the settle that made the commands goes
        on at once, and only acknowledged commands get their markers."""
        acks: list[asyncio.Future[None] | None] = []
        arrived = self.arrived
        now = time.perf_counter()
        observe = self.link.metrics.observe
        loop = asyncio.get_running_loop()
        publish = self.link.publish_nowait
        for i, c in enumerate(commands):
            topic, payload, props = self.message(c, traces[i] if traces else "")
            fut: asyncio.Future[None] = loop.create_future()
            acks.append(fut if publish(topic, payload, props, acked=fut, key=c.command_id)
                        else None)
            t = arrived.pop(c.job, None)
            if t is not None:
                observe("answer_to_command_seconds", now - t)
        return acks

    @property
    def ack_wait_s(self) -> float:
        return ACK_WAIT_S

    def unacked(self, n: int) -> None:
        """``n`` commands were not acknowledged within ``ACK_WAIT_S``."""
        self.link.metrics.inc("mqtt_unacked_commands", n)

    async def send(self, commands: Sequence[Command]) -> list[bool]:
        acks = self.publish(commands)
        waiting = [f for f in acks if f is not None and not f.done()]
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=ACK_WAIT_S)
            if late:
                self.unacked(len(late))
        # cancelled: the broker refused it (a PUBACK with an error code)
        return [f is not None and f.done() and not f.cancelled() for f in acks]


ARRIVED_MAX = 100_000
_OUTCOMES = {"completed": Completed, "failed": Failed, "held": Held, "not_held": NotHeld}


class LinkedContexts(Protocol):
    """Where answers' and pull events' own trace contexts go (``tracing.spans``)."""

    def answered(self, command_id: str, trace: TraceContext) -> None: ...

    def evented(self, scope: str, type_id: str, trace: TraceContext) -> None: ...


class EquipmentIn:
    """Answers and pull events from equipment, for one host."""

    def __init__(self, host: Host, link: MqttLink, sink: MqttSink | None = None) -> None:
        self.host = host
        self.arrived = sink.arrived if sink is not None else {}
        self.link = link
        self.metrics = host.metrics
        self.prefix = link.config.equipment_prefix
        self.max_bytes = link.config.mqtt_max_payload
        # A job's last answer is never followed by a command: its arrival goes when the
        # job ends on this host (which applied that answer), not only at ARRIVED_MAX,
        # or a busy host carries up to 100,000 ended jobs' entries (~15 MB).
        prev_end = host.settler.on_end
        arrived = self.arrived

        def on_end(scope: str, job: str, decision: Any) -> None:
            arrived.pop(job, None)
            if prev_end is not None:
                prev_end(scope, job, decision)
        host.settler.on_end = on_end
        host.on_answers_done = link.release_acks
        # where answers' and events' own contexts go, to be linked from the attempts
        # they settle (setting otel)
        self.spans: LinkedContexts | None = None
        link.subscribe(f"{self.prefix}/+/responses", self.on_answer)
        link.subscribe(f"{self.prefix}/+/events", self.on_event)

    def _receive(self, message: Message, leaf: str,
                 what: str) -> tuple[str, CloudEvent] | None:
        """The scope (from the topic) and the CloudEvent of a message, or None (logged
        and counted as ``bad_{what}``)."""
        topic = message.topic
        scope = _scope_of(topic, self.prefix, leaf)
        if scope is None:
            self.metrics.inc(f"bad_{what}")
            log.warning("%s on %s: not a scope's %s topic", what, topic, leaf)
            return None
        try:
            ev = decode(message.payload, message.properties, max_bytes=self.max_bytes)
        except CloudEventError as e:
            self.metrics.inc(f"bad_{what}")
            log.warning("%s on %s refused: %s", what, topic, e, extra={"scope": scope})
            return None
        if "traceparent" in ev.extensions:
            try:
                ctx = context_of(ev.extensions)
                if ctx is not None and self.spans is not None:
                    self._link(scope, ev, what, ctx)
            except InvalidTraceParent as e:
                # the message is used without it: a trace is never worth an answer
                self.metrics.inc_labeled("trace_contexts_invalid", "source", "equipment")
                log.info("%s %s on %s: traceparent ignored: %s", what, ev.id, topic, e,
                         extra={"scope": scope})
        return scope, ev

    def _link(self, scope: str, ev: CloudEvent, what: str, ctx: TraceContext) -> None:
        assert self.spans is not None
        if what == "answers":
            cid = ev.extensions.get("causationid")
            if not cid and ev.correlation_data:
                cid = ev.correlation_data.decode("utf-8", "replace")
            if isinstance(cid, str) and cid:
                self.spans.answered(cid, ctx)
        else:
            self.spans.evented(scope, ev.type, ctx)

    def on_answer(self, message: Message) -> None:
        got = self._receive(message, "responses", "answers")
        if got is None:
            return
        scope, ev = got
        event = answer_event(ev)
        if isinstance(event, str):
            self.metrics.inc("bad_answers")
            cid = ev.extensions.get("causationid")
            log.warning("answer %s on %s refused: %s", ev.id, message.topic, event,
                        extra={"scope": scope, **command_fields(cid if isinstance(cid, str)
                                                                else "")})
            return
        self.metrics.inc("answers_received")
        if isinstance(event, (Completed, Failed)):
            # Held / not held answers wait for the MES's Resume: not a latency of ours.
            # A job's last answer is never followed by a command: the oldest entries
            # make room (insertion order), so the histogram never stops recording.
            arrived = self.arrived
            if len(arrived) >= ARRIVED_MAX:
                for _ in range(ARRIVED_MAX // 10):
                    del arrived[next(iter(arrived))]
            job = job_of_command(event.command_id)
            arrived.pop(job, None)
            arrived[job] = time.perf_counter()
        # acknowledged once settled: a host that dies first never acknowledged it
        self.host.answer(scope, event, self.link.hold_ack(message))

    async def on_event(self, message: Message) -> None:
        got = self._receive(message, "events", "events")
        if got is None:
            return
        scope, ev = got
        if ev.data is not None and not isinstance(ev.data, dict):
            self.metrics.inc("bad_events")
            log.warning("event %s on %s refused: data is not an object", ev.id,
                        message.topic, extra={"scope": scope})
            return
        self.metrics.inc("events_received")
        await self.host.queue_event(scope, ev.type, ev.subject,
                                    ev.extensions.get("correlationid"), ev.data)


def command_fields(command_id: str) -> dict[str, str]:
    """Log fields of a command id (``{job}:{action}#{n}``, maybe ``:hold``): job,
    action and the id; only the id when it names no job, none for a long or empty one."""
    if not command_id or len(command_id) > 600:
        return {}
    job = job_of_command(command_id)
    if not job:
        return {"command_id": command_id}
    action = command_id[len(job) + 1:command_id.rfind("#")]
    return {"job": job, "action": action, "command_id": command_id}


def answer_event(ev: CloudEvent) -> BaseEvent | str:
    """The core event an answer means, or why it means none."""
    cid = ev.extensions.get("causationid")
    if not cid and ev.correlation_data:
        try:
            cid = ev.correlation_data.decode()
        except UnicodeDecodeError:
            return "correlation data is not UTF-8"
    if not cid or not isinstance(cid, str) or len(cid) > 600:
        return "no command id (causationid or correlation data)"
    data = ev.data if ev.data is not None else {}
    if not isinstance(data, dict):
        return "data is not an object"
    outcome = data.get("Outcome", "completed")
    kind = _OUTCOMES.get(outcome) if isinstance(outcome, str) else None
    if kind is None:
        return f"unknown Outcome {outcome!r}"
    if kind is Completed:
        result = data.get("Result")
        if result is not None and not isinstance(result, dict):
            return "Result is not an object"
        return Completed(cid, result)
    if kind is Failed:
        reason = data.get("Reason")
        return Failed(cid, reason if isinstance(reason, str) else "failed by the equipment")
    return kind(cid)
