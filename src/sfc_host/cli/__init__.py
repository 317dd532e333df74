"""The ``sfc-host`` command."""

from sfc_host.cli.main import main

__all__ = ["main"]
