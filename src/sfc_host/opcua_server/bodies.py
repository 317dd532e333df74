"""The server's side of the service bodies, on the compiled codec
(``sfc_fast.wire.uabinary``): a request's fields after its RequestHeader read into a
small frozen value, a response's fields after its ResponseHeader written from plain
values (IEC 62541 Part 4 §5, laid out as Part 6 §5.2 encodes them). The client's
``services`` module does the same from the other side; the two meet on the wire.

``read_<service>(r)`` reads a request's body (the Reader stands after the header),
``write_<service>(w, ...)`` writes the response's body. A request keeps the fields a
server acts on; every other field is read past, so the Reader ends where the body ends.
CloseSession, UnregisterNodes and CloseSecureChannel answer with no body beyond the
ResponseHeader.

A request cannot make the server allocate by its counts alone: an array longer than
the bytes left is the codec's ``DecodeError``; an array of operations longer than
``MAX_OPERATIONS`` is ``TooManyOperations`` (a ``DecodeError`` whose ``status`` is
BadTooManyOperations), and any other array longer than ``MAX_ARRAY`` a plain
``DecodeError`` (answered BadDecodingError).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sfc_fast.wire.uabinary import (
    DataValue,
    DecodeError,
    ExpandedNodeId,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
    ticks_now,
)
from sfc_host.errors import SfcHostError
from sfc_host.opcua_client import services

# The DefaultBinary encoding ids (Part 6 Annex A) the client's module lacks
FIND_SERVERS, FIND_SERVERS_RESPONSE = 422, 425
REGISTER_NODES, REGISTER_NODES_RESPONSE = 560, 563
UNREGISTER_NODES, UNREGISTER_NODES_RESPONSE = 566, 569
ISSUED_TOKEN = 940

# Status codes (Part 6 Annex A.2) a decoding failure is answered with
BAD_DECODING_ERROR = 0x80070000
BAD_TOO_MANY_OPERATIONS = 0x80100000

# Bounds on what one request may ask for, checked before anything is allocated
MAX_OPERATIONS = 10_000     # items of a service's operation list (nodes to read, ...)
MAX_ARRAY = 10_000          # items of any other array of a request (locale ids, ...)

NO_REMAINING_PATH = 0xFFFFFFFF  # a BrowsePathTarget's RemainingPathIndex when complete
UATCP_BINARY = "http://opcfoundation.org/UA-Profile/Transport/uatcp-uasc-uabinary"

# the user token policy of an endpoint: the client's own description of one
UserTokenPolicy = services.UserTokenPolicy

_NULL = NodeId(0)


class TooManyOperations(DecodeError, SfcHostError):
    """A request with more operations than the server takes in one call: answered with
    ``status`` (BadTooManyOperations), not BadDecodingError."""

    status = BAD_TOO_MANY_OPERATIONS


def _operations(r: Reader, what: str) -> int:
    """The count of a request's operation list (a null list is empty)."""
    at = r.pos
    n = r.length()
    if n > MAX_OPERATIONS:
        raise TooManyOperations(f"{n} {what} at byte {at}: at most {MAX_OPERATIONS} a request",
                                at)
    return max(n, 0)


def _count(r: Reader, what: str) -> int:
    """The count of any other array of a request (a null array is empty)."""
    at = r.pos
    n = r.length()
    if n > MAX_ARRAY:
        raise DecodeError(f"{n} {what} at byte {at}: at most {MAX_ARRAY} in an array", at)
    return max(n, 0)


def _strings(r: Reader, what: str) -> tuple[str, ...]:
    return tuple(r.string() or "" for _ in range(_count(r, what)))


def _write_strings(w: Writer, values: Sequence[str]) -> None:
    w.length(len(values))
    for s in values:
        w.string(s)


def _write_statuses(w: Writer, values: Sequence[int]) -> None:
    w.length(len(values))
    for s in values:
        w.status(s)


def _no_diagnostics(w: Writer) -> None:
    # an empty array, not a null one: both decode to no diagnostics, and empty is
    # what servers send when the request asked for none
    w.length(0)


# ---- headers and faults


@dataclass(frozen=True, slots=True)
class RequestHeader:
    auth_token: NodeId
    timestamp: int              # DateTime ticks, 0 when the client sent none
    handle: int
    return_diagnostics: int
    audit_entry_id: str
    timeout_ms: int             # 0: no hint


def read_type_id(r: Reader) -> int:
    """The message's type: the numeric id of a namespace 0 encoding id, -1 for any
    other NodeId (no service of ours)."""
    tid = r.nodeid()
    ident = tid.identifier
    return ident if tid.namespace == 0 and isinstance(ident, int) else -1


