"""Every setting of a host instance, in one dataclass.

Sources, later ones winning: the defaults below, a TOML file (top-level keys or a
``[host]`` table), environment variables ``SFC_<NAME>`` (``SFC_READ_COUNT=200``), and
explicit overrides (the CLI's flags). Unknown keys and wrong types are refused with
one clear line naming the setting.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import json
import logging
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sfc_host.errors import ConfigError
from sfc_host.names import check_scope

# the job acceptance checks an MES request goes through (``mes_acceptance`` switches
# each; mes/catalog.py runs them)
MES_ACCEPTANCE_CHECKS = ("work_master", "equipment", "material_class", "material_definition",
                         "personnel", "physical_asset", "max_job_orders")


def without_credentials(url: str) -> str:
    """A server URL for a log line or an error: ``redis://user:secret@h:6379/0`` is
    shown as ``redis://h:6379/0`` (a password never reaches a log or a terminal)."""
    u = urlsplit(url)
    return urlunsplit(u._replace(netloc=u.netloc.rpartition("@")[2])) if "@" in u.netloc \
        else url


def parse_mission_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME={json object}`` (the CLI's ``--mission``, the host's
    ``missions`` setting) as name and arguments; ValueError saying what is wrong."""
    name, _, raw = spec.partition("=")
    try:
        args = json.loads(raw) if raw else {}
    except ValueError as e:
        raise ValueError(f"arguments are not JSON ({e})") from None
    if not isinstance(args, dict):
        raise ValueError("arguments must be a JSON object")
    return name, args


@dataclass
class HostConfig:
    # Redis
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    redis_cluster: bool = False          # talk to a Redis Cluster (scopes spread by hash tag)
    # connections in the shared pool: MES requests take one each while they run, and a
    # burst of them must not leave the answer path waiting (16 stalled it in the soak)
    redis_pool_size: int = 64
    redis_ca_file: str = ""              # rediss:// (TLS): CA bundle (default: the system's)
    redis_cert_file: str = ""            # TLS client certificate (a server that asks)
    redis_key_file: str = ""
    # Work streams (one consumer group per host deployment)
    group: str = "sfc-host"
    consumer: str = ""                   # default: hostname-pid
    scopes: list[str] = field(default_factory=list)  # served from the start (more are discovered)
    read_count: int = 128                # entries per stream per XREADGROUP
    read_block_ms: int = 100             # longest wait for new entries when idle
    # Only scopes known to have new entries are read on a pass (this host wrote them, or
    # a notice said so); every scope's stream is read at least this often regardless
    full_read_interval_ms: int = 1_000
    discover_interval_ms: int = 1000     # how often the scope registry is read
    claim_min_idle_ms: int = 30_000      # an entry pending this long is taken over
    claim_interval_ms: int = 5_000       # XAUTOCLAIM at most this often per scope
    max_deliveries: int = 5              # then the entry goes to the dead stream
    cas_rounds: int = 4                  # reads again after a lost race, then leaves it
    trim_acked: bool = True              # the sweep trims entries every group has acked
    # Time
    sweep_interval_ms: int = 200         # how often the scopes with due jobs are swept
    # a scope with nothing due is swept (its heartbeat written) at least this often;
    # at most half of outage_threshold_ms is used (see idle_sweep_ms)
    idle_sweep_interval_ms: int = 3_000
    sweep_limit: int = 1000              # jobs popped per scope and sweep
    outage_threshold_ms: int = 10_000    # a heartbeat older than this is an outage
    # Answers from equipment
    answer_batch: int = 256              # answers settled together (per worker)
    answer_workers: int = 3              # batches in flight at once (overlap Redis and CPU)
    answer_queue_max: int = 100_000      # answers waiting (Redis away); beyond, the oldest go
    # Caches
    graph_cache_size: int = 512          # compiled recipes kept in memory
    state_cache_size: int = 100_000      # job states kept to evolve answers without a read
    # MQTT
    mqtt_url: str = "mqtt://127.0.0.1:1883"   # mqtt:// or mqtts:// (TLS)
    mqtt_version: int = 5                # 5 or 3 (3.1.1: CloudEvents always structured)
    mqtt_binary: bool = True             # MQTT 5: binary CloudEvents (attributes as user
                                         # properties) or structured JSON
    mqtt_username: str = ""
    mqtt_password: str = field(default="", repr=False)   # never logged
    mqtt_client_id: str = ""             # default: sfc-{consumer}
    mqtt_ca_file: str = ""               # TLS: CA bundle (default: the system's)
    mqtt_cert_file: str = ""             # TLS client certificate
    mqtt_key_file: str = ""
    mqtt_shared_group: str = "sfc"       # $share/{group}/… so several hosts split the load
    mqtt_qos: int = 1                    # 0 or 1 (sessions are clean: no QoS 2)
    mqtt_keepalive_s: int = 30           # a dead broker is found within 1.5x this
    mqtt_receive_maximum: int = 256      # messages taken and not yet handled (backlog)
    mqtt_queue_size: int = 100_000       # outgoing messages waiting; a full queue is counted
    mqtt_max_payload: int = 1 << 20      # bytes; a larger message is refused (logged, counted)
    mes_prefix: str = "mes"              # may have several levels ("app/jobs")
    # request topics {mes}/commands, {mes}/+/commands … with up to this many levels
    # between prefix and "commands" (the original's topic wildcard levels)
    mes_topic_levels: int = 3
    mes_source: str = "sfc-host"         # CloudEvent source of replies, events, metadata
    mes_message_expiry_s: int = 0        # MessageExpiryInterval of replies and events; 0 = none
    mes_dedupe_s: int = 600              # a request id (per source) seen this long is a repeat
    mes_retained_expiry_s: int = 172_800 # MessageExpiryInterval of retained order/result/index
    # job acceptance checks (each switchable): every one of MES_ACCEPTANCE_CHECKS
    mes_acceptance: list[str] = field(default_factory=lambda: list(MES_ACCEPTANCE_CHECKS))
    equipment_prefix: str = "equipment"
    # stations reached over OPC UA (docs/equipment-opcua.md): a TOML file of servers and
    # the units and methods that serve action types; "" = every station speaks MQTT
    equipment_opcua: str = ""
    max_job_orders: int = 10_000         # live job orders a scope accepts
    # an order cleared or cancelled (EndState) is deleted with its job state and job
    # response this long after (seconds); 0 keeps them until the id is stored again
    ended_retention_s: int = 604_800
    # Script engine (Tasks and Missions run inside the host, with its MQTT and job control)
    scripts_dir: str = ""                # a scripts folder; "" = no engine
    missions: list[str] = field(default_factory=list)  # started at start: NAME or NAME=JSON
    # Metrics
    metrics_port: int = 0                # Prometheus endpoint; 0 = off
    metrics_host: str = "127.0.0.1"
    # The operator's web view (sfc_host.web) on the same HTTP port
    web: bool = False                    # serve the view (needs metrics_port)
    web_control: bool = False            # Pause/Resume/Abort/Stop/Clear buttons
    web_token: str = field(default="", repr=False)   # required off loopback; never logged
    web_token_file: str = ""             # or the token read from this file
    # Traces: a link from a job's trace id to the plant's trace viewer, e.g.
    # "https://grafana.example/explore?traceId={trace_id}" ("" = the id alone)
    trace_url: str = ""
    # OpenTelemetry spans of requests, jobs, attempts and holds (the [otel] extra; the
    # OTEL_* variables configure the exporter); off: the context still flows on the wire
    otel: bool = False
    # The OPC UA face: ISA-95 Job Control v2 for an MES that speaks OPC UA (the [opcua]
    # extra), beside the MQTT face, on the same job control
    opcua: bool = False
    opcua_endpoint: str = "opc.tcp://127.0.0.1:4840/sfc-host/"
    # Basic256Sha256 message security modes offered: SignAndEncrypt, Sign, None
    opcua_security: list[str] = field(default_factory=lambda: ["SignAndEncrypt", "Sign"])
    opcua_allow_insecure: bool = False   # security None off loopback
    opcua_pki_dir: str = ""              # own/, trusted/, rejected/ (sfc-host opcua cert)
    opcua_users_file: str = ""           # users and roles; else SFC_OPCUA_USERS
    opcua_anonymous: str = "browse"      # anonymous sessions: browse, call or none
    opcua_list_interval_ms: int = 1000   # JobOrderList rewritten at most this often
    # Process
    tune_gc: bool = True                 # raise the GC thresholds while the host runs
    # Logging
    log_level: str = "INFO"
    log_format: str = "text"             # text or json (one object a line, with job fields)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def consumer_name(self) -> str:
        return self.consumer or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def idle_sweep_ms(self) -> int:
        """The longest time between two sweeps of a scope by a running host: well
        inside the outage threshold, so a heartbeat that old means no host ran."""
        return max(self.sweep_interval_ms,
                   min(self.idle_sweep_interval_ms, self.outage_threshold_ms // 2))

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool)):
                raise ConfigError(f"setting {f.name}: expected an integer, got {v!r}")
            if f.type == "bool" and not isinstance(v, bool):
                raise ConfigError(f"setting {f.name}: expected true or false, got {v!r}")
            if f.type == "str" and not isinstance(v, str):
                raise ConfigError(f"setting {f.name}: expected a string, got {v!r}")
            if f.type == "int" and v < 0:
                raise ConfigError(f"setting {f.name}: must not be negative, got {v}")
        for name in ("scopes", "missions"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                raise ConfigError(f"setting {name}: expected a list of strings, got {v!r}")
        for name in ("read_count", "sweep_interval_ms", "sweep_limit", "answer_batch",
                     "cas_rounds", "max_deliveries", "graph_cache_size", "redis_pool_size",
                     "answer_workers", "answer_queue_max", "idle_sweep_interval_ms",
                     "full_read_interval_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name}: must be at least 1")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"setting log_format: expected text or json, got "
                              f"{self.log_format!r}")
        if self.outage_threshold_ms <= self.sweep_interval_ms:
            raise ConfigError("setting outage_threshold_ms: must be longer than "
                              "sweep_interval_ms")
        self._validate_values()

    def _validate_mes(self) -> None:
        p = self.mes_prefix
        if not p or p.startswith("/") or p.endswith("/") or "//" in p:
            raise ConfigError(f"setting mes_prefix: {p!r} is not a topic prefix (levels "
                              "without wildcards, e.g. mes or app/jobs)")
        if self.mes_topic_levels > 16:
            raise ConfigError(f"setting mes_topic_levels: at most 16, not "
                              f"{self.mes_topic_levels}")
        if not isinstance(self.mes_acceptance, list) or not all(
                isinstance(c, str) for c in self.mes_acceptance):
            raise ConfigError(f"setting mes_acceptance: expected a list of strings, got "
                              f"{self.mes_acceptance!r}")
        unknown = sorted(set(self.mes_acceptance) - set(MES_ACCEPTANCE_CHECKS))
        if unknown:
            raise ConfigError(f"setting mes_acceptance: unknown check {unknown[0]!r} "
                              f"(known: {', '.join(MES_ACCEPTANCE_CHECKS)})")

    def _validate_values(self) -> None:
        """The values a type check lets through but the host cannot use: each refused
        with the setting's name and value, before anything connects."""
        if self.metrics_port and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"setting metrics_port: {self.metrics_port} is not a port "
                              "(1-65535, or 0 for no endpoint)")
        _check_url("redis_url", self.redis_url, ("redis", "rediss", "unix"),
                   "redis://host:port/db, rediss://… or unix://path")
        _check_url("mqtt_url", self.mqtt_url, ("mqtt", "mqtts", "tcp", "ssl"),
                   "mqtt://host:port or mqtts://host:port")
        if self.trace_url and ("{trace_id}" not in self.trace_url
                               or urlsplit(self.trace_url).scheme not in ("http", "https")):
            raise ConfigError(f"setting trace_url: {self.trace_url!r}: an http(s) address "
                              "with {trace_id} where the trace id goes")
        if self.opcua:
            _check_opcua(self)
        if self.mqtt_version not in (3, 5):
            raise ConfigError(f"setting mqtt_version: expected 3 or 5, got {self.mqtt_version}")
        if self.mqtt_qos == 2:
            raise ConfigError("setting mqtt_qos: 2 is not offered: the host's MQTT sessions "
                              "are clean, so QoS 2 would be at least once across a "
                              "reconnect; use 1 (commands carry ids, receivers deduplicate)")
        if self.mqtt_qos not in (0, 1):
            raise ConfigError(f"setting mqtt_qos: expected 0 or 1, got {self.mqtt_qos}")
        if not 1 <= self.mqtt_keepalive_s <= 65535:
            raise ConfigError(f"setting mqtt_keepalive_s: expected 1 to 65535 seconds, got "
                              f"{self.mqtt_keepalive_s}")
        if not 1 <= self.mqtt_receive_maximum <= 65535:
            raise ConfigError(f"setting mqtt_receive_maximum: expected 1 to 65535, got "
                              f"{self.mqtt_receive_maximum}")
        if self.mqtt_version == 3 and self.mqtt_password and not self.mqtt_username:
            raise ConfigError("setting mqtt_password: MQTT 3.1.1 sends a password only with "
                              "a user name; set mqtt_username too")
        for name in ("mes_prefix", "equipment_prefix", "mqtt_shared_group"):
            v = getattr(self, name)
            if any(c in v for c in "+#\0") or (name == "mqtt_shared_group" and "/" in v):
                raise ConfigError(f"setting {name}: {v!r} cannot be used in an MQTT topic")
        for scope in self.scopes:
            try:
                check_scope(scope)
            except ValueError as e:
                raise ConfigError(f"setting scopes: {e}") from None
        self._validate_mes()
        if self.web:
            check_web_access(self, "setting web")
        if self.missions:
            for spec in self.missions:
                try:
                    parse_mission_spec(spec)
                except ValueError as e:
                    raise ConfigError(f"setting missions: {spec!r}: {e}") from None
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ConfigError(f"setting log_level: unknown level {self.log_level!r} "
                              "(DEBUG, INFO, WARNING, ERROR)")

    def check_files(self) -> None:
        """The files and folders the settings name exist (the host never creates them):
        checked at start, before the script engine would create a missing folder."""
        if self.scripts_dir and not Path(self.scripts_dir).is_dir():
            raise ConfigError(f"setting scripts_dir: {self.scripts_dir!r} is not a folder")
        for name in ("redis_ca_file", "redis_cert_file", "redis_key_file", "mqtt_ca_file",
                     "mqtt_cert_file", "mqtt_key_file"):
            v = getattr(self, name)
            if v and not Path(v).is_file():
                raise ConfigError(f"setting {name}: {v!r} is not a file")
        if self.web_token_file:
            self.web_access_token()     # readable and not empty
        if self.equipment_opcua and not _installed("cryptography"):
            raise ConfigError("setting equipment_opcua: the OPC UA client's crypto "
                              "(cryptography) is not installed: pip install 'sfc-fast[opcua]'")
        if self.equipment_opcua and not Path(self.equipment_opcua).is_file():
            raise ConfigError(f"setting equipment_opcua: {self.equipment_opcua!r} is not a "
                              "file")
        if self.opcua and not _installed("cryptography"):
            raise ConfigError("setting opcua: the OPC UA face's crypto (cryptography) is not "
                              "installed: pip install 'sfc-fast[opcua]'")
        if self.opcua and self.opcua_pki_dir and not Path(self.opcua_pki_dir).is_dir():
            raise ConfigError(f"setting opcua_pki_dir: {self.opcua_pki_dir!r} is not a folder "
                              "(sfc-host opcua cert makes it)")
        if self.opcua and self.opcua_users_file and not Path(self.opcua_users_file).is_file():
            raise ConfigError(f"setting opcua_users_file: {self.opcua_users_file!r} is not "
                              "a file")
        if self.otel and not _installed("opentelemetry.sdk"):
            raise ConfigError("setting otel: the OpenTelemetry SDK is not installed: "
                              "pip install 'sfc-fast[otel]'")

    def web_access_token(self) -> str:
        """The web view's access token: ``web_token``, else the first line of
        ``web_token_file``; "" for none."""
        if self.web_token or not self.web_token_file:
            return self.web_token
        try:
            token = Path(self.web_token_file).read_text().strip()
        except OSError as e:
            raise ConfigError(f"setting web_token_file: cannot read {self.web_token_file!r}: "
                              f"{e.strerror or e}") from None
        if not token:
            raise ConfigError(f"setting web_token_file: {self.web_token_file!r} is empty")
        return token

    @classmethod
    def load(cls, path: str | Path | None = None, *, env: Mapping[str, str] | None = None,
             **overrides: Any) -> HostConfig:
        values: dict[str, Any] = {}
        if path is not None:
            values.update(_from_toml(Path(path)))
        values.update(_from_env(os.environ if env is None else env))
        values.update({k: v for k, v in overrides.items() if v is not None})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown setting {unknown[0]!r}")
        return cls(**values)


