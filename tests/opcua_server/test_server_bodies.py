"""The server's service bodies against asyncua, an independent implementation: each
request asyncua encodes reads, with our reader, to the values asyncua was given and
leaves nothing unread; each response we write asyncua decodes to the values we wrote,
ResponseHeader and ServiceFault included. Truncated requests and counts beyond the
bounds raise DecodeError before anything is allocated.

asyncua's DataValue puts ServerTimestamp before SourcePicoseconds (against Part 6), so
the values exchanged with it carry no picoseconds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua import ua_binary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfc_fast.wire import uabinary as u
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
)
from sfc_host.opcua_client import services
from sfc_host.opcua_server import bodies as b

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------
# Strategies

namespaces = st.integers(0, 2 ** 16 - 1)
nodeids = st.one_of(
    st.builds(NodeId, st.one_of(st.integers(0, 255), st.integers(0, 2 ** 32 - 1)),
              st.one_of(st.just(0), namespaces)),
    st.builds(NodeId, st.text(max_size=12), namespaces),
    st.builds(NodeId, st.uuids(), namespaces),
    st.builds(NodeId, st.binary(max_size=12), namespaces),
)
expanded = st.builds(ExpandedNodeId, nodeids, st.none() | st.text(min_size=1, max_size=12),
                     st.integers(0, 2 ** 31 - 1))
texts = st.none() | st.text(max_size=16)
names = st.text(max_size=12)
blobs = st.none() | st.binary(max_size=24)
u32 = st.integers(0, 2 ** 32 - 1)
# asyncua reads a QualifiedName's namespace as an Int16
qnames = st.builds(QualifiedName, texts, st.integers(0, 2 ** 15 - 1))
ltexts = st.builds(LocalizedText, texts, texts)
str_lists = st.none() | st.lists(texts, max_size=4)
# whole microseconds: asyncua's datetimes have no finer grain
ticks = st.integers(0, 2 ** 60).map(lambda t: t // 10 * 10)

SCALARS: dict[int, st.SearchStrategy[Any]] = {
    u.BOOLEAN: st.booleans(),
    u.INT32: st.integers(-(2 ** 31), 2 ** 31 - 1),
    u.UINT32: u32,
    u.DOUBLE: st.floats(allow_nan=False),
    u.STRING: texts,
    u.BYTE_STRING: blobs,
    u.NODE_ID: nodeids,
}
variants = st.sampled_from(sorted(SCALARS)).flatmap(lambda t: st.one_of(
    SCALARS[t].map(lambda v: Variant(t, v)),
    st.lists(SCALARS[t], max_size=4).map(lambda vs: Variant(t, vs))))
data_values = st.builds(DataValue, st.none() | variants, u32, st.none() | ticks,
                        st.none() | ticks)


# ---------------------------------------------------------------------------------
# Our values <-> asyncua's


def ua_node(n: NodeId) -> ua.NodeId:
    return ua.NodeId(n.identifier, n.namespace)


def our_node(n: ua.NodeId) -> NodeId:
    ident = n.Identifier
    return NodeId(str(ident) if isinstance(ident, str) else ident, n.NamespaceIndex)


def our_expanded(n: ua.NodeId) -> ExpandedNodeId:
    return ExpandedNodeId(our_node(n), getattr(n, "NamespaceUri", None),
                          getattr(n, "ServerIndex", 0) or 0)


def as_expanded(n: NodeId | ExpandedNodeId) -> ExpandedNodeId:
    return n if isinstance(n, ExpandedNodeId) else ExpandedNodeId(n)


def ua_qname(q: QualifiedName) -> ua.QualifiedName:
    return ua.QualifiedName(q.name, q.namespace)


def our_qname(q: ua.QualifiedName) -> QualifiedName:
    return QualifiedName(q.Name, q.NamespaceIndex)


def ua_text(t: LocalizedText) -> ua.LocalizedText:
    return ua.LocalizedText(t.text, t.locale)


def our_text(t: ua.LocalizedText) -> LocalizedText:
    return LocalizedText(t.Text, t.Locale)


def _ua_scalar(t: int, v: Any) -> Any:
    return ua_node(v) if t == u.NODE_ID and v is not None else v


def ua_variant(v: Variant | None) -> ua.Variant:
    if v is None:
        return ua.Variant()
    vt = ua.VariantType(v.type)
    if v.is_array:
        return ua.Variant([_ua_scalar(v.type, x) for x in v.value], vt, is_array=True)
    return ua.Variant(_ua_scalar(v.type, v.value), vt)


def our_variant(v: ua.Variant | None) -> Variant | None:
    if v is None or v.VariantType == ua.VariantType.Null:
        return None
    t = v.VariantType.value
    conv = our_node if t == u.NODE_ID else (lambda x: x)
    if v.is_array:
        return Variant(t, [None if x is None else conv(x) for x in v.Value or []])
    return Variant(t, None if v.Value is None else conv(v.Value))


def _dt(t: int | None) -> datetime | None:
    return None if t is None else u.datetime_from_ticks(t)


def _ticks(d: datetime | None) -> int | None:
    return None if d is None else ua.datetime_to_win_epoch(d)


def ua_data_value(d: DataValue) -> ua.DataValue:
    return ua.DataValue(Value=ua_variant(d.value), StatusCode=ua.StatusCode(d.status),
                        SourceTimestamp=_dt(d.source_time), ServerTimestamp=_dt(d.server_time))


def our_data_value(d: ua.DataValue) -> DataValue:
    return DataValue(our_variant(d.Value), d.StatusCode.value if d.StatusCode else 0,
                     _ticks(d.SourceTimestamp), _ticks(d.ServerTimestamp))


def strings(values: list[str | None] | None) -> tuple[str, ...]:
    """A string array as our reader gives it back: null items and arrays empty."""
    return tuple(s or "" for s in values or [])


def ua_app(a: b.ApplicationDescription) -> ua.ApplicationDescription:
    return ua.ApplicationDescription(
        ApplicationUri=a.application_uri, ProductUri=a.product_uri,
        ApplicationName=ua_text(a.application_name),
        ApplicationType=ua.ApplicationType(a.application_type),
        GatewayServerUri=a.gateway_server_uri, DiscoveryProfileUri=a.discovery_profile_uri,
        DiscoveryUrls=list(a.discovery_urls))


def our_app(a: ua.ApplicationDescription) -> b.ApplicationDescription:
    return b.ApplicationDescription(
        a.ApplicationUri or "", a.ProductUri or "", our_text(a.ApplicationName),
        a.ApplicationType.value, a.GatewayServerUri or "", a.DiscoveryProfileUri or "",
        strings(a.DiscoveryUrls))


apps = st.builds(b.ApplicationDescription, names, names, ltexts, st.integers(0, 3), names,
                 names, st.lists(names, max_size=3).map(tuple))
token_policies = st.builds(b.UserTokenPolicy, names, st.integers(0, 3), names)
endpoints = st.builds(b.EndpointDescription, names, apps, st.binary(max_size=40),
                      st.integers(1, 3), names, st.lists(token_policies, max_size=3).map(tuple),
                      st.integers(0, 255), names)


def ua_request_header(token: ua.NodeId | None = None, handle: int = 7) -> ua.RequestHeader:
    return ua.RequestHeader(AuthenticationToken=token or ua.NodeId(),
                            Timestamp=datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
                            RequestHandle=handle, TimeoutHint=5000)


def request(message: Any, type_id: int) -> tuple[Reader, b.RequestHeader]:
    """asyncua's encoding of ``message``; our reader standing after its RequestHeader."""
    r = Reader(ua_binary.struct_to_binary(message))
    assert b.read_type_id(r) == type_id
    return r, b.read_request_header(r)


