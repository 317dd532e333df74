"""Equipment over OPC UA beside MQTT: the host's command sink sends each command either
to the OPC UA unit or method that serves its (scope, type), or on to the MQTT sink; the
bindings' outcomes come back as answers, the variables' data changes and the servers'
events as pull events.
A recipe does not change: where its actions go is the equipment file's business."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from sfc_fast import Command, Graph, Problem, job_of_command
from sfc_fast.events import BaseEvent, Completed, Failed
from sfc_fast.wire.uabinary import DataValue, NodeId, QualifiedName
from sfc_host.aio import reap
from sfc_host.equipment.mqtt_transport import MqttSink
from sfc_host.equipment.opcua.method import MethodBinding
from sfc_host.equipment.opcua.packml import PackMLUnit
from sfc_host.equipment.opcua.session import ServerLink
from sfc_host.equipment.opcua.settings import EquipmentFile, EventSettings
from sfc_host.equipment.opcua.values import to_json
from sfc_host.execution.host import Host
from sfc_host.opcua_client import Client, OpcUaError
from sfc_host.opcua_client.services import BASE_EVENT_TYPE, HAS_PROPERTY, HAS_SUBTYPE

log = logging.getLogger("sfc_host.equipment.opcua")

BINDING_CODE = "SFC026"     # an action's parameters its OPC UA binding cannot take


class OpcuaEquipment:
    """The servers, their units, methods and event sources, for one host."""

    def __init__(self, host: Host, equipment: EquipmentFile) -> None:
        self.host = host
        self.metrics = host.metrics
        self.links = {name: ServerLink(s) for name, s in equipment.servers.items()}
        self.bindings: dict[str, PackMLUnit | MethodBinding] = {}
        for u in equipment.units:
            self.bindings[u.equipment] = PackMLUnit(u, self.links[u.server], self._answer)
        for m in equipment.methods:
            self.bindings[m.equipment] = MethodBinding(m, self.links[m.server], self._answer)
        self.routes: dict[tuple[str, str], PackMLUnit | MethodBinding] = {
            key: self.bindings[b.equipment] for key, b in equipment.routes().items()}
        self.events = [EventSource(e, self.links[e.server], host) for e in equipment.events]
        self.arrived: dict[str, float] = {}     # the sink's: job -> its last answer's time
        self._tasks: set[asyncio.Task[None]] = set()

    def serves(self, scope: str, type_id: str) -> bool:
        return (scope, type_id) in self.routes

    def binding(self, scope: str, type_id: str) -> PackMLUnit | MethodBinding | None:
        return self.routes.get((scope, type_id))

    def start(self) -> None:
        for link in self.links.values():
            link.start()

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            await reap(t)
        for link in self.links.values():
            await link.aclose()

    def not_ready(self) -> list[str]:
        """Each server not connected and each binding not found, one line each."""
        out = [f"opcua equipment: {link.status()}" for link in self.links.values()
               if link.status()]
        out += [f"opcua equipment: {b.problem}" for b in self.bindings.values()
                if b.problem and b.link.connected.is_set()]
        return out

    def links_view(self) -> list[dict[str, Any]]:
        """Each server's link, for the web view and ``/readyz``."""
        return [{"server": name, "endpoint": link.settings.endpoint,
                 "connected": link.connected.is_set(), "problem": link.status()}
                for name, link in self.links.items()]

    def send(self, cmd: Command) -> asyncio.Future[None]:
        """Carry the command out on its binding; the future is done once it is with
        the equipment, cancelled when it never got there."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        b = self.routes[(cmd.scope, cmd.type_id)]
        t = asyncio.get_running_loop().create_task(b.run(cmd, fut))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        self.metrics.inc("equipment_opcua_commands")
        return fut

    def following(self) -> int:
        """Units running a command this host follows (their outcome not answered yet)."""
        return sum(1 for b in self.bindings.values()
                   if isinstance(b, PackMLUnit) and b.current is not None)

    def resendable(self, cmd: Command) -> bool:
        """Whether a command may be sent again without the equipment doing it twice:
        a unit reads the command id it took first; a method only with a CommandId."""
        b = self.routes.get((cmd.scope, cmd.type_id))
        return b is None or isinstance(b, PackMLUnit) or b.takes_command_id

    def types(self, scope: str) -> set[str]:
        """The action types bound for a scope: its announced capabilities."""
        return {t for s, t in self.routes if s == scope}

    def problems(self, scope: str, graph: Graph) -> list[Problem]:
        """``SFC026`` for each parameter of a Work Master's action that its binding
        cannot take (a method's input arguments by name and declared type; a unit's
        parameter variables or SetParameter). A binding whose server was not reached yet
        is checked when it runs instead (logged)."""
        out: list[Problem] = []
        for i in range(len(graph.actions)):
            info = graph.action_info(i)
            b = self.routes.get((scope, info["type_id"] or ""))
            if b is None or info["interaction"] != "push_command":
                continue
            if b.problem:
                log.warning("action %r of a Work Master in %s: %s is not bound (%s); its "
                            "parameters are checked when it runs", info["name"], scope,
                            b.name, b.problem)
                continue
            kind = "unit" if isinstance(b, PackMLUnit) else "method"
            out += [Problem(BINDING_CODE, f"Actions[{i}].Parameters",
                            f"{why} ({kind} {b.name}, action {info['name']!r})")
                    for why in b.check(info["parameters"] or {})]
        return out

    def job_ended(self, scope: str, job: str, decision: Any) -> None:
        for b in self.bindings.values():
            if isinstance(b, PackMLUnit) and scope in b.settings.scopes:
                b.job_ended(job)

    def _answer(self, scope: str, event: BaseEvent) -> None:
        self.metrics.inc("equipment_opcua_answers")
        if isinstance(event, Completed | Failed):
            # the answer-to-command latency, as for MQTT answers: the job's next command
            # observes it (a job's last answer is popped when the job ends)
            self.arrived[job_of_command(event.command_id)] = time.perf_counter()
        self.host.answer(scope, event)


class EventSource:
    """Pull events of a type: a variable's data changes (the first value a new
    subscription delivers is the state, not an event, and is passed over), or the OPC
    UA events of an event type (and its subtypes) that a notifier raises, their named
    fields as the data."""

    def __init__(self, settings: EventSettings, link: ServerLink, host: Host) -> None:
        self.settings = settings
        self.link = link
        self.host = host
        # the variable's value as last delivered (a JSON text; None: none yet): a
        # delivery of the same value is the state again (a new or restored monitored
        # item's first), not a change
        self._last: str | None = None
        self._sub: Any = None
        self._names: list[str] = []             # the data keys of the selected fields
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_connect.append(self.bind)

    async def bind(self) -> None:
        """Subscribe, after each connect (a new session has no subscription of the one
        before)."""
        client = self.link.client
        assert client is not None
        s = self.settings
        self._sub = None
        try:
            sub = await client.create_subscription(50, self)
            if s.event_type:
                etype = await client.node(s.event_type)
                fields = await self._fields(client, etype)
                self._names = list(fields)
                await sub.watch_events(await client.node(s.source),
                                       [(fields[k][0], [fields[k][1]]) for k in self._names],
                                       await _subtypes(client, etype))
            else:
                await sub.watch([await client.node(s.node)])
            self._sub = sub
        except (ConnectionError, OSError, TimeoutError, OpcUaError, ValueError) as e:
            log.error("OPC UA event %s on %s: %s", s.type, s.event_type or s.node, e)

    async def _fields(self, client: Client,
                      etype: NodeId) -> dict[str, tuple[NodeId, QualifiedName]]:
        """The selected fields (data key: the type that declares the property, and its
        browse name) the event type or a supertype has. A field it does not have is
        said once, at the bind (its key would be missing from every event's data)."""
        have: dict[str, tuple[NodeId, QualifiedName]] = {}
        node: NodeId | None = etype
        while node is not None:
            for ref in await client.browse(node, HAS_PROPERTY):
                have.setdefault(ref.browse_name.name, (node, ref.browse_name))
            if node == BASE_EVENT_TYPE:
                break
            parents = await client.browse(node, HAS_SUBTYPE, forward=False)
            node = parents[0].node if parents else None
        missing = sorted(set(self.settings.fields.values()) - set(have))
        if missing:
            log.error("OPC UA event %s: the event type %s has no field %s (it has %s); "
                      "those keys stay out of the events' data", self.settings.type,
                      self.settings.event_type, ", ".join(missing), ", ".join(sorted(have)))
        return {key: have[name] for key, name in self.settings.fields.items()
                if name in have}

    def data_changed(self, handle: int, value: DataValue) -> None:
        v = to_json(value.value)
        text = json.dumps(v, sort_keys=True, default=str)
        last, self._last = self._last, text
        if last is None or text == last:
            return
        self._queue({self.settings.field: v})

    def event(self, handle: int, fields: list[Any]) -> None:
        self._queue({key: to_json(v) for key, v in zip(self._names, fields, strict=False)})

    def _queue(self, data: dict[str, Any]) -> None:
        s = self.settings
        t = asyncio.get_running_loop().create_task(self.host.queue_event(
            s.scope, s.type, s.scope, None, data))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)


