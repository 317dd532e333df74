"""The server: endpoints, sessions and the services over an ``AddressSpace``.

Each request is read with the compiled codec and answered in the same loop pass where
it can be: Browse, Read, Write, Translate and the subscription services never make a
task. A method's callback is the owner's (``methods.add``) and may be a coroutine; a
read of a value may wait for the owner first (``before_read``: the face brings a list
up to date). Events go out through ``subscriptions``: encoded once, whatever the number
of subscribers (docs/design.md, "The OPC UA face on a server of our own").

What a user may do is the owner's to say (``allowed``); who a user is, too
(``identify``); and which client applications are trusted (``trusts``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sfc_fast.wire.uabinary import (
    DataValue,
    DecodeError,
    EncodeError,
    LocalizedText,
    NodeId,
    Reader,
    Writer,
)
from sfc_host.opcua_client import BASIC256SHA256, MODE_NONE, POLICY_NONE, services
from sfc_host.opcua_server import bodies
from sfc_host.opcua_server.channel import ServerChannel
from sfc_host.opcua_server.methods import MethodTable
from sfc_host.opcua_server.nodes import VARIABLE, AddressSpace
from sfc_host.opcua_server.sessions import (
    ANONYMOUS,
    CERTIFICATE,
    USER_NAME,
    Identity,
    Refused,
    Session,
    Sessions,
    UserToken,
)
from sfc_host.opcua_server.subscriptions import Event, Subscriptions

log = logging.getLogger("sfc_host.opcua_server")

BAD_SERVICE_UNSUPPORTED = 0x800B0000
BAD_DECODING_ERROR = 0x80070000
BAD_ENCODING_ERROR = 0x80060000
BAD_INTERNAL_ERROR = 0x80020000
BAD_TOO_MANY_OPERATIONS = 0x80100000
BAD_NOTHING_TO_DO = 0x800F0000
BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_ATTRIBUTE_ID_INVALID = 0x80350000
BAD_NOT_WRITABLE = 0x803B0000
BAD_TYPE_MISMATCH = 0x80740000
BAD_USER_ACCESS_DENIED = 0x801F0000
BAD_CONTINUATION_POINT_INVALID = 0x804A0000
BAD_IDENTITY_TOKEN_INVALID = 0x80200000
BAD_INDEX_RANGE_INVALID = 0x80360000

VALUE = 13
ACCESS_LEVEL = 17
CURRENT_WRITE = 0x02
MAX_BROWSE_POINTS = 16          # continuation points a session keeps
_DISCOVERY = frozenset({services.GET_ENDPOINTS, bodies.FIND_SERVERS})
_SESSIONLESS = _DISCOVERY | {services.CREATE_SESSION, services.ACTIVATE_SESSION}
BAD_SECURITY_POLICY_REJECTED = 0x80550000

Allowed = Callable[[Any, str, NodeId], bool]
"""(user, "call" or "write", node) -> whether the user may."""


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What the server says of itself in its endpoints."""
    url: str
    application_uri: str
    product_uri: str
    name: str


