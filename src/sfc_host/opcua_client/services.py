"""The bodies of the services the client uses, each written or read in place by the
compiled codec (``sfc_fast.wire.uabinary``): a request's fields after its
RequestHeader, a response's after its ResponseHeader (IEC 62541 Part 4 §5, encoded as
Part 6 §5.2 lays out). Only the fields the client needs are kept from a response; the
rest are read past.

The numbers are the DefaultBinary encoding ids of the request and response types
(Part 6, Annex A).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sfc_fast.wire.uabinary import (
    DataValue,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
)
from sfc_host.opcua_client.errors import OpcUaError

OPEN_REQUEST, OPEN_RESPONSE, CLOSE_CHANNEL = 446, 449, 452
SERVICE_FAULT = 397
GET_ENDPOINTS, GET_ENDPOINTS_RESPONSE = 428, 431
CREATE_SESSION, CREATE_SESSION_RESPONSE = 461, 464
ACTIVATE_SESSION, ACTIVATE_SESSION_RESPONSE = 467, 470
CLOSE_SESSION, CLOSE_SESSION_RESPONSE = 473, 476
READ, READ_RESPONSE = 631, 634
WRITE, WRITE_RESPONSE = 673, 676
CALL, CALL_RESPONSE = 712, 715
BROWSE, BROWSE_RESPONSE = 527, 530
BROWSE_NEXT, BROWSE_NEXT_RESPONSE = 533, 536
TRANSLATE, TRANSLATE_RESPONSE = 554, 557
CREATE_SUBSCRIPTION, CREATE_SUBSCRIPTION_RESPONSE = 787, 790
CREATE_MONITORED_ITEMS, CREATE_MONITORED_ITEMS_RESPONSE = 751, 754
DELETE_SUBSCRIPTIONS, DELETE_SUBSCRIPTIONS_RESPONSE = 847, 850
PUBLISH, PUBLISH_RESPONSE = 826, 829
DATA_CHANGE_NOTIFICATION, EVENT_NOTIFICATION_LIST, STATUS_CHANGE_NOTIFICATION = 811, 916, 820
EVENT_FILTER, LITERAL_OPERAND, SIMPLE_ATTRIBUTE_OPERAND = 727, 597, 603
ANONYMOUS_TOKEN, USER_NAME_TOKEN, X509_TOKEN = 321, 324, 327
ARGUMENT = 298

# attribute ids (Part 6 Annex A.1)
NODE_CLASS, BROWSE_NAME, DISPLAY_NAME = 2, 3, 4
EVENT_NOTIFIER, VALUE, DATA_TYPE, VALUE_RANK = 12, 13, 14, 15
DATA_TYPE_DEFINITION = 23
# reference types
HIERARCHICAL, HAS_COMPONENT, HAS_PROPERTY, HAS_SUBTYPE = 33, 47, 46, 45
HAS_ENCODING = 38
TIMESTAMPS_BOTH = 2
REPORTING = 2
IN_LIST = 9
BASE_EVENT_TYPE = NodeId(2041)

_NULL = NodeId(0)
# a null DataEncoding: a server refuses an empty name for any attribute but the Value
_NO_ENCODING = QualifiedName(None)


class Unexpected(OpcUaError):
    """A response of another type than the request's."""


# ---- endpoints and sessions


@dataclass(frozen=True)
class UserTokenPolicy:
    policy_id: str
    token_type: int             # 0 anonymous, 1 user name, 2 certificate, 3 issued
    policy_uri: str             # '' when the endpoint's own


@dataclass(frozen=True)
class Endpoint:
    url: str
    server_certificate: bytes
    mode: int                   # 1 None, 2 Sign, 3 SignAndEncrypt
    policy_uri: str
    user_tokens: tuple[UserTokenPolicy, ...]
    level: int
    application_uri: str = ""


def write_get_endpoints(w: Writer, url: str) -> None:
    w.string(url)
    w.length(-1)            # locale ids
    w.length(-1)            # profile uris


def read_application(r: Reader) -> str:
    """An ApplicationDescription, read past; its application URI kept."""
    uri = r.string() or ""
    r.string()              # product uri
    r.localized_text()
    r.uint32()              # application type
    r.string()              # gateway server uri
    r.string()              # discovery profile uri
    for _ in range(max(r.length(), 0)):
        r.string()
    return uri


