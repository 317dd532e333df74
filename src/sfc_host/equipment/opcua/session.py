"""One OPC UA session per server, shared by every unit, method and event of it: asyncua's
client, connected with backoff until the server answers, then kept by asyncua's own
reconnect (its subscriptions re-created, each monitored item's current value delivered
again, so an outcome missed while away is read from the unit's state)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncua import Client, Node, ua
from asyncua.client.ua_client import UaClientState
from asyncua.crypto import security_policies

from sfc_host.aio import reap
from sfc_host.equipment.opcua.settings import ServerSettings

log = logging.getLogger("sfc_host.equipment.opcua")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
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
        self._closing = False

    def status(self) -> str:
        """'' when connected, else why not (``/readyz``, the web view)."""
        return "" if self.connected.is_set() else self.last_error

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"opcua-{self.name}")

    async def aclose(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await reap(self._task)
        client, self.client = self.client, None
        if client is not None:
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
            server_cert = _server_certificate(s.trust_dir)
            await client.set_security(security_policies.SecurityPolicyBasic256Sha256,
                                      s.certificate, s.private_key,
                                      server_certificate=server_cert,
                                      mode=_MODES[s.security])
        return client

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
                                  f"{_why(e)}"
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
        for hook in self.on_connect:
            try:
                await hook()
            except Exception:
                log.exception("OPC UA server %s: setting up after the connect failed",
                              self.name)


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


def _server_certificate(trust_dir: str) -> str | None:
    """The one certificate of the trust folder, for a secure channel's server check."""
    if not trust_dir:
        return None
    certs = sorted(p for p in Path(trust_dir).iterdir()
                   if p.suffix.lower() in (".der", ".pem", ".crt"))
    return str(certs[0]) if certs else None


def _why(e: BaseException) -> str:
    if isinstance(e, ua.UaStatusCodeError):
        return f"{type(e).__name__} ({e})"
    return str(e) or type(e).__name__


def status_name(code: Any) -> str:
    """The name of a status code (``BadNodeIdUnknown``)."""
    try:
        return ua.StatusCode(code.value if hasattr(code, "value") else code).name
    except Exception:
        return str(code)
