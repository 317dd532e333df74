"""sfc-host: the thin service around the sfc_fast core (Redis, MQTT, job control, CLI)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
