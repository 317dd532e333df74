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
import socket
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from asyncua import Node, Server, ua
from cryptography import x509

from sfc_host import __version__
from sfc_host.config import HostConfig
from sfc_host.opcua.security import (
    HostRules,
    HostUsers,
    Pki,
    SecurityError,
    TrustList,
    load_users,
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


_POLICIES = {"SignAndEncrypt": ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
             "Sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
             "None": ua.SecurityPolicyType.NoSecurity}


async def make_server(config: HostConfig) -> tuple[Server, Namespaces, Node]:
    """The server (not yet listening), its namespaces and the event type it raises.
    ``SecurityError`` for a PKI folder, certificate or users file it cannot use."""
    # asyncua logs every request at INFO: the host's log is for what the host does
    logging.getLogger("asyncua").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    modes = config.opcua_security
    secure = any(m != "None" for m in modes)
    users = check_security(config)
    trust = None
    if secure:
        trust = TrustList(Pki(config.opcua_pki_dir))
        await trust.refresh()
    server = Server(user_manager=HostUsers(users, config.opcua_anonymous, trust))
    await server.init()
    server.set_endpoint(config.opcua_endpoint)
    server.set_server_name(f"sfc-host {config.consumer_name}")
    uri = application_uri(config)
    await server.set_application_uri(uri)
    server.product_uri = PRODUCT_URI
    await server.set_build_info(PRODUCT_URI, "sfc-fast", "sfc-fast", __version__, "0",
                                dt.datetime.now(dt.UTC))
    if secure:
        pki = Pki(config.opcua_pki_dir)
        await server.load_certificate(str(pki.cert))
        await server.load_private_key(str(pki.key))
        server.set_certificate_validator(trust)
    server.set_security_policy([_POLICIES[m] for m in modes], permission_ruleset=HostRules())
    tokens: list[Any] = []
    if config.opcua_anonymous != "none":
        tokens.append(ua.AnonymousIdentityToken)
    if any(s.startswith("scrypt$") for _, s in users.values()):
        tokens.append(ua.UserNameIdentityToken)
    if any(s.startswith("x509:") for _, s in users.values()):
        tokens.append(ua.X509IdentityToken)
    server.set_identity_tokens(tokens)
    await server.import_xml(str(nodeset_path()))
    ns = Namespaces(await server.get_namespace_index(JC_URI),
                    await server.register_namespace(OWN_URI))
    event_type = await server.create_custom_event_type(
        ua.NodeId(EVENT_TYPE_NAME, ns.own), ua.QualifiedName(EVENT_TYPE_NAME, ns.own),
        ua.NodeId(STATUS_EVENT_TYPE, ns.jc))
    return server, ns, event_type


async def check_server(config: HostConfig) -> int:
    """``sfc-host run --check``: the server made as the start makes it (its PKI folder,
    trust list, users, endpoint and NodeSet), then dropped without listening, so the
    check cannot pass where the start would fail; the number of users.
    ``SecurityError`` or ``ValueError`` naming what is wrong."""
    server, _, _ = await make_server(config)
    users = server.iserver.user_manager
    return len(users.users) if isinstance(users, HostUsers) else 0


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


# ---- who watches what: asyncua keeps each subscription's monitored items in private
# maps (``_monitored_events``, ``_monitored_items``). The ``[opcua]`` extra pins asyncua
# to 2.1 and tests/opcua/test_opcua.py checks both answers; without a map both say yes,
# so the face does everything as if a client watched.


def takes_events(server: Server, node: ua.NodeId) -> bool:
    """Whether a monitored item takes the events ``node`` raises."""
    for sub in server.iserver.subscription_service.subscriptions.values():
        watched = getattr(sub.monitored_item_srv, "_monitored_events", None)
        if watched is None or watched.get(node):
            return True
    return False


def follows_values(server: Server, nodes: set[ua.NodeId]) -> bool:
    """Whether a monitored item follows the value of one of ``nodes``."""
    for sub in server.iserver.subscription_service.subscriptions.values():
        items = getattr(sub.monitored_item_srv, "_monitored_items", None)
        if items is None:
            return True
        for item in items.values():
            rv = getattr(item, "read_value_id", None)
            if rv is None or rv.NodeId in nodes:
                return True
    return False
