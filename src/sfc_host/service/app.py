"""A whole host instance: the Redis side (``Host``) wired to MQTT (equipment commands,
answers and events), the MES job control, metrics and the script engine. The engine's
built-in Tasks run the host's loops; with ``scripts_dir`` it runs the scripts' Tasks and
Missions too, on their own MQTT connection (``api.jobs`` is this host's job control).
``sfc-host run`` and the demo start one of these.

``start`` goes in a safe order (docs/design.md#start-order): Redis and its scripts, the
engine's build and the missions' arguments, the HTTP port, the MQTT connections
(publishing only), recovery and the loops, and only then the MQTT subscriptions.
Whatever fails, fails before the host took a message another host should have had.

    async with App(HostConfig.load("host.toml")) as app:
        await app.wait_closed()
"""

from __future__ import annotations

import asyncio
import logging
import platform
import tempfile
from typing import Any

from sfc_host import __version__
from sfc_host.config import ConfigError, HostConfig
from sfc_host.engine import Engine, RedisMissionStore, mission_prefix
from sfc_host.engine import MqttLink as EngineMqtt
from sfc_host.equipment.mqtt_transport import EquipmentIn, MqttSink
from sfc_host.execution.host import Host
from sfc_host.mes.control import MesControl
from sfc_host.mes.presence import Presence, presence_topic
from sfc_host.metrics import COUNTERS, Metrics
from sfc_host.mqtt import MqttLink
from sfc_host.service.endpoint import Extension, HttpEndpoint
from sfc_host.service.ends import RunEnds
from sfc_host.service.preflight import (
    build_problems,
    check_missions,
    listen_error,
    opcua_equipment,
    opcua_face,
    opcua_listen_error,
    opcua_routing,
    span_recorder,
)
from sfc_host.service.script_bridge import ScriptJobs, ScriptLink
from sfc_host.store.client import REDIS_FAILURES

log = logging.getLogger("sfc_host.service.app")

READY_PING_S = 1.0       # /readyz: Redis must answer a PING within this


