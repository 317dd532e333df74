"""The host process."""
