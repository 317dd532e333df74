"""The link's delivery check: messages of our own, sent on topics under a base no one
else uses, must come back through our own (shared) subscription, unchanged, before the
link says it listens.

Two kinds of broker leave a host that looks ready deaf. One grants ``$share/…``
filters and delivers nothing through them (MQTT 3.1.1 has no way to say it lacks
them). Another maps topic levels onto a separator of its own and turns a ``.`` inside a
level into a level break, so ``equipment/plant.line1/responses`` arrives as
``equipment/plant/line1/responses`` and matches no subscription of a dotted scope. The
check sends one message on the base topic and one per dotted scope on
``{base}/{scope}``, and reads what came back where.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

PROBE_S = 5.0            # the wait for our own messages to come back


class DeliveryProbe:
    """One run of the check: its topics, what came back, and the verdict."""

    def __init__(self, base: str, scopes: Sequence[str] = ()) -> None:
        self.base = base
        nonce = os.urandom(8).hex()
        topics = [base, *(f"{base}/{s}" for s in scopes)]
        # payload -> the topic it went out on; payload -> the topic it came back on
        self.sent = {f"{nonce}:{i}".encode(): t for i, t in enumerate(topics)}
        self.came: dict[bytes, str] = {}
        self.scopes = {f"{base}/{s}": s for s in scopes}
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def topic_filter(self, group: str) -> str:
        """Our subscription: ``#`` also matches a topic the broker split into more
        levels, so a rewrite is seen, not only missed."""
        flt = f"{self.base}/#"
        return f"$share/{group}/{flt}" if group else flt

    def takes(self, topic: str) -> bool:
        return topic == self.base or topic.startswith(self.base + "/")

    def feed(self, topic: str, payload: bytes) -> None:
        if payload in self.sent and payload not in self.came:
            self.came[payload] = topic
            if len(self.came) == len(self.sent) and not self.done.done():
                self.done.set_result(None)

    def refused(self) -> None:
        """The broker refused one of our messages: the wait is over."""
        if not self.done.done():
            self.done.cancel()

    def failure(self, flt: str, client_id: str, shared: bool) -> str:
        """Why the check failed, in one line; "" when every message came back where it
        was sent."""
        for payload, got in self.came.items():
            sent = self.sent[payload]
            if got != sent:
                return self._rewritten(sent, got)
        if self.done.cancelled():
            return (f"the broker refused the host's check message under {self.base}: its "
                    f"ACL must let client {client_id} publish and subscribe there "
                    f"(docs/operations.md, the broker's ACL)")
        missing = [t for p, t in self.sent.items() if p not in self.came]
        if not missing:
            return ""
        if self.base in missing and shared:
            return (f"the broker granted the shared subscription {flt} but delivered "
                    f"nothing through it within {PROBE_S:g} s; this broker does not serve "
                    f"shared subscriptions (set mqtt_shared_group = \"\" for one host only, "
                    f"or use a broker that does), or its ACL keeps {self.base} from client "
                    f"{client_id}")
        if self.base in missing:
            return (f"the broker delivered nothing on {self.base} within {PROBE_S:g} s: "
                    f"its ACL keeps it from client {client_id}")
        scoped = next(t for t in missing if t in self.scopes)
        return (f"scope {self.scopes[scoped]!r}: the broker delivered nothing on {scoped} "
                f"within {PROBE_S:g} s, so it loses messages on topics with a '.' in a "
                f"level (a broker that maps topic levels onto '.'); use scopes without "
                f"'.', or a broker that keeps topic names as sent")

    def _rewritten(self, sent: str, got: str) -> str:
        scope = self.scopes.get(sent)
        what = f"scope {scope!r} cannot work through it" if scope else "the host cannot work"
        return (f"the broker rewrote the topic {sent} into {got} (a '.' in a topic level "
                f"became a level break): {what}, its messages would match no subscription; "
                f"use scopes without '.', or a broker that keeps topic names as sent")