class App:
    def __init__(self, config: HostConfig, *, span_processor: Any = None) -> None:
        """``span_processor``: where spans go with ``otel = true`` (an SDK
        ``SpanProcessor``); by default a batch processor over the exporter the
        ``OTEL_*`` variables name."""
        config.check_files()     # before the engine would create a missing scripts_dir
        self.config = config
        self.metrics = Metrics()
        self.metrics.set_info("build_info", {"version": __version__,
                                             "python": platform.python_version()},
                              "The host's version; always 1.")
        self.link = MqttLink(config, self.metrics)
        self.sink = MqttSink(self.link)
        # The host's loops run as built-in Tasks of the script engine, so the engine's
        # Stop stops the host's work too (docs/design.md#script-engine).
        # stations over OPC UA beside MQTT: one sink routes each command to its binding
        routing = opcua_routing(config, self.sink)
        self.host = Host(config, routing or self.sink, metrics=self.metrics, loops=False)
        self.equipment = EquipmentIn(self.host, self.link, self.sink)
        self.mes = MesControl(self.host, self.link)
        self.opcua_equipment: Any = opcua_equipment(config, self.host, routing, self.mes)
        self.spans = span_recorder(config, span_processor, self.metrics)
        self.opcua: Any = opcua_face(config, self.host, self.mes, self.link)
        if self.spans is not None:
            self.host.settler.spans = self.spans
            self.mes.trace_with(self.spans)
            self.equipment.spans = self.spans
        self.presence = Presence(self.link, config.consumer_name,
                                 lambda: self.host.streams.scopes.keys())
        # another host's end (or this host's previous run's): its answers are had again
        self.ends = RunEnds(self.link, self.host.client, self.metrics, config.consumer_name,
                            self.presence.started_at, self._take_over)
        # a message of our own must come back through a shared subscription before the
        # host says it is ready: a broker may grant $share/… and deliver nothing
        self.link.probe_topic = f"{presence_topic(config.mes_prefix, config.consumer_name)}/probe"
        # ... and one per dotted scope, on its topic shape: a broker may rewrite the dots
        self.link.probe_scopes = tuple(s for s in config.scopes if "." in s)
        self.metrics.declare([*COUNTERS, *(f"loop_errors_{n}" for n, _ in self.host.passes())])
        self._closed = asyncio.Event()
        self._closing = False
        self.recovered = False               # recovery ran (readiness)
        self.http: HttpEndpoint | None = None
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
        cfg = self.config
        await self.host.scripts.load()            # Redis reachable, its scripts loaded
        for name, one_pass in self.host.passes():
            self.engine.add_builtin_task(f"host.{name}", one_pass, interval=0,
                                         critical=False)
        problems = await self.engine.build()
        if problems:
            raise build_problems(problems)
        missions = check_missions(self.engine.missions, cfg.missions)
        if cfg.metrics_port > 0:
            http = HttpEndpoint(self.metrics, cfg.metrics_host, cfg.metrics_port,
                                labels={"consumer": cfg.consumer_name},
                                readiness=self.not_ready, extension=self._web())
            try:
                await http.start()
            except OSError as e:
                raise listen_error(cfg, e) from None
            self.http = http
        links = [self.link, *([self.script_link] if self.script_link is not None else [])]
        for link in links:
            await link.start(subscribe=False)    # commands may go out; nothing comes in
        for link in links:
            await link.wait_connected(connect_timeout_s)
        if self.opcua_equipment is not None:
            self.opcua_equipment.start()         # sessions to the PLCs, in the background
        await self.host.start()                  # discovery and recovery
        self.recovered = True
        await self.mes.start()
        if self.opcua is not None:
            try:
                await self.opcua.start()
            except OSError as e:
                raise opcua_listen_error(cfg, e) from None
            except ValueError as e:     # a PKI folder, certificate or users file
                raise ConfigError(str(e)) from None
        self.presence.start()
        await self.engine.start()                # the host's loops and the scripts' Tasks
        for name, args in missions:
            inst = await self.engine.start_mission(name, **args)
            log.info("mission %s (%s) started", inst.id, name)
        for link in links:                       # ready: now messages may come
            await link.open_subscriptions()
        await self.ends.start()
        self.mes.capabilities.ask(self.host.streams.scopes)
        return self

    async def _take_over(self) -> int:
        """Another host's end: its open commands again, but never a method call that
        cannot tell a repeat (``equipment.opcua``)."""
        eq = self.opcua_equipment
        return await self.host.resend_open(None if eq is None else eq.resendable)

    def _web(self) -> Extension | None:
        """The web view's routes on the HTTP endpoint (``web = true``); its buttons
        use the MES's job control (``web_control = true``)."""
        if not self.config.web:
            return None
        from sfc_host.web.app import WebView  # aiohttp pages only when asked for

        view = WebView(self.host.client, self.config, metrics=self.metrics,
                       control=self.mes if self.config.web_control else None)
        return view.install

    async def not_ready(self) -> list[str]:
        """What keeps the host from being ready (``/readyz``); empty when it is."""
        if self._closing:
            return ["stopping"]
        missing = []
        try:
            await asyncio.wait_for(self.host.client.ping(), READY_PING_S)
        except REDIS_FAILURES as e:
            missing.append(f"redis: {str(e)[:200] or f'no answer within {READY_PING_S:g} s'}")
        for name, link in (("mqtt", self.link), ("mqtt (scripts)", self.script_link)):
            if link is None:
                continue
            missing.extend(f"{name}: {why}" for why in link.not_listening())
        if self.opcua_equipment is not None:
            missing.extend(self.opcua_equipment.not_ready())
        if self.engine.state != "Running":
            missing.append(f"engine: {self.engine.state}")
        if not self.recovered:
            missing.append("recovery: not done")
        return missing

    async def aclose(self) -> None:
        self._closing = True
        # what comes next goes to the other hosts; what came here is settled below, and
        # only then is the end recorded as needing no take-over
        unsubscribed = await self.link.close_subscriptions()
        await self.ends.aclose()
        if self.http is not None:
            await self.http.aclose()
        if self.opcua is not None:
            await self.opcua.aclose()
        # The passes end at once; then the engine's Stop waits for them (and the
        # scripts). An engine that never started has nothing to stop.
        self.host.begin_close()
        if self.engine.state == "Running":
            try:
                await self.engine.stop()
            except Exception:   # a script's fault: the host's own close goes on
                log.exception("the script engine did not stop cleanly")
        if self.script_link is not None:
            await self.script_link.aclose()
        following = self.opcua_equipment.following() if self.opcua_equipment else 0
        if unsubscribed and self.recovered and not self.host.backlog and not following:
            # nothing taken is left unapplied, and no unit is left with no one to follow
            # it (another host then takes it over from the unit's state)
            await self.ends.ended_cleanly()
        if self.opcua_equipment is not None:
            await self.opcua_equipment.aclose()
        await self.mes.aclose()                  # its publisher reads Redis: before it goes
        await self.host.aclose()
        if self.link.connected.is_set():
            await self.presence.stop()
        await self.link.aclose()
        if self.spans is not None:
            # what is queued goes out (the exporter's own timeout bounds the wait)
            await asyncio.to_thread(self.spans.shutdown)
        if self._empty is not None:
            self._empty.cleanup()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> App:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