def done(r: Reader) -> None:
    assert r.remaining == 0, f"{r.remaining} bytes of the request left unread"


def response(cls: type, type_id: int, body: Callable[[Writer], None], handle: int = 42,
             status: int = 0) -> Any:
    """The message we write (header and ``body``) decoded by asyncua as ``cls``."""
    w = b.start_response(type_id, handle, status)
    body(w)
    buf = Buffer(w.getvalue())
    msg = ua_binary.struct_from_binary(cls, buf)
    assert len(buf) == 0, f"asyncua left {len(buf)} bytes unread"
    assert msg.TypeId == ua.NodeId(type_id)
    assert msg.ResponseHeader.RequestHandle == handle
    assert msg.ResponseHeader.ServiceResult.value == status
    return msg


# ---------------------------------------------------------------------------------
# Headers and faults


@FAST
@given(nodeids, u32, u32, texts, u32, st.booleans())
def test_request_header_reads_as_asyncua_wrote_it(token: NodeId, handle: int, diags: int,
                                                  audit: str | None, timeout: int,
                                                  extra: bool) -> None:
    when = datetime(2023, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    hdr = ua.RequestHeader(
        AuthenticationToken=ua_node(token), Timestamp=when, RequestHandle=handle,
        ReturnDiagnostics=diags, AuditEntryId=audit, TimeoutHint=timeout,
        AdditionalHeader=ua.ExtensionObject(TypeId=ua.NodeId(99, 3), Body=b"\x01\x02\x03")
        if extra else ua.ExtensionObject())
    r = Reader(ua_binary.struct_to_binary(hdr))
    got = b.read_request_header(r)
    done(r)
    assert got == b.RequestHeader(token, ua.datetime_to_win_epoch(when), handle, diags,
                                  audit or "", timeout)


@pytest.mark.parametrize("status", [0, 0x80340000, 0x80100000])
def test_response_header_decodes_in_asyncua(status: int) -> None:
    before = datetime.now(UTC)
    msg = response(ua.CloseSessionResponse, services.CLOSE_SESSION_RESPONSE, lambda w: None,
                   handle=0xFFFFFFFF, status=status)
    hdr = msg.ResponseHeader
    assert before.replace(tzinfo=None) <= hdr.Timestamp.replace(tzinfo=None) \
        <= datetime.now(UTC).replace(tzinfo=None)
    assert hdr.StringTable == []
    assert hdr.ServiceDiagnostics == ua.DiagnosticInfo()
    assert hdr.AdditionalHeader == ua.ExtensionObject()


@pytest.mark.parametrize("status", [0x80070000, 0x80100000, 0x80260000])
def test_service_fault_is_a_whole_message_asyncua_reads(status: int) -> None:
    data = b.service_fault(1234, status)
    buf = Buffer(data)
    fault = ua_binary.struct_from_binary(ua.ServiceFault, buf)
    assert len(buf) == 0
    assert fault.TypeId == ua.NodeId(397)
    assert fault.ResponseHeader.RequestHandle == 1234
    assert fault.ResponseHeader.ServiceResult.value == status


def test_the_type_id_of_a_message() -> None:
    for node, want in [(NodeId(631), 631), (NodeId(631, 1), -1), (NodeId("x"), -1)]:
        w = Writer()
        w.nodeid(node)
        assert b.read_type_id(Reader(w.getvalue())) == want


# ---------------------------------------------------------------------------------
# The secure channel


@FAST
@given(u32, st.integers(0, 1), st.integers(1, 3), blobs, u32)
def test_open_secure_channel_request(version: int, kind: int, mode: int, nonce: bytes | None,
                                     lifetime: int) -> None:
    req = ua.OpenSecureChannelRequest(RequestHeader=ua_request_header(),
                                      Parameters=ua.OpenSecureChannelParameters(
        ClientProtocolVersion=version, RequestType=ua.SecurityTokenRequestType(kind),
        SecurityMode=ua.MessageSecurityMode(mode), ClientNonce=nonce,
        RequestedLifetime=lifetime))
    r, _ = request(req, services.OPEN_REQUEST)
    got = b.read_open_secure_channel(r)
    done(r)
    assert got == b.OpenSecureChannelRequest(version, kind, mode, nonce or b"", lifetime)
    assert got.renew is (kind == 1)


@FAST
@given(u32, u32, ticks, u32, st.binary(max_size=32))
def test_open_secure_channel_response(channel: int, token: int, created: int, lifetime: int,
                                      nonce: bytes) -> None:
    msg = response(ua.OpenSecureChannelResponse, services.OPEN_RESPONSE,
                   lambda w: b.write_open_secure_channel(
                       w, channel_id=channel, token_id=token, created_at=created,
                       lifetime_ms=lifetime, server_nonce=nonce))
    p = msg.Parameters
    assert p.ServerProtocolVersion == 0
    t = p.SecurityToken
    assert (t.ChannelId, t.TokenId, t.RevisedLifetime) == (channel, token, lifetime)
    assert ua.datetime_to_win_epoch(t.CreatedAt) == created
    assert (p.ServerNonce or b"") == nonce


# ---------------------------------------------------------------------------------
# Discovery


@FAST
@given(texts, str_lists, str_lists)
def test_get_endpoints_request(url: str | None, locales: list | None,
                               profiles: list | None) -> None:
    req = ua.GetEndpointsRequest(RequestHeader=ua_request_header(),
                                 Parameters=ua.GetEndpointsParameters(
        EndpointUrl=url, LocaleIds=locales, ProfileUris=profiles))
    r, hdr = request(req, services.GET_ENDPOINTS)
    got = b.read_get_endpoints(r)
    done(r)
    assert hdr.handle == 7 and hdr.timeout_ms == 5000 and hdr.auth_token == NodeId(0)
    assert got == b.GetEndpointsRequest(url or "", strings(locales), strings(profiles))


def _check_endpoint(theirs: ua.EndpointDescription, ours: b.EndpointDescription) -> None:
    assert theirs.EndpointUrl == ours.endpoint_url
    assert our_app(theirs.Server) == ours.server
    assert (theirs.ServerCertificate or b"") == ours.server_certificate
    assert theirs.SecurityMode.value == ours.security_mode
    assert theirs.SecurityPolicyUri == ours.security_policy_uri
    assert theirs.TransportProfileUri == ours.transport_profile_uri
    assert theirs.SecurityLevel == ours.security_level
    assert [(t.PolicyId, t.TokenType.value, t.SecurityPolicyUri or "", t.IssuedTokenType,
             t.IssuerEndpointUrl) for t in theirs.UserIdentityTokens] == \
        [(t.policy_id, t.token_type, t.policy_uri, None, None)
         for t in ours.user_identity_tokens]


@FAST
@given(st.lists(endpoints, max_size=3))
def test_get_endpoints_response(eps: list[b.EndpointDescription]) -> None:
    msg = response(ua.GetEndpointsResponse, services.GET_ENDPOINTS_RESPONSE,
                   lambda w: b.write_get_endpoints(w, eps))
    assert len(msg.Endpoints) == len(eps)
    for theirs, ours in zip(msg.Endpoints, eps, strict=True):
        _check_endpoint(theirs, ours)
    # the client of our own reads the same layout
    w = Writer()
    b.write_get_endpoints(w, eps)
    r = Reader(w.getvalue())
    client = services.read_endpoints(r)
    done(r)
    assert [(e.url, e.application_uri, e.server_certificate, e.mode, e.policy_uri,
             e.user_tokens, e.level) for e in client] == \
        [(e.endpoint_url, e.server.application_uri, e.server_certificate, e.security_mode,
          e.security_policy_uri, e.user_identity_tokens, e.security_level) for e in eps]


@FAST
@given(texts, str_lists, str_lists)
def test_find_servers_request(url: str | None, locales: list | None,
                              uris: list | None) -> None:
    req = ua.FindServersRequest(RequestHeader=ua_request_header(),
                                Parameters=ua.FindServersParameters(
        EndpointUrl=url, LocaleIds=locales, ServerUris=uris))
    r, _ = request(req, b.FIND_SERVERS)
    got = b.read_find_servers(r)
    done(r)
    assert got == b.FindServersRequest(url or "", strings(locales), strings(uris))


@FAST
@given(st.lists(apps, max_size=3))
def test_find_servers_response(servers: list[b.ApplicationDescription]) -> None:
    msg = response(ua.FindServersResponse, b.FIND_SERVERS_RESPONSE,
                   lambda w: b.write_find_servers(w, servers))
    assert [our_app(a) for a in msg.Servers] == servers


# ---------------------------------------------------------------------------------
# Sessions


@FAST
@given(apps, texts, texts, texts, blobs, blobs, st.floats(0, 1e9), u32, nodeids)
def test_create_session_request(client: b.ApplicationDescription, server_uri: str | None,
                                url: str | None, name: str | None, nonce: bytes | None,
                                cert: bytes | None, timeout: float, max_size: int,
                                token: NodeId) -> None:
    req = ua.CreateSessionRequest(RequestHeader=ua_request_header(ua_node(token)),
                                  Parameters=ua.CreateSessionParameters(
        ClientDescription=ua_app(client), ServerUri=server_uri, EndpointUrl=url,
        SessionName=name, ClientNonce=nonce, ClientCertificate=cert,
        RequestedSessionTimeout=timeout, MaxResponseMessageSize=max_size))
    r, hdr = request(req, services.CREATE_SESSION)
    got = b.read_create_session(r)
    done(r)
    assert hdr.auth_token == token
    assert got == b.CreateSessionRequest(client, server_uri or "", url or "", name or "",
                                         nonce or b"", cert or b"", timeout, max_size)


@FAST
@given(nodeids, nodeids, st.floats(0, 1e9), st.binary(max_size=32), st.binary(max_size=40),
       st.lists(endpoints, max_size=2), names, st.binary(max_size=40), u32)
def test_create_session_response(sid: NodeId, token: NodeId, timeout: float, nonce: bytes,
                                 cert: bytes, eps: list[b.EndpointDescription], algorithm: str,
                                 signature: bytes, max_size: int) -> None:
    def body(w: Writer) -> None:
        b.write_create_session(w, session_id=sid, auth_token=token, timeout_ms=timeout,
                               server_nonce=nonce, server_certificate=cert, endpoints=eps,
                               signature_algorithm=algorithm, signature=signature,
                               max_request_size=max_size)

    p = response(ua.CreateSessionResponse, services.CREATE_SESSION_RESPONSE, body).Parameters
    assert our_node(p.SessionId) == sid and our_node(p.AuthenticationToken) == token
    assert p.RevisedSessionTimeout == timeout
    assert (p.ServerNonce or b"", p.ServerCertificate or b"") == (nonce, cert)
    for theirs, ours in zip(p.ServerEndpoints, eps, strict=True):
        _check_endpoint(theirs, ours)
    assert p.ServerSoftwareCertificates == []
    assert (p.ServerSignature.Algorithm or "", p.ServerSignature.Signature or b"") == \
        (algorithm, signature)
    assert p.MaxRequestMessageSize == max_size


_TOKENS: list[tuple[Any, Any]] = [
    (None, None),
    (ua.AnonymousIdentityToken(PolicyId="anonymous"), b.AnonymousIdentity("anonymous")),
    (ua.AnonymousIdentityToken(PolicyId=None), b.AnonymousIdentity("")),
    (ua.UserNameIdentityToken(PolicyId="user", UserName="operator", Password=b"\x00secret",
                              EncryptionAlgorithm="http://www.w3.org/2001/04/xmlenc#rsa-oaep"),
     b.UserNameIdentity("user", "operator", b"\x00secret",
                        "http://www.w3.org/2001/04/xmlenc#rsa-oaep")),
    (ua.UserNameIdentityToken(PolicyId="user", UserName="ü", Password=b"pw"),
     b.UserNameIdentity("user", "ü", b"pw", "")),
    (ua.X509IdentityToken(PolicyId="cert", CertificateData=b"\x30\x82der"),
     b.X509Identity("cert", b"\x30\x82der")),
]


@pytest.mark.parametrize(("token", "want"), _TOKENS)
def test_activate_session_request_with_each_token(token: Any, want: Any) -> None:
    req = ua.ActivateSessionRequest(RequestHeader=ua_request_header(ua.NodeId(b"tok", 1)),
                                    Parameters=ua.ActivateSessionParameters(
        ClientSignature=ua.SignatureData("http://www.w3.org/2000/09/xmldsig#rsa-sha1", b"sig"),
        ClientSoftwareCertificates=[ua.SignedSoftwareCertificate(b"c1", b"s1"),
                                    ua.SignedSoftwareCertificate(None, b"s2")],
        LocaleIds=["de-DE", "en"], UserIdentityToken=token,
        UserTokenSignature=ua.SignatureData("alg", b"tsig")))
    r, hdr = request(req, services.ACTIVATE_SESSION)
    got = b.read_activate_session(r)
    done(r)
    assert hdr.auth_token == NodeId(b"tok", 1)
    assert got == b.ActivateSessionRequest("http://www.w3.org/2000/09/xmldsig#rsa-sha1", b"sig",
                                           ("de-DE", "en"), want, "alg", b"tsig")


def test_an_issued_token_is_kept_whole_for_the_server_to_refuse() -> None:
    token = ua.IssuedIdentityToken(PolicyId="jwt", TokenData=b"eyJ", EncryptionAlgorithm=None)
    req = ua.ActivateSessionRequest(RequestHeader=ua_request_header(),
                                    Parameters=ua.ActivateSessionParameters(
        UserIdentityToken=token))
    r, _ = request(req, services.ACTIVATE_SESSION)
    got = b.read_activate_session(r)
    done(r)
    assert isinstance(got.identity, ExtensionObject)
    assert got.identity.type_id == NodeId(b.ISSUED_TOKEN)
    assert got.identity.body == ua_binary.struct_to_binary(token)
    assert (got.signature_algorithm, got.signature, got.locale_ids) == ("", b"", ())


def test_an_identity_token_is_decoded_the_way_the_client_writes_it() -> None:
    for obj, want in [
        (services.identity_token("a"), b.AnonymousIdentity("a")),
        (services.identity_token("u", user="bob", secret=b"x", algorithm="enc"),
         b.UserNameIdentity("u", "bob", b"x", "enc")),
        (services.identity_token("c", certificate=b"der"), b.X509Identity("c", b"der")),
    ]:
        assert b.read_identity_token(obj) == want
    xml = ExtensionObject(NodeId(services.ANONYMOUS_TOKEN), b"<x/>", 2)
    assert b.read_identity_token(xml) is xml
    with pytest.raises(DecodeError):
        b.read_identity_token(ExtensionObject(NodeId(services.USER_NAME_TOKEN), b"\x01\x00"))


@FAST
@given(st.binary(max_size=32), st.lists(u32, max_size=3))
def test_activate_session_response(nonce: bytes, results: list[int]) -> None:
    p = response(ua.ActivateSessionResponse, services.ACTIVATE_SESSION_RESPONSE,
                 lambda w: b.write_activate_session(w, nonce, results)).Parameters
    assert (p.ServerNonce or b"") == nonce
    assert [s.value for s in p.Results] == results
    assert p.DiagnosticInfos == []
    # and the client of our own reads it
    w = Writer()
    b.write_activate_session(w, nonce, results)
    assert services.read_activate_session(Reader(w.getvalue())) == (nonce, results)


@pytest.mark.parametrize("delete", [True, False])
def test_close_session_request(delete: bool) -> None:
    req = ua.CloseSessionRequest(RequestHeader=ua_request_header(), DeleteSubscriptions=delete)
    r, _ = request(req, services.CLOSE_SESSION)
    got = b.read_close_session(r)
    done(r)
    assert got == b.CloseSessionRequest(delete)


# ---------------------------------------------------------------------------------
# Browsing

browse_descriptions = st.builds(b.BrowseDescription, nodeids, st.integers(0, 2), nodeids,
                                st.booleans(), st.integers(0, 255), st.integers(0, 63))


@FAST
@given(nodeids, u32, st.lists(browse_descriptions, max_size=4))
def test_browse_request(view: NodeId, limit: int, nodes: list[b.BrowseDescription]) -> None:
    req = ua.BrowseRequest(RequestHeader=ua_request_header(), Parameters=ua.BrowseParameters(
        View=ua.ViewDescription(ViewId=ua_node(view), Timestamp=datetime(2020, 1, 1),
                                ViewVersion=3),
        RequestedMaxReferencesPerNode=limit,
        NodesToBrowse=[ua.BrowseDescription(
            NodeId=ua_node(n.node_id), BrowseDirection=ua.BrowseDirection(n.direction),
            ReferenceTypeId=ua_node(n.reference_type), IncludeSubtypes=n.include_subtypes,
            NodeClassMask=n.node_class_mask, ResultMask=n.result_mask) for n in nodes]))
    r, _ = request(req, services.BROWSE)
    got = b.read_browse(r)
    done(r)
    assert got == b.BrowseRequest(view, limit, tuple(nodes))


node_classes = st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64, 128])
references = st.builds(b.ReferenceDescription, nodeids, st.booleans(), nodeids | expanded,
                       qnames, ltexts, node_classes, st.none() | nodeids | expanded)
