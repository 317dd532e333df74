"""Station equipment."""
