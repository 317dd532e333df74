"""MQTT for the host, on a client of our own: ``MqttLink`` (``link``: sessions, backoff,
keep alive) on a ``connection`` and the compiled packet codec ``sfc_fast.wire.mqtt5``,
composing ``endpoint`` (URL, settings, the broker's CONNACK), ``outbox`` (the outgoing
queue and window), ``routes`` (which handler takes a message), ``inbox`` (the handlers'
backlog and deferred acknowledgements), ``subscriber`` (subscriptions on the broker and
the delivery check of ``probe``) and ``will`` (the Last Will); ``cloudevents``
(CloudEvents in binary and structured mode); ``topics`` (filters and matching);
``settings`` (``MqttSettings``, what the link reads of the settings). Handlers get the
codec's ``Message`` (``topic``, ``payload``, ``qos``, ``retain``, ``properties``) and
messages are sent with its ``Properties``."""

from sfc_fast.wire.mqtt5 import Message, Properties
from sfc_host.mqtt import cloudevents
from sfc_host.mqtt.connection import MqttError
from sfc_host.mqtt.endpoint import MqttRefused, MqttUnsupported
from sfc_host.mqtt.link import MqttLink
from sfc_host.mqtt.outbox import IN_FLIGHT
from sfc_host.mqtt.settings import MqttSettings
from sfc_host.mqtt.topics import filter_problem, topic_matches

__all__ = ["IN_FLIGHT", "Message", "MqttError", "MqttLink", "MqttRefused", "MqttSettings",
           "MqttUnsupported", "Properties", "cloudevents", "filter_problem", "topic_matches"]
