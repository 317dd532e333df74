"""What the MQTT link reads of the settings: the host's ``HostConfig`` satisfies it, and so
does any object with these fields (a test's, an embedding application's), so the link
never imports the host's settings."""

from __future__ import annotations

from typing import Protocol


class MqttSettings(Protocol):
    consumer_name: str        # the default client id is sfc-{consumer_name}
    mqtt_url: str
    mqtt_version: int         # 5 or 3 (3.1.1)
    mqtt_username: str
    mqtt_password: str
    mqtt_client_id: str
    mqtt_ca_file: str
    mqtt_cert_file: str
    mqtt_key_file: str
    mqtt_shared_group: str
    mqtt_qos: int
    mqtt_keepalive_s: int
    mqtt_receive_maximum: int
    mqtt_queue_size: int
    mqtt_max_payload: int
