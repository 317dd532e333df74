"""What the equipment of a scope can do, and the build check that uses it (H-13).

Equipment announces the CloudEvent types it serves with a retained message on
``{eq}/{scope}/capabilities/{equipment}``: plain JSON ``{"TypeIds": [...]}``; an empty
retained message withdraws it. Every host keeps the union in Redis
(``sfc:{S}:capabilities``, equipment -> JSON list), so a Work Master PUT on any host is
checked against it: an action whose type (its ``TypeId``, and its hold and restart
types) no announced equipment serves is a build error ``SFC025``, not a job that fails
at run time. A scope where nothing was announced accepts every type (announcing is
optional; the action's deadline then settles a type nobody serves). A host that starts
asks every scope's equipment to announce again (``ask``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from sfc_fast import Graph, Problem
from sfc_host.metrics import Metrics
from sfc_host.mqtt import Message, MqttLink
from sfc_host.names import check_scope

log = logging.getLogger("sfc_host.equipment.capabilities")

CODE = "SFC025"
MAX_TYPES = 10_000
ASK = b'{"Announce":true}'
_FIELDS = (("type_id", "TypeId"), ("hold_type_id", "HoldTypeId"),
           ("restart_type_id", "RestartTypeId"))


def key(base: str) -> str:
    return base + "capabilities"


def unserved(graph: Graph, served: set[str]) -> list[Problem]:
    """``SFC025`` for every action type of ``graph`` not in ``served``."""
    problems = []
    for i in range(len(graph.actions)):
        info = graph.action_info(i)
        for field, name in _FIELDS:
            t = info.get(field)
            if t and t not in served:
                problems.append(Problem(
                    CODE, f"Actions[{i}].{name}",
                    f"no equipment of the scope serves {t!r} (action {info['name']!r})"))
    return problems


def parse(payload: bytes) -> list[str] | None:
    """The announced types; None for an empty message (withdrawn). ValueError when the
    message is not ``{"TypeIds": [str, ...]}``."""
    if not payload:
        return None
    try:
        doc = json.loads(payload)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    types = doc.get("TypeIds") if isinstance(doc, dict) else None
    if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
        raise ValueError('expected {"TypeIds": [non-empty strings]}')
    if len(types) > MAX_TYPES:
        raise ValueError(f"more than {MAX_TYPES} types")
    return sorted(set(types))


class Capabilities:
    """Keeps the announcements in Redis (each host, plain subscription: retained
    messages do not reach shared subscriptions)."""

    def __init__(self, client: Any, keys: Any, link: MqttLink, metrics: Metrics) -> None:
        self.client = client
        self.keys = keys            # scope -> ScopeKeys
        self.metrics = metrics
        self.link = link
        self.prefix = link.config.equipment_prefix
        link.subscribe(f"{self.prefix}/+/capabilities/+", self.on_message, shared=False)

    def ask(self, scopes: Iterable[str]) -> None:
        """Ask each scope's equipment to announce again (``{eq}/{scope}/capabilities``,
        not retained): some brokers hand retained messages only to a subscription of
        the exact topic, so a host that subscribes with a wildcard would never see what
        was announced before it started."""
        for scope in scopes:
            self.link.publish_nowait(f"{self.prefix}/{scope}/capabilities", ASK, qos=1)

    async def on_message(self, message: Message) -> None:
        topic = message.topic
        parts = topic.split("/")
        try:
            if len(parts) != 4 or parts[0] != self.prefix or not parts[3]:
                raise ValueError("not a capabilities topic")
            scope = check_scope(parts[1])
            types = parse(message.payload)
        except ValueError as e:
            self.metrics.inc("bad_capabilities")
            log.warning("capabilities on %s refused: %s", topic, e)
            return
        k = key(self.keys(scope).base)
        if types is None:
            await self.client.hdel(k, parts[3])
        else:
            await self.client.hset(k, parts[3], json.dumps(types))
        self.metrics.inc("capabilities_received")

    async def served(self, scope: str) -> set[str] | None:
        """The union of the scope's announced types; None when nothing is announced."""
        raw = await self.client.hvals(key(self.keys(scope).base))
        if not raw:
            return None
        out: set[str] = set()
        for r in raw:
            out.update(json.loads(r))
        return out