def read_endpoint(r: Reader) -> Endpoint:
    url = r.string() or ""
    app_uri = read_application(r)
    cert = r.bytestring() or b""
    mode = r.uint32()
    policy = r.string() or ""
    tokens = []
    for _ in range(max(r.length(), 0)):
        pid = r.string() or ""
        ttype = r.uint32()
        r.string()          # issued token type
        r.string()          # issuer endpoint url
        tokens.append(UserTokenPolicy(pid, ttype, r.string() or ""))
    r.string()              # transport profile
    level = r.byte()
    return Endpoint(url, cert, mode, policy, tuple(tokens), level, app_uri)


def read_endpoints(r: Reader) -> list[Endpoint]:
    return [read_endpoint(r) for _ in range(max(r.length(), 0))]


def write_create_session(w: Writer, *, application_uri: str, name: str, url: str,
                         nonce: bytes, certificate: bytes | None, timeout_ms: float) -> None:
    w.string(application_uri)           # ClientDescription: ApplicationUri
    w.string("urn:sfc-fast")            # ProductUri
    w.localized_text(LocalizedText(name))
    w.uint32(1)                         # ApplicationType: Client
    w.string(None)
    w.string(None)
    w.length(-1)                        # discovery urls
    w.string(None)                      # ServerUri
    w.string(url)
    w.string(name)                      # SessionName
    w.bytestring(nonce or None)
    w.bytestring(certificate)
    w.double(timeout_ms)
    w.uint32(0)                         # MaxResponseMessageSize: no limit


@dataclass
class Session:
    session_id: NodeId
    token: NodeId
    timeout_ms: float
    nonce: bytes
    certificate: bytes
    signature: bytes
    algorithm: str
    endpoints: list[Endpoint]


def read_create_session(r: Reader) -> Session:
    sid = r.nodeid()
    token = r.nodeid()
    timeout = r.double()
    nonce = r.bytestring() or b""
    cert = r.bytestring() or b""
    endpoints = read_endpoints(r)
    for _ in range(max(r.length(), 0)):     # software certificates
        r.bytestring()
        r.bytestring()
    algorithm = r.string() or ""
    signature = r.bytestring() or b""
    return Session(sid, token, timeout, nonce, cert, signature, algorithm, endpoints)


def identity_token(policy_id: str, *, user: str = "", secret: bytes = b"",
                   algorithm: str = "", certificate: bytes = b"") -> ExtensionObject:
    w = Writer()
    w.string(policy_id)
    if user:
        w.string(user)
        w.bytestring(secret)
        w.string(algorithm or None)
        return ExtensionObject(NodeId(USER_NAME_TOKEN), w.getvalue())
    if certificate:
        w.bytestring(certificate)
        return ExtensionObject(NodeId(X509_TOKEN), w.getvalue())
    return ExtensionObject(NodeId(ANONYMOUS_TOKEN), w.getvalue())


def write_activate_session(w: Writer, *, algorithm: str, signature: bytes,
                           token: ExtensionObject, token_algorithm: str = "",
                           token_signature: bytes = b"") -> None:
    w.string(algorithm or None)
    w.bytestring(signature or None)
    w.length(0)                         # software certificates
    w.length(1)
    w.string("en")
    w.extension_object(token)
    w.string(token_algorithm or None)
    w.bytestring(token_signature or None)


def read_activate_session(r: Reader) -> tuple[bytes, list[int]]:
    nonce = r.bytestring() or b""
    return nonce, read_statuses(r)


# ---- attribute services


def read_statuses(r: Reader) -> list[int]:
    return [r.status() for _ in range(max(r.length(), 0))]


def skip_diagnostics(r: Reader) -> None:
    for _ in range(max(r.length(), 0)):
        r.diagnostic_info()


def write_read(w: Writer, items: list[tuple[NodeId, int]], timestamps: int = 0) -> None:
    w.double(0.0)                       # MaxAge: the value now
    w.uint32(timestamps)                # 0 source, 2 both
    w.length(len(items))
    for node, attribute in items:
        w.nodeid(node)
        w.uint32(attribute)
        w.string(None)                  # index range
        w.qualified_name(_NO_ENCODING)


def read_read(r: Reader) -> list[DataValue]:
    return [r.data_value() for _ in range(max(r.length(), 0))]


def write_write(w: Writer, items: list[tuple[NodeId, Variant]]) -> None:
    w.length(len(items))
    for node, value in items:
        w.nodeid(node)
        w.uint32(VALUE)
        w.string(None)
        w.data_value(DataValue(value))


@dataclass(frozen=True)
class CallResult:
    status: int
    input_statuses: list[int]
    outputs: list[Any]                  # the output arguments' values


