"""``sfc-host`` in process, as a test calls it."""

from __future__ import annotations

import pytest

from sfc_host.cli.main import main


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``sfc-host *argv`` in this process: (exit code, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse exits for usage errors
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err
