"""The link's Last Will: the message the broker publishes for us when the connection ends
without our DISCONNECT (the host's presence turns to gone, ``mes/presence.py``), and
what a broker's refusal of it changes for the next CONNECT."""

from __future__ import annotations

from typing import Any

from sfc_fast.wire.mqtt5 import Properties

# CONNACK codes about our will, which the next CONNECT changes: retain, QoS not supported
WILL_REFUSED = frozenset((0x9A, 0x9B))


class LastWill:
    """The will of the next CONNECT (none until ``set``), at QoS 1 until a broker says
    it takes no QoS 1 will."""

    def __init__(self) -> None:
        self.message: tuple[str, bytes, Properties | None] | None = None
        self.qos = 1

    def set(self, topic: str, payload: bytes, properties: Properties | None = None) -> None:
        self.message = (topic, payload, properties)

    def fields(self, v5: bool, retain: bool) -> dict[str, Any]:
        """The CONNECT's will arguments (``encode_connect``); empty without a will.
        ``retain``: whether the broker keeps retained messages."""
        if self.message is None:
            return {}
        topic, payload, props = self.message
        return {"will_topic": topic, "will_payload": payload, "will_qos": self.qos,
                "will_retain": retain, "will_properties": props if v5 else None}

    def refused(self, code: int, v5: bool) -> bool:
        """A CONNACK refused the connection with ``code``: True when it was the will's
        QoS, which the next CONNECT lowers (its retain flag follows the broker's
        retain, see ``Endpoint``)."""
        if v5 and code == 0x9B and self.qos:
            self.qos = 0
            return True
        return False