def read_request_header(r: Reader) -> RequestHeader:
    token = r.nodeid()
    timestamp = r.datetime()
    handle = r.uint32()
    diagnostics = r.uint32()
    audit = r.string() or ""
    timeout = r.uint32()
    r.extension_object()        # additional header: no parameters of ours ride in it
    return RequestHeader(token, timestamp, handle, diagnostics, audit, timeout)


def write_response_header(w: Writer, request_handle: int, status: int = 0) -> None:
    w.datetime(ticks_now())
    w.uint32(request_handle)
    w.status(status)
    w.byte(0)                   # service diagnostics: a DiagnosticInfo with no fields
    w.length(0)                 # string table
    w.extension_object(None)    # additional header


def start_response(type_id: int, request_handle: int, status: int = 0) -> Writer:
    """A Writer holding a response message's type id and ResponseHeader; its body
    follows."""
    w = Writer()
    w.nodeid(NodeId(type_id))
    write_response_header(w, request_handle, status)
    return w


def service_fault(request_handle: int, status: int) -> bytes:
    """A whole ServiceFault message: the answer to a request that failed as a whole."""
    return start_response(services.SERVICE_FAULT, request_handle, status).getvalue()


# ---- the secure channel


@dataclass(frozen=True, slots=True)
class OpenSecureChannelRequest:
    protocol_version: int
    request_type: int           # 0 issue, 1 renew
    security_mode: int          # 1 None, 2 Sign, 3 SignAndEncrypt
    client_nonce: bytes
    requested_lifetime_ms: int

    @property
    def renew(self) -> bool:
        return self.request_type == 1


def read_open_secure_channel(r: Reader) -> OpenSecureChannelRequest:
    version = r.uint32()
    kind = r.uint32()
    mode = r.uint32()
    nonce = r.bytestring() or b""
    return OpenSecureChannelRequest(version, kind, mode, nonce, r.uint32())


def write_open_secure_channel(w: Writer, *, channel_id: int, token_id: int, created_at: int,
                              lifetime_ms: int, server_nonce: bytes,
                              protocol_version: int = 0) -> None:
    """``created_at``: DateTime ticks."""
    w.uint32(protocol_version)
    w.uint32(channel_id)
    w.uint32(token_id)
    w.datetime(created_at)
    w.uint32(lifetime_ms)
    w.bytestring(server_nonce)  # empty under SecurityPolicy None: length 0, not null


# ---- discovery


@dataclass(frozen=True, slots=True)
class ApplicationDescription:
    application_uri: str
    product_uri: str
    application_name: LocalizedText
    application_type: int = 0   # 0 server, 1 client, 2 both, 3 discovery server
    gateway_server_uri: str = ""
    discovery_profile_uri: str = ""
    discovery_urls: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EndpointDescription:
    endpoint_url: str
    server: ApplicationDescription
    server_certificate: bytes
    security_mode: int          # 1 None, 2 Sign, 3 SignAndEncrypt
    security_policy_uri: str
    user_identity_tokens: tuple[UserTokenPolicy, ...]
    security_level: int = 0
    transport_profile_uri: str = UATCP_BINARY


def read_application_description(r: Reader) -> ApplicationDescription:
    uri = r.string() or ""
    product = r.string() or ""
    name = r.localized_text()
    kind = r.uint32()
    gateway = r.string() or ""
    profile = r.string() or ""
    urls = _strings(r, "discovery urls")
    return ApplicationDescription(uri, product, name, kind, gateway, profile, urls)


def write_application_description(w: Writer, app: ApplicationDescription) -> None:
    w.string(app.application_uri)
    w.string(app.product_uri)
    w.localized_text(app.application_name)
    w.uint32(app.application_type)
    w.string(app.gateway_server_uri or None)
    w.string(app.discovery_profile_uri or None)
    _write_strings(w, app.discovery_urls)


def write_endpoint_description(w: Writer, e: EndpointDescription) -> None:
    w.string(e.endpoint_url)
    write_application_description(w, e.server)
    w.bytestring(e.server_certificate or None)
    w.uint32(e.security_mode)
    w.string(e.security_policy_uri)
    w.length(len(e.user_identity_tokens))
    for t in e.user_identity_tokens:
        w.string(t.policy_id)
        w.uint32(t.token_type)
        w.string(None)          # issued token type: no issued tokens taken
        w.string(None)          # issuer endpoint url
        w.string(t.policy_uri or None)
    w.string(e.transport_profile_uri)
    w.byte(e.security_level)


