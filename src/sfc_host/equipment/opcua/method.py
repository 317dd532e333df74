"""An action that calls an OPC UA method: the recipe's parameters become the method's
input arguments by name, converted to their declared types (read from its
InputArguments when the session connects); the output arguments, by their names, are
the action's results; a Bad status fails the action with the status's name.

A method call carries no command id of its own, so a PLC cannot tell a call sent again
from new work: a method with an input argument named ``CommandId`` gets the command id
there (the PLC can then answer a repeat from what it remembers), and only such a method
is called again when a host takes over another's death. Without it, a call whose host
died before its result was stored is left to the action's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sfc_fast import Command
from sfc_fast.events import BaseEvent, Completed, Failed
from sfc_fast.wire.uabinary import STRING, NodeId, Variant
from sfc_host.equipment.opcua.session import ServerLink
from sfc_host.equipment.opcua.settings import MethodSettings
from sfc_host.equipment.opcua.values import builtin, problem, to_json, to_variant, type_name
from sfc_host.opcua_client import BadStatus, status_name

log = logging.getLogger("sfc_host.equipment.opcua")

COMMAND_ID = "CommandId"
Answer = Callable[[str, BaseEvent], None]


class MethodBinding:
    """One method of one server, for the action types it serves."""

    def __init__(self, settings: MethodSettings, link: ServerLink, answer: Answer) -> None:
        self.settings = settings
        self.name = settings.equipment
        self.link = link
        self.answer = answer
        self.inputs: list[tuple[str, int | None]] = []
        self.outputs: list[str] = []
        self._object: NodeId | None = None
        self._method: NodeId | None = None
        self.problem = "not bound yet"
        self.bound = asyncio.Event()          # the method found at least once
        link.on_connect.append(self.bind)

    @property
    def takes_command_id(self) -> bool:
        return any(n == COMMAND_ID for n, _ in self.inputs)

    async def bind(self) -> None:
        client = self.link.client
        assert client is not None
        try:
            self._object = await client.node(self.settings.object)
            self._method = await client.node(self.settings.method)
            self.inputs = [(a.name, builtin(a.data_type))
                           for a in await client.arguments(self._method)]
            self.outputs = [a.name for a in
                            await client.arguments(self._method, "OutputArguments")]
            self.problem = ""
            self.bound.set()
        except Exception as e:
            self.problem = (f"method {self.settings.method} of {self.name}: "
                            f"{e.name if isinstance(e, BadStatus) else e}")
            log.error("OPC UA %s", self.problem)

    def check(self, params: dict[str, Any]) -> list[str]:
        """What in a recipe's parameters the method cannot take, one line each."""
        out = []
        for name, vt in self.inputs:
            if name == COMMAND_ID:
                continue
            if name not in params:
                out.append(f"no parameter {name!r} for the method's input argument "
                           f"({type_name(vt)})")
            elif problem(params[name], vt):
                out.append(f"parameter {name!r}: {problem(params[name], vt)}")
        known = {n for n, _ in self.inputs}
        out += [f"parameter {n!r} is no input argument of the method" for n in params
                if n not in known]
        return out

    async def run(self, cmd: Command, handed: Any) -> None:
        params = cmd.parameters or {}
        if not self.bound.is_set():
            try:
                await asyncio.wait_for(self.bound.wait(), max(
                    0.1, (cmd.deadline_ms or 0) / 1000 - time.time()) if cmd.deadline_ms
                    else 30.0)
            except TimeoutError:
                handed.cancel()        # not carried out: its deadline sends it again
                return
        if self.problem or self._object is None or self._method is None:
            handed.set_result(None)
            self.answer(cmd.scope, Failed(cmd.command_id, self.problem or "not bound"))
            return
        try:
            args = [Variant(STRING, cmd.command_id) if name == COMMAND_ID
                    else to_variant(params.get(name), vt) for name, vt in self.inputs]
        except ValueError as e:
            handed.set_result(None)
            self.answer(cmd.scope, Failed(cmd.command_id, f"{e} ({self.check(params)})"))
            return
        client = self.link.client
        try:
            if client is None:
                raise ConnectionError("not connected")
            [result] = await client.call([(self._object, self._method, args)])
        except Exception as e:
            handed.cancel()         # not known to have reached the server
            log.warning("method %s: %s not called: %s", self.settings.method,
                        cmd.command_id, e)
            return
        handed.set_result(None)
        if result.status & 0x80000000:
            self.answer(cmd.scope, Failed(cmd.command_id, status_name(result.status)))
            return
        self.answer(cmd.scope, Completed(cmd.command_id, {
            name: to_json(v) for name, v in zip(self.outputs, result.outputs, strict=False)}))
