"""The OPC UA face: ISA-95 Job Control v2 (OPC 10031-4) for an MES that speaks OPC UA,
beside the MQTT face (``mes``) and on the same job control. Needs the ``[opcua]``
extra (asyncua); the host imports it only with ``opcua = true``.

- ``face``: the face of one host (``OpcUaFace``): each scope's receiver and response
  provider, their methods, status events and ``JobOrderList``;
- ``methods``: a call checked and run through the MES side's job control;
- ``convert``: ISA-95 values between the MQTT face's JSON and OPC UA structures;
- ``server``: asyncua's server with the Job Control NodeSet (``nodeset/``) loaded.
"""