def _write_endpoints(w: Writer, endpoints: Sequence[EndpointDescription]) -> None:
    w.length(len(endpoints))
    for e in endpoints:
        write_endpoint_description(w, e)


@dataclass(frozen=True, slots=True)
class GetEndpointsRequest:
    endpoint_url: str
    locale_ids: tuple[str, ...]
    profile_uris: tuple[str, ...]


def read_get_endpoints(r: Reader) -> GetEndpointsRequest:
    url = r.string() or ""
    locales = _strings(r, "locale ids")
    return GetEndpointsRequest(url, locales, _strings(r, "profile uris"))


def write_get_endpoints(w: Writer, endpoints: Sequence[EndpointDescription]) -> None:
    _write_endpoints(w, endpoints)


@dataclass(frozen=True, slots=True)
class FindServersRequest:
    endpoint_url: str
    locale_ids: tuple[str, ...]
    server_uris: tuple[str, ...]


def read_find_servers(r: Reader) -> FindServersRequest:
    url = r.string() or ""
    locales = _strings(r, "locale ids")
    return FindServersRequest(url, locales, _strings(r, "server uris"))


def write_find_servers(w: Writer, servers: Sequence[ApplicationDescription]) -> None:
    w.length(len(servers))
    for app in servers:
        write_application_description(w, app)


# ---- sessions


@dataclass(frozen=True, slots=True)
class CreateSessionRequest:
    client: ApplicationDescription
    server_uri: str
    endpoint_url: str
    session_name: str
    client_nonce: bytes
    client_certificate: bytes
    requested_timeout_ms: float
    max_response_size: int      # 0: no limit


def read_create_session(r: Reader) -> CreateSessionRequest:
    client = read_application_description(r)
    server_uri = r.string() or ""
    url = r.string() or ""
    name = r.string() or ""
    nonce = r.bytestring() or b""
    cert = r.bytestring() or b""
    timeout = r.double()
    return CreateSessionRequest(client, server_uri, url, name, nonce, cert, timeout, r.uint32())


def write_create_session(w: Writer, *, session_id: NodeId, auth_token: NodeId,
                         timeout_ms: float, server_nonce: bytes, server_certificate: bytes,
                         endpoints: Sequence[EndpointDescription], signature_algorithm: str,
                         signature: bytes, max_request_size: int = 0) -> None:
    w.nodeid(session_id)
    w.nodeid(auth_token)
    w.double(timeout_ms)
    w.bytestring(server_nonce)
    w.bytestring(server_certificate or None)
    _write_endpoints(w, endpoints)
    w.length(0)                 # signed software certificates: none
    w.string(signature_algorithm or None)
    w.bytestring(signature or None)
    w.uint32(max_request_size)


@dataclass(frozen=True, slots=True)
class AnonymousIdentity:
    policy_id: str


@dataclass(frozen=True, slots=True)
class UserNameIdentity:
    policy_id: str
    user_name: str
    password: bytes             # as sent: encrypted when encryption_algorithm is set
    encryption_algorithm: str


@dataclass(frozen=True, slots=True)
class X509Identity:
    policy_id: str
    certificate: bytes


IdentityToken = AnonymousIdentity | UserNameIdentity | X509Identity


@dataclass(frozen=True, slots=True)
class ActivateSessionRequest:
    signature_algorithm: str
    signature: bytes
    locale_ids: tuple[str, ...]
    # None for a null token (Part 4 takes it for anonymous); the ExtensionObject itself
    # for a token of another type (an issued token, an XML body): the server refuses it
    identity: IdentityToken | ExtensionObject | None
    token_signature_algorithm: str
    token_signature: bytes


def read_identity_token(obj: ExtensionObject | None) -> IdentityToken | ExtensionObject | None:
    """A UserIdentityToken's ExtensionObject decoded into its kind."""
    if obj is None:
        return None
    tid = obj.type_id
    kind = tid.identifier if tid.namespace == 0 else -1
    if kind not in (services.ANONYMOUS_TOKEN, services.USER_NAME_TOKEN, services.X509_TOKEN) \
            or obj.encoding != 1:
        return obj
    r = Reader(obj.body or b"")
    policy = r.string() or ""
    if kind == services.ANONYMOUS_TOKEN:
        return AnonymousIdentity(policy)
    if kind == services.X509_TOKEN:
        return X509Identity(policy, r.bytestring() or b"")
    user = r.string() or ""
    password = r.bytestring() or b""
    return UserNameIdentity(policy, user, password, r.string() or "")


