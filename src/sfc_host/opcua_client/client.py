"""A session on one OPC UA server: the endpoints asked for, the secure channel opened,
the session created and activated (anonymous, a user name or an X.509 user), and the
services a host needs of a PLC: Read, Write, Call, Browse, TranslateBrowsePaths and
subscriptions (``subscription.py``).

Every service takes many operations in one request (``read`` of many nodes, ``call`` of
many methods): a caller that has several at once sends one request, not several. A
session with nothing to do reads the server's state now and then, so the server keeps
it and a dead connection is found (``closed``); reconnecting is the caller's, with a
new ``Client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from sfc_fast.wire.uabinary import (
    DataValue,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
)
from sfc_host.opcua_client import services
from sfc_host.opcua_client.batch import Batch
from sfc_host.opcua_client.channel import Channel
from sfc_host.opcua_client.errors import BadStatus, ChannelError, OpcUaError
from sfc_host.opcua_client.security import (
    BASIC256SHA256,
    MODE_NONE,
    POLICY_NONE,
    ChannelSecurity,
    encrypt_secret,
    first_certificate,
    verify_signature,
)
from sfc_host.opcua_client.services import CallResult, Endpoint, Reference
from sfc_host.opcua_client.subscription import Publisher, Subscription

log = logging.getLogger("sfc_host.opcua_client")

NAMESPACE_ARRAY = NodeId(2255)
SERVER_STATE = NodeId(2259)
SESSION_TIMEOUT_MS = 60_000.0
KEEPALIVE_S = 5.0               # an idle session's read of the server state


async def get_endpoints(url: str, timeout_s: float = 5.0) -> list[Endpoint]:
    """The server's endpoints, asked for on a channel without security."""
    ch = Channel(url, ChannelSecurity(MODE_NONE), timeout_s)
    await ch.open()
    try:
        w = Writer()
        services.write_get_endpoints(w, url)
        return services.read_endpoints(await ch.request(services.GET_ENDPOINTS,
                                                        w.getvalue()))
    finally:
        await ch.close()


def find_endpoint(endpoints: Sequence[Endpoint], mode: int) -> Endpoint:
    """The endpoint for ``mode``: Basic256Sha256 for the secure modes."""
    policy = POLICY_NONE if mode == MODE_NONE else BASIC256SHA256
    for ep in endpoints:
        if ep.mode == mode and ep.policy_uri == policy:
            return ep
    have = ", ".join(sorted({f"{_MODE_NAMES.get(e.mode, e.mode)} "
                             f"{e.policy_uri.rpartition('#')[2]}" for e in endpoints}))
    raise OpcUaError(f"the server offers no endpoint for {_MODE_NAMES.get(mode, mode)} "
                     f"{policy.rpartition('#')[2]} (it offers: {have or 'none'})")


_MODE_NAMES = {1: "None", 2: "Sign", 3: "SignAndEncrypt"}


