"""What a host checks before it takes any message, shared by ``App.start`` and
``sfc-host run --check``: the missions against their signatures, the HTTP port free,
and (``--check --connect``) Redis and the broker reachable.

A user mistake raises ``ConfigError`` (exit 2); a server that cannot be reached or
refuses the host raises the client's own error, which ``describe_failure`` turns into
one line (exit 1).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from sfc_host import __version__
from sfc_host.config import ConfigError, HostConfig, parse_mission_spec, without_credentials
from sfc_host.engine import MissionDef, check_mission_call
from sfc_host.errors import Unreachable

EXIT_MISTAKE = 2
EXIT_UNREACHABLE = 1


def check_missions(defs: Mapping[str, MissionDef], specs: list[str]
                   ) -> list[tuple[str, dict[str, Any]]]:
    """Each ``missions`` entry names a mission of the build and carries arguments its
    function takes; the (name, arguments) to start."""
    out = []
    for spec in specs:
        try:
            name, args = parse_mission_spec(spec)
        except ValueError as e:
            raise ConfigError(f"setting missions: {spec!r}: {e}") from None
        try:
            check_mission_call(defs, name, args)
        except ValueError as e:
            raise ConfigError(f"setting missions: {spec!r}: {e}") from None
        out.append((name, args))
    return out


def build_problems(problems: list[Any]) -> ConfigError:
    return ConfigError("setting scripts_dir: the scripts do not build: " + "; ".join(
        f"{p.file}:{p.line}: {p.message}" for p in problems))


def listen_error(config: HostConfig, e: OSError) -> ConfigError:
    """The HTTP endpoint's bind failure as the setting to change."""
    where = f"{config.metrics_host}:{config.metrics_port}"
    if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"setting metrics_host: cannot listen on {where}: "
                           f"{e.strerror or e}")
    why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
    return ConfigError(f"setting metrics_port: cannot listen on {where}: {why}")


def opcua_listen_error(config: HostConfig, e: OSError) -> ConfigError:
    """The OPC UA endpoint's address cannot be bound: in one line."""
    return ConfigError(f"setting opcua_endpoint: cannot listen on {config.opcua_endpoint}: "
                       f"{e.strerror or e}")


def check_port(config: HostConfig) -> None:
    """The endpoint's address can be bound now (``--check``; the host binds it for real
    before it subscribes)."""
    if not config.metrics_port:
        return
    try:
        _bind(config.metrics_host, config.metrics_port)
    except OSError as e:
        raise listen_error(config, e) from None


def _bind(host: str, port: int) -> None:
    """Bind every address of ``host:port`` for a moment (``OSError`` if one cannot be)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers
            s.bind(addr)


def _extra_missing(setting: str, stack: str) -> ConfigError:
    """A setting whose optional extra (named like the setting) cannot be imported: the
    line the settings' own check gives (``HostConfig.check_files``), for an extra that
    is there but broken."""
    return ConfigError(f"setting {setting}: {stack} is not installed: "
                       f"pip install 'sfc-fast[{setting}]'")


def opcua_face(config: HostConfig, host: Any, mes: Any, link: Any) -> Any:
    """The OPC UA face of ``opcua = true`` (None when off); a ``ConfigError`` for a
    missing extra. The face's modules are imported only here."""
    if not config.opcua:
        return None
    try:
        from sfc_host.opcua.face import OpcUaFace
    except ImportError:
        raise _extra_missing("opcua", "the OPC UA stack") from None
    return OpcUaFace(config, host, mes, link)


def opcua_routing(config: HostConfig, mqtt_sink: Any) -> Any:
    """The command sink that sends OPC UA stations' commands to their bindings
    (``equipment_opcua``; None when every station speaks MQTT)."""
    if not config.equipment_opcua:
        return None
    try:
        from sfc_host.equipment.opcua.transport import RoutingSink
    except ImportError:
        raise _extra_missing("opcua", "the OPC UA stack") from None
    return RoutingSink(mqtt_sink)


