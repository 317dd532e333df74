"""The web view in a real browser: headless chromium driven by selenium (Debian's
``chromium`` and ``chromium-driver``; .ci/setup installs them) against ``sfc-host run``
with ``web = true`` and ``web_control = true``, real redis-server and mosquitto, an MES
and a station on MQTT. It follows a running job from the scopes page to its own page,
sees its steps turn active and finished without a reload, pauses and resumes it with
the buttons, sees it complete; ``sfc-host web`` beside it shows no buttons and refuses a
POST; the hostile-names recipe renders as text. Its screenshots go to a temporary folder;
``python tests/helpers/screenshots.py`` runs the same tour and puts them in docs/img/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import screenshots

pytestmark = pytest.mark.servers

# the operator's tour (helpers/web_tour.py): without chromium, chromedriver or selenium,
# importing it skips this module
pytest.importorskip("helpers.web_tour")


def test_an_operator_follows_pauses_and_resumes_a_job_in_the_browser(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The tour as the screenshot command runs it, its pictures in a temporary folder."""
    out = tmp_path / "img"
    assert screenshots.main(["--out", str(out), "--redis", redis_url, "--mqtt", mqtt_url]) == 0
    for name in screenshots.SHOTS:
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name


def test_the_screenshot_command_starts_as_a_script() -> None:
    done = subprocess.run([sys.executable, str(Path(screenshots.__file__)), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--out" in done.stdout, done.stderr
