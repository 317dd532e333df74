"""The OPC UA equipment file (setting ``equipment_opcua``): which OPC UA servers the
host reaches as a client, and which action types of which scopes each of their units
or methods serves. Read and checked whole when the host starts: every mistake is one
line naming the file and the entry.

    [[server]]
    name = "plc1"
    endpoint = "opc.tcp://10.0.0.5:4840"
    security = "None"                  # or "Sign", "SignAndEncrypt" (Basic256Sha256)
    # certificate = "pki/own/cert.der"; private_key = "pki/own/key.pem" (secure modes)
    # trust_dir = "pki/plc1"           # the server certificates trusted (DER or PEM)
    # username = "sfc"; password_env = "PLC1_PASSWORD"
    # or an X.509 user: user_certificate = "pki/sfc-user.der"; user_private_key = "….pem"

    [[unit]]                           # a PackML unit (OPC 30050)
    equipment = "filler1"
    server = "plc1"
    scopes = ["line1"]
    node = "ns=2;s=Filler1"            # the unit: a PackMLBaseObjectType instance
    types = ["com.example.fill.v1"]
    hold_types = ["com.example.fill.hold.v1"]        # the job's hold: Hold, then Held
    restart_types = ["com.example.fill.restart.v1"]  # the restart: Unhold
    command_id = "ns=2;s=Filler1.CommandId"          # a String the unit keeps
    results = { level = "ns=2;s=Filler1.Level" }     # read when the unit completes
    cancel = "Stop"                    # or "Abort"

    [[method]]                         # an action that calls a method
    equipment = "scale1"
    server = "plc1"
    scopes = ["line1"]
    types = ["com.example.weigh.v1"]
    object = "ns=2;s=Scale1"
    method = "ns=2;s=Scale1.Weigh"

    [[event]]                          # pull events from a variable's data changes
    server = "plc1"
    scope = "line1"
    type = "com.example.qa_result.v1"
    node = "ns=2;s=Camera1.Passed"
    field = "passed"

    [[event]]                          # pull events from OPC UA events of a type
    server = "plc1"
    scope = "line1"
    type = "com.example.reject.v1"
    event_type = "ns=2;i=3001"         # and its subtypes
    source = "ns=2;s=Camera1"          # the notifier (default: the Server object)
    fields = { reason = "Message", code = "RejectCode" }
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sfc_host.config import ConfigError
from sfc_host.names import check_scope

SECURITY = ("None", "Sign", "SignAndEncrypt")
SERVER_OBJECT = "i=2253"        # the Server object: every event of the server reaches it
DEFAULT_EVENT_FIELDS = {"message": "Message", "severity": "Severity"}
CANCEL = ("Stop", "Abort")


@dataclass
class ServerSettings:
    name: str
    endpoint: str
    security: str = "None"
    certificate: str = ""
    private_key: str = ""
    trust_dir: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    timeout_s: float = 5.0
    user_certificate: str = ""         # an X.509 user: its certificate and key
    user_private_key: str = ""


@dataclass
class UnitSettings:
    equipment: str
    server: str
    scopes: list[str]
    node: str
    types: list[str]
    command_id: str
    hold_types: list[str] = field(default_factory=list)
    restart_types: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    cancel: str = "Stop"


@dataclass
class MethodSettings:
    equipment: str
    server: str
    scopes: list[str]
    types: list[str]
    object: str
    method: str


@dataclass
class EventSettings:
    """Pull events of ``type`` in ``scope``: a variable's data changes (``node``, the
    value as data ``{field: value}``), or the OPC UA events of an event type and its
    subtypes (``event_type``) that ``source`` notifies (default: the Server object),
    their ``fields`` (data key -> the event field's browse name) as data."""

    server: str
    scope: str
    type: str
    node: str = ""
    field: str = "value"
    event_type: str = ""
    source: str = ""
    fields: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass
class EquipmentFile:
    servers: dict[str, ServerSettings]
    units: list[UnitSettings]
    methods: list[MethodSettings]
    events: list[EventSettings]

    def routes(self) -> dict[tuple[str, str], UnitSettings | MethodSettings]:
        """(scope, type) -> the unit or method that serves it."""
        out: dict[tuple[str, str], UnitSettings | MethodSettings] = {}
        for u in self.units:
            for s in u.scopes:
                for t in (*u.types, *u.hold_types, *u.restart_types):
                    out[(s, t)] = u
        for m in self.methods:
            for s in m.scopes:
                for t in m.types:
                    out[(s, t)] = m
        return out


def load(path: str | Path, env: dict[str, str] | None = None) -> EquipmentFile:
    """The file, checked; ``ConfigError`` in one line for any mistake."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"setting equipment_opcua: cannot read {str(p)!r}: "
                          f"{e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"setting equipment_opcua: {str(p)!r} is not TOML: {e}") from None
    return parse(doc, str(p), os.environ if env is None else env)


def parse(doc: dict[str, Any], where: str, env: Any) -> EquipmentFile:
    unknown = set(doc) - {"server", "unit", "method", "event"}
    if unknown:
        raise _err(where, "", f"unknown section {sorted(unknown)[0]!r} (server, unit, "
                              "method, event)")
    servers: dict[str, ServerSettings] = {}
    for i, raw in enumerate(_tables(doc, "server", where)):
        s = _server(raw, where, f"server[{i}]", env)
        if s.name in servers:
            raise _err(where, f"server[{i}]", f"a second server named {s.name!r}")
        servers[s.name] = s
    units = [_unit(raw, where, f"unit[{i}]", servers)
             for i, raw in enumerate(_tables(doc, "unit", where))]
    methods = [_method(raw, where, f"method[{i}]", servers)
               for i, raw in enumerate(_tables(doc, "method", where))]
    events = [_event(raw, where, f"event[{i}]", servers)
              for i, raw in enumerate(_tables(doc, "event", where))]
    out = EquipmentFile(servers, units, methods, events)
    _check_types_once(out, where)
    return out


def _check_types_once(f: EquipmentFile, where: str) -> None:
    seen: dict[tuple[str, str], str] = {}
    for kind, items in (("unit", f.units), ("method", f.methods)):
        for i, item in enumerate(items):
            types = (*item.types, *getattr(item, "hold_types", ()),
                     *getattr(item, "restart_types", ()))
            for s in item.scopes:
                for t in types:
                    other = seen.get((s, t))
                    if other is not None:
                        raise _err(where, f"{kind}[{i}]", f"type {t!r} in scope {s!r} is "
                                                          f"served by {other} already")
                    seen[(s, t)] = f"{kind}[{i}] ({item.equipment})"


def _tables(doc: dict[str, Any], name: str, where: str) -> list[dict[str, Any]]:
    v = doc.get(name, [])
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise _err(where, name, f"write each as [[{name}]]")
    return v


def _err(where: str, entry: str, why: str) -> ConfigError:
    at = f" {entry}" if entry else ""
    return ConfigError(f"setting equipment_opcua: {where}{at}: {why}")


class _Entry:
    """Reads the fields of one table, each checked; unknown keys refused."""

    def __init__(self, raw: dict[str, Any], where: str, entry: str, known: set[str]) -> None:
        self.raw, self.where, self.entry = raw, where, entry
        extra = set(raw) - known
        if extra:
            raise _err(where, entry, f"unknown key {sorted(extra)[0]!r}")

    def text(self, key: str, default: str | None = None) -> str:
        v = self.raw.get(key, default)
        if not isinstance(v, str) or (default is None and not v):
            raise _err(self.where, self.entry, f"{key} is a non-empty string")
        return v

    def texts(self, key: str, required: bool = True) -> list[str]:
        v = self.raw.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v) \
                or (required and not v):
            raise _err(self.where, self.entry, f"{key} is a list of non-empty strings")
        return list(v)

    def mapping(self, key: str) -> dict[str, str]:
        v = self.raw.get(key, {})
        if not isinstance(v, dict) or not all(isinstance(x, str) and x for x in v.values()):
            raise _err(self.where, self.entry, f"{key} maps names to node ids")
        return dict(v)

    def scopes(self, key: str = "scopes") -> list[str]:
        out = self.texts(key)
        for s in out:
            try:
                check_scope(s)
            except ValueError as e:
                raise _err(self.where, self.entry, f"{key}: {e}") from None
        return out

    def server(self, servers: dict[str, ServerSettings]) -> str:
        name = self.text("server")
        if name not in servers:
            raise _err(self.where, self.entry, f"server {name!r} is not a [[server]] of "
                                               "the file")
        return name


def _server(raw: dict[str, Any], where: str, entry: str, env: Any) -> ServerSettings:
    e = _Entry(raw, where, entry, {"name", "endpoint", "security", "certificate",
                                   "private_key", "trust_dir", "username", "password_env",
                                   "timeout_s", "user_certificate", "user_private_key"})
    endpoint = e.text("endpoint")
    u = urlsplit(endpoint)
    if u.scheme != "opc.tcp" or not u.hostname:
        raise _err(where, entry, f"endpoint {endpoint!r}: use opc.tcp://host:port/…")
    security = e.text("security", "None")
    if security not in SECURITY:
        raise _err(where, entry, f"security {security!r}: one of {', '.join(SECURITY)}")
    cert, key = e.text("certificate", ""), e.text("private_key", "")
    if security != "None" and not (cert and key):
        raise _err(where, entry, f"security {security}: certificate and private_key (the "
                                 "host's application certificate for this server)")
    for k, v in (("certificate", cert), ("private_key", key)):
        if v and not Path(v).is_file():
            raise _err(where, entry, f"{k} {v!r} is not a file")
    trust = e.text("trust_dir", "")
    if security != "None" and not trust:
        raise _err(where, entry, f"security {security}: trust_dir (the folder of the "
                                 "server certificates the host trusts)")
    if trust and not Path(trust).is_dir():
        raise _err(where, entry, f"trust_dir {trust!r} is not a folder")
    password = ""
    var = e.text("password_env", "")
    if var:
        password = env.get(var, "")
        if not password:
            raise _err(where, entry, f"password_env: the variable {var} is not set")
    timeout = raw.get("timeout_s", 5.0)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise _err(where, entry, "timeout_s is a number of seconds above 0")
    ucert, ukey = e.text("user_certificate", ""), e.text("user_private_key", "")
    if bool(ucert) != bool(ukey):
        raise _err(where, entry, "user_certificate and user_private_key go together (an "
                                 "X.509 user)")
    if ucert and e.text("username", ""):
        raise _err(where, entry, "username or user_certificate: a session has one user")
    for k, v in (("user_certificate", ucert), ("user_private_key", ukey)):
        if v and not Path(v).is_file():
            raise _err(where, entry, f"{k} {v!r} is not a file")
    return ServerSettings(e.text("name"), endpoint, security, cert, key, trust,
                          e.text("username", ""), password, float(timeout), ucert, ukey)


def _unit(raw: dict[str, Any], where: str, entry: str,
          servers: dict[str, ServerSettings]) -> UnitSettings:
    e = _Entry(raw, where, entry, {"equipment", "server", "scopes", "node", "types",
                                   "hold_types", "restart_types", "command_id", "results",
                                   "parameters", "cancel"})
    cancel = e.text("cancel", "Stop")
    if cancel not in CANCEL:
        raise _err(where, entry, f"cancel {cancel!r}: Stop or Abort")
    hold, restart = e.texts("hold_types", False), e.texts("restart_types", False)
    if bool(hold) != bool(restart):
        raise _err(where, entry, "hold_types and restart_types go together (a held unit "
                                 "is started again by Unhold)")
    return UnitSettings(e.text("equipment"), e.server(servers), e.scopes(), e.text("node"),
                        e.texts("types"), e.text("command_id"), hold, restart,
                        e.mapping("results"), e.mapping("parameters"), cancel)


def _method(raw: dict[str, Any], where: str, entry: str,
            servers: dict[str, ServerSettings]) -> MethodSettings:
    e = _Entry(raw, where, entry, {"equipment", "server", "scopes", "types", "object",
                                   "method"})
    return MethodSettings(e.text("equipment"), e.server(servers), e.scopes(),
                          e.texts("types"), e.text("object"), e.text("method"))


def _event(raw: dict[str, Any], where: str, entry: str,
           servers: dict[str, ServerSettings]) -> EventSettings:
    e = _Entry(raw, where, entry, {"server", "scope", "type", "node", "field", "event_type",
                                   "source", "fields"})
    scope = e.text("scope")
    try:
        check_scope(scope)
    except ValueError as err:
        raise _err(where, entry, f"scope: {err}") from None
    if ("node" in raw) == ("event_type" in raw):
        raise _err(where, entry, "one of node (a variable's data changes) or event_type "
                                 "(the events of a type)")
    if "node" in raw:
        if "source" in raw or "fields" in raw:
            raise _err(where, entry, "source and fields go with event_type, not node")
        return EventSettings(e.server(servers), scope, e.text("type"), e.text("node"),
                             e.text("field", "value"))
    if "field" in raw:
        raise _err(where, entry, "field goes with node; an event_type names fields = "
                                 "{ key = \"BrowseName\" }")
    fields = e.mapping("fields") or dict(DEFAULT_EVENT_FIELDS)
    return EventSettings(e.server(servers), scope, e.text("type"),
                         event_type=e.text("event_type"), source=e.text("source", SERVER_OBJECT),
                         fields=fields)