def write_call(w: Writer, calls: list[tuple[NodeId, NodeId, list[Variant]]]) -> None:
    w.length(len(calls))
    for obj, method, args in calls:
        w.nodeid(obj)
        w.nodeid(method)
        w.length(len(args))
        for a in args:
            w.variant(a)


def read_call(r: Reader) -> list[CallResult]:
    out = []
    for _ in range(max(r.length(), 0)):
        status = r.status()
        inputs = read_statuses(r)
        skip_diagnostics(r)
        outputs = [_value(r.variant()) for _ in range(max(r.length(), 0))]
        out.append(CallResult(status, inputs, outputs))
    return out


def _value(v: Variant | None) -> Any:
    return None if v is None else v.value


# ---- browsing


@dataclass(frozen=True)
class Reference:
    reference_type: NodeId
    forward: bool
    node: NodeId
    browse_name: QualifiedName
    display_name: str
    node_class: int
    type_definition: NodeId


def write_browse(w: Writer, nodes: list[NodeId], reference_type: NodeId, *, forward: bool,
                 subtypes: bool = True, node_class_mask: int = 0) -> None:
    w.nodeid(_NULL)                     # view: the whole address space
    w.datetime(0)
    w.uint32(0)
    w.uint32(0)                         # references per node: the server's choice
    w.length(len(nodes))
    for node in nodes:
        w.nodeid(node)
        w.uint32(0 if forward else 1)
        w.nodeid(reference_type)
        w.boolean(subtypes)
        w.uint32(node_class_mask)
        w.uint32(0x3F)                  # every field of a reference


def read_browse_results(r: Reader) -> list[tuple[int, bytes, list[Reference]]]:
    out = []
    for _ in range(max(r.length(), 0)):
        status = r.status()
        point = r.bytestring() or b""
        refs = []
        for _ in range(max(r.length(), 0)):
            rtype = r.nodeid()
            fwd = r.boolean()
            target = r.expanded_nodeid().node
            name = r.qualified_name()
            text = r.localized_text().text or ""
            nclass = r.uint32()
            tdef = r.expanded_nodeid().node
            refs.append(Reference(rtype, fwd, target, name, text, nclass, tdef))
        out.append((status, point, refs))
    return out


def write_browse_next(w: Writer, points: list[bytes], release: bool = False) -> None:
    w.boolean(release)
    w.length(len(points))
    for p in points:
        w.bytestring(p)


def write_translate(w: Writer, paths: list[tuple[NodeId, list[QualifiedName]]]) -> None:
    w.length(len(paths))
    hierarchical = NodeId(HIERARCHICAL)
    for start, names in paths:
        w.nodeid(start)
        w.length(len(names))
        for name in names:
            w.nodeid(hierarchical)
            w.boolean(False)            # inverse
            w.boolean(True)             # subtypes
            w.qualified_name(name)


def read_translate(r: Reader) -> list[tuple[int, list[NodeId]]]:
    out = []
    for _ in range(max(r.length(), 0)):
        status = r.status()
        targets = []
        for _ in range(max(r.length(), 0)):
            targets.append(r.expanded_nodeid().node)
            r.uint32()                  # remaining path index
        out.append((status, targets))
    return out


# ---- subscriptions


def write_create_subscription(w: Writer, interval_ms: float, lifetime: int, keepalive: int,
                              per_publish: int = 0, priority: int = 0) -> None:
    w.double(interval_ms)
    w.uint32(lifetime)
    w.uint32(keepalive)
    w.uint32(per_publish)
    w.boolean(True)
    w.byte(priority)


def read_create_subscription(r: Reader) -> tuple[int, float, int, int]:
    return r.uint32(), r.double(), r.uint32(), r.uint32()


@dataclass
class MonitorRequest:
    node: NodeId
    handle: int
    attribute: int = VALUE
    sampling_ms: float = 0.0
    queue: int = 1
    filter: ExtensionObject | None = None


def write_create_monitored_items(w: Writer, subscription: int,
                                 items: list[MonitorRequest]) -> None:
    w.uint32(subscription)
    w.uint32(TIMESTAMPS_BOTH)
    w.length(len(items))
    for it in items:
        w.nodeid(it.node)
        w.uint32(it.attribute)
        w.string(None)
        w.qualified_name(_NO_ENCODING)
        w.uint32(REPORTING)
        w.uint32(it.handle)
        w.double(it.sampling_ms)
        w.extension_object(it.filter)
        w.uint32(it.queue)
        w.boolean(True)                 # discard the oldest


