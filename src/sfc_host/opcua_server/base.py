"""Namespace 0 of the server: the OPC Foundation's standard nodes a server must have
(the type system, the folders, the Server object), read from a trimmed copy of their
NodeSet (``nodeset/Opc.Ua.NodeSet2.Base.xml``, made by ``tools/base_nodeset.py``), and
the Server object's values that are this server's own (``describe_server``).

The file is parsed once per process and each ``base_space()`` is a copy of it: tests
make many servers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    BYTE,
    DATETIME,
    EXTENSION_OBJECT,
    INT32,
    LOCALIZED_TEXT,
    STRING,
    UINT32,
    DataValue,
    ExtensionObject,
    LocalizedText,
    NodeId,
    Variant,
    Writer,
    datetime_from_ticks,
    ticks_from_datetime,
    ticks_now,
)
from sfc_host.opcua_server.bodies import MAX_OPERATIONS
from sfc_host.opcua_server.nodes import (
    ACCESS_LEVEL,
    ACCESS_LEVEL_EX,
    DATA_TYPE_ATTR,
    NAMESPACE_ARRAY,
    USER_ACCESS_LEVEL,
    VALUE,
    VALUE_RANK,
    VARIABLE,
    AddressSpace,
)
from sfc_host.opcua_server.nodeset import load_nodeset

__all__ = ["BASE_NODESET", "LIMITS", "base_space", "describe_server"]

BASE_NODESET = Path(__file__).with_name("nodeset") / "Opc.Ua.NodeSet2.Base.xml"

# the Server object and its children (Part 5 §8.3.2, Part 6 Annex A ids)
SERVER_ARRAY = NodeId(2254)
SERVER_STATUS = NodeId(2256)
START_TIME, CURRENT_TIME, STATE, BUILD_INFO = NodeId(2257), NodeId(2258), NodeId(2259), \
    NodeId(2260)
PRODUCT_NAME, PRODUCT_URI, MANUFACTURER_NAME = NodeId(2261), NodeId(2262), NodeId(2263)
SOFTWARE_VERSION, BUILD_NUMBER, BUILD_DATE = NodeId(2264), NodeId(2265), NodeId(2266)
SECONDS_TILL_SHUTDOWN, SHUTDOWN_REASON = NodeId(2992), NodeId(2993)
SERVICE_LEVEL, AUDITING = NodeId(2267), NodeId(2994)
SERVER_CAPABILITIES, OPERATION_LIMITS = NodeId(2268), NodeId(11704)
ENABLED_FLAG, REDUNDANCY_SUPPORT = NodeId(2294), NodeId(3709)

BUILD_INFO_ENCODING = NodeId(340)           # BuildInfo, Default Binary
SERVER_STATUS_ENCODING = NodeId(864)        # ServerStatusDataType, Default Binary
RUNNING = 0                                 # ServerState (Part 5 §12.6)

# ServerCapabilities' and OperationLimits' values by browse name; the ones not named
# here are 0 ("no limit" in Part 5 §6.3.11) or an empty array. The per-call limits are
# what the request reader lets through.
LIMITS: dict[str, Any] = {
    "MaxNodesPerRead": MAX_OPERATIONS,
    "MaxNodesPerWrite": MAX_OPERATIONS,
    "MaxNodesPerMethodCall": MAX_OPERATIONS,
    "MaxNodesPerBrowse": MAX_OPERATIONS,
    "MaxNodesPerRegisterNodes": MAX_OPERATIONS,
    "MaxNodesPerTranslateBrowsePathsToNodeIds": MAX_OPERATIONS,
    "MaxMonitoredItemsPerCall": MAX_OPERATIONS,
    "MaxNodesPerNodeManagement": 0,
    "LocaleIdArray": ["en"],
    "ServerProfileArray": [],
}


@functools.cache
def _prototype() -> AddressSpace:
    space = AddressSpace()
    load_nodeset(space, BASE_NODESET)
    return space


def base_space() -> AddressSpace:
    """A fresh address space holding namespace 0 (its own copy of the parsed file), the
    NamespaceArray following the namespace table."""
    space = _prototype().copy()
    space.set_value(NAMESPACE_ARRAY, Variant(STRING, list(space.namespaces)))
    return space


def describe_server(space: AddressSpace, application_uri: str, product_uri: str,
                    build: Mapping[str, Any], start_ticks: int, *,
                    limits: Mapping[str, Any] | None = None) -> None:
    """Fills the Server object of ``space`` (from ``base_space``) for this server:
    ServerArray, NamespaceArray, ServerStatus (its CurrentTime, and the whole
    ServerStatus structure, computed on each read; State Running), BuildInfo, ServiceLevel
    255, Auditing off, ServerCapabilities and OperationLimits (``LIMITS`` updated by
    ``limits``), diagnostics off, no redundancy.

    ``build``: BuildInfo's fields by their names (Part 5 §12.4), ``ProductName``,
    ``ManufacturerName``, ``SoftwareVersion``, ``BuildNumber`` (str), ``BuildDate``
    (DateTime ticks or an aware datetime), or as ``product_name``, ...; any left out is
    empty (the date: ``start_ticks``). ``start_ticks``: the StartTime."""
    def put(node: NodeId, kind: int, value: Any) -> None:
        space.set_value(node, DataValue(Variant(kind, value), 0, start_ticks, start_ticks))

    put(SERVER_ARRAY, STRING, [application_uri])
    put(NAMESPACE_ARRAY, STRING, list(space.namespaces))
    def field(name: str, snake: str, default: Any = "") -> Any:
        return build.get(name, build.get(snake, default))

    build_date = field("BuildDate", "build_date", start_ticks)
    if isinstance(build_date, datetime):
        build_date = ticks_from_datetime(build_date)
    info = (product_uri, str(field("ManufacturerName", "manufacturer_name")),
            str(field("ProductName", "product_name")),
            str(field("SoftwareVersion", "software_version")),
            str(field("BuildNumber", "build_number")))
    put(PRODUCT_URI, STRING, info[0])
    put(MANUFACTURER_NAME, STRING, info[1])
    put(PRODUCT_NAME, STRING, info[2])
    put(SOFTWARE_VERSION, STRING, info[3])
    put(BUILD_NUMBER, STRING, info[4])
    put(BUILD_DATE, DATETIME, datetime_from_ticks(build_date))
    put(BUILD_INFO, EXTENSION_OBJECT, _build_info(info, build_date))
    put(START_TIME, DATETIME, datetime_from_ticks(start_ticks))
    put(STATE, INT32, RUNNING)
    put(SECONDS_TILL_SHUTDOWN, UINT32, 0)
    put(SHUTDOWN_REASON, LOCALIZED_TEXT, LocalizedText(None))
    put(SERVICE_LEVEL, BYTE, 255)
    put(AUDITING, BOOLEAN, False)
    put(REDUNDANCY_SUPPORT, INT32, 0)       # RedundancySupport None
    put(ENABLED_FLAG, BOOLEAN, False)
    # no diagnostics are kept, so they cannot be switched on
    flag = space.get(ENABLED_FLAG)
    if flag is not None:
        for attr in (ACCESS_LEVEL, USER_ACCESS_LEVEL, ACCESS_LEVEL_EX):
            flag.attributes[attr] = 1
    wanted = {**LIMITS, **(limits or {})}
    for parent in (SERVER_CAPABILITIES, OPERATION_LIMITS):
        for nid in space.targets(parent):
            node = space.get(nid)
            if node is None or node.node_class != VARIABLE:
                continue
            kind = builtin_type(space, node.attributes.get(DATA_TYPE_ATTR, NodeId(24)))
            if node.attributes.get(VALUE_RANK, -1) >= 0:
                put(nid, kind, list(wanted.get(node.browse_name.name or "", [])))
            else:
                put(nid, kind, wanted.get(node.browse_name.name or "", 0))

    def current_time() -> DataValue:
        now = ticks_now()
        return DataValue(Variant(DATETIME, datetime_from_ticks(now)), 0, now, now)

    def server_status() -> DataValue:
        now = ticks_now()
        return DataValue(Variant(EXTENSION_OBJECT, _server_status(space, now)), 0, now, now)

    space.dynamic(CURRENT_TIME, current_time)
    space.dynamic(SERVER_STATUS, server_status)


def builtin_type(space: AddressSpace, data_type: NodeId) -> int:
    """The built-in type (Part 6 §5.1.2) that values of ``data_type`` travel as:
    Int32 for an enumeration, ExtensionObject for a structure, Variant for an abstract
    BaseDataType or Number."""
    for t in (data_type, *space.supertypes(data_type)):
        if t.namespace == 0 and isinstance(t.identifier, int):
            if t.identifier == 29:
                return INT32
            if 1 <= t.identifier <= 22:
                return t.identifier
    return 24


def _write_build_info(w: Writer, info: tuple[str, ...], build_date: int) -> None:
    for s in info:                  # ProductUri, ManufacturerName, ProductName,
        w.string(s)                 # SoftwareVersion, BuildNumber
    w.datetime(build_date)


def _build_info(info: tuple[str, ...], build_date: int) -> ExtensionObject:
    w = Writer()
    _write_build_info(w, info, build_date)
    return ExtensionObject(BUILD_INFO_ENCODING, w.getvalue())


def _value(space: AddressSpace, node: NodeId, default: Any) -> Any:
    dv = space.read(node, VALUE)
    return default if dv.value is None or dv.value.value is None else dv.value.value


def _ticks(value: Any) -> int:
    return ticks_from_datetime(value) if isinstance(value, datetime) else int(value)


def _server_status(space: AddressSpace, now: int) -> ExtensionObject:
    """The ServerStatusDataType made of the ServerStatus children's values, so that a
    change of one (State at shutdown, say) shows in both."""
    w = Writer()
    w.datetime(_ticks(_value(space, START_TIME, 0)))
    w.datetime(now)
    w.int32(_value(space, STATE, RUNNING))
    info = tuple(str(_value(space, n, "")) for n in (PRODUCT_URI, MANUFACTURER_NAME,
                                                     PRODUCT_NAME, SOFTWARE_VERSION,
                                                     BUILD_NUMBER))
    _write_build_info(w, info, _ticks(_value(space, BUILD_DATE, 0)))
    w.uint32(_value(space, SECONDS_TILL_SHUTDOWN, 0))
    w.localized_text(_value(space, SHUTDOWN_REASON, LocalizedText(None)))
    return ExtensionObject(SERVER_STATUS_ENCODING, w.getvalue())