browse_results = st.builds(b.BrowseResult, u32, st.binary(max_size=16),
                           st.lists(references, max_size=3))


def _check_browse_results(theirs: list[ua.BrowseResult], ours: list[b.BrowseResult]) -> None:
    assert len(theirs) == len(ours)
    for t, o in zip(theirs, ours, strict=True):
        assert t.StatusCode.value == o.status
        assert (t.ContinuationPoint or b"") == o.continuation_point
        assert [(our_node(x.ReferenceTypeId), x.IsForward, our_expanded(x.NodeId),
                 our_qname(x.BrowseName), our_text(x.DisplayName), x.NodeClass.value,
                 our_expanded(x.TypeDefinition)) for x in t.References] == \
            [(x.reference_type, x.is_forward, as_expanded(x.target), x.browse_name,
              x.display_name, x.node_class,
              as_expanded(NodeId(0) if x.type_definition is None else x.type_definition))
             for x in o.references]


@FAST
@given(st.lists(browse_results, max_size=3))
def test_browse_response(results: list[b.BrowseResult]) -> None:
    msg = response(ua.BrowseResponse, services.BROWSE_RESPONSE,
                   lambda w: b.write_browse(w, results))
    _check_browse_results(msg.Results, results)
    assert msg.DiagnosticInfos == []