class Server:
    """An OPC UA server over ``space``. ``modes`` are the message security modes
    offered (1 None, 2 Sign, 3 SignAndEncrypt, Basic256Sha256 for the last two);
    ``user_tokens`` the identity token types (0 anonymous, 1 user name, 2 X.509)."""

    def __init__(self, space: AddressSpace, me: ServerIdentity, *,
                 modes: Sequence[int] = (MODE_NONE,), certificate: bytes | None = None,
                 private_key: Any = None, user_tokens: Sequence[int] = (ANONYMOUS,),
                 identify: Callable[[Identity], Any] | None = None,
                 trusts: Callable[[bytes], int] | None = None,
                 allowed: Allowed | None = None) -> None:
        if any(m != MODE_NONE for m in modes) and (certificate is None or private_key is None):
            raise ValueError("Sign and SignAndEncrypt need the server's certificate and key")
        self.space = space
        self.me = me
        self.modes = frozenset(modes)
        self.certificate = certificate
        self.private_key = private_key
        self.user_tokens = tuple(user_tokens)
        self._identify = identify or _anonymous_only
        self._trusts = trusts or (lambda _der: 0)
        self.allowed: Allowed = allowed or (lambda _user, _what, _node: True)
        self.methods = MethodTable(space)
        self.subscriptions: Subscriptions | None = None
        self.sessions: Sessions | None = None
        self._read_hooks: dict[NodeId, Callable[[NodeId], Awaitable[None]]] = {}
        self._channels: set[ServerChannel] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handlers: dict[int, Callable[..., None]] = {
            services.GET_ENDPOINTS: self._get_endpoints,
            bodies.FIND_SERVERS: self._find_servers,
            services.CREATE_SESSION: self._create_session,
            services.ACTIVATE_SESSION: self._activate_session,
            services.CLOSE_SESSION: self._close_session,
            services.BROWSE: self._browse,
            services.BROWSE_NEXT: self._browse_next,
            services.TRANSLATE: self._translate,
            services.READ: self._read,
            services.WRITE: self._write,
            services.CALL: self._call,
            bodies.REGISTER_NODES: self._register_nodes,
            bodies.UNREGISTER_NODES: self._unregister_nodes,
        }

    # ---- life

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Listen at the endpoint's address (or ``host``/``port``: port 0 for a free
        one, then see ``port``)."""
        loop = self._loop = asyncio.get_running_loop()
        self.subscriptions = Subscriptions(self.space, loop)
        self.sessions = Sessions(self._identify, self._session_closed)
        u = urlsplit(self.me.url)
        self._server = await loop.create_server(
            lambda: ServerChannel(self), host if host is not None else u.hostname,
            port if port is not None else (u.port or 4840), reuse_address=True)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for ch in list(self._channels):
            ch.close()
        if self.sessions is not None:
            self.sessions.close_all()
        if self.subscriptions is not None:
            self.subscriptions.close()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # ---- the owner's hooks

    def before_read(self, node: NodeId, hook: Callable[[NodeId], Awaitable[None]]) -> None:
        """``hook`` runs, and is awaited, before a Read of ``node``'s value."""
        self._read_hooks[node] = hook

    def raise_event(self, notifier: NodeId, event: Event) -> None:
        if self.subscriptions is not None:
            self.subscriptions.raise_event(notifier, event)

    def takes_events(self, notifier: NodeId) -> bool:
        return self.subscriptions is not None and self.subscriptions.watches_events(notifier)

    # ---- ChannelOwner

    def trusts(self, certificate: bytes) -> int:
        return self._trusts(certificate)

    def channel_closed(self, channel: ServerChannel) -> None:
        self._channels.discard(channel)

    def request(self, channel: ServerChannel, request_id: int, type_id: int,
                body: Reader) -> None:
        self._channels.add(channel)
        assert self._loop is not None       # started
        try:
            header = bodies.read_request_header(body)
        except DecodeError as e:
            channel.close(BAD_DECODING_ERROR, f"a request header that cannot be read: {e}")
            return
        handler = self._handlers.get(type_id)
        sessions = self.sessions
        assert sessions is not None and self.subscriptions is not None
        reply = _Reply(channel, request_id, type_id + 3, header.handle,
                       self._loop.time() + header.timeout_ms / 1000
                       if header.timeout_ms else float("inf"))
        reply.auth_token = header.auth_token
        if MODE_NONE not in self.modes and type_id not in _DISCOVERY and \
                channel.security is not None and channel.security.mode == MODE_NONE:
            # a channel without security is for discovery only, unless None is offered
            reply.fail(BAD_SECURITY_POLICY_REJECTED)
            return
        try:
            if type_id in _SESSIONLESS:
                assert handler is not None
                handler(reply, body)
                return
            session = sessions.find(channel, header.auth_token,
                                    activated=type_id != services.CLOSE_SESSION)
            if type_id in self.subscriptions.SERVICES:
                self.subscriptions.request(session.session_id, type_id, body, reply)
            elif handler is not None:
                handler(reply, body, session)
            else:
                reply.fail(BAD_SERVICE_UNSUPPORTED)
        except Refused as e:
            log.info("OPC UA %s: %s", channel.peer, e)
            reply.fail(e.status)
        except DecodeError as e:
            status = getattr(e, "status", None) or BAD_DECODING_ERROR
            log.warning("OPC UA %s: a request that cannot be read: %s", channel.peer, e)
            reply.fail(status)
        except EncodeError as e:
            log.error("OPC UA %s: a response that cannot be written: %s", channel.peer, e)
            reply.fail(BAD_ENCODING_ERROR)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- discovery

    def endpoints(self) -> list[bodies.EndpointDescription]:
        app = self._application()
        out = []
        for mode in sorted(self.modes, reverse=True):
            secure = mode != MODE_NONE
            tokens = []
            for t in self.user_tokens:
                if t == CERTIFICATE and not secure:
                    continue
                name = {ANONYMOUS: "anonymous", USER_NAME: "username",
                        CERTIFICATE: "certificate"}[t]
                tokens.append(bodies.UserTokenPolicy(name, t, ""))
            out.append(bodies.EndpointDescription(
                self.me.url, app, self.certificate or b"", mode,
                BASIC256SHA256 if secure else POLICY_NONE, tuple(tokens),
                {1: 0, 2: 10, 3: 20}[mode]))
        return out

    def _application(self) -> bodies.ApplicationDescription:
        return bodies.ApplicationDescription(
            self.me.application_uri, self.me.product_uri, LocalizedText(self.me.name),
            0, "", "", (self.me.url,))

    def _get_endpoints(self, reply: _Reply, r: Reader) -> None:
        bodies.read_get_endpoints(r)
        w = reply.writer()
        bodies.write_get_endpoints(w, self.endpoints())
        reply.send(w)

    def _find_servers(self, reply: _Reply, r: Reader) -> None:
        bodies.read_find_servers(r)
        w = reply.writer()
        bodies.write_find_servers(w, [self._application()])
        reply.send(w)

    # ---- sessions

    def _create_session(self, reply: _Reply, r: Reader) -> None:
        req = bodies.read_create_session(r)
        assert self.sessions is not None
        channel = reply.channel
        session = self.sessions.create(channel, req.session_name, req.requested_timeout_ms,
                                       req.client_certificate or None)
        algorithm, signature = "", b""
        sec = channel.security
        if sec is not None and sec.mode != MODE_NONE and req.client_certificate:
            algorithm, signature = sec.client_signature(req.client_certificate,
                                                        req.client_nonce)
        w = reply.writer()
        bodies.write_create_session(
            w, session_id=session.session_id, auth_token=session.token,
            timeout_ms=session.timeout_s * 1000, server_nonce=session.nonce,
            server_certificate=self.certificate or b"", endpoints=self.endpoints(),
            signature_algorithm=algorithm, signature=signature)
        reply.send(w)

    def _activate_session(self, reply: _Reply, r: Reader) -> None:
        req = bodies.read_activate_session(r)
        assert self.sessions is not None
        token = _user_token(req.identity, self.user_tokens)
        session = self.sessions.activate(
            reply.channel, reply.auth_token, req.signature, token, req.token_signature,
            self.certificate, self.private_key)
        w = reply.writer()
        bodies.write_activate_session(w, session.nonce)
        reply.send(w)

    def _close_session(self, reply: _Reply, r: Reader, session: Session) -> None:
        bodies.read_close_session(r)
        assert self.sessions is not None
        self.sessions.close(session.token)
        reply.send(reply.writer())

    def _session_closed(self, session: Session) -> None:
        if self.subscriptions is not None:
            self.subscriptions.close_session(session.session_id)

    # ---- views

    def _browse(self, reply: _Reply, r: Reader, session: Session) -> None:
        req = bodies.read_browse(r)
        limit = req.max_references
        results = []
        for d in req.nodes:
            found = self.space.browse(d.node_id, d.direction, d.reference_type,
                                      d.include_subtypes, d.node_class_mask, d.result_mask)
            if isinstance(found, int):
                results.append(bodies.BrowseResult(found))
                continue
            refs = [_reference(x) for x in found]
            results.append(self._page(session, refs, limit))
        w = reply.writer()
        bodies.write_browse(w, results)
        reply.send(w)

    def _page(self, session: Session, refs: list[bodies.ReferenceDescription],
              limit: int) -> bodies.BrowseResult:
        if not limit or len(refs) <= limit:
            return bodies.BrowseResult(0, b"", refs)
        points = session.browse_points
        if points is None:
            points = session.browse_points = {}
        while len(points) >= MAX_BROWSE_POINTS:
            points.pop(next(iter(points)))
        key = os.urandom(16)
        points[key] = (refs[limit:], limit)
        return bodies.BrowseResult(0, key, refs[:limit])

    def _browse_next(self, reply: _Reply, r: Reader, session: Session) -> None:
        req = bodies.read_browse_next(r)
        points = session.browse_points or {}
        results = []
        for key in req.continuation_points:
            entry = points.pop(key, None)
            if entry is None:
                results.append(bodies.BrowseResult(BAD_CONTINUATION_POINT_INVALID))
            elif req.release:
                results.append(bodies.BrowseResult(0))
            else:
                refs, limit = entry
                results.append(self._page(session, refs, limit))
        w = reply.writer()
        bodies.write_browse(w, results)
        reply.send(w)

    def _translate(self, reply: _Reply, r: Reader, session: Session) -> None:
        paths = bodies.read_translate(r)
        results = []
        for p in paths:
            found = self.space.translate(p.start, [
                (e.reference_type, e.is_inverse, e.include_subtypes, e.target_name)
                for e in p.elements])
            if isinstance(found, int):
                results.append(bodies.BrowsePathResult(found))
            else:
                results.append(bodies.BrowsePathResult(0, tuple(found)))
        w = reply.writer()
        bodies.write_translate(w, results)
        reply.send(w)

    def _register_nodes(self, reply: _Reply, r: Reader, session: Session) -> None:
        req = bodies.read_register_nodes(r)
        w = reply.writer()
        bodies.write_register_nodes(w, req.nodes)
        reply.send(w)

    def _unregister_nodes(self, reply: _Reply, r: Reader, session: Session) -> None:
        bodies.read_register_nodes(r)
        reply.send(reply.writer())

    # ---- attributes

    def _read(self, reply: _Reply, r: Reader, session: Session) -> None:
        req = bodies.read_read(r)
        hooks = self._read_hooks
        if hooks and any(v.attribute_id == VALUE and v.node_id in hooks for v in req.nodes):
            self._spawn(self._read_after(reply, req))
            return
        self._answer_read(reply, req)

    async def _read_after(self, reply: _Reply, req: bodies.ReadRequest) -> None:
        done: set[NodeId] = set()
        for v in req.nodes:
            hook = self._read_hooks.get(v.node_id) if v.attribute_id == VALUE else None
            if hook is None or v.node_id in done:
                continue
            done.add(v.node_id)
            try:
                await hook(v.node_id)
            except Exception:
                log.exception("OPC UA: bringing %s up to date before a read failed",
                              v.node_id)
        self._answer_read(reply, req)

    def _answer_read(self, reply: _Reply, req: bodies.ReadRequest) -> None:
        space = self.space
        values = []
        for v in req.nodes:
            if v.index_range:
                values.append(DataValue(None, BAD_INDEX_RANGE_INVALID))
                continue
            values.append(space.read(v.node_id, v.attribute_id))
        w = reply.writer()
        bodies.write_read(w, values)
        reply.send(w)

    def _write(self, reply: _Reply, r: Reader, session: Session) -> None:
        results = []
        for v in bodies.read_write(r):
            results.append(self._write_one(session, v))
        w = reply.writer()
        bodies.write_write(w, results)
        reply.send(w)

    def _write_one(self, session: Session, v: bodies.WriteValue) -> int:
        node = self.space.get(v.node_id)
        if node is None:
            return BAD_NODE_ID_UNKNOWN
        if v.attribute_id != VALUE or node.node_class != VARIABLE:
            return BAD_NOT_WRITABLE if node.node_class == VARIABLE else \
                BAD_ATTRIBUTE_ID_INVALID
        if v.index_range:
            return BAD_INDEX_RANGE_INVALID
        if not node.attributes.get(ACCESS_LEVEL, 1) & CURRENT_WRITE:
            return BAD_NOT_WRITABLE
        if not self.allowed(session.user, "write", v.node_id):
            return BAD_USER_ACCESS_DENIED
        if not self.methods.fits(v.value.value, node):
            return BAD_TYPE_MISMATCH
        self.space.set_value(v.node_id, v.value)
        return 0

    # ---- methods

    def _call(self, reply: _Reply, r: Reader, session: Session) -> None:
        calls = bodies.read_call(r)
        if not calls:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        results: list[Any] = []
        pending = False
        for c in calls:
            res = self.methods.call(session, c.object_id, c.method_id, c.arguments,
                                    self.allowed)
            pending = pending or inspect.isawaitable(res)
            results.append(res)
        if pending:
            self._spawn(self._call_after(reply, results))
        else:
            self._answer_call(reply, results)

    async def _call_after(self, reply: _Reply, results: list[Any]) -> None:
        done = []
        for res in results:
            if inspect.isawaitable(res):
                try:
                    res = await res
                except Exception:
                    log.exception("OPC UA: a method's callback failed")
                    res = bodies.CallMethodResult(BAD_INTERNAL_ERROR)
            done.append(res)
        self._answer_call(reply, done)

    def _answer_call(self, reply: _Reply, results: list[bodies.CallMethodResult]) -> None:
        w = reply.writer()
        bodies.write_call(w, results)
        reply.send(w)


