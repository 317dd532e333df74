"""What deploy/ ships for a plant server: the complete example settings, the systemd
unit, the wheelhouse script; and the files a release carries (LICENSE, CHANGELOG).

The wheel itself is built and installed offline in test_wheel.py (slow)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sfc_host.config import HostConfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HOST_TOML = DEPLOY / "host.toml"
UNIT = DEPLOY / "sfc-host.service"


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _settings(path: Path) -> dict:
    doc = tomllib.loads(path.read_text())
    host = doc.pop("host", {})
    return {**{k: v for k, v in doc.items() if not isinstance(v, dict)}, **host}


def test_host_toml_names_every_setting_with_its_default() -> None:
    """Fails when a HostConfig field is added without a line in deploy/host.toml, or
    when a default changes and the file still shows the old one."""
    given = _settings(HOST_TOML)
    fields = {f.name: f for f in dataclasses.fields(HostConfig)}
    missing = sorted(set(fields) - set(given))
    assert not missing, f"deploy/host.toml lacks these HostConfig settings: {missing}"
    unknown = sorted(set(given) - set(fields))
    assert not unknown, f"deploy/host.toml has settings HostConfig does not know: {unknown}"
    wrong = {n: (given[n], _default(f)) for n, f in fields.items() if given[n] != _default(f)}
    assert not wrong, f"deploy/host.toml (value, default) that differ: {wrong}"


def test_host_toml_comments_every_setting() -> None:
    """Every setting has a comment line right above it (or a group's comment above a
    run of related settings, such as the three TLS files)."""
    lines = HOST_TOML.read_text().splitlines()
    uncommented = []
    for i, line in enumerate(lines):
        if "=" not in line or line.startswith(("#", "[")) or not line.strip():
            continue
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].startswith("#"):
            j -= 1          # a run of settings under one comment
        if j < 0 or not lines[j].startswith("#") or i - j > 4:
            uncommented.append(line.split("=")[0].strip())
    assert not uncommented, f"settings without a comment in deploy/host.toml: {uncommented}"


def test_host_toml_loads() -> None:
    cfg = HostConfig.load(HOST_TOML, env={})
    assert cfg == HostConfig()


def test_run_check_accepts_host_toml(tmp_path: Path) -> None:
    """`sfc-host run --check` takes the file as shipped (settings, no scripts, no
    servers reached); from a folder outside the tree, with no SFC_* variables."""
    cmd = [sys.executable, "-m", "sfc_host", "run"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    if "--check" not in subprocess.run([*cmd, "--help"], capture_output=True, text=True,
                                       env=env, timeout=60).stdout:
        pytest.skip("this sfc-host has no 'run --check' yet")
    r = subprocess.run([*cmd, "--check", "--config", str(HOST_TOML)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return tool


def _unit_for_checks(tmp_path: Path) -> Path:
    """The unit with its ExecStart pointed at an executable that exists here (verify
    checks that the program is there)."""
    exe = tmp_path / "sfc-host"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    text = UNIT.read_text()
    assert "/opt/sfc-host/bin/sfc-host run --config /etc/sfc-host/host.toml" in text
    unit = tmp_path / "sfc-host.service"
    unit.write_text(text.replace("/opt/sfc-host/bin/sfc-host", str(exe)))
    return unit


def test_unit_verifies(tmp_path: Path) -> None:
    tool = _systemd_analyze()
    unit = _unit_for_checks(tmp_path)
    r = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True,
                       text=True, timeout=60)
    # verify prints problems of this unit as "sfc-host.service:LINE: …" (and may warn
    # about the machine's own units, which are none of this test's business)
    own = [ln for ln in (r.stdout + r.stderr).splitlines() if "sfc-host.service" in ln]
    assert r.returncode == 0 and not own, r.stdout + r.stderr


def test_unit_is_hardened(tmp_path: Path) -> None:
    """systemd's own exposure score (0 best, 10 worst) stays at 2.0 or below: 1.4 today,
    with network access the only large exposure left."""
    tool = _systemd_analyze()
    unit = _unit_for_checks(tmp_path)
    r = subprocess.run([tool, "security", "--offline=yes", "--threshold=20", "--no-pager",
                        str(unit)], capture_output=True, text=True, timeout=60)
    if "Unknown option" in r.stderr or "unrecognized option" in r.stderr:
        pytest.skip(f"this systemd-analyze has no offline security check: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr


def test_unit_settings() -> None:
    text = UNIT.read_text()
    settings = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            settings.setdefault(k, []).append(v)
    assert settings["User"] == ["sfc-host"] and settings["Group"] == ["sfc-host"]
    assert settings["Restart"] == ["on-failure"]
    assert settings["RestartPreventExitStatus"] == ["2"]     # a mistake is not retried
    assert settings["After"] == ["network-online.target"]
    assert settings["Wants"] == ["network-online.target"]
    assert settings["KillSignal"] == ["SIGTERM"]
    assert "ExecReload" not in settings                      # no reload in the host
    assert settings["CapabilityBoundingSet"] == [""]
    assert settings["RestrictAddressFamilies"] == ["AF_INET AF_INET6 AF_UNIX"]


def test_wheelhouse_script_is_valid_bash() -> None:
    script = DEPLOY / "build-wheelhouse.sh"
    assert script.stat().st_mode & 0o111, "deploy/build-wheelhouse.sh is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_license_and_changelog() -> None:
    lic = (REPO / "LICENSE").read_text()
    assert lic.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in lic
    assert "END OF TERMS AND CONDITIONS" in lic
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "LICENSE" in pyproject["project"].get("license-files", ["LICENSE"])
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