def test_the_client_reads_a_browse_response_as_we_wrote_it() -> None:
    ref = b.ReferenceDescription(NodeId(47), True, NodeId("Unit", 2), QualifiedName("Unit", 2),
                                 LocalizedText("Unit"), 1, NodeId(58))
    w = Writer()
    b.write_browse(w, [b.BrowseResult(0, b"\x01", [ref]), b.BrowseResult(0x80340000)])
    r = Reader(w.getvalue())
    got = services.read_browse_results(r)
    services.skip_diagnostics(r)
    done(r)
    assert got == [(0, b"\x01", [services.Reference(NodeId(47), True, NodeId("Unit", 2),
                                                    QualifiedName("Unit", 2), "Unit", 1,
                                                    NodeId(58))]),
                   (0x80340000, b"", [])]


@FAST
@given(st.booleans(), st.none() | st.lists(blobs, max_size=4))
def test_browse_next_request(release: bool, points: list[bytes | None] | None) -> None:
    req = ua.BrowseNextRequest(RequestHeader=ua_request_header(),
                               Parameters=ua.BrowseNextParameters(
        ReleaseContinuationPoints=release, ContinuationPoints=points))
    r, _ = request(req, services.BROWSE_NEXT)
    got = b.read_browse_next(r)
    done(r)
    assert got == b.BrowseNextRequest(release, tuple(p or b"" for p in points or []))