def read_activate_session(r: Reader) -> ActivateSessionRequest:
    algorithm = r.string() or ""
    signature = r.bytestring() or b""
    for _ in range(_count(r, "software certificates")):
        r.bytestring()          # certificate data
        r.bytestring()          # signature
    locales = _strings(r, "locale ids")
    identity = read_identity_token(r.extension_object())
    token_algorithm = r.string() or ""
    token_signature = r.bytestring() or b""
    return ActivateSessionRequest(algorithm, signature, locales, identity, token_algorithm,
                                  token_signature)


def write_activate_session(w: Writer, server_nonce: bytes,
                           results: Sequence[int] = ()) -> None:
    """``results``: the status of each software certificate, none taken."""
    w.bytestring(server_nonce)
    _write_statuses(w, results)
    _no_diagnostics(w)


@dataclass(frozen=True, slots=True)
class CloseSessionRequest:
    delete_subscriptions: bool


def read_close_session(r: Reader) -> CloseSessionRequest:
    return CloseSessionRequest(r.boolean())


# ---- browsing


@dataclass(frozen=True, slots=True)
class BrowseDescription:
    node_id: NodeId
    direction: int              # 0 forward, 1 inverse, 2 both
    reference_type: NodeId      # null: every reference type
    include_subtypes: bool
    node_class_mask: int        # 0: every node class
    result_mask: int            # the ReferenceDescription fields asked for (bits 0..5)


@dataclass(frozen=True, slots=True)
class BrowseRequest:
    view_id: NodeId             # null: the whole address space
    max_references: int         # per node; 0: the server's choice
    nodes: tuple[BrowseDescription, ...]


def read_browse(r: Reader) -> BrowseRequest:
    view = r.nodeid()
    r.datetime()                # view timestamp
    r.uint32()                  # view version
    limit = r.uint32()
    nodes = []
    for _ in range(_operations(r, "nodes to browse")):
        node = r.nodeid()
        direction = r.uint32()
        rtype = r.nodeid()
        subtypes = r.boolean()
        mask = r.uint32()
        nodes.append(BrowseDescription(node, direction, rtype, subtypes, mask, r.uint32()))
    return BrowseRequest(view, limit, tuple(nodes))


@dataclass(frozen=True, slots=True)
class ReferenceDescription:
    reference_type: NodeId
    is_forward: bool
    target: NodeId | ExpandedNodeId
    browse_name: QualifiedName
    display_name: LocalizedText
    node_class: int
    type_definition: NodeId | ExpandedNodeId | None = None   # None: a null NodeId


@dataclass(frozen=True, slots=True)
class BrowseResult:
    status: int
    continuation_point: bytes = b""     # empty: no more references
    references: Sequence[ReferenceDescription] = ()


def write_browse(w: Writer, results: Sequence[BrowseResult]) -> None:
    """The response body of Browse, and of BrowseNext."""
    w.length(len(results))
    for res in results:
        w.status(res.status)
        w.bytestring(res.continuation_point or None)
        w.length(len(res.references))
        for ref in res.references:
            w.nodeid(ref.reference_type)
            w.boolean(ref.is_forward)
            w.expanded_nodeid(ref.target)
            w.qualified_name(ref.browse_name)
            w.localized_text(ref.display_name)
            w.uint32(ref.node_class)
            w.expanded_nodeid(_NULL if ref.type_definition is None else ref.type_definition)
    _no_diagnostics(w)


@dataclass(frozen=True, slots=True)
class BrowseNextRequest:
    release: bool               # release the points rather than browse on
    continuation_points: tuple[bytes, ...]


def read_browse_next(r: Reader) -> BrowseNextRequest:
    release = r.boolean()
    points = tuple(r.bytestring() or b"" for _ in range(_operations(r, "continuation points")))
    return BrowseNextRequest(release, points)


write_browse_next = write_browse


@dataclass(frozen=True, slots=True)
class RelativePathElement:
    reference_type: NodeId      # null: any reference type
    is_inverse: bool
    include_subtypes: bool
    target_name: QualifiedName


@dataclass(frozen=True, slots=True)
class BrowsePath:
    start: NodeId
    elements: tuple[RelativePathElement, ...]


