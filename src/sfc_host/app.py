"""A whole host instance: the Redis side (``Host``) wired to MQTT (equipment commands,
answers and events). ``sfc-host run`` and the demo start one of these.

    async with App(HostConfig.load("host.toml")) as app:
        await app.wait_closed()
"""

from __future__ import annotations

import asyncio

from sfc_host.config import HostConfig
from sfc_host.equipment_mqtt import EquipmentIn, MqttSink
from sfc_host.host import Host
from sfc_host.mes import MesControl
from sfc_host.metrics import Metrics, MetricsServer
from sfc_host.mqtt import MqttLink


class App:
    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.link = MqttLink(config, self.metrics)
        self.sink = MqttSink(self.link)
        self.host = Host(config, self.sink, metrics=self.metrics)
        self.equipment = EquipmentIn(self.host, self.link, self.sink)
        self.mes = MesControl(self.host, self.link)
        self._closed = asyncio.Event()
        self.metrics_server: MetricsServer | None = None

    async def start(self, connect_timeout_s: float = 10.0) -> App:
        await self.link.start()
        await self.link.wait_connected(connect_timeout_s)
        await self.host.start()
        if self.config.metrics_port > 0:
            self.metrics_server = MetricsServer(self.metrics, self.config.metrics_host,
                                                self.config.metrics_port,
                                                labels={"consumer": self.config.consumer_name})
            await self.metrics_server.start()
        return self

    async def aclose(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.aclose()
        await self.host.aclose()
        await self.mes.aclose()
        await self.link.aclose()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> App:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