@FAST
@given(st.lists(browse_results, max_size=3))
def test_browse_next_response(results: list[b.BrowseResult]) -> None:
    p = response(ua.BrowseNextResponse, services.BROWSE_NEXT_RESPONSE,
                 lambda w: b.write_browse_next(w, results)).Parameters
    _check_browse_results(p.Results, results)
    assert p.DiagnosticInfos == []


path_elements = st.builds(b.RelativePathElement, nodeids, st.booleans(), st.booleans(), qnames)
browse_paths = st.builds(b.BrowsePath, nodeids,
                         st.lists(path_elements, max_size=4).map(tuple))


@FAST
@given(st.lists(browse_paths, max_size=4))
def test_translate_request(paths: list[b.BrowsePath]) -> None:
    req = ua.TranslateBrowsePathsToNodeIdsRequest(
        RequestHeader=ua_request_header(),
        Parameters=ua.TranslateBrowsePathsToNodeIdsParameters(BrowsePaths=[
            ua.BrowsePath(StartingNode=ua_node(p.start), RelativePath=ua.RelativePath(Elements=[
                ua.RelativePathElement(ReferenceTypeId=ua_node(e.reference_type),
                                       IsInverse=e.is_inverse,
                                       IncludeSubtypes=e.include_subtypes,
                                       TargetName=ua_qname(e.target_name))
                for e in p.elements])) for p in paths]))
    r, _ = request(req, services.TRANSLATE)
    got = b.read_translate(r)
    done(r)
    assert got == tuple(paths)


