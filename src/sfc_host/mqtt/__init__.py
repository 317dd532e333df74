"""MQTT for the host: ``MqttLink`` (link.py) on a connection of our own (connection.py)
and the compiled packet codec ``sfc_fast.wire.mqtt5``; handlers get its ``Message``
(``topic``, ``payload``, ``qos``, ``retain``, ``properties``) and messages are sent with
its ``Properties``."""

from sfc_fast.wire.mqtt5 import Message, Properties
from sfc_host.mqtt.connection import MqttError
from sfc_host.mqtt.link import IN_FLIGHT, MqttLink, MqttRefused, MqttUnsupported
from sfc_host.mqtt.topics import filter_problem, topic_matches

__all__ = ["IN_FLIGHT", "Message", "MqttError", "MqttLink", "MqttRefused", "MqttUnsupported",
           "Properties", "filter_problem", "topic_matches"]
