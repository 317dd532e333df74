"""sfc-host: the thin service around the sfc_fast core (Redis, MQTT, job control, CLI)."""

__version__ = "0.1.0"
