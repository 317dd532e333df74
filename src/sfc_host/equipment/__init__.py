"""Station equipment: commands out and answers and pull events in over MQTT
(``mqtt_transport``), and what the equipment of a scope announces it can do
(``capabilities``)."""

from sfc_host.equipment.capabilities import Capabilities, unserved
from sfc_host.equipment.mqtt_transport import EquipmentIn, MqttSink

__all__ = ["Capabilities", "EquipmentIn", "MqttSink", "unserved"]
