"""An OPC UA server of our own, for the host's ISA-95 Job Control face: ``Server``
(``server``: endpoints, sessions, the services) over an ``AddressSpace`` (``nodes``,
filled by ``nodeset`` from NodeSet2 files and by ``base`` with namespace 0), on a
``channel`` per client (its secure channel's crypto is the client's ``security``),
``sessions`` (who the user is, proved), ``methods`` (the Call service's checks) and
``subscriptions`` (monitored items, events encoded once for every subscriber). Values
are the compiled codec's (``NodeId``, ``Variant``, ``DataValue``, ...). Why a server of
our own: docs/design.md, "The OPC UA face on a server of our own"."""

from sfc_fast.wire.uabinary import DataValue, ExtensionObject, LocalizedText, NodeId, Variant
from sfc_host.opcua_server.base import base_space, describe_server
from sfc_host.opcua_server.bodies import CallMethodResult
from sfc_host.opcua_server.nodes import (
    AddressSpace,
    Argument,
    Node,
    StructureDefinition,
)
from sfc_host.opcua_server.nodeset import NodesetError, load_nodeset
from sfc_host.opcua_server.server import Server, ServerIdentity
from sfc_host.opcua_server.sessions import (
    ANONYMOUS,
    CERTIFICATE,
    USER_NAME,
    Identity,
    Refused,
    Session,
)
from sfc_host.opcua_server.subscriptions import Event

__all__ = ["ANONYMOUS", "CERTIFICATE", "USER_NAME", "AddressSpace", "Argument",
           "CallMethodResult", "DataValue", "Event", "ExtensionObject", "Identity",
           "LocalizedText", "Node", "NodeId", "NodesetError", "Refused", "Server",
           "ServerIdentity", "Session", "StructureDefinition", "Variant", "base_space",
           "describe_server", "load_nodeset"]
