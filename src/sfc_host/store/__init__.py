"""Everything the host keeps in Redis."""