def opcua_equipment(config: HostConfig, host: Any, routing: Any, mes: Any) -> Any:
    """The OPC UA stations of ``equipment_opcua``, their file read and checked (a
    ``ConfigError`` in one line); wired to ``routing``, to the Work Master check and to
    the jobs' ends."""
    if routing is None:
        return None
    from sfc_host.equipment.opcua.settings import load
    from sfc_host.equipment.opcua.transport import OpcuaEquipment

    eq = OpcuaEquipment(host, load(config.equipment_opcua))
    routing.opcua = eq
    eq.arrived = routing.arrived        # one answer-to-command clock for both transports
    mes.bound_equipment = eq
    prev_end = host.settler.on_end

    def on_end(scope: str, job: str, decision: Any) -> None:
        eq.job_ended(scope, job, decision)
        if prev_end is not None:
            prev_end(scope, job, decision)
    host.settler.on_end = on_end
    return eq


def span_recorder(config: HostConfig, processor: Any = None, metrics: Any = None) -> Any:
    """The span recorder of ``otel = true`` (``tracing.spans``; None when off or when
    ``OTEL_TRACES_EXPORTER=none``); a ``ConfigError`` for a missing extra or an
    ``OTEL_*`` variable the host cannot use. The SDK is imported only here."""
    if not config.otel:
        return None
    try:
        from sfc_host.tracing.spans import recorder_from
    except ImportError:
        raise _extra_missing("otel", "the OpenTelemetry SDK") from None
    try:
        return recorder_from(config.consumer_name, __version__, config.equipment_prefix,
                             processor=processor, metrics=metrics)
    except ConfigError as e:
        raise ConfigError(f"setting otel: {e}") from None


def check_traces(config: HostConfig) -> str:
    """``--check``: the exporter the ``OTEL_*`` variables name can be made; what it
    is, for the summary line."""
    if not config.otel:
        return ""
    try:
        from sfc_host.tracing.spans import check_batch, exporter_from
    except ImportError:
        raise _extra_missing("otel", "the OpenTelemetry SDK") from None
    try:
        exporter = exporter_from(os.environ)
        if exporter is not None:
            check_batch(os.environ)
    except ConfigError as e:
        raise ConfigError(f"setting otel: {e}") from None
    if exporter is None:
        return "; traces: none (OTEL_TRACES_EXPORTER=none)"
    where = getattr(exporter, "endpoint", "") or type(exporter).__name__
    protocol = getattr(exporter, "protocol", "")
    exporter.shutdown()
    return f"; traces to {where}" + (f" ({protocol})" if protocol else "")