class Client:
    """A session. ``await connect()``, then the services; ``closed`` is done when the
    connection is gone."""

    def __init__(self, url: str, *, mode: int = MODE_NONE, certificate: bytes | None = None,
                 private_key: Any = None, server_certificate: bytes | None = None,
                 username: str = "", password: str = "", user_certificate: bytes | None = None,
                 user_key: Any = None, application_uri: str = "urn:sfc-fast:client",
                 name: str = "sfc-host", timeout_s: float = 5.0) -> None:
        self.url = url
        self.mode = mode
        self.certificate = certificate
        self.private_key = private_key
        self.server_certificate = server_certificate
        self.username = username
        self.password = password
        self.user_certificate = user_certificate
        self.user_key = user_key
        self.application_uri = application_uri
        self.name = name
        self.timeout_s = timeout_s
        self.channel: Channel | None = None
        self.session: services.Session | None = None
        self.subscriptions: dict[int, Subscription] = {}
        self._namespaces: list[str] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._publisher: Publisher | None = None
        self._batches: dict[tuple[int, int], Batch] = {}

    @property
    def closed(self) -> asyncio.Future[None]:
        assert self.channel is not None and self.channel.closed is not None
        return self.channel.closed

    @property
    def connected(self) -> bool:
        return self.channel is not None and self.channel.closed is not None \
            and not self.channel.closed.done()

    async def connect(self, endpoint: Endpoint | None = None) -> None:
        """Open the channel and the session. ``endpoint`` (from ``get_endpoints``)
        saves asking for it again; its certificate must be ``server_certificate``
        when one is given."""
        if endpoint is None:
            endpoint = find_endpoint(await get_endpoints(self.url, self.timeout_s), self.mode)
        server_cert = self.server_certificate or endpoint.server_certificate
        if self.mode != MODE_NONE and not server_cert:
            raise OpcUaError(f"{self.url}: the endpoint has no server certificate")
        security = ChannelSecurity(self.mode, self.certificate, self.private_key,
                                   server_cert if self.mode != MODE_NONE else None)
        ch = self.channel = Channel(self.url, security, self.timeout_s)
        await ch.open()
        try:
            await self._create_session(endpoint, server_cert)
        except BaseException:
            ch.abort()
            raise
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _create_session(self, endpoint: Endpoint, server_cert: bytes) -> None:
        ch = self.channel
        assert ch is not None
        nonce = ch.security.nonce()
        w = Writer()
        services.write_create_session(w, application_uri=self.application_uri,
                                      name=self.name, url=self.url, nonce=nonce,
                                      certificate=self.certificate
                                      if self.mode != MODE_NONE else None,
                                      timeout_ms=SESSION_TIMEOUT_MS)
        s = services.read_create_session(await ch.request(services.CREATE_SESSION,
                                                          w.getvalue()))
        if self.mode != MODE_NONE:
            if s.certificate and \
                    first_certificate(s.certificate) != first_certificate(server_cert):
                raise OpcUaError(f"{self.url}: the session's server certificate is not "
                                 "the endpoint's")
            verify_signature(server_cert, s.signature, (self.certificate or b"") + nonce,
                             f"{self.url}: the server's session signature")
        self.session = s
        ch.auth_token = s.token
        algorithm, signature = ch.security.client_signature(server_cert, s.nonce)
        token, token_alg, token_sig = self._identity(endpoint, s.nonce, server_cert)
        w = Writer()
        services.write_activate_session(w, algorithm=algorithm, signature=signature,
                                        token=token, token_algorithm=token_alg,
                                        token_signature=token_sig)
        nonce2, _results = services.read_activate_session(
            await ch.request(services.ACTIVATE_SESSION, w.getvalue()))
        s.nonce = nonce2 or s.nonce

    def _identity(self, endpoint: Endpoint, server_nonce: bytes,
                  server_cert: bytes) -> tuple[Any, str, bytes]:
        kind = 1 if self.username else 2 if self.user_certificate else 0
        policy = next((p for p in endpoint.user_tokens if p.token_type == kind), None)
        if policy is None:
            what = ("user name", "X.509 user", "anonymous")[kind - 1 if kind else 2]
            raise OpcUaError(f"{self.url}: the endpoint takes no {what} sessions")
        uri = policy.policy_uri or endpoint.policy_uri
        if kind == 1:
            secret, alg = encrypt_secret(uri, server_cert, self.password.encode(),
                                         server_nonce)
            if not alg and endpoint.mode == MODE_NONE:
                log.warning("OPC UA %s: the password goes in clear text (security None, "
                            "and the endpoint's user policy encrypts nothing)", self.url)
            return services.identity_token(policy.policy_id, user=self.username,
                                           secret=secret, algorithm=alg), "", b""
        if kind == 2:
            assert self.user_certificate is not None
            sig = ChannelSecurity(2, self.user_certificate, self.user_key, server_cert) \
                .client_signature(server_cert, server_nonce)
            return (services.identity_token(policy.policy_id,
                                            certificate=self.user_certificate),
                    sig[0], sig[1])
        return services.identity_token(policy.policy_id), "", b""

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive
        if self._publisher is not None:
            self._publisher.stop()
        ch = self.channel
        if ch is None:
            return
        if self.connected and self.session is not None:
            w = Writer()
            w.boolean(True)                 # its subscriptions too
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ch.request(services.CLOSE_SESSION, w.getvalue()), 2.0)
        await ch.close()

    async def _keep_alive(self) -> None:
        """Read the server's state when the session has been quiet: the server keeps
        the session, and a connection that died without a word is found."""
        ch = self.channel
        assert ch is not None
        seen = -1
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            if ch.responses != seen:        # answered since: alive
                seen = ch.responses
                continue
            try:
                await self.read([(SERVER_STATE, services.VALUE)])
            except (TimeoutError, BadStatus) as e:
                ch.abort(ChannelError(f"{self.url}: the server did not answer ({e})"))
                return
            except ChannelError:
                return
            seen = ch.responses

    # ---- services

    async def request(self, type_id: int, w: Writer, timeout_s: float | None = None) -> Reader:
        return await self._send(type_id, w.getvalue(), timeout_s)

    async def read(self, items: list[tuple[NodeId, int]], timestamps: int = 0) -> list[DataValue]:
        """DataValues of (node, attribute) pairs, in one request with the other reads
        of this event-loop pass (``batch``)."""
        if not items:
            return []                       # a server refuses an empty request
        return await self._batch(services.READ, timestamps).add(items)

    async def read_values(self, nodes: Sequence[NodeId]) -> list[Any]:
        """The nodes' values; a Bad status raises ``BadStatus`` naming the node."""
        values = await self.read([(n, services.VALUE) for n in nodes])
        out = []
        for node, dv in zip(nodes, values, strict=True):
            if dv.status & 0x80000000:
                raise BadStatus(dv.status, f"read {node}")
            out.append(None if dv.value is None else dv.value.value)
        return out

    async def write(self, items: list[tuple[NodeId, Variant]]) -> list[int]:
        """Write values; the status of each (0 Good). One request with the other
        writes of this event-loop pass."""
        if not items:
            return []                       # a server refuses an empty request
        return await self._batch(services.WRITE).add(items)

    async def write_values(self, items: list[tuple[NodeId, Variant]]) -> None:
        """Write values; the first Bad status raises ``BadStatus`` naming its node."""
        for (node, _v), status in zip(items, await self.write(items), strict=True):
            if status & 0x80000000:
                raise BadStatus(status, f"write {node}")

    async def call(self, calls: list[tuple[NodeId, NodeId, list[Variant]]]) -> list[CallResult]:
        """Call methods (object, method, input arguments), in one request with the
        other calls of this event-loop pass."""
        if not calls:
            return []                       # a server refuses an empty request
        return await self._batch(services.CALL).add(calls)

    def _batch(self, type_id: int, option: int = 0) -> Batch:
        b = self._batches.get((type_id, option))
        if b is None:
            if type_id == services.READ:
                def write(w: Writer, items: list[Any]) -> None:
                    services.write_read(w, items, option)
                b = Batch(self._send, type_id, write, services.read_read)
            elif type_id == services.WRITE:
                b = Batch(self._send, type_id, services.write_write, services.read_statuses)
            else:
                b = Batch(self._send, type_id, services.write_call, services.read_call)
            self._batches[(type_id, option)] = b
        return b

    def _send(self, type_id: int, body: bytes,
              timeout_s: float | None = None) -> asyncio.Future[Reader]:
        ch = self.channel
        if ch is None:
            raise ChannelError(f"{self.url}: not connected")
        return ch.request(type_id, body, timeout_s)

    async def browse(self, node: NodeId, reference_type: int = services.HIERARCHICAL, *,
                     forward: bool = True, node_class_mask: int = 0) -> list[Reference]:
        """Every reference of ``node`` of the type (and its subtypes), following the
        continuation points."""
        w = Writer()
        services.write_browse(w, [node], NodeId(reference_type), forward=forward,
                              node_class_mask=node_class_mask)
        [(status, point, refs)] = services.read_browse_results(
            await self.request(services.BROWSE, w))
        if status & 0x80000000:
            raise BadStatus(status, f"browse {node}")
        while point:
            w = Writer()
            services.write_browse_next(w, [point])
            [(status, point, more)] = services.read_browse_results(
                await self.request(services.BROWSE_NEXT, w))
            if status & 0x80000000:
                raise BadStatus(status, f"browse {node}")
            refs.extend(more)
        return refs

    async def translate(self, paths: list[tuple[NodeId, list[QualifiedName]]]
                        ) -> list[NodeId | None]:
        """The node at each browse path (hierarchical references), None where there
        is none."""
        if not paths:
            return []                       # a server refuses an empty request
        w = Writer()
        services.write_translate(w, paths)
        out: list[NodeId | None] = []
        for status, targets in services.read_translate(
                await self.request(services.TRANSLATE, w)):
            out.append(targets[0] if not status & 0x80000000 and targets else None)
        return out

    async def child(self, node: NodeId, *names: QualifiedName) -> NodeId:
        """The node at a browse path; ``BadNoMatch`` when there is none."""
        [found] = await self.translate([(node, list(names))])
        if found is None:
            path = "/".join(f"{n.namespace}:{n.name}" for n in names)
            raise BadStatus(0x806F0000, f"{node} has no {path}")
        return found

    async def arguments(self, method: NodeId,
                        which: str = "InputArguments") -> list[services.Argument]:
        """A method's declared input (or ``OutputArguments``) arguments; none when the
        method declares none."""
        [prop] = await self.translate([(method, [QualifiedName(which, 0)])])
        if prop is None:
            return []
        [value] = await self.read_values([prop])
        return services.read_arguments(value)

    async def namespace_index(self, uri: str, *, fresh: bool = False) -> int:
        """The index of a namespace URI in the server's namespace array."""
        if self._namespaces is None or fresh or uri not in self._namespaces:
            [ns] = await self.read_values([NAMESPACE_ARRAY])
            self._namespaces = list(ns or [])
        try:
            return self._namespaces.index(uri)
        except ValueError:
            raise OpcUaError(f"{self.url}: the server has no namespace {uri}") from None

    async def node(self, text: str) -> NodeId:
        """A node id as settings write it: ``ns=3;s=Filler1``, or with the namespace's
        URI, ``nsu=urn:plant:units;s=Filler1``, which stays right when a server numbers
        its namespaces anew."""
        if text.startswith("nsu="):
            uri, sep, rest = text[4:].partition(";")
            if not sep:
                raise ValueError(f"node id {text!r}: nsu=URI;s=… or nsu=URI;i=…")
            text = f"ns={await self.namespace_index(uri)};{rest}"
        return NodeId.parse(text)

    async def create_subscription(self, interval_ms: float, handler: Any, *,
                                  keepalive: int = 100, lifetime: int = 0) -> Subscription:
        """A subscription whose notifications go to ``handler`` (``subscription.py``)."""
        if self._publisher is None:
            self._publisher = Publisher(self)
        return await Subscription.create(self, self._publisher, interval_ms, handler,
                                         keepalive=keepalive, lifetime=lifetime)