def read_create_monitored_items(r: Reader) -> list[tuple[int, int]]:
    """(status, monitored item id) of each item."""
    out = []
    for _ in range(max(r.length(), 0)):
        status = r.status()
        mid = r.uint32()
        r.double()
        r.uint32()
        r.extension_object()
        out.append((status, mid))
    return out


def event_filter(select: list[tuple[NodeId, list[QualifiedName]]],
                 types: list[NodeId] | None) -> ExtensionObject:
    """An EventFilter: the fields at ``select``'s browse paths, each from the event type
    that declares it, of the events whose EventType is one of ``types`` (all when
    None). The where clause is an InList of the event types, not an OfType: servers
    that evaluate no OfType (asyncua's) take it, and the caller lists the subtypes."""
    w = Writer()
    w.length(len(select))
    for type_definition, path in select:
        _simple_operand(w, type_definition, path)
    if not types:
        w.length(0)
        return ExtensionObject(NodeId(EVENT_FILTER), w.getvalue())
    w.length(1)                             # one element: EventType InList types
    w.uint32(IN_LIST)
    w.length(1 + len(types))
    op = Writer()
    _simple_operand(op, BASE_EVENT_TYPE, [QualifiedName("EventType")])
    w.extension_object(ExtensionObject(NodeId(SIMPLE_ATTRIBUTE_OPERAND), op.getvalue()))
    for t in types:
        op = Writer()
        op.variant(Variant(17, t))
        w.extension_object(ExtensionObject(NodeId(LITERAL_OPERAND), op.getvalue()))
    return ExtensionObject(NodeId(EVENT_FILTER), w.getvalue())


def _simple_operand(w: Writer, type_definition: NodeId, path: list[QualifiedName]) -> None:
    w.nodeid(type_definition)
    w.length(len(path))
    for name in path:
        w.qualified_name(name)
    w.uint32(VALUE)
    w.string(None)


def write_delete_subscriptions(w: Writer, ids: list[int]) -> None:
    w.length(len(ids))
    for i in ids:
        w.uint32(i)


def write_publish(w: Writer, acks: list[tuple[int, int]]) -> None:
    w.length(len(acks))
    for sub, seq in acks:
        w.uint32(sub)
        w.uint32(seq)


@dataclass
class Notification:
    subscription: int
    sequence: int                       # 0 for a keep-alive
    data_changes: list[tuple[int, DataValue]] = field(default_factory=list)
    events: list[tuple[int, list[Any]]] = field(default_factory=list)
    status: int | None = None           # a StatusChangeNotification's


def read_publish(r: Reader) -> Notification:
    sub = r.uint32()
    for _ in range(max(r.length(), 0)):  # available sequence numbers
        r.uint32()
    r.boolean()                          # more notifications
    seq = r.uint32()
    r.datetime()
    n = Notification(sub, 0)
    datas = r.length()
    if datas > 0:
        n.sequence = seq
    for _ in range(max(datas, 0)):
        obj = r.extension_object()
        if obj is None or obj.body is None:
            continue
        kind = obj.type_id.identifier if obj.type_id.namespace == 0 else -1
        inner = Reader(obj.body)
        if kind == DATA_CHANGE_NOTIFICATION:
            for _ in range(max(inner.length(), 0)):
                handle = inner.uint32()
                n.data_changes.append((handle, inner.data_value()))
        elif kind == EVENT_NOTIFICATION_LIST:
            for _ in range(max(inner.length(), 0)):
                handle = inner.uint32()
                fields = [_value(inner.variant()) for _ in range(max(inner.length(), 0))]
                n.events.append((handle, fields))
        elif kind == STATUS_CHANGE_NOTIFICATION:
            n.status = inner.status()
    return n


# ---- structures a method takes


@dataclass(frozen=True)
class Argument:
    name: str
    data_type: NodeId
    value_rank: int
    dimensions: list[int]


def read_arguments(values: Any) -> list[Argument]:
    """A method's InputArguments or OutputArguments property value: an array of
    Argument structures, as ExtensionObjects."""
    out = []
    for obj in values or []:
        if not isinstance(obj, ExtensionObject) or obj.body is None:
            raise Unexpected(f"an argument is no Argument structure: {obj!r}")
        r = Reader(obj.body)
        name = r.string() or ""
        dtype = r.nodeid()
        rank = r.int32()
        dims = [r.uint32() for _ in range(max(r.length(), 0))]
        r.localized_text()
        out.append(Argument(name, dtype, rank, dims))
    return out
