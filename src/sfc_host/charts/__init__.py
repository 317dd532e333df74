"""Pictures of recipes and jobs: ``svg`` (a recipe, or a running job's steps coloured
by state) and ``mermaid`` (a flowchart as text)."""

from sfc_host.charts.mermaid import to_mermaid
from sfc_host.charts.svg import job_classes, to_svg

__all__ = ["job_classes", "to_mermaid", "to_svg"]
