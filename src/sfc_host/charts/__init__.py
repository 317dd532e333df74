"""Pictures of recipes and jobs."""
