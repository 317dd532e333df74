"""Example PackML units (OPC 30050) on an asyncua server, for the demo and the tests: a
PLC as a plant would have it, with no MQTT and no knowledge of the host.

    python -m sfc_host.examples.packml_unit --port 4841 --units Filler1,Capper1

Each unit is a ``PackMLBaseObjectType`` instance ``{ns}:{name}`` (node ids
``ns=…;s={name}…`` in ``urn:sfc-fast:example-units``) with the state machine's
methods (Start, Stop, Hold, Unhold, Reset, Abort, Clear, on ``BaseStateMachine``;
SetParameter on the unit) and ISA-TR88 states in ``BaseStateMachine/CurrentState``:
Start runs Idle → Starting → Execute, works ``--work-ms``, then Completing → Complete;
Hold: Holding → Held; Unhold: Unholding → Execute with the rest of the work; Stop:
Stopping → Stopped; Abort: Aborting → Aborted; Clear: Clearing → Stopped; Reset:
Resetting → Idle. Beside the model, each unit has:

- ``{name}.CommandId`` (String): the id of the command it last took (the host writes it
  before Start; a host that died and another that takes over read it);
- ``{name}.Setpoint`` (Double, writable) and parameters sent with SetParameter;
- ``{name}.Program`` (String, writable): a program or specification the unit takes;
- ``{name}.Result`` (Double): the setpoint (plus the parameters' sum) once complete;
- ``{name}.Starts`` (UInt32): how many times Start was called;
- ``{name}.Fault`` (Boolean, writable): the next Start aborts, with a stop reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from asyncua import Server, ua
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.user_managers import UserManager

NODESET = Path(__file__).resolve().parents[1] / "equipment" / "opcua" / "nodeset" / \
    "Opc.Ua.PackML.NodeSet2.xml"
URI = "urn:sfc-fast:example-units"
PACKML_URI = "http://opcfoundation.org/UA/PackML/"
STEP_S = 0.01               # each acting state (Starting, Completing, …) lasts this long

log = logging.getLogger("sfc_host.examples.packml_unit")


class _NotNow(Exception):
    """A command the unit's state does not allow: the call's status BadInvalidState."""


def _guarded(fn: Any) -> Any:
    """A method callback whose refusal is a status the client sees (an exception in a
    callback would reach it as BadUnexpectedError)."""
    async def call(*args: Any) -> Any:
        try:
            return await fn(*args)
        except _NotNow:
            return ua.StatusCode(ua.StatusCodes.BadInvalidState)
    return call


class Unit:
    """One unit's state machine, driving its variables."""

    def __init__(self, name: str, work_s: float) -> None:
        self.name = name
        self.work_s = work_s
        self.state = "Idle"
        self.params: dict[str, float] = {}
        self.left = 0.0                    # work left (held work goes on from here)
        self.nodes: dict[str, Any] = {}
        self._work: asyncio.Task[None] | None = None

    async def set_state(self, state: str) -> None:
        self.state = state
        await self.nodes["state"].write_value(ua.LocalizedText(state, "en"))

    async def _acting(self, acting: str, then: str) -> None:
        await self.set_state(acting)
        await asyncio.sleep(STEP_S)
        await self.set_state(then)

    def _refuse_unless(self, *states: str) -> None:
        if self.state not in states:
            raise _NotNow()

    # ---- methods

    async def start(self, parent: Any, *args: Any) -> list[ua.Variant]:
        self._refuse_unless("Idle")
        starts = await self.nodes["starts"].read_value()
        await self.nodes["starts"].write_value(ua.Variant(starts + 1, ua.VariantType.UInt32))
        if await self.nodes["fault"].read_value():
            await self.nodes["fault"].write_value(False)
            await self._stop_reason("fault injected: jam in the infeed")
            self._spawn(self._acting("Aborting", "Aborted"))
            return []
        self.left = self.work_s
        self._spawn(self._run_from("Starting"))
        return []

    async def hold(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Execute", "Starting")
        self._cancel_work()
        self._spawn(self._acting("Holding", "Held"))
        return []

    async def unhold(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Held")
        self._spawn(self._run_from("Unholding"))
        return []

    async def stop(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Starting", "Execute", "Completing", "Holding", "Held",
                            "Unholding", "Suspended", "Idle", "Complete")
        self._cancel_work()
        await self._stop_reason("stopped by the host")
        self._spawn(self._acting("Stopping", "Stopped"))
        return []

    async def abort(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Starting", "Execute", "Completing", "Holding", "Held",
                            "Unholding", "Idle", "Complete", "Stopped", "Stopping")
        self._cancel_work()
        await self._stop_reason("aborted by the host")
        self._spawn(self._acting("Aborting", "Aborted"))
        return []

    async def clear(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Aborted")
        self._spawn(self._acting("Clearing", "Stopped"))
        return []

    async def reset(self, parent: Any) -> list[ua.Variant]:
        self._refuse_unless("Complete", "Stopped")
        self.params.clear()
        self._spawn(self._acting("Resetting", "Idle"))
        return []

    async def set_parameter(self, parent: Any, descriptors: Any) -> list[ua.Variant]:
        v = descriptors.Value if isinstance(descriptors, ua.Variant) else descriptors
        # the model declares an array of descriptors; a client sending one alone is let be
        for d in v if isinstance(v, list) else [v]:
            self.params[str(d.Name)] = float(d.Value)
        return []

    # ---- work

    async def _run_from(self, acting: str) -> None:
        await self._acting(acting, "Execute")
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await asyncio.sleep(self.left)
        except asyncio.CancelledError:
            self.left = max(0.0, self.left - (loop.time() - began))
            raise
        setpoint = await self.nodes["setpoint"].read_value()
        await self.nodes["result"].write_value(
            ua.Variant(float(setpoint) + sum(self.params.values()), ua.VariantType.Double))
        await self._acting("Completing", "Complete")

    async def _stop_reason(self, text: str) -> None:
        node = self.nodes.get("stop_reason")
        cls = getattr(ua, "PackMLAlarmDataType", None)
        if node is not None and cls is not None:
            await node.write_value(cls(ID=1, Value=1, Message=text))

    def _spawn(self, coro: Any) -> None:
        self._work = asyncio.get_running_loop().create_task(coro)

    def _cancel_work(self) -> None:
        if self._work is not None and not self._work.done():
            self._work.cancel()


class Users(UserManager):
    """User names and passwords (a secured example server): a session must name one."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    def get_user(self, iserver: Any, username: str | None = None,
                 password: str | None = None, certificate: Any = None) -> User | None:
        if username is not None and self.users.get(username) == password:
            return User(role=UserRole.User, name=username)
        return None


async def build(port: int, names: list[str], work_s: float = 0.05,
                host: str = "127.0.0.1", *, certificate: str = "", private_key: str = "",
                users: dict[str, str] | None = None) -> tuple[Server, dict[str, Unit]]:
    """A server with the units, not started yet (``async with server:`` runs it).
    With ``certificate`` and ``private_key`` it offers Basic256Sha256 SignAndEncrypt
    only, and with ``users`` it takes no anonymous session."""
    server = Server(user_manager=Users(users) if users else None)
    await server.init()
    server.set_endpoint(f"opc.tcp://{host}:{port}/units/")
    server.set_server_name("sfc-fast example PackML units")
    if certificate:
        await server.load_certificate(certificate)
        await server.load_private_key(private_key)
        server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
    else:
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    if users:
        server.set_security_IDs(["Username"])
    await server.import_xml(str(NODESET))
    await server.load_data_type_definitions()
    packml = await server.get_namespace_index(PACKML_URI)
    ns = await server.register_namespace(URI)
    units = {}
    for name in names:
        units[name] = await _unit(server, ns, packml, name, work_s)
    return server, units


async def _unit(server: Server, ns: int, packml: int, name: str, work_s: float) -> Unit:
    u = Unit(name, work_s)
    obj = await server.nodes.objects.add_object(ua.NodeId(name, ns), ua.QualifiedName(
        name, ns), objecttype=ua.NodeId(6, packml))
    sm = await obj.get_child(f"{packml}:BaseStateMachine")
    u.nodes["state"] = await sm.get_child("0:CurrentState")
    await u.set_state("Idle")
    for parent, method, fn in (
            (sm, "Start", u.start), (sm, "Stop", u.stop), (sm, "Abort", u.abort),
            (sm, "Hold", u.hold), (sm, "Unhold", u.unhold), (sm, "Reset", u.reset),
            (sm, "Clear", u.clear), (obj, "SetParameter", u.set_parameter)):
        await _method(server, parent, packml, ns, f"{name}.{method}", method, _guarded(fn))
    admin = await obj.get_child(f"{packml}:Admin")
    reason_type = ua.NodeId(15, packml)
    u.nodes["stop_reason"] = await admin.add_variable(
        ua.NodeId(f"{name}.Admin.StopReason", ns), ua.QualifiedName("StopReason", packml),
        ua.Variant(None, ua.VariantType.ExtensionObject), datatype=reason_type)
    for key, var, value, vt, writable in (
            ("command_id", "CommandId", "", ua.VariantType.String, True),
            ("setpoint", "Setpoint", 0.0, ua.VariantType.Double, True),
            ("program", "Program", "", ua.VariantType.String, True),
            ("result", "Result", 0.0, ua.VariantType.Double, False),
            ("starts", "Starts", 0, ua.VariantType.UInt32, False),
            ("fault", "Fault", False, ua.VariantType.Boolean, True)):
        node = await obj.add_variable(ua.NodeId(f"{name}.{var}", ns),
                                      ua.QualifiedName(var, ns), ua.Variant(value, vt))
        if writable:
            await node.set_writable()
        u.nodes[key] = node
    return u


async def _method(server: Server, parent: Any, packml: int, ns: int, node_id: str,
                  method: str, fn: Any) -> None:
    """The method on its parent: linked where the type made it, added where the type
    leaves it optional (the state machine's commands)."""
    try:
        node = await parent.get_child(f"{packml}:{method}")
    except ua.UaStatusCodeError:
        args = [ua.NodeId(16, packml)] if method in ("Start", "SetParameter") else []
        await parent.add_method(ua.NodeId(node_id, ns), ua.QualifiedName(method, packml),
                                fn, args, [])
        return
    server.link_method(node, fn)


async def serve(port: int, names: list[str], work_s: float) -> None:
    server, _ = await build(port, names, work_s, host="0.0.0.0")
    async with server:
        print(f"PackML units {', '.join(names)} on opc.tcp://127.0.0.1:{port}/units/",
              flush=True)
        await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=4841)
    p.add_argument("--units", default="Filler1,Capper1")
    p.add_argument("--work-ms", type=float, default=50.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, [u for u in args.units.split(",") if u],
                          args.work_ms / 1000))


if __name__ == "__main__":
    main()
