"""Station equipment: commands out and answers and pull events in over MQTT
(``mqtt_transport``), and what the equipment of a scope announces it can do
(``capabilities``)."""