targets = st.one_of(nodeids, expanded, st.tuples(nodeids | expanded, st.integers(0, 10)))


@FAST
@given(st.lists(st.builds(b.BrowsePathResult, u32, st.lists(targets, max_size=3)),
                max_size=3))
def test_translate_response(results: list[b.BrowsePathResult]) -> None:
    msg = response(ua.TranslateBrowsePathsToNodeIdsResponse, services.TRANSLATE_RESPONSE,
                   lambda w: b.write_translate(w, results))
    assert msg.DiagnosticInfos == []
    for t, o in zip(msg.Results, results, strict=True):
        assert t.StatusCode.value == o.status
        assert [(our_expanded(x.TargetId), x.RemainingPathIndex) for x in t.Targets] == \
            [(as_expanded(x[0]), x[1]) if isinstance(x, tuple)
             else (as_expanded(x), b.NO_REMAINING_PATH) for x in o.targets]


@FAST
@given(st.none() | st.lists(nodeids, max_size=5))
def test_register_and_unregister_nodes(nodes: list[NodeId] | None) -> None:
    wire = [ua_node(n) for n in nodes] if nodes is not None else None
    for req, tid, read in [
        (ua.RegisterNodesRequest(RequestHeader=ua_request_header(),
                                 Parameters=ua.RegisterNodesParameters(NodesToRegister=wire)),
         b.REGISTER_NODES, b.read_register_nodes),
        (ua.UnregisterNodesRequest(RequestHeader=ua_request_header(),
                                   Parameters=ua.UnregisterNodesParameters(
                                       NodesToUnregister=wire)),
         b.UNREGISTER_NODES, b.read_unregister_nodes),
    ]:
        r, _ = request(req, tid)
        got = read(r)
        done(r)
        assert got == b.RegisterNodesRequest(tuple(nodes or []))
    p = response(ua.RegisterNodesResponse, b.REGISTER_NODES_RESPONSE,
                 lambda w: b.write_register_nodes(w, nodes or [])).Parameters
    assert [our_node(n) for n in p.RegisteredNodeIds] == (nodes or [])
    response(ua.UnregisterNodesResponse, b.UNREGISTER_NODES_RESPONSE, lambda w: None)


# ---------------------------------------------------------------------------------
# Attributes and methods

read_ids = st.builds(b.ReadValueId, nodeids, st.integers(1, 27), names, qnames)


@FAST
@given(st.floats(0, 1e9), st.integers(0, 3), st.lists(read_ids, max_size=4), st.booleans())
def test_read_request(max_age: float, timestamps: int, nodes: list[b.ReadValueId],
                      null_range: bool) -> None:
    req = ua.ReadRequest(RequestHeader=ua_request_header(), Parameters=ua.ReadParameters(
        MaxAge=max_age, TimestampsToReturn=ua.TimestampsToReturn(timestamps),
        NodesToRead=[ua.ReadValueId(
            NodeId=ua_node(n.node_id), AttributeId=n.attribute_id,
            IndexRange=None if null_range and not n.index_range else n.index_range,
            DataEncoding=ua_qname(n.data_encoding)) for n in nodes]))
    r, _ = request(req, services.READ)
    got = b.read_read(r)
    done(r)
    assert got == b.ReadRequest(max_age, timestamps, tuple(nodes))


@FAST
@given(st.lists(data_values, max_size=4))
def test_read_response(values: list[DataValue]) -> None:
    msg = response(ua.ReadResponse, services.READ_RESPONSE, lambda w: b.write_read(w, values))
    assert [our_data_value(v) for v in msg.Results] == values
    assert msg.DiagnosticInfos == []
    w = Writer()
    b.write_read(w, values)
    assert services.read_read(Reader(w.getvalue())) == values


