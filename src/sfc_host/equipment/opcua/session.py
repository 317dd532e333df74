"""One OPC UA session per server, shared by every unit, method and event of it: the
host's own client (``sfc_host.opcua_client``), connected with backoff until the server
answers, and connected again the same way whenever the connection is lost. After each
connect the units' state feed (one subscription for all of them) and the event
subscriptions are made anew, so each unit's first notice is its state now and an
outcome missed while away is read from it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key

from sfc_fast.wire.uabinary import DataValue, NodeId
from sfc_host.aio import reap
from sfc_host.equipment.opcua.settings import ServerSettings
from sfc_host.errors import SfcHostError

__all__ = ["ServerLink", "Untrusted", "status_name"]
from sfc_host.opcua_client import (
    MODE_NONE,
    MODE_SIGN,
    MODE_SIGN_AND_ENCRYPT,
    BadStatus,
    Client,
    Endpoint,
    OpcUaError,
    find_endpoint,
    first_certificate,
    get_endpoints,
    status_name,
)

log = logging.getLogger("sfc_host.equipment.opcua")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
FEED_MS = 10             # the state feed's publishing interval: an outcome's delay
FEED_QUEUE = 16          # each state a unit passes, not only the last of an interval
APPLICATION_URI = "urn:sfc-fast:equipment-client"

_MODES = {"None": MODE_NONE, "Sign": MODE_SIGN, "SignAndEncrypt": MODE_SIGN_AND_ENCRYPT}


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

    async def watch(self, node: NodeId, handler: Any) -> None:
        """Data changes of ``node`` to ``handler.state_changed(DataValue)``, on the
        link's one state feed: one subscription for every unit, so one publish response
        carries the changes of many. Made anew after each connect, its first notice of
        each node is the node's value now."""
        client = self.client
        if client is None:
            raise ConnectionError("not connected")
        async with self._feed_lock:
            feed = self._feed
            if feed is None or feed.client is not client:
                feed = _Feed(client)
                feed.sub = await client.create_subscription(FEED_MS, feed)
                self._feed = feed
            if node not in feed.nodes:
                [handle] = await feed.sub.watch([node], queue=FEED_QUEUE)
                feed.nodes[node] = handle
            feed.handlers[feed.nodes[node]] = handler

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
            self._dropping = loop.create_task(client.close())
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
        self.connected.clear()
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 2.0)
            except Exception as e:      # the server may be gone already
                log.debug("OPC UA server %s: close: %s", self.name, e)

    async def _connect(self) -> Client:
        s = self.settings
        mode = _MODES[s.security]
        endpoint = find_endpoint(await get_endpoints(s.endpoint, s.timeout_s), mode)
        kwargs: dict[str, Any] = {}
        if mode != MODE_NONE:
            own = Path(s.certificate).read_bytes()
            kwargs = {"certificate": _der(own),
                      "private_key": load_pem_private_key(Path(s.private_key).read_bytes(),
                                                          None),
                      "server_certificate": self._trusted(endpoint),
                      "application_uri": _uri_of(_der(own)) or APPLICATION_URI}
        if s.user_certificate:
            kwargs["user_certificate"] = _der(Path(s.user_certificate).read_bytes())
            kwargs["user_key"] = load_pem_private_key(Path(s.user_private_key).read_bytes(),
                                                      None)
        client = Client(s.endpoint, mode=mode, username=s.username, password=s.password,
                        timeout_s=s.timeout_s, name="sfc-host", **kwargs)
        await client.connect(endpoint)
        return client

    def _trusted(self, endpoint: Endpoint) -> bytes:
        """The server's certificate, from its endpoint, if ``trust_dir`` holds it. An
        untrusted one is refused and kept in ``trust_dir/rejected/`` for an
        administrator, who trusts it by moving it into ``trust_dir`` (taken at the next
        attempt, no restart)."""
        s = self.settings
        der = first_certificate(endpoint.server_certificate)
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
        if not isinstance(e, BadStatus) or e.name not in _IDENTITY_REFUSED:
            return ""
        user = self.settings.username
        if self.settings.user_certificate:
            return (f": the server refused the X.509 user of {self.settings.user_certificate}"
                    "; check that the server trusts it")
        if not user:
            return ": the server takes no anonymous session; set username and password_env"
        return (f": the server refused user {user!r}; check username and the password in "
                "the variable password_env names")

    async def _run(self) -> None:
        fails = 0
        while not self._closing:
            try:
                client = await self._connect()
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
            self.client = client
            log.info("OPC UA server %s at %s connected", self.name, self.settings.endpoint)
            self.connected.set()
            self.last_error = ""
            await self._hooks()
            await asyncio.shield(client.closed)
            self.connected.clear()
            self.client = None
            self._feed = None
            self.last_error = f"OPC UA server {self.name}: connection lost, reconnecting"
            log.warning("%s", self.last_error)
            await client.close()
            fails = 1
            await asyncio.sleep(BACKOFF_S[0] * random.uniform(0.5, 1.0))

    async def _hooks(self) -> None:
        for hook in self.on_connect:
            try:
                await hook()
            except Exception:
                log.exception("OPC UA server %s: setting up after the connect failed",
                              self.name)


class _Feed:
    """The link's state subscription: each node's changes to its own handler."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sub: Any = None
        self.nodes: dict[NodeId, int] = {}          # node: client handle
        self.handlers: dict[int, Any] = {}          # client handle: handler

    def data_changed(self, handle: int, value: DataValue) -> None:
        handler = self.handlers.get(handle)
        if handler is not None:
            handler.state_changed(value)

    def event(self, handle: int, fields: list[Any]) -> None:
        pass


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


def _der(data: bytes) -> bytes:
    """A certificate file's bytes as DER (the file may be PEM)."""
    if b"-----BEGIN" in data:
        return x509.load_pem_x509_certificate(data).public_bytes(Encoding.DER)
    return data


def _uri_of(der: bytes) -> str:
    try:
        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
            x509.SubjectAlternativeName)
    except (x509.ExtensionNotFound, ValueError):
        return ""
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else ""


# the server refused the session's identity: the user, not the link, is at fault
_IDENTITY_REFUSED = frozenset(("BadUserAccessDenied", "BadIdentityTokenRejected",
                               "BadIdentityTokenInvalid"))


def _why(e: BaseException) -> str:
    if isinstance(e, Untrusted):
        return str(e)
    if isinstance(e, BadStatus):
        return f"{e.name} ({e})" if str(e) != e.name else e.name
    if isinstance(e, OpcUaError | OSError):
        return str(e) or type(e).__name__
    return str(e) or type(e).__name__
