"""The host process (``sfc-host run``): ``app`` wires every part together, ``preflight``
checks settings and servers before anything starts (``run --check``), ``endpoint``
serves ``/metrics``, ``/healthz`` and ``/readyz``, ``script_bridge`` gives the script
engine the host's MQTT and job control."""

from sfc_host.service.app import App
from sfc_host.service.endpoint import HttpEndpoint
from sfc_host.service.preflight import check_config, check_servers
from sfc_host.service.script_bridge import ScriptJobs, ScriptLink

__all__ = ["App", "HttpEndpoint", "ScriptJobs", "ScriptLink", "check_config", "check_servers"]
