"""Equipment over OPC UA (the ``[opcua]`` extra): the host as an OPC UA client of the
plant's PLCs, beside the MQTT contract. ``settings`` reads the equipment file,
``session`` keeps one session per server, ``packml`` drives a PackML unit, ``method``
calls a method, ``transport`` routes each command to its binding and turns outcomes
and data changes into answers and pull events (docs/equipment-opcua.md)."""
