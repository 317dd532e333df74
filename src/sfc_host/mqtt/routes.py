"""Which handler takes an incoming message: the subscriptions registered with the link
and the topics they match.

A message goes to the handler of the first matching filter (the host's link, whose
filters do not overlap) or, with ``fan_out`` (the script engine's link), to every
matching subscription once. On MQTT 5 the broker sends one copy per matching
subscription, told apart by subscription identifiers; on 3.1.1 one copy. A message no
subscription matches is counted and said once per topic.
"""

from __future__ import annotations

import logging

from sfc_fast.wire.mqtt5 import Message
from sfc_host.metrics import Metrics
from sfc_host.mqtt.inbox import DROP_WARNED_MAX, Handler, Inbox
from sfc_host.mqtt.probe import DeliveryProbe
from sfc_host.mqtt.topics import dotted_original, filter_problem, topic_matches

log = logging.getLogger("sfc_host.mqtt")

ROUTES_MAX = 10_000      # topics whose handler is remembered (a scope's topics each)

# (filter, filter as subscribed, handler)
Entry = tuple[str, str, Handler]


class Routes:
    """The registered subscriptions, the topics routed so far, and the connection's
    ``on_message``: messages to ``inbox``, or to the delivery check running."""

    def __init__(self, group: str, inbox: Inbox, metrics: Metrics, *,
                 fan_out: bool = False) -> None:
        self.group = group                  # the shared subscriptions' group ("" none)
        self.inbox = inbox
        self.metrics = metrics
        self.fan_out = fan_out
        self.subs: list[Entry] = []
        # topic -> its handler (None: unrouted), so a topic's filters are matched once;
        # emptied whenever the subscriptions change
        self._routes: dict[str, Handler | None] = {}
        self.sub_ids: dict[str, int] = {}   # filter as subscribed -> its identifier
        self.probe: DeliveryProbe | None = None   # the delivery check's messages go there
        self._unrouted_warned: set[str] = set()

    def add(self, topic_filter: str, handler: Handler, shared: bool) -> tuple[Entry, bool]:
        """Register a subscription: its entry, and whether its filter (as subscribed)
        is new. ``ValueError`` for what is no topic filter."""
        group = self.group
        as_ = f"$share/{group}/{topic_filter}" if shared and group else topic_filter
        problem = filter_problem(topic_filter) or filter_problem(as_)
        if problem:
            raise ValueError(f"{str(topic_filter)[:200]!r}: {problem}")
        new = not self.has(as_)
        entry = (topic_filter, as_, handler)
        self.subs.append(entry)
        self._routes.clear()
        if self.fan_out and as_ not in self.sub_ids:
            self.sub_ids[as_] = len(self.sub_ids) + 1
        return entry, new

    def remove(self, entry: Entry) -> bool:
        """End a subscription; True when it was the last on its filter as subscribed."""
        if entry not in self.subs:
            return False
        self.subs.remove(entry)
        self._routes.clear()
        return not self.has(entry[1])

    def has(self, as_: str) -> bool:
        return any(s[1] == as_ for s in self.subs)

    def filters(self) -> list[str]:
        """Every filter as subscribed, once each, in the order registered."""
        return list(dict.fromkeys(s[1] for s in self.subs))

    def shared(self) -> bool:
        return bool(self.group) and any(s[1].startswith("$share/") for s in self.subs)

    def dispatch(self, message: Message) -> bool:
        """Hand a message to its handler(s); True when its PUBACK waits for them."""
        topic = message.topic
        if self.probe is not None and self.probe.takes(topic):
            self.probe.feed(topic, message.payload)
            return False
        if self.fan_out:
            return self._fan_out(message, topic)
        routes = self._routes
        try:
            handler = routes[topic]
        except KeyError:
            handler = next((h for f, _, h in self.subs if topic_matches(f, topic)), None)
            if len(routes) < ROUTES_MAX:
                routes[topic] = handler
        if handler is None:
            self._unrouted(topic)
            return False
        return self.inbox.handle(handler, message, topic, None)

    def _fan_out(self, message: Message, topic: str) -> bool:
        p = message.properties
        ids = p.SubscriptionIdentifier if p is not None else None
        sub_ids = self.sub_ids
        handlers = [h for f, as_, h in self.subs
                    if (sub_ids.get(as_) in ids if ids else topic_matches(f, topic))]
        if not handlers:
            self._unrouted(topic)
            return False
        inbox = self.inbox
        ack = inbox.shared_ack(message)
        for h in handlers:
            inbox.handle(h, message, topic, ack)
        return ack is not None and ack.left > 0

    def _unrouted(self, topic: str) -> None:
        """A message no subscription of ours matches: counted, and said once per topic
        with what probably happened (a broker that rewrote its topic, most often)."""
        self.metrics.inc("mqtt_unrouted")
        warned = self._unrouted_warned
        if topic in warned or len(warned) >= DROP_WARNED_MAX:
            return
        warned.add(topic)
        filters = [f for f, _, _ in self.subs]
        sent_as = dotted_original(topic, filters)
        if sent_as is not None:
            why = (f"it was probably sent as {sent_as!r}, which the host subscribes to, "
                   f"and the broker turned a '.' into a level break: scopes with '.' "
                   f"cannot work through this broker")
        else:
            why = ("probably a subscription ended while it was on its way, or a broker "
                   "that delivers what no subscription of this client asked for")
        log.warning("an MQTT message on %r matched no subscription of the host: %s "
                    "(logged once per topic; counted in sfc_mqtt_unrouted_total)",
                    topic[:200], why)