def read_translate(r: Reader) -> tuple[BrowsePath, ...]:
    """TranslateBrowsePathsToNodeIds: the browse paths."""
    paths = []
    for _ in range(_operations(r, "browse paths")):
        start = r.nodeid()
        elements = []
        for _ in range(_count(r, "relative path elements")):
            rtype = r.nodeid()
            inverse = r.boolean()
            subtypes = r.boolean()
            elements.append(RelativePathElement(rtype, inverse, subtypes, r.qualified_name()))
        paths.append(BrowsePath(start, tuple(elements)))
    return tuple(paths)


@dataclass(frozen=True, slots=True)
class BrowsePathResult:
    status: int
    # each target a node the whole path reached, or (a node outside the server, the
    # index of the first path element not followed)
    targets: Sequence[NodeId | ExpandedNodeId | tuple[NodeId | ExpandedNodeId, int]] = ()


def write_translate(w: Writer, results: Sequence[BrowsePathResult]) -> None:
    w.length(len(results))
    for res in results:
        w.status(res.status)
        w.length(len(res.targets))
        for t in res.targets:
            if isinstance(t, tuple):
                w.expanded_nodeid(t[0])
                w.uint32(t[1])
            else:
                w.expanded_nodeid(t)
                w.uint32(NO_REMAINING_PATH)
    _no_diagnostics(w)


@dataclass(frozen=True, slots=True)
class RegisterNodesRequest:
    nodes: tuple[NodeId, ...]


def read_register_nodes(r: Reader) -> RegisterNodesRequest:
    """RegisterNodes' and UnregisterNodes' request: the nodes."""
    return RegisterNodesRequest(tuple(r.nodeid() for _ in range(_operations(r, "nodes"))))


read_unregister_nodes = read_register_nodes


def write_register_nodes(w: Writer, nodes: Sequence[NodeId]) -> None:
    """The registered ids: a server without a faster id for a node echoes it."""
    w.length(len(nodes))
    for n in nodes:
        w.nodeid(n)


# ---- attributes and methods


@dataclass(frozen=True, slots=True)
class ReadValueId:
    node_id: NodeId
    attribute_id: int
    index_range: str            # empty: the whole value
    data_encoding: QualifiedName


@dataclass(frozen=True, slots=True)
class ReadRequest:
    max_age_ms: float
    timestamps: int             # 0 source, 1 server, 2 both, 3 neither
    nodes: tuple[ReadValueId, ...]


def read_read(r: Reader) -> ReadRequest:
    max_age = r.double()
    timestamps = r.uint32()
    nodes = []
    for _ in range(_operations(r, "nodes to read")):
        node = r.nodeid()
        attribute = r.uint32()
        index_range = r.string() or ""
        nodes.append(ReadValueId(node, attribute, index_range, r.qualified_name()))
    return ReadRequest(max_age, timestamps, tuple(nodes))


def write_read(w: Writer, values: Sequence[DataValue]) -> None:
    w.length(len(values))
    for v in values:
        w.data_value(v)
    _no_diagnostics(w)


@dataclass(frozen=True, slots=True)
class WriteValue:
    node_id: NodeId
    attribute_id: int
    index_range: str
    value: DataValue


def read_write(r: Reader) -> tuple[WriteValue, ...]:
    """Write: the values to write."""
    out = []
    for _ in range(_operations(r, "nodes to write")):
        node = r.nodeid()
        attribute = r.uint32()
        index_range = r.string() or ""
        out.append(WriteValue(node, attribute, index_range, r.data_value()))
    return tuple(out)


def write_write(w: Writer, results: Sequence[int]) -> None:
    _write_statuses(w, results)
    _no_diagnostics(w)


@dataclass(frozen=True, slots=True)
class CallMethodRequest:
    object_id: NodeId
    method_id: NodeId
    arguments: tuple[Variant | None, ...]   # None: a null Variant


def read_call(r: Reader) -> tuple[CallMethodRequest, ...]:
    """Call: the methods to call."""
    out = []
    for _ in range(_operations(r, "methods to call")):
        obj = r.nodeid()
        method = r.nodeid()
        args = tuple(r.variant() for _ in range(_count(r, "input arguments")))
        out.append(CallMethodRequest(obj, method, args))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CallMethodResult:
    status: int
    input_argument_results: Sequence[int] = ()     # empty unless an argument was refused
    outputs: Sequence[Variant | None] = ()


def write_call(w: Writer, results: Sequence[CallMethodResult]) -> None:
    w.length(len(results))
    for res in results:
        w.status(res.status)
        _write_statuses(w, res.input_argument_results)
        _no_diagnostics(w)
        w.length(len(res.outputs))
        for v in res.outputs:
            w.variant(v)
    _no_diagnostics(w)
