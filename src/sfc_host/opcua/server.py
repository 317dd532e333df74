"""The OPC UA server the face runs on: asyncua's, on the host's event loop, with the
ISA-95 Job Control v2 NodeSet loaded from the package and a namespace of our own for
the objects of each scope and the status event type.

The NodeSet is the OPC Foundation's published file, unchanged (its MIT header kept):
``import_xml`` loads its 258 nodes and makes its structure classes in ``asyncua.ua``.
The event type ``ISA95JobOrderStatusEventType`` is abstract; the server raises its own
concrete subtype, ``SfcJobOrderStatusEventType``.
"""

from __future__ import annotations

import datetime as dt
import logging
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from asyncua import Node, Server, ua

from sfc_host import __version__

log = logging.getLogger("sfc_host.opcua")

JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/"
OWN_URI = "urn:sfc-fast:opcua"
PRODUCT_URI = "urn:sfc-fast"
NODESET = "opc.ua.isa95-jobcontrol.nodeset2.xml"

# node ids in the Job Control namespace (opc.ua.isa95-jobcontrol.nodeids.csv)
RECEIVER_TYPE = 1002
PROVIDER_TYPE = 1003
STATUS_EVENT_TYPE = 1006
EVENT_TYPE_NAME = "SfcJobOrderStatusEventType"


def nodeset_path() -> Path:
    """The Job Control v2 NodeSet shipped with the package."""
    return Path(str(resources.files("sfc_host.opcua") / "nodeset" / NODESET))


class Namespaces:
    """The namespace indexes the server gave the Job Control model and our objects."""

    def __init__(self, jc: int, own: int) -> None:
        self.jc = jc
        self.own = own


async def make_server(endpoint: str, consumer: str) -> tuple[Server, Namespaces, Node]:
    """The server (not yet listening), its namespaces and the event type it raises."""
    # asyncua logs every request at INFO: the host's log is for what the host does
    logging.getLogger("asyncua").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    server = Server()
    await server.init()
    server.set_endpoint(endpoint)
    server.set_server_name(f"sfc-host {consumer}")
    host = urlsplit(endpoint).hostname or "localhost"
    await server.set_application_uri(f"urn:sfc-fast:{host}:{consumer}")
    server.product_uri = PRODUCT_URI
    await server.set_build_info(PRODUCT_URI, "sfc-fast", "sfc-fast", __version__, "0",
                          dt.datetime.now(dt.UTC))
    server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    await server.import_xml(str(nodeset_path()))
    ns = Namespaces(await server.get_namespace_index(JC_URI),
                    await server.register_namespace(OWN_URI))
    event_type = await server.create_custom_event_type(
        ua.NodeId(EVENT_TYPE_NAME, ns.own), ua.QualifiedName(EVENT_TYPE_NAME, ns.own),
        ua.NodeId(STATUS_EVENT_TYPE, ns.jc))
    return server, ns, event_type
