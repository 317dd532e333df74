"""``sfc-host demo``."""