class RoutingSink:
    """The host's command sink: OPC UA commands to their bindings, the rest to MQTT."""

    def __init__(self, mqtt: MqttSink) -> None:
        self.mqtt = mqtt
        self.opcua: OpcuaEquipment | None = None
        self.arrived = mqtt.arrived

    @property
    def ack_wait_s(self) -> float:
        return self.mqtt.ack_wait_s

    def unacked(self, n: int) -> None:
        self.mqtt.unacked(n)

    def publish(self, commands: Sequence[Command],
                traces: Sequence[str] = ()) -> list[asyncio.Future[None] | None]:
        eq = self.opcua
        if eq is None or not any(eq.serves(c.scope, c.type_id) for c in commands):
            return self.mqtt.publish(commands, traces)
        out: list[asyncio.Future[None] | None] = [None] * len(commands)
        rest = [i for i, c in enumerate(commands) if not eq.serves(c.scope, c.type_id)]
        now = time.perf_counter()
        observe = self.mqtt.link.metrics.observe
        for i, c in enumerate(commands):
            if eq.serves(c.scope, c.type_id):
                out[i] = eq.send(c)
                t = self.arrived.pop(c.job, None)
                if t is not None:
                    observe("answer_to_command_seconds", now - t)
        if rest:
            sent = self.mqtt.publish([commands[i] for i in rest],
                                     [traces[i] for i in rest] if traces else ())
            for i, f in zip(rest, sent, strict=True):
                out[i] = f
        return out

    async def send(self, commands: Sequence[Command]) -> list[bool]:
        acks = self.publish(commands)
        waiting = [f for f in acks if f is not None and not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.ack_wait_s)
        return [f is not None and f.done() and not f.cancelled() for f in acks]


async def _subtypes(client: Client, etype: NodeId) -> list[NodeId]:
    """The event type and every subtype of it, as the server has them at the bind."""
    out, todo = [etype], [etype]
    while todo and len(out) < 10_000:
        node = todo.pop()
        for ref in await client.browse(node, HAS_SUBTYPE):
            if ref.node not in out:
                out.append(ref.node)
                todo.append(ref.node)
    return out
