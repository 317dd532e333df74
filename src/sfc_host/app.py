"""A whole host instance: the Redis side (``Host``) wired to MQTT (equipment commands,
answers and events), the MES job control, metrics and the script engine. The engine's
built-in Tasks run the host's loops; with ``scripts_dir`` it runs the scripts' Tasks and
Missions too, on their own MQTT connection (``api.jobs`` is this host's job control).
``sfc-host run`` and the demo start one of these.

    async with App(HostConfig.load("host.toml")) as app:
        await app.wait_closed()
"""

from __future__ import annotations

import asyncio
import logging
import tempfile

from sfc_host.config import ConfigError, HostConfig
from sfc_host.engine.api import MqttLink as EngineMqtt
from sfc_host.engine.manager import Engine
from sfc_host.engine.missions import RedisMissionStore, mission_prefix, parse_mission_spec
from sfc_host.equipment_mqtt import EquipmentIn, MqttSink
from sfc_host.host import Host
from sfc_host.mes import MesControl
from sfc_host.metrics import Metrics, MetricsServer
from sfc_host.mqtt import MqttLink
from sfc_host.script_host import ScriptJobs, ScriptLink

log = logging.getLogger("sfc_host.app")


class App:
    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.link = MqttLink(config, self.metrics)
        self.sink = MqttSink(self.link)
        # The host's loops run as built-in Tasks of the script engine (DESIGN §4), so
        # the engine's Stop stops the host's work too.
        self.host = Host(config, self.sink, metrics=self.metrics, loops=False)
        self.equipment = EquipmentIn(self.host, self.link, self.sink)
        self.mes = MesControl(self.host, self.link)
        self._closed = asyncio.Event()
        self.metrics_server: MetricsServer | None = None
        self.script_link: MqttLink | None = None
        self._empty: tempfile.TemporaryDirectory[str] | None = None
        mqtt: EngineMqtt | None = None
        if config.scripts_dir:
            scripts = config.scripts_dir
            self.script_link = MqttLink(config, self.metrics, fan_out=True,
                                        client_id=f"{self.link.client_id}-scripts")
            mqtt = ScriptLink(self.script_link)
        else:
            # no scripts: an engine with an empty folder still runs the host's loops
            self._empty = tempfile.TemporaryDirectory(prefix="sfc-host-scripts-")
            scripts = self._empty.name
        missions = RedisMissionStore(self.host.client,
                                     prefix=mission_prefix(config.redis_cluster))
        self.engine: Engine = Engine(scripts, store=missions, mqtt=mqtt,
                                     jobs=ScriptJobs(self.mes))

    async def start(self, connect_timeout_s: float = 10.0) -> App:
        await self.link.start()
        await self.link.wait_connected(connect_timeout_s)
        await self.host.start()
        if self.script_link is not None:
            await self.script_link.start()
            await self.script_link.wait_connected(connect_timeout_s)
        for name, one_pass in self.host.passes():
            self.engine.add_builtin_task(f"host.{name}", one_pass, interval=0,
                                         critical=False)
        await self._start_engine(self.engine)
        if self.config.metrics_port > 0:
            self.metrics_server = MetricsServer(self.metrics, self.config.metrics_host,
                                                self.config.metrics_port,
                                                labels={"consumer": self.config.consumer_name})
            await self.metrics_server.start()
        return self

    async def _start_engine(self, engine: Engine) -> None:
        problems = await engine.build()
        if problems:
            raise ConfigError("scripts_dir: the scripts do not build: " + "; ".join(
                f"{p.file}:{p.line}: {p.message}" for p in problems))
        await engine.start()
        for spec in self.config.missions:
            try:
                name, args = parse_mission_spec(spec)
            except ValueError as e:
                raise ConfigError(f"missions: {spec!r}: {e}") from None
            try:
                inst = await engine.start_mission(name, **args)
            except KeyError as e:  # an unknown mission: the message names the known ones
                raise ConfigError(f"missions: {spec!r}: {e.args[0]}") from None
            log.info("mission %s (%s) started", inst.id, name)

    async def aclose(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.aclose()
        # The passes end at once; then the engine's Stop waits for them (and the
        # scripts). An engine that never started has nothing to stop.
        self.host.begin_close()
        if self.engine.state == "Running":
            try:
                await self.engine.stop()
            except Exception:
                log.exception("the script engine did not stop cleanly")
        if self.script_link is not None:
            await self.script_link.aclose()
        await self.host.aclose()
        await self.mes.aclose()
        await self.link.aclose()
        if self._empty is not None:
            self._empty.cleanup()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> App:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
