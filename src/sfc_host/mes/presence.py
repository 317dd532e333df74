"""The host's own status for the MES and operators: a retained message on
``{mes}/hosts/{consumer}`` that says it is online (version, scopes served, since when),
and a Last Will on the same topic that the broker publishes when the host vanishes
without a goodbye (a crash, a cut cable, a hung process the broker timed out). A host
that stops cleanly says it is offline itself.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Callable, Collection

from sfc_host import __version__
from sfc_host.aio import reap
from sfc_host.mqtt import MqttLink

log = logging.getLogger("sfc_host.mes")

CHECK_S = 5.0            # how often the served scopes are compared with the last message


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def presence_topic(mes_prefix: str, consumer: str) -> str:
    return f"{mes_prefix}/hosts/{consumer}"


class Presence:
    """Publishes the host's status on every (re)connect and when its scopes change."""

    def __init__(self, link: MqttLink, consumer: str,
                 scopes: Callable[[], Collection[str]]) -> None:
        self.link = link
        self.consumer = consumer
        self.scopes = scopes
        self.topic = presence_topic(link.config.mes_prefix, consumer)
        self.started_at = _now()
        self._shown: tuple[str, ...] | None = None
        self._task: asyncio.Task[None] | None = None
        link.set_will(self.topic, self._payload(False, "the connection ended without a "
                                                       "goodbye (Last Will)"))
        link.on_connect.append(self.publish)

    def _payload(self, online: bool, reason: str = "") -> bytes:
        body: dict[str, object] = {
            "host": self.consumer, "online": online, "version": __version__,
            "client_id": self.link.client_id, "started_at": self.started_at}
        if online:
            body["scopes"] = list(self._shown or ())
            body["published_at"] = _now()
        else:
            body["reason"] = reason
        return json.dumps(body, separators=(",", ":")).encode()

    def publish(self) -> None:
        self._shown = tuple(sorted(self.scopes()))
        self.link.publish_nowait(self.topic, self._payload(True), qos=1, retain=True,
                                 status=True)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            if self.link.connected.is_set() and tuple(sorted(self.scopes())) != self._shown:
                self.publish()

    async def stop(self) -> None:
        """Offline, said by the host itself (a clean stop sends no Last Will)."""
        if self._task is not None:
            self._task.cancel()
            await reap(self._task)
            self._task = None
        self.link.publish_nowait(self.topic, self._payload(False, "stopped"), qos=1,
                                 retain=True, status=True)
