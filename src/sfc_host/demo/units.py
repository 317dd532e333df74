"""The demo's PLCs (``sfc-host demo --equipment opcua``): the example PackML units on an
OPC UA server in this process, one unit per push action type of the example recipes in
each scope, and the equipment file that binds them. The pull events (camera QA, torque
verification, booth ready) still come from the stations, as sensors on MQTT would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sfc_host.demo.servers import free_port

URI = "urn:sfc-fast:example-units"
# push type -> (unit name's stem, setpoint, parameter variables, result variables)
UNITS: dict[str, tuple[str, float, dict[str, str], dict[str, str]]] = {
    "com.example.station.position.v1": ("Positioner", 0.0, {}, {}),
    "com.example.station.tighten.v1": ("Nutrunner", 85.0, {"torque_spec": "Program"},
                                       {"torque": "Result"}),
    "com.example.cell.load.v1": ("Loader", 0.0, {}, {}),
    # program 7 goes through SetParameter: the result is the setpoint plus 7, 85 N·m
    "com.example.cell.tighten.v1": ("Tightener", 78.0, {}, {"torque": "Result"}),
    "com.example.cell.loosen.v1": ("Loosener", 0.0, {}, {}),
    "com.example.cell.unload.v1": ("Unloader", 0.0, {}, {}),
    "com.example.booth.prime.v1": ("Primer", 0.0, {}, {}),
    "com.example.booth.paint.v1": ("Painter", 0.0, {}, {}),
    "com.example.booth.cure.v1": ("Oven", 0.0, {}, {}),
}
HOLDS = {"com.example.booth.paint.v1": ("com.example.booth.paint.hold.v1",
                                        "com.example.booth.paint.restart.v1")}


def unit_name(type_id: str, scope: str) -> str:
    return f"{UNITS[type_id][0]}_{scope.replace('.', '_')}"


async def start_units(scopes: list[str], work_s: float) -> tuple[Any, str]:
    """The server with every scope's units, running; and its endpoint."""
    from sfc_host.examples.packml_unit import build

    port = free_port()
    names = [unit_name(t, s) for s in scopes for t in UNITS]
    server, units = await build(port, names, work_s)
    for s in scopes:
        for t, (_, setpoint, _, _) in UNITS.items():
            await units[unit_name(t, s)].nodes["setpoint"].write_value(setpoint)
    await server.start()
    return server, f"opc.tcp://127.0.0.1:{port}/units/"


def equipment_file(path: Path, endpoint: str, scopes: list[str]) -> Path:
    """The equipment file that binds every unit to its type and scope."""
    out = [f'[[server]]\nname = "units"\nendpoint = "{endpoint}"\n']
    for s in scopes:
        for t, (_, _, params, results) in UNITS.items():
            name = unit_name(t, s)
            node = f"nsu={URI};s={name}"
            hold, restart = HOLDS.get(t, (None, None))
            out.append(
                f'[[unit]]\nequipment = "{name}"\nserver = "units"\nscopes = ["{s}"]\n'
                f'node = "{node}"\ntypes = ["{t}"]\ncommand_id = "{node}.CommandId"\n'
                + (f'hold_types = ["{hold}"]\nrestart_types = ["{restart}"]\n' if hold
                   else "")
                + _table("parameters", params, node) + _table("results", results, node))
    path.write_text("\n".join(out))
    return path


def _table(key: str, items: dict[str, str], node: str) -> str:
    if not items:
        return ""
    inner = ", ".join(f'{k} = "{node}.{v}"' for k, v in items.items())
    return f"{key} = {{ {inner} }}\n"