async def check_opcua(config: HostConfig) -> str:
    """``--check``: the OPC UA server made as the start makes it (certificate, trust
    list, users, NodeSet; ``opcua = true``) and its endpoint's address bound; what it
    offers, for the summary line."""
    if not config.opcua:
        return ""
    try:
        from sfc_host.opcua.server import check_server
    except ImportError:
        raise _extra_missing("opcua", "the OPC UA stack") from None
    try:
        users = await check_server(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    where = urlsplit(config.opcua_endpoint)
    try:
        _bind(where.hostname or "0.0.0.0", where.port or 4840)
    except OSError as e:
        raise opcua_listen_error(config, e) from None
    return (f"; OPC UA on {config.opcua_endpoint} ({', '.join(config.opcua_security)}; "
            f"{users} user{'' if users == 1 else 's'}, anonymous "
            f"{config.opcua_anonymous})")


def check_equipment(config: HostConfig) -> str:
    """The OPC UA equipment file read and checked as the start reads it; what it binds."""
    if not config.equipment_opcua:
        return ""
    try:
        from sfc_host.equipment.opcua.settings import load
    except ImportError:
        raise _extra_missing("opcua", "the OPC UA stack") from None
    f = load(config.equipment_opcua)
    return (f"; OPC UA equipment: {len(f.servers)} server{'' if len(f.servers) == 1 else 's'}"
            f", {len(f.units)} unit{'' if len(f.units) == 1 else 's'}, {len(f.methods)} "
            f"method{'' if len(f.methods) == 1 else 's'}, {len(f.events)} event source"
            f"{'' if len(f.events) == 1 else 's'}")


async def check_config(config: HostConfig) -> str:
    """Settings, scripts, missions and the port, without connecting; a summary line."""
    from sfc_host.engine import Engine

    config.check_files()
    check_port(config)
    traces = check_traces(config) + await check_opcua(config) + check_equipment(config)
    if not config.scripts_dir:
        check_missions({}, config.missions)     # none can be known
        return f"settings ok (no scripts_dir){traces}"
    engine = Engine(config.scripts_dir)
    problems = await engine.build()
    if problems:
        raise build_problems(problems)
    check_missions(engine.missions, config.missions)
    return (f"settings ok; scripts build: {len(engine.tasks)} tasks, "
            f"{len(engine.missions)} missions; {len(config.missions)} missions to start"
            f"{traces}")


async def check_servers(config: HostConfig, timeout_s: float = 10.0) -> str:
    """Redis answers and takes the host's scripts; the broker takes a connection (under
    a client id of its own, so a running host with the same settings stays connected)."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from sfc_host.metrics import Metrics
    from sfc_host.mqtt import MqttError, MqttLink, MqttRefused
    from sfc_host.store.client import REDIS_FAILURES, connect
    from sfc_host.store.lua_scripts import Scripts

    client = connect(config)
    try:
        await asyncio.wait_for(Scripts(client).load(), timeout_s)
    except TimeoutError:
        raise Unreachable(_line(RedisTimeoutError(f"no answer within {timeout_s:g} s"),
                                config)) from None
    except REDIS_FAILURES as e:
        raise Unreachable(_line(e, config)) from e
    finally:
        await client.aclose()
    link = MqttLink(config, Metrics(), client_id=f"{config.mqtt_client_id or 'sfc'}-check-"
                                                 f"{config.consumer_name}")
    await link.start(subscribe=False)
    try:
        await link.wait_connected(timeout_s)
    except (MqttError, MqttRefused, OSError) as e:
        raise Unreachable(_line(e, config, link.last_error)) from e
    finally:
        await link.aclose(drain_s=0)
    return (f"Redis at {without_credentials(config.redis_url)} and the broker at "
            f"{without_credentials(config.mqtt_url)} reachable")


def describe_failure(e: BaseException, config: HostConfig, mqtt_why: str = ""
                     ) -> tuple[int, str] | None:
    """A start-up failure as (exit status, one line), or None for a bug (a traceback is
    then the right thing to show)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException, ResponseError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from sfc_host.mqtt import MqttRefused

    redis_at = without_credentials(config.redis_url)
    if isinstance(e, ConfigError):     # a setting, scripts that do not build, a mission
        return EXIT_MISTAKE, str(e)
    if isinstance(e, Unreachable):
        return EXIT_UNREACHABLE, str(e)
    if isinstance(e, RedisConnectionError | RedisTimeoutError):  # also a wrong password
        return EXIT_UNREACHABLE, f"cannot reach Redis at {redis_at} ({e})"
    if isinstance(e, ResponseError):   # e.g. an ACL that lacks a command the host needs
        return EXIT_UNREACHABLE, f"Redis at {redis_at} refused the host: {e}"
    if isinstance(e, RedisClusterException):
        # redis-py says "Cluster mode is not enabled" for any refused CLUSTER SLOTS,
        # most often an ACL user without it
        return EXIT_UNREACHABLE, (
            f"Redis Cluster at {redis_at}: the nodes could not be listed ({e}); an ACL "
            f"user needs +cluster|slots and +command (docs/operations.md, Redis Cluster)")
    if isinstance(e, MqttRefused):     # wrong credentials: at once, not after 10 s
        return EXIT_UNREACHABLE, str(e)
    if isinstance(e, TimeoutError):
        return EXIT_UNREACHABLE, (f"cannot reach the MQTT broker at "
                                  f"{without_credentials(config.mqtt_url)}"
                                  + (f" ({mqtt_why})" if mqtt_why else ""))
    return None


def _line(e: BaseException, config: HostConfig, mqtt_why: str = "") -> str:
    failure = describe_failure(e, config, mqtt_why)
    if failure is None:
        raise e
    return failure[1]
