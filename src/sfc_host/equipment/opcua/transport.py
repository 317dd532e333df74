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

from asyncua import Node
from asyncua.common.events import get_event_properties_from_type_node

from sfc_fast import Command, Graph, Problem, job_of_command
from sfc_fast.events import BaseEvent, Completed, Failed
from sfc_host.aio import reap
from sfc_host.equipment.mqtt_transport import MqttSink
from sfc_host.equipment.opcua.method import MethodBinding
from sfc_host.equipment.opcua.packml import PackMLUnit
from sfc_host.equipment.opcua.session import ServerLink, drop_subscription, node_of
from sfc_host.equipment.opcua.settings import EquipmentFile, EventSettings
from sfc_host.equipment.opcua.values import to_json
from sfc_host.execution.host import Host

log = logging.getLogger("sfc_host.equipment.opcua")

BINDING_CODE = "SFC026"     # an action's parameters its OPC UA binding cannot take


class OpcuaEquipment:
    """The servers, their units, methods and event sources, for one host."""

    def __init__(self, host: Host, equipment: EquipmentFile) -> None:
        self.host = host
        self.metrics = host.metrics
        self.links = {name: ServerLink(s) for name, s in equipment.servers.items()}
        for link in self.links.values():
            link.on_connect.append(_loader(link))
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
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_connect.append(self.bind)

    async def bind(self) -> None:
        """Subscribe, after each connect, in place of the subscription made before
        (``drop_subscription``)."""
        client = self.link.client
        assert client is not None
        s = self.settings
        old, self._sub = self._sub, None
        await drop_subscription(old)
        try:
            sub = self._sub = await client.create_subscription(50, self)
            if s.event_type:
                etype = await node_of(client, s.event_type)
                await self._check_fields(etype)
                await sub.subscribe_events(await node_of(client, s.source), etype)
            else:
                await sub.subscribe_data_change(await node_of(client, s.node))
        except Exception as e:      # asyncua's faults have no common root
            log.error("OPC UA event %s on %s: %s", s.type, s.event_type or s.node, e)

    async def _check_fields(self, etype: Node) -> None:
        """A field the event type does not have is said once, at the bind (its key
        would be missing from every event's data)."""
        props = await get_event_properties_from_type_node(etype) or []
        have = {(await p.read_browse_name()).Name for p in props}
        missing = sorted(set(self.settings.fields.values()) - have)
        if missing:
            log.error("OPC UA event %s: the event type %s has no field %s (it has %s); "
                      "those keys stay out of the events' data", self.settings.type,
                      self.settings.event_type, ", ".join(missing), ", ".join(sorted(have)))

    def datachange_notification(self, node: Node, val: Any, data: Any) -> None:
        value = to_json(val)
        text = json.dumps(value, sort_keys=True, default=str)
        last, self._last = self._last, text
        if last is None or text == last:
            return
        self._queue({self.settings.field: value})

    def event_notification(self, event: Any) -> None:
        data = {}
        for key, name in self.settings.fields.items():
            if hasattr(event, name):
                data[key] = to_json(getattr(event, name))
        self._queue(data)

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


def _loader(link: ServerLink) -> Any:
    async def load() -> None:
        # the server's structures (PackML's descriptor among them) as Python classes
        assert link.client is not None
        try:
            await link.client.load_data_type_definitions()
        except Exception as e:
            log.warning("OPC UA server %s: its structures not loaded: %s", link.name, e)
    return load

