"""The OPC UA server the face runs on: our own (``sfc_host.opcua_server``), on the
host's event loop, with the ISA-95 Job Control v2 NodeSet loaded from the package and a
namespace of our own for the objects of each scope and the status event type.

The NodeSet is the OPC Foundation's published file, unchanged (its MIT header kept);
its DataTypeDefinitions give the structures' layouts (``structures``). The event type
``ISA95JobOrderStatusEventType`` is abstract; the server raises its own concrete
subtype, ``SfcJobOrderStatusEventType``.
"""

from __future__ import annotations

import logging
import socket
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from sfc_fast.wire.uabinary import NodeId, QualifiedName, ticks_now
from sfc_host import __version__
from sfc_host.config import HostConfig
from sfc_host.opcua.security import (
    HostUsers,
    Pki,
    SecurityError,
    TrustList,
    allowed,
    load_users,
)
from sfc_host.opcua_server import (
    ANONYMOUS,
    CERTIFICATE,
    USER_NAME,
    Server,
    ServerIdentity,
    base_space,
    describe_server,
    load_nodeset,
)

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


def application_uri(config: HostConfig) -> str:
    """The server's application URI, which its certificate must name: the endpoint's
    host (this machine's name for a wildcard address) and the ``consumer`` setting
    (``sfc-host`` when unset: the default consumer name changes with each process)."""
    host = urlsplit(config.opcua_endpoint).hostname or ""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"urn:sfc-fast:{host}:{config.consumer or 'sfc-host'}"


_MODES = {"None": 1, "Sign": 2, "SignAndEncrypt": 3}


def make_server(config: HostConfig) -> tuple[Server, Namespaces, NodeId]:
    """The server (not yet listening), its namespaces and the event type it raises.
    ``SecurityError`` for a PKI folder, certificate or users file it cannot use."""
    modes = config.opcua_security
    secure = any(m != "None" for m in modes)
    users = check_security(config)
    trust = None
    certificate, key = None, None
    if secure:
        pki = Pki(config.opcua_pki_dir)
        trust = TrustList(pki)
        trust.refresh()
        certificate = pki.cert.read_bytes()
        try:
            key = load_pem_private_key(pki.key.read_bytes(), None)
        except (OSError, ValueError, TypeError) as e:
            raise SecurityError(f"setting opcua_pki_dir: {pki.key} is no unencrypted PEM "
                                f"private key: {e}") from None
    space = base_space()
    load_nodeset(space, nodeset_path())
    ns = Namespaces(space.namespace_index(JC_URI), space.register_namespace(OWN_URI))
    event_type = NodeId(EVENT_TYPE_NAME, ns.own)
    space.add_event_type(event_type, QualifiedName(EVENT_TYPE_NAME, ns.own),
                         supertype=NodeId(STATUS_EVENT_TYPE, ns.jc))
    uri = application_uri(config)
    describe_server(space, uri, PRODUCT_URI,
                    {"ProductName": "sfc-fast", "ManufacturerName": "sfc-fast",
                     "SoftwareVersion": __version__, "BuildNumber": "0"}, ticks_now())
    tokens = []
    if config.opcua_anonymous != "none":
        tokens.append(ANONYMOUS)
    if any(s.startswith("scrypt$") for _, s in users.values()):
        tokens.append(USER_NAME)
    if any(s.startswith("x509:") for _, s in users.values()):
        tokens.append(CERTIFICATE)
    server = Server(space, ServerIdentity(config.opcua_endpoint, uri, PRODUCT_URI,
                                          f"sfc-host {config.consumer_name}"),
                    modes=[_MODES[m] for m in modes], certificate=certificate,
                    private_key=key, user_tokens=tokens,
                    identify=HostUsers(users, config.opcua_anonymous).identify,
                    trusts=trust.check if trust is not None else None, allowed=allowed)
    return server, ns, event_type


async def check_server(config: HostConfig) -> int:
    """``sfc-host run --check``: the server made as the start makes it (its PKI folder,
    trust list, users, endpoint and NodeSet), then dropped without listening, so the
    check cannot pass where the start would fail; the number of users."""
    make_server(config)
    return len(load_users(config.opcua_users_file))


def check_security(config: HostConfig) -> dict[str, tuple[str, str]]:
    """The face's security can be set up as configured: the PKI folder and the server's
    certificate (naming this server's URI), the users; the users. ``SecurityError``
    naming what is wrong (``sfc-host run --check`` says it too)."""
    if any(m != "None" for m in config.opcua_security):
        pki = Pki(config.opcua_pki_dir)
        pki.check()
        _check_certificate(pki, application_uri(config))
    users = load_users(config.opcua_users_file)
    if config.opcua_anonymous == "none" and not users:
        raise SecurityError("setting opcua_anonymous: none, and no users "
                            "(opcua_users_file or SFC_OPCUA_USERS): nobody could connect")
    return users


def _check_certificate(pki: Pki, uri: str) -> None:
    """The server's own certificate names this server's URI."""
    try:
        cert = x509.load_der_x509_certificate(pki.cert.read_bytes())
    except (OSError, ValueError) as e:
        raise SecurityError(f"setting opcua_pki_dir: {pki.cert} is not a DER certificate: "
                            f"{e}") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if uri not in uris:
        raise SecurityError(f"setting opcua_pki_dir: {pki.cert} names {uris or 'no URI'}, "
                            f"not this server's {uri} (the endpoint's host and the "
                            "consumer name): make it again with sfc-host opcua cert --force")
