"""The host process (``sfc-host run``): ``app`` wires every part together, ``preflight``
checks settings and servers before anything starts (``run --check``), ``endpoint``
serves ``/metrics``, ``/healthz`` and ``/readyz``, ``script_bridge`` gives the script
engine the host's MQTT and job control."""
