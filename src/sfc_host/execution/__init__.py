"""Running jobs."""