write_values = st.builds(b.WriteValue, nodeids, st.integers(1, 27), names, data_values)


@FAST
@given(st.none() | st.lists(write_values, max_size=4))
def test_write_request(items: list[b.WriteValue] | None) -> None:
    req = ua.WriteRequest(RequestHeader=ua_request_header(), Parameters=ua.WriteParameters(
        NodesToWrite=None if items is None else [ua.WriteValue(
            NodeId=ua_node(i.node_id), AttributeId=i.attribute_id, IndexRange=i.index_range,
            Value=ua_data_value(i.value)) for i in items]))
    r, _ = request(req, services.WRITE)
    got = b.read_write(r)
    done(r)
    assert got == tuple(items or [])


@FAST
@given(st.lists(u32, max_size=5))
def test_write_response(statuses: list[int]) -> None:
    msg = response(ua.WriteResponse, services.WRITE_RESPONSE,
                   lambda w: b.write_write(w, statuses))
    assert [s.value for s in msg.Results] == statuses
    assert msg.DiagnosticInfos == []


calls = st.builds(b.CallMethodRequest, nodeids, nodeids,
                  st.lists(st.none() | variants, max_size=4).map(tuple))


@FAST
@given(st.lists(calls, max_size=3))
def test_call_request(methods: list[b.CallMethodRequest]) -> None:
    req = ua.CallRequest(RequestHeader=ua_request_header(), Parameters=ua.CallParameters(
        MethodsToCall=[ua.CallMethodRequest(
            ObjectId=ua_node(c.object_id), MethodId=ua_node(c.method_id),
            InputArguments=[ua_variant(a) for a in c.arguments]) for c in methods]))
    r, _ = request(req, services.CALL)
    got = b.read_call(r)
    done(r)
    assert got == tuple(methods)


call_results = st.builds(b.CallMethodResult, u32, st.lists(u32, max_size=3),
                         st.lists(variants, max_size=3))


@FAST
@given(st.lists(call_results, max_size=3))
def test_call_response(results: list[b.CallMethodResult]) -> None:
    msg = response(ua.CallResponse, services.CALL_RESPONSE, lambda w: b.write_call(w, results))
    assert msg.DiagnosticInfos == []
    for t, o in zip(msg.Results, results, strict=True):
        assert t.StatusCode.value == o.status
        assert [s.value for s in t.InputArgumentResults] == list(o.input_argument_results)
        assert t.InputArgumentDiagnosticInfos == []
        assert [our_variant(v) for v in t.OutputArguments] == list(o.outputs)
    w = Writer()
    b.write_call(w, results)
    assert [(c.status, c.input_statuses, c.outputs)
            for c in services.read_call(Reader(w.getvalue()))] == \
        [(c.status, list(c.input_argument_results), [v.value for v in c.outputs])
         for c in results]


# ---------------------------------------------------------------------------------
# Bad input: truncated bodies, counts beyond the bounds


def _requests() -> list[tuple[Any, int, Callable[[Reader], Any]]]:
    hdr = ua_request_header()
    node, other = ua.NodeId("Unit.Start", 2), ua.NodeId(uuid.UUID(int=5), 3)
    return [
        (ua.OpenSecureChannelRequest(RequestHeader=hdr, Parameters=ua.OpenSecureChannelParameters(
            ClientNonce=b"n" * 32, RequestedLifetime=60000)),
         services.OPEN_REQUEST, b.read_open_secure_channel),
        (ua.GetEndpointsRequest(RequestHeader=hdr, Parameters=ua.GetEndpointsParameters(
            EndpointUrl="opc.tcp://h:4840", LocaleIds=["en"], ProfileUris=["p"])),
         services.GET_ENDPOINTS, b.read_get_endpoints),
        (ua.FindServersRequest(RequestHeader=hdr, Parameters=ua.FindServersParameters(
            EndpointUrl="u", ServerUris=["s"])), b.FIND_SERVERS, b.read_find_servers),
        (ua.CreateSessionRequest(RequestHeader=hdr, Parameters=ua.CreateSessionParameters(
            ClientDescription=ua.ApplicationDescription(
                ApplicationUri="urn:c", ApplicationName=ua.LocalizedText("c"),
                DiscoveryUrls=["d"]),
            EndpointUrl="opc.tcp://h:4840", SessionName="s", ClientNonce=b"n" * 32,
            ClientCertificate=b"c", RequestedSessionTimeout=1000.0)),
         services.CREATE_SESSION, b.read_create_session),
        (ua.ActivateSessionRequest(RequestHeader=hdr, Parameters=ua.ActivateSessionParameters(
            ClientSignature=ua.SignatureData("a", b"s"), LocaleIds=["en"],
            UserIdentityToken=ua.UserNameIdentityToken(PolicyId="p", UserName="u",
                                                       Password=b"pw"))),
         services.ACTIVATE_SESSION, b.read_activate_session),
        (ua.CloseSessionRequest(RequestHeader=hdr), services.CLOSE_SESSION,
         b.read_close_session),
        (ua.BrowseRequest(RequestHeader=hdr, Parameters=ua.BrowseParameters(NodesToBrowse=[
            ua.BrowseDescription(NodeId=node, ReferenceTypeId=ua.NodeId(33))])),
         services.BROWSE, b.read_browse),
        (ua.BrowseNextRequest(RequestHeader=hdr, Parameters=ua.BrowseNextParameters(
            ContinuationPoints=[b"cp"])), services.BROWSE_NEXT, b.read_browse_next),
        (ua.TranslateBrowsePathsToNodeIdsRequest(
            RequestHeader=hdr, Parameters=ua.TranslateBrowsePathsToNodeIdsParameters(
                BrowsePaths=[ua.BrowsePath(StartingNode=node, RelativePath=ua.RelativePath(
                    Elements=[ua.RelativePathElement(TargetName=ua.QualifiedName("x", 2))]))])),
         services.TRANSLATE, b.read_translate),
        (ua.RegisterNodesRequest(RequestHeader=hdr, Parameters=ua.RegisterNodesParameters(
            NodesToRegister=[node, other])), b.REGISTER_NODES, b.read_register_nodes),
        (ua.ReadRequest(RequestHeader=hdr, Parameters=ua.ReadParameters(NodesToRead=[
            ua.ReadValueId(NodeId=node, AttributeId=13)])), services.READ, b.read_read),
        (ua.WriteRequest(RequestHeader=hdr, Parameters=ua.WriteParameters(NodesToWrite=[
            ua.WriteValue(NodeId=node, AttributeId=13,
                          Value=ua.DataValue(ua.Variant(5, ua.VariantType.Int32)))])),
         services.WRITE, b.read_write),
        (ua.CallRequest(RequestHeader=hdr, Parameters=ua.CallParameters(MethodsToCall=[
            ua.CallMethodRequest(ObjectId=node, MethodId=other,
                                 InputArguments=[ua.Variant("x", ua.VariantType.String)])])),
         services.CALL, b.read_call),
    ]


