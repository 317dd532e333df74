"""A PackML unit (OPC 30050) as the equipment of an action: parameters written, the
command id written, then ``Start``; the unit's ``CurrentState`` by subscription settles
the action (Complete: completed, its result variables read, then ``Reset``; Aborted or
Stopped: failed with the unit's stop reason). The job's hold is ``Hold`` and the unit's
Held; the restart is ``Unhold``; a job that ends while its command runs stops the unit
(``Stop`` or ``Abort``).

**Never twice.** A PLC's Start is not idempotent, so the host never sends one blind:
before any Start it reads the unit's state and the command id the unit last took (a
String variable the binding names, written by the host just before each Start). The
same id there means the command went out already, from this host or one that died:
the attempt is followed from the unit's state, not started again. Details: docs/
equipment-opcua.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sfc_fast import Command, job_of_command
from sfc_fast.events import BaseEvent, Completed, Failed, Held, NotHeld
from sfc_fast.wire.uabinary import (
    EXTENSION_OBJECT,
    STRING,
    DataValue,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
)
from sfc_host.equipment.opcua.session import ServerLink
from sfc_host.equipment.opcua.settings import UnitSettings
from sfc_host.equipment.opcua.values import builtin, problem, to_json, to_variant
from sfc_host.opcua_client import BadStatus, Client, OpcUaError, status_name
from sfc_host.opcua_client.services import DATA_TYPE, HAS_ENCODING, VALUE

log = logging.getLogger("sfc_host.equipment.opcua")

PACKML_URI = "http://opcfoundation.org/UA/PackML/"
RUNNING = frozenset(("Starting", "Execute", "Completing", "Unholding", "Unsuspending",
                     "Suspending", "Suspended", "Holding", "Held"))
# on their way to a resting state by themselves
# the states that settle an attempt (Held answers a hold)
OUTCOMES = frozenset(("Complete", "Aborted", "Stopped", "Held"))
ACTING = frozenset(("Resetting", "Clearing", "Stopping", "Aborting", "Completing"))
# moving on by themselves: a unit in one of these is waited for, not read at every step
MOVING = (RUNNING | ACTING) - {"Held", "Suspended"}
SETTLE_S = 30.0          # how long the unit may take to reach a resting state on a Stop
BIND_WAIT_S = 30.0       # a command's wait for its unit to be bound, with no deadline
DESCRIPTOR_TYPE = 16     # PackMLDescriptorDataType's id in the PackML namespace
Answer = Callable[[str, BaseEvent], None]


@dataclass
class Attempt:
    scope: str
    command_id: str
    hold_id: str = ""         # a hold asked for and not answered yet


class PackMLUnit:
    """One unit: its nodes, found after each connect, and the attempt it runs."""

    def __init__(self, settings: UnitSettings, link: ServerLink, answer: Answer) -> None:
        self.settings = settings
        self.name = settings.equipment
        self.link = link
        self.answer = answer
        self.state = ""                       # the unit's CurrentState, as last seen
        self.current: Attempt | None = None
        self._lock = asyncio.Lock()           # one command at a time on a unit
        self._nodes: dict[str, NodeId] = {}
        self._param_types: dict[str, int | None] = {}
        self._set_parameter_array = False     # SetParameter takes a list of descriptors
        self._descriptor_encoding: NodeId | None = None
        # the source timestamp of the Idle read before the running attempt's Start: a
        # notice of that same Idle, published late, is not a PLC that lost the command
        self._idle_at: Any = None
        self._read_at: Any = None             # the source timestamp of the last state read
        self._notices = 0                     # state notices so far
        self._read_notices = 0                # of them, when the last read was sent
        self.problem = "not bound yet"
        self.bound = asyncio.Event()          # the nodes found at least once
        # those waiting for a state: its test, and the future a notice that passes it ends
        self._waiters: list[tuple[Callable[[str], bool], asyncio.Future[None]]] = []
        self._settling = ""                   # the command whose Complete is being reset
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_connect.append(self.bind)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---- binding

    async def bind(self) -> None:
        """Find the unit's nodes and subscribe to its state (after every connect)."""
        client = self.link.client
        assert client is not None
        try:
            ns = await client.namespace_index(PACKML_URI, fresh=True)
            unit = await client.node(self.settings.node)
            sm = await client.child(unit, QualifiedName("BaseStateMachine", ns))
            nodes: dict[str, NodeId | None] = {
                "unit": unit, "sm": sm,
                "state": await client.child(sm, QualifiedName("CurrentState", 0)),
                "command_id": await client.node(self.settings.command_id)}
            methods = ("Start", "Stop", "Abort", "Hold", "Unhold", "Reset", "Clear")
            found = await client.translate(
                [(sm, [QualifiedName(m, ns)]) for m in methods]
                + [(unit, [QualifiedName("SetParameter", ns)]),
                   (unit, [QualifiedName("Admin", ns), QualifiedName("StopReason", ns)])])
            nodes.update(zip((*methods, "SetParameter", "StopReason"), found, strict=True))
            # OPC 30050 declares its argument an array of descriptors: a server that checks
            # the arguments' value rank (node-opcua) refuses a scalar
            self._set_parameter_array = await _takes_array(client, nodes["SetParameter"])
            for name, nid in self.settings.results.items():
                nodes[f"result:{name}"] = await client.node(nid)
            params = {name: await client.node(nid)
                      for name, nid in self.settings.parameters.items()}
            types = await client.read([(n, DATA_TYPE) for n in params.values()])
            for (name, node), dv in zip(params.items(), types, strict=True):
                nodes[f"param:{name}"] = node
                self._param_types[name] = builtin(dv.value.value) if dv.value else None
            missing = [m for m in ("Start", "Stop", "Hold", "Unhold", "Reset")
                       if nodes.get(m) is None]
            if missing:
                raise ValueError(f"no {', '.join(missing)} method on its BaseStateMachine")
            self._descriptor_encoding = await _binary_encoding(client,
                                                               NodeId(DESCRIPTOR_TYPE, ns))
            self._nodes = {k: v for k, v in nodes.items() if v is not None}
            await self.link.watch(self._nodes["state"], self)
            self.problem = ""
            self.bound.set()
        except Exception as e:
            self.problem = f"unit {self.name} ({self.settings.node}): {_why(e)}"
            log.error("OPC UA %s", self.problem)

    def state_changed(self, value: DataValue) -> None:
        """The state feed's notice: the unit's state changed (or, on a new
        subscription, is what it is)."""
        state = _text(value)
        self.state = state
        self._notices += 1
        if self._waiters:
            self._wake(state)
        if self.current is not None:
            if state in OUTCOMES:
                self._spawn(self._settle(state))
            elif state == "Idle" and not self._same_idle(value):
                self._spawn(self._lost())

    def _same_idle(self, value: DataValue) -> bool:
        """The notice is of the Idle read before the attempt's Start (the same source
        timestamp): published after the Start, yet no news."""
        at = value.source_time
        return at is not None and at == self._idle_at

    async def _lost(self) -> None:
        """Idle while an attempt runs: a late notice of the state before its Start, or
        a PLC that restarted and lost the command. Its command id, read now, tells: the
        host wrote the attempt's id before the Start, so any other id means the unit no
        longer knows it. That fails the action at once, rather than at its deadline;
        it is never started again blind, as the work it did before the restart is not
        known."""
        a = self.current
        if a is None:
            return
        try:
            state, last = await self._read()
        except (ConnectionError, OSError, TimeoutError, OpcUaError):
            return      # the link is away again: its next notification tells
        if self.current is not a or state != "Idle" or last == a.command_id:
            return
        self.current = None
        self.answer(a.scope, Failed(a.command_id, f"unit {self.name} lost command "
                                    f"{a.command_id}: it is Idle and holds command "
                                    f"{last or 'none'} (the PLC restarted?)"))
        if a.hold_id:
            self.answer(a.scope, NotHeld(a.hold_id))

    def _wake(self, state: str) -> None:
        for done, fut in self._waiters:
            if not fut.done() and done(state):
                fut.set_result(None)

    # ---- the attempt's outcome, from the state

    async def _settle(self, state: str | None = None) -> None:
        a = self.current
        if a is None:
            return
        state = self.state if state is None else state
        if state == "Complete":
            self.current = None
            self._settling = a.command_id        # its Reset is this settle's to call
            try:
                self.answer(a.scope, Completed(a.command_id, await self._results()))
                await self._call("Reset", quiet=True)
            finally:
                self._settling = ""
        elif state in ("Aborted", "Stopped"):
            self.current = None
            self.answer(a.scope, Failed(a.command_id, await self._stop_reason(state)))
            if a.hold_id:
                self.answer(a.scope, NotHeld(a.hold_id))
        elif state == "Held" and a.hold_id:
            self.answer(a.scope, Held(a.hold_id))
            a.hold_id = ""

    async def _results(self) -> dict[str, Any]:
        keys = [k for k in self._nodes if k.startswith("result:")]
        client = self.link.client
        if not keys or client is None:
            return {}
        try:
            values = await client.read_values([self._nodes[k] for k in keys])
        except (ConnectionError, OSError, TimeoutError, OpcUaError) as e:
            log.warning("unit %s: results not read: %s", self.name, e)
            return {}
        return {k[7:]: to_json(v) for k, v in zip(keys, values, strict=True)}

    async def _stop_reason(self, state: str) -> str:
        node = self._nodes.get("StopReason")
        client = self.link.client
        text = ""
        if node is not None and client is not None:
            try:
                [v] = await client.read_values([node])
                text = _alarm_message(v)
            except (ConnectionError, OSError, TimeoutError, OpcUaError, ValueError):
                text = ""
        return f"unit {self.name} went {state}" + (f": {text}" if text else "")

    # ---- commands

    async def run(self, cmd: Command, handed: asyncio.Future[None]) -> None:
        """Carry a command out; ``handed`` is done once it is with the unit (its sent
        marker), cancelled when it never reached it."""
        # a start waits its turn on the unit; a hold or a restart acts on the attempt
        # that has the unit, so it never queues behind a start waiting for it
        turn = contextlib.nullcontext() if cmd.hold or cmd.restart else self._lock
        async with turn:
            try:
                await _bound(self.bound, cmd.deadline_ms)
                if self.problem:
                    raise _Refused(self.problem)
                if not (cmd.hold or cmd.restart):
                    await self._until_free(cmd)
                state, last = await self._read()
                if cmd.hold:
                    await self._hold(cmd, state)
                elif cmd.restart and state == "Held":
                    await self._unhold(cmd)
                else:
                    await self._start(cmd, state, last)
                _done(handed)
            except _Refused as e:
                _done(handed)
                self.answer(cmd.scope, Failed(cmd.command_id, str(e)))
            except Exception as e:
                # the server away or a request timed out: not handed over, so the deadline
                # (or the dispatch entry) sends the same id again, read before any Start
                handed.cancel()
                log.warning("unit %s: %s not carried out: %s", self.name, cmd.command_id,
                            _why(e))

    async def _until_free(self, cmd: Command) -> None:
        """A unit running another job's attempt from this host is waited for by its
        state notices, up to the command's deadline, before it is read: a read now
        would only show it busy."""
        a = self.current
        if a is None or job_of_command(a.command_id) == job_of_command(cmd.command_id):
            return
        left = SETTLE_S if cmd.deadline_ms is None else cmd.deadline_ms / 1000 - time.time()
        await self._wait(lambda s: self.current is None and not self._moving(s),
                         max(left, 0.1))

    async def _read(self) -> tuple[str, str]:
        """The unit's state and the command id it last took, read now: what the
        subscription has shown may be a publishing interval behind."""
        client = self.link.client
        if client is None:
            raise ConnectionError("not connected")
        self._read_notices = self._notices
        got, had = await client.read([(self._nodes["state"], VALUE),
                                      (self._nodes["command_id"], VALUE)])
        last = had.value.value if had.value is not None else None
        self._read_at = got.source_time
        return _text(got), str(last or "")

    async def _start(self, cmd: Command, state: str, last: str) -> None:
        cid = cmd.command_id
        if last == cid:
            self._adopt(cmd, state)
            return
        await self._to_idle(cid, state, last, cmd.deadline_ms)
        await self._write_parameters(cmd.parameters or {}, cid)
        self._idle_at = self._read_at
        self.current = Attempt(cmd.scope, cid)
        await self._call("Start", self._descriptor(cid))

    def _adopt(self, cmd: Command, state: str) -> None:
        """The unit took this command already (a resend, or another host's send): its
        state now says how far it got."""
        self.current = Attempt(cmd.scope, cmd.command_id)
        if state == "Idle":
            # reset after it completed: the answer may not have been applied
            self.current = None
            self._spawn(self._answer_done(cmd))
        else:
            self._spawn(self._settle(state))

    async def _answer_done(self, cmd: Command) -> None:
        self.answer(cmd.scope, Completed(cmd.command_id, await self._results()))

    async def _to_idle(self, cid: str, state: str, last: str,
                       deadline_ms: int | None) -> None:
        """Bring a unit left in a resting state to Idle; a unit running another command
        of the same job (an attempt timed out) is stopped first; a unit busy with
        another job's command is waited for (a line's unit takes one job after the
        other), up to the action's deadline."""
        loop = asyncio.get_running_loop()
        wait_s = SETTLE_S if deadline_ms is None else deadline_ms / 1000 - time.time()
        end = loop.time() + max(wait_s, 1.0)
        while state != "Idle":
            read = state
            if loop.time() > end:
                raise _Refused(f"unit {self.name} is {state or 'in no state'} with "
                               f"command {last or 'none'} and did not come to Idle in "
                               "time")
            if state in ACTING:
                pass                    # on its way to a resting state: wait for it
            elif state == "Complete" and last and self._settles(last):
                pass                    # the settle of that command resets it
            elif state in ("Complete", "Stopped"):
                await self._call("Reset", quiet=True)
            elif state == "Aborted":
                await self._call("Clear", quiet=True)
            elif state in RUNNING and last and \
                    job_of_command(last) == job_of_command(cid):
                self.current = None
                await self._call(self.settings.cancel, quiet=True)
            elif state not in RUNNING:
                raise _Refused(f"unit {self.name} is {state or 'in no state'} with "
                               f"command {last or 'none'}, not Idle")
            # until a notice since the read shows the unit come to rest in another state,
            # or a moment passed; then read anew: a read a resting state, not one each
            # state it passes, and none on a notice older than the read
            n = self._read_notices
            await self._wait(lambda s, was=read, n=n: (
                self._notices > n and s != was and not self._moving(s)), 0.5)
            state, last = await self._read()

    def _moving(self, state: str) -> bool:
        """The unit moves on from ``state`` by itself, or a settle of this host resets
        it (the Complete of the attempt it runs)."""
        return state in MOVING or (state == "Complete" and (
            self.current is not None or bool(self._settling)))

    def _settles(self, command_id: str) -> bool:
        """A settle of this host resets the unit's Complete of ``command_id``: one runs,
        or its notice has come and its settle is about to run."""
        a = self.current
        return command_id == self._settling or (
            a is not None and a.command_id == command_id and self.state == "Complete")

    async def _write_parameters(self, params: dict[str, Any], cid: str) -> None:
        """The parameters, then the command id, in one write where variables take
        them; a parameter without a variable goes through SetParameter."""
        nodes, values = [], []
        for name, value in params.items():
            node = self._nodes.get(f"param:{name}")
            if node is not None:
                try:
                    values.append(to_variant(value, self._param_types.get(name)))
                except ValueError as e:
                    raise _Refused(f"parameter {name!r}: {e}") from None
                nodes.append(node)
                continue
            if "SetParameter" not in self._nodes:
                raise _Refused(f"parameter {name!r}: unit {self.name} has no variable "
                               "for it and no SetParameter method")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _Refused(f"parameter {name!r}: SetParameter takes numbers, not "
                               f"{type(value).__name__}")
            d = self._descriptor(name, float(value))
            await self._call("SetParameter", Variant(EXTENSION_OBJECT, [d.value])
                             if self._set_parameter_array else d, on="unit")
        nodes.append(self._nodes["command_id"])
        values.append(Variant(STRING, cid))
        client = self.link.client
        if client is None:
            raise ConnectionError("not connected")
        await client.write_values(list(zip(nodes, values, strict=True)))

    def check(self, params: dict[str, Any]) -> list[str]:
        """What of an action's parameters the unit cannot take, one line each."""
        out = []
        for name, value in params.items():
            if f"param:{name}" in self._nodes:
                why = problem(value, self._param_types.get(name))
                if why:
                    out.append(f"parameter {name!r}: {why}")
            elif "SetParameter" not in self._nodes:
                out.append(f"parameter {name!r}: the unit has no variable for it and no "
                           "SetParameter method")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                out.append(f"parameter {name!r}: SetParameter takes numbers")
        return out

    async def _hold(self, cmd: Command, state: str) -> None:
        a = self.current
        base = cmd.command_id.removesuffix(":hold")
        if a is None or a.command_id != base or state not in RUNNING:
            self.answer(cmd.scope, NotHeld(cmd.command_id))
            return
        if state == "Held":
            self.answer(cmd.scope, Held(cmd.command_id))
            return
        a.hold_id = cmd.command_id
        await self._call("Hold")

    async def _unhold(self, cmd: Command) -> None:
        client = self.link.client
        if client is None:
            raise ConnectionError("not connected")
        await client.write_values([(self._nodes["command_id"],
                                    Variant(STRING, cmd.command_id))])
        self.current = Attempt(cmd.scope, cmd.command_id)
        await self._call("Unhold")

    def job_ended(self, job: str) -> None:
        """The job of the running command ended (cancelled, aborted): stop the unit."""
        a = self.current
        if a is None or job_of_command(a.command_id) != job:
            return
        self.current = None
        self._spawn(self._call(self.settings.cancel, quiet=True))

    async def _call(self, method: str, *args: Variant, on: str = "sm",
                    quiet: bool = False) -> None:
        node = self._nodes.get(method)
        if node is None:
            raise _Refused(f"unit {self.name} has no {method} method")
        client = self.link.client
        if client is None:
            raise ConnectionError("not connected")
        parent = self._nodes["unit"] if on == "unit" else self._nodes["sm"]
        [res] = await client.call([(parent, node, list(args))])
        if res.status & 0x80000000:
            why = f"unit {self.name}: {method} refused ({status_name(res.status)})"
            if quiet:
                # a reset or stop that raced another (the unit on its way already): the
                # next step reads the unit's state anyway
                log.debug("%s", why)
                return
            raise _Refused(why)

    def _descriptor(self, name: str, value: float = 0.0) -> Variant:
        """A PackMLDescriptorDataType (ID Int32, Name String, Unit EUInformation,
        Value Float; OPC 30050), encoded by its fields with the encoding the server
        names for it."""
        if self._descriptor_encoding is None:
            raise _Refused(f"unit {self.name}: the server has no binary encoding of "
                           "PackMLDescriptorDataType")
        w = Writer()
        w.int32(0)
        w.string(name)
        w.string(None)                  # Unit, an EUInformation: no unit
        w.int32(-1)
        w.localized_text(LocalizedText(None))
        w.localized_text(LocalizedText(None))
        w.float32(value)                # Value is a Float
        return Variant(EXTENSION_OBJECT, ExtensionObject(self._descriptor_encoding,
                                                         w.getvalue()))

    async def _wait(self, done: Callable[[str], bool], timeout: float) -> None:
        """Until a state notice passes ``done`` (or the state now does), or
        ``timeout``: checked in the notice's own call, with no task per notice."""
        if done(self.state):
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (done, fut)
        self._waiters.append(entry)
        timer = loop.call_later(timeout, _done, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiters.remove(entry)


async def _bound(bound: asyncio.Event, deadline_ms: int | None) -> None:
    """Until the binding has found its nodes (a host that just started, a server not
    reached yet), up to the action's deadline: a command then is not carried out (its
    marker unwritten), and its deadline sends it again."""
    if bound.is_set():
        return
    left = BIND_WAIT_S if deadline_ms is None else deadline_ms / 1000 - time.time()
    await asyncio.wait_for(bound.wait(), max(left, 0.1))


class _Refused(Exception):
    """The command reached the unit (or needs not) and fails: an answer, not a resend."""


def _done(f: asyncio.Future[None]) -> None:
    if not f.done():
        f.set_result(None)


async def _takes_array(client: Client, method: NodeId | None) -> bool:
    """The method's first input argument is an array (its ValueRank 0 or more)."""
    args = await client.arguments(method) if method is not None else []
    return bool(args) and args[0].value_rank >= 0


async def _binary_encoding(client: Client, data_type: NodeId) -> NodeId | None:
    """The node of a structure's Default Binary encoding."""
    for ref in await client.browse(data_type, HAS_ENCODING):
        if ref.browse_name.name == "Default Binary":
            return ref.node
    return None


def _text(value: DataValue) -> str:
    """A state variable's value as text (a LocalizedText, or a String)."""
    v = value.value.value if value.value is not None else None
    if isinstance(v, LocalizedText):
        return v.text or ""
    return str(v or "")


def _alarm_message(value: object) -> str:
    """A PackMLAlarmDataType's Message (ID Int32, Value Int32, Message String, ...)."""
    if not isinstance(value, ExtensionObject) or not value.body:
        return ""
    r = Reader(value.body)
    r.int32()
    r.int32()
    return r.string() or ""


def _why(e: BaseException) -> str:
    if isinstance(e, BadStatus):
        return e.name
    return str(e) or type(e).__name__