def is_loopback(host: str) -> bool:
    """Whether an address to listen on reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:       # a name: it may resolve to any interface
        return False


def check_web_access(config: HostConfig, what: str) -> None:
    """The web view needs the HTTP port, and an access token when it listens beyond
    loopback (anyone on the network could read every job otherwise)."""
    if not config.metrics_port:
        raise ConfigError(f"{what}: the web view is served on the HTTP port: set "
                          "metrics_port (1-65535)")
    if not is_loopback(config.metrics_host) and not (config.web_token
                                                     or config.web_token_file):
        raise ConfigError(f"{what}: metrics_host {config.metrics_host!r} is not loopback: "
                          "set web_token or web_token_file (every request must carry it)")


OPCUA_SECURITY = ("SignAndEncrypt", "Sign", "None")


def _check_opcua(c: HostConfig) -> None:
    u = urlsplit(c.opcua_endpoint)
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "opc.tcp" or not u.hostname or not port:
        raise ConfigError(f"setting opcua_endpoint: {c.opcua_endpoint!r}: use "
                          "opc.tcp://host:port/path (port 1-65535)")
    modes = c.opcua_security
    if not isinstance(modes, list) or not modes or any(m not in OPCUA_SECURITY for m in modes):
        raise ConfigError(f"setting opcua_security: {modes!r}: a non-empty list of "
                          f"{', '.join(OPCUA_SECURITY)}")
    if "None" in modes and not is_loopback(u.hostname) and not c.opcua_allow_insecure:
        raise ConfigError(f"setting opcua_security: None on {u.hostname!r}, which is not "
                          "loopback: anyone on the network could drive jobs; keep it to "
                          "Sign and SignAndEncrypt, or set opcua_allow_insecure = true on a "
                          "network protected otherwise")
    if any(m != "None" for m in modes) and not c.opcua_pki_dir:
        raise ConfigError("setting opcua_pki_dir: needed for Sign and SignAndEncrypt (the "
                          "server's certificate and the trusted clients'): make it with "
                          "sfc-host opcua cert")
    if c.opcua_anonymous not in ("browse", "call", "none"):
        raise ConfigError(f"setting opcua_anonymous: {c.opcua_anonymous!r}: browse, call "
                          "or none")
    if c.opcua_list_interval_ms < 100:
        raise ConfigError(f"setting opcua_list_interval_ms: {c.opcua_list_interval_ms} is "
                          "below 100")


def _installed(module: str) -> bool:
    """``module`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_url(name: str, url: str, schemes: tuple[str, ...], use: str) -> None:
    u = urlsplit(url)
    shown = without_credentials(url)
    if u.scheme not in schemes:
        raise ConfigError(f"setting {name}: {shown!r}: use {use}")
    if u.scheme == "unix" or ":" not in u.netloc.rpartition("@")[2].rpartition("]")[2]:
        return                       # no port given: the scheme's default
    try:
        port = u.port
    except ValueError:               # not a number, or above 65535
        port = None
    if not port:
        raise ConfigError(f"setting {name}: {shown!r}: the port is not in 1-65535")


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    host = doc.pop("host", {})
    if not isinstance(host, dict):
        raise ConfigError(f"{path}: [host] must be a table")
    other = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    return {**other, **host}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(HostConfig):
        raw = env.get("SFC_" + f.name.upper())
        if raw is None:
            continue
        out[f.name] = _parse(f.name, f.type, raw)
    return out


def _parse(name: str, typ: Any, raw: str) -> Any:
    if typ == "int":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"SFC_{name.upper()}: expected an integer, got {raw!r}") from None
    if typ == "bool":
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"SFC_{name.upper()}: expected true or false, got {raw!r}")
    if typ == "list[str]":
        if raw.lstrip().startswith("["):
            # a JSON list carries any text, commas and quotes too (missions' arguments)
            try:
                v = json.loads(raw)
            except ValueError as e:
                raise ConfigError(f"SFC_{name.upper()}: not a JSON list ({e})") from None
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                raise ConfigError(f"SFC_{name.upper()}: expected a JSON list of strings, "
                                  f"got {raw!r}")
            return v
        return [s.strip() for s in raw.split(",") if s.strip()]
    return raw
