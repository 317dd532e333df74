"""The OPC UA face: ISA-95 Job Control v2 (OPC 10031-4) for an MES that speaks OPC UA,
beside the MQTT face (``mes``) and on the same job control, served by our own OPC UA
server (``sfc_host.opcua_server``); the host imports it only with ``opcua = true``.

- ``face``: the face of one host (``OpcUaFace``): each scope's receiver and response
  provider, their methods, status events and ``JobOrderList``;
- ``methods``: a call checked and run through the MES side's job control;
- ``structures``: ISA-95 values between the MQTT face's JSON and OPC UA's binary
  bodies, laid out by the NodeSet's DataTypeDefinitions;
- ``bodies``, ``lists``: what the events and the order lists carry;
- ``security``: the trust list, users and what they may do;
- ``server``: the server with the Job Control NodeSet (``nodeset/``) loaded.
"""
