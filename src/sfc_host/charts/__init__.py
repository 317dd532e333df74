"""Pictures of recipes and jobs: ``svg`` (a recipe, or a running job's steps coloured
by state) and ``mermaid`` (a flowchart as text)."""