_REQUESTS = _requests()


@pytest.mark.parametrize(("req", "type_id", "read"), _REQUESTS,
                         ids=[type(req).__name__ for req, _, _ in _REQUESTS])
def test_every_truncation_of_a_request_is_a_decode_error(
        req: Any, type_id: int, read: Callable[[Reader], Any]) -> None:
    data = ua_binary.struct_to_binary(req)
    r = Reader(data)
    assert b.read_type_id(r) == type_id
    b.read_request_header(r)
    start = r.pos
    read(r)
    done(r)
    for cut in range(start, len(data)):
        r = Reader(data[:cut], start)
        with pytest.raises(DecodeError):
            read(r)


def _body(count: int, item: bytes) -> bytes:
    w = Writer()
    w.length(count)
    w.raw(item * max(count, 0))
    return w.getvalue()


def _read_value_id() -> bytes:
    w = Writer()
    w.nodeid(NodeId(85))
    w.uint32(13)
    w.string(None)
    w.qualified_name(QualifiedName(None))
    return w.getvalue()


def test_more_operations_than_the_bound_is_too_many_operations() -> None:
    head = Writer()
    head.double(0.0)
    head.uint32(0)
    item = _read_value_id()
    ok = head.getvalue() + _body(b.MAX_OPERATIONS, item)
    assert len(b.read_read(Reader(ok)).nodes) == b.MAX_OPERATIONS
    over = head.getvalue() + _body(b.MAX_OPERATIONS + 1, item)
    with pytest.raises(b.TooManyOperations) as caught:
        b.read_read(Reader(over))
    assert isinstance(caught.value, DecodeError)
    assert caught.value.status == b.BAD_TOO_MANY_OPERATIONS
    assert caught.value.pos == 12               # where the count stands
    for read in (b.read_write, b.read_call, b.read_translate, b.read_register_nodes):
        with pytest.raises(b.TooManyOperations):
            read(Reader(_body(b.MAX_OPERATIONS + 1, b"\x00" * 4)))


# the fields before each request's operation list
_BEFORE_OPERATIONS: list[tuple[Callable[[Reader], Any], bytes]] = [
    (b.read_read, b"\x00" * 12),              # max age, timestamps to return
    (b.read_write, b""),
    (b.read_call, b""),
    (b.read_browse_next, b"\x00"),            # release
    (b.read_register_nodes, b""),
    (b.read_translate, b""),
]


@pytest.mark.parametrize("count", [0x7FFFFFFF, 1_000_000, -2])
def test_a_count_the_bytes_cannot_hold_is_a_decode_error(count: int) -> None:
    w = Writer()
    w.uint32(count & 0xFFFFFFFF)
    w.raw(b"\x00" * 64)
    for read, before in _BEFORE_OPERATIONS:
        with pytest.raises(DecodeError) as caught:
            read(Reader(before + w.getvalue()))
        assert not isinstance(caught.value, b.TooManyOperations)


def _one_call_head() -> bytes:
    """A Call request's body up to its one method's input arguments."""
    w = Writer()
    w.length(1)
    w.nodeid(NodeId(1))
    w.nodeid(NodeId(2))
    return w.getvalue()


def test_an_inner_array_beyond_its_bound_is_a_plain_decode_error() -> None:
    w = Writer()
    w.string("opc.tcp://h:4840")
    null_strings = _body(b.MAX_ARRAY + 1, b"\xff\xff\xff\xff")
    with pytest.raises(DecodeError) as caught:
        b.read_get_endpoints(Reader(w.getvalue() + null_strings))
    assert not isinstance(caught.value, b.TooManyOperations)
    # a call's input arguments: null Variants, one byte each
    with pytest.raises(DecodeError) as caught:
        b.read_call(Reader(_one_call_head() + _body(b.MAX_ARRAY + 1, b"\x00")))
    assert not isinstance(caught.value, b.TooManyOperations)
    (call,) = b.read_call(Reader(_one_call_head() + _body(b.MAX_ARRAY, b"\x00")))
    assert call.arguments == (None,) * b.MAX_ARRAY