class _Reply:
    """One request's answer: a response written with its header, or a ServiceFault."""

    __slots__ = ("auth_token", "channel", "deadline", "handle", "request_id", "response")

    def __init__(self, channel: ServerChannel, request_id: int, response: int, handle: int,
                 deadline: float) -> None:
        self.channel = channel
        self.request_id = request_id
        self.response = response
        self.handle = handle
        self.deadline = deadline
        self.auth_token = NodeId(0)

    def writer(self) -> Writer:
        return bodies.start_response(self.response, self.handle)

    def send(self, w: Writer) -> None:
        self.channel.respond(self.request_id, w.getvalue())

    def ok(self, body: bytes) -> None:
        w = self.writer()
        w.raw(body)
        self.send(w)

    def fail(self, status: int) -> None:
        self.channel.respond(self.request_id, bodies.service_fault(self.handle, status))


def _anonymous_only(identity: Identity) -> Any:
    if identity.kind != ANONYMOUS:
        raise Refused(BAD_IDENTITY_TOKEN_INVALID, "only anonymous sessions are taken")
    return None


def _user_token(identity: Any, offered: Sequence[int]) -> UserToken:
    """ActivateSession's identity token as the sessions check it; a null token is
    anonymous (Part 4 §5.6.3)."""
    if identity is None or isinstance(identity, bodies.AnonymousIdentity):
        token = UserToken(ANONYMOUS, identity.policy_id if identity else "")
    elif isinstance(identity, bodies.UserNameIdentity):
        token = UserToken(USER_NAME, identity.policy_id, identity.user_name,
                          identity.password, identity.encryption_algorithm)
    elif isinstance(identity, bodies.X509Identity):
        token = UserToken(CERTIFICATE, identity.policy_id, certificate=identity.certificate)
    else:
        raise Refused(BAD_IDENTITY_TOKEN_INVALID, "an identity token of an unknown type")
    if token.kind not in offered:
        raise Refused(BAD_IDENTITY_TOKEN_INVALID,
                      f"an identity token of type {token.kind}, not offered")
    return token


def _reference(d: Any) -> bodies.ReferenceDescription:
    return bodies.ReferenceDescription(d.type_id, d.forward, d.target, d.browse_name,
                                       d.display_name, d.node_class, d.type_definition)
