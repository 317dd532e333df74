"""One OPC UA session per server, shared by every unit, method and event of it: asyncua's
client, connected with backoff until the server answers, then kept by asyncua's own
reconnect. After each connect the units' state feed (one subscription for all of them)
is made anew, so each unit's first notice is its state now and an outcome missed while
away is read from it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncua import Client, Node, ua
from asyncua.client.ua_client import UaClientState
from asyncua.crypto import security_policies, uacrypto
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from sfc_host.aio import reap
from sfc_host.equipment.opcua.settings import ServerSettings
from sfc_host.errors import SfcHostError

log = logging.getLogger("sfc_host.equipment.opcua")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
FEED_MS = 10             # the state feed's publishing interval: an outcome's delay
APPLICATION_URI = "urn:sfc-fast:equipment-client"

_MODES = {"Sign": ua.MessageSecurityMode.Sign,
          "SignAndEncrypt": ua.MessageSecurityMode.SignAndEncrypt}


class ServerLink:
    """The session to one server; ``on_connect`` hooks run after every (re)connect."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self.client: Client | None = None
        self.connected = asyncio.Event()
        self.last_error = "not connected yet"
        self.on_connect: list[Callable[[], Awaitable[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._dropping: asyncio.Task[None] | None = None
        self._closing = False
        self._feed: _Feed | None = None
        self._feed_lock = asyncio.Lock()

    async def watch(self, node: Node, handler: Any) -> None:
        """Data changes of ``node`` to ``handler.datachange_notification``, on the link's
        one state feed: one subscription for every unit, so one publish response
        carries the changes of many. Made anew after each connect (``_hooks``), its
        first notice of each node is the node's value now."""
        client = self.client
        if client is None:
            raise ConnectionError("not connected")
        async with self._feed_lock:
            feed = self._feed
            if feed is None:
                feed = _Feed()
                feed.sub = await client.create_subscription(FEED_MS, feed)
                self._feed = feed
            new = node.nodeid not in feed.handlers
            feed.handlers[node.nodeid] = handler
            if new:
                await feed.sub.subscribe_data_change(node)

    def status(self) -> str:
        """'' when connected, else why not (``/readyz``, the web view)."""
        return "" if self.connected.is_set() else self.last_error

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"opcua-{self.name}")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A link that failed on a fault of ours is said, in /readyz too, and starts
        again after the longest backoff: it must never end in silence."""
        if self._closing or task.cancelled() or task.exception() is None:
            return
        e = task.exception()
        self.connected.clear()
        self.last_error = (f"OPC UA server {self.name}: the link failed ({type(e).__name__}: "
                           f"{e}); it starts again")
        log.error("%s", self.last_error, exc_info=e)
        loop = asyncio.get_running_loop()
        client, self.client = self.client, None
        if client is not None:          # the next start makes a session of its own
            self._dropping = loop.create_task(self._drop(client))
        loop.call_later(BACKOFF_S[-1], self._again)

    def _again(self) -> None:
        if not self._closing:
            self.start()

    async def aclose(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await reap(self._task)
        client, self.client = self.client, None
        if client is not None:
            await self._drop(client)

    async def _drop(self, client: Client) -> None:
        try:
            await asyncio.wait_for(client.disconnect(), 2.0)
        except Exception as e:      # the server may be gone already
            log.debug("OPC UA server %s: disconnect: %s", self.name, e)

    async def _make(self) -> Client:
        s = self.settings
        client = Client(s.endpoint, timeout=s.timeout_s, auto_reconnect=True,
                        reconnect_max_delay=10.0)
        client.application_uri = APPLICATION_URI
        client.name = client.description = "sfc-host"
        if s.username:
            client.set_user(s.username)
            client.set_password(s.password)
        if s.security != "None":
            own = await uacrypto.load_certificate(s.certificate)
            client.application_uri = _uri_of(own) or APPLICATION_URI
            server_cert = await self._trusted_server_certificate()
            await client.set_security(security_policies.SecurityPolicyBasic256Sha256,
                                      s.certificate, s.private_key,
                                      server_certificate=uacrypto.CertProperties(
                                          server_cert, "der"),
                                      mode=_MODES[s.security])
        return client

    async def _trusted_server_certificate(self) -> bytes:
        """The server's certificate, from its endpoints, if ``trust_dir`` holds it. An
        untrusted one is refused and kept in ``trust_dir/rejected/`` for an
        administrator, who trusts it by moving it into ``trust_dir`` (taken at the next
        attempt, no restart)."""
        s = self.settings
        probe = Client(s.endpoint, timeout=s.timeout_s)
        endpoints = await probe.connect_and_get_server_endpoints()
        ep = Client.find_endpoint(endpoints, _MODES[s.security],
                                  security_policies.SecurityPolicyBasic256Sha256.URI)
        der = _first_certificate(ep.ServerCertificate)
        trusted = _trusted(Path(s.trust_dir))
        if der in trusted:
            return der
        thumb = hashlib.sha1(der).hexdigest()
        rejected = Path(s.trust_dir) / "rejected"
        rejected.mkdir(exist_ok=True)
        (rejected / f"{thumb}.der").write_bytes(der)
        raise Untrusted(f"its certificate (SHA-1 {thumb}) is not in {s.trust_dir}: refused "
                        f"and kept in {rejected}; move it into {s.trust_dir} to trust it")

    def _hint(self, e: BaseException) -> str:
        """What to check, for a refusal whose status code alone does not say it."""
        if type(e).__name__ not in _IDENTITY_REFUSED:
            return ""
        user = self.settings.username
        if not user:
            return ": the server takes no anonymous session; set username and password_env"
        return (f": the server refused user {user!r}; check username and the password in "
                "the variable password_env names")

    async def _run(self) -> None:
        fails = 0
        while not self._closing:
            try:
                client = await self._make()
                await client.connect()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.last_error = f"OPC UA server {self.name} at {self.settings.endpoint}: " \
                                  f"{_why(e)}{self._hint(e)}"
                if fails == 0 or fails % 10 == 0:
                    log.warning("%s; trying again", self.last_error)
                delay = BACKOFF_S[min(fails, len(BACKOFF_S) - 1)]
                fails += 1
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                continue
            fails = 0
            self.client = client
            log.info("OPC UA server %s at %s connected", self.name, self.settings.endpoint)
            await self._follow(client)
            return

    async def _follow(self, client: Client) -> None:
        """Until closed: the hooks after each (re)connect, the state for ``status``."""
        was = UaClientState.DISCONNECTED
        async with client.subscribe_state() as sub:
            state = client.state
            while not self._closing:
                if state is UaClientState.CONNECTED and was is not UaClientState.CONNECTED:
                    self.connected.set()
                    self.last_error = ""
                    await self._hooks()
                elif state is not UaClientState.CONNECTED and self.connected.is_set():
                    self.connected.clear()
                    self.last_error = f"OPC UA server {self.name}: connection lost, " \
                                      "reconnecting"
                    log.warning("%s", self.last_error)
                was = state
                try:
                    state = await sub.next_change(5.0)
                except TimeoutError:
                    state = client.state

    async def _hooks(self) -> None:
        await drop_subscription(self._feed.sub if self._feed is not None else None)
        self._feed = None
        for hook in self.on_connect:
            try:
                await hook()
            except Exception:
                log.exception("OPC UA server %s: setting up after the connect failed",
                              self.name)


async def drop_subscription(sub: Any) -> None:
    """Delete a subscription made before a reconnect: asyncua keeps or restores it, and
    a restore cut short leaves it deaf, so each connect makes its own anew; left, the
    kept one would deliver every change a second time."""
    if sub is None or sub.is_deleted:
        return
    try:
        await sub.delete()
    except Exception as e:      # gone with the old session: nothing to delete
        log.debug("an old subscription not deleted: %s", e)


class _Feed:
    """The link's state subscription: each node's changes to its own handler."""

    def __init__(self) -> None:
        self.sub: Any = None
        self.handlers: dict[ua.NodeId, Any] = {}

    def datachange_notification(self, node: Node, val: Any, data: Any) -> None:
        handler = self.handlers.get(node.nodeid)
        if handler is not None:
            handler.datachange_notification(node, val, data)


async def node_of(client: Client, text: str) -> Node:
    """A node from its id as the equipment file writes it: ``ns=3;s=Filler1``, or with
    the namespace's URI, ``nsu=urn:plant:units;s=Filler1``, which stays right when a
    server numbers its namespaces anew."""
    if text.startswith("nsu="):
        uri, sep, rest = text[4:].partition(";")
        if not sep:
            raise ValueError(f"node id {text!r}: nsu=URI;s=… or nsu=URI;i=…")
        text = f"ns={await client.get_namespace_index(uri)};{rest}"
    return client.get_node(text)


class Untrusted(SfcHostError):
    """The server's certificate is not in the trust folder."""


def _trusted(folder: Path) -> set[bytes]:
    """The DER bytes of every certificate file in the folder (DER or PEM)."""
    out: set[bytes] = set()
    for p in folder.iterdir():
        if not p.is_file() or p.suffix.lower() not in (".der", ".pem", ".crt", ".cer"):
            continue
        data = p.read_bytes()
        try:
            cert = x509.load_pem_x509_certificate(data) if b"-----BEGIN" in data \
                else x509.load_der_x509_certificate(data)
        except ValueError:
            log.warning("%s in the OPC UA trust folder is no certificate", p)
            continue
        out.add(cert.public_bytes(Encoding.DER))
    return out


def _first_certificate(chain: bytes) -> bytes:
    """The leaf of a DER chain (a server may send its chain in one field)."""
    cert = x509.load_der_x509_certificate(chain[:_der_length(chain)])
    return cert.public_bytes(Encoding.DER)


def _der_length(data: bytes) -> int:
    """The length of the first DER element (a SEQUENCE) of ``data``."""
    if len(data) < 2 or data[1] < 0x80:
        return 2 + (data[1] if len(data) > 1 else 0)
    n = data[1] & 0x7F
    return 2 + n + int.from_bytes(data[2:2 + n], "big")


def _uri_of(cert: Any) -> str:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ""
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else ""


# the server refused the session's identity: the user, not the link, is at fault
_IDENTITY_REFUSED = frozenset(("BadUserAccessDenied", "BadIdentityTokenRejected",
                               "BadIdentityTokenInvalid"))


def _why(e: BaseException) -> str:
    if isinstance(e, Untrusted):
        return str(e)
    if isinstance(e, ua.UaStatusCodeError):
        return f"{type(e).__name__} ({e})"
    return str(e) or type(e).__name__


def status_name(code: Any) -> str:
    """The name of a status code (``BadNodeIdUnknown``)."""
    try:
        return ua.StatusCode(code.value if hasattr(code, "value") else code).name
    except Exception:
        return str(code)
