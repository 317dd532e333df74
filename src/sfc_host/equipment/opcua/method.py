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

from asyncua import Node, ua

from sfc_fast import Command
from sfc_fast.events import BaseEvent, Completed, Failed
from sfc_host.equipment.opcua.session import ServerLink, node_of, status_name
from sfc_host.equipment.opcua.settings import MethodSettings
from sfc_host.equipment.opcua.values import builtin, problem, to_json, to_variant, type_name

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
        self.inputs: list[tuple[str, ua.VariantType | None]] = []
        self.outputs: list[str] = []
        self._object: Node | None = None
        self._method: Node | None = None
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
            self._object = await node_of(client, self.settings.object)
            self._method = await node_of(client, self.settings.method)
            self.inputs = [(a.Name, builtin(a.DataType))
                           for a in await _arguments(self._method, "InputArguments")]
            self.outputs = [a.Name for a in await _arguments(self._method, "OutputArguments")]
            self.problem = ""
            self.bound.set()
        except Exception as e:
            self.problem = (f"method {self.settings.method} of {self.name}: "
                            f"{status_name(e.code) if isinstance(e, ua.UaStatusCodeError) else e}")
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
            args = [ua.Variant(cmd.command_id, ua.VariantType.String) if name == COMMAND_ID
                    else to_variant(params.get(name), vt) for name, vt in self.inputs]
        except ValueError as e:
            handed.set_result(None)
            self.answer(cmd.scope, Failed(cmd.command_id, f"{e} ({self.check(params)})"))
            return
        try:
            result = await self._object.call_method(self._method, *args)
        except ua.UaStatusCodeError as e:
            handed.set_result(None)
            self.answer(cmd.scope, Failed(cmd.command_id, status_name(e.code)))
            return
        except Exception as e:
            handed.cancel()         # not known to have reached the server
            log.warning("method %s: %s not called: %s", self.settings.method,
                        cmd.command_id, e)
            return
        handed.set_result(None)
        values = result if isinstance(result, list) else ([] if result is None else [result])
        self.answer(cmd.scope, Completed(cmd.command_id, {
            name: to_json(v) for name, v in zip(self.outputs, values, strict=False)}))


async def _arguments(method: Node, name: str) -> list[Any]:
    try:
        prop = await method.get_child(f"0:{name}")
    except ua.UaStatusCodeError:
        return []
    return list(await prop.read_value() or [])
