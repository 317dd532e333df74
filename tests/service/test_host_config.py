"""HostConfig: defaults, TOML, environment, overrides, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfc_host.config import ConfigError, HostConfig


def test_defaults_are_valid() -> None:
    c = HostConfig()
    assert c.redis_url.startswith("redis://") and c.read_count == 128
    assert c.consumer_name  # hostname-pid


def test_toml_then_environment_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "host.toml"
    f.write_text('group = "top"\n[host]\nread_count = 7\nscopes = ["a", "b"]\n'
                 'redis_cluster = true\n')
    c = HostConfig.load(f, env={})
    assert (c.group, c.read_count, c.scopes, c.redis_cluster) == ("top", 7, ["a", "b"], True)
    c = HostConfig.load(f, env={"SFC_READ_COUNT": "9", "SFC_SCOPES": "x, y",
                                "SFC_TRIM_ACKED": "off"})
    assert (c.read_count, c.scopes, c.trim_acked) == (9, ["x", "y"], False)
    c = HostConfig.load(f, env={"SFC_READ_COUNT": "9"}, read_count=11, group=None)
    assert c.read_count == 11 and c.group == "top"


@pytest.mark.parametrize(("kwargs", "env", "text", "message"), [
    ({}, {"SFC_READ_COUNT": "many"}, None, "SFC_READ_COUNT: expected an integer"),
    ({}, {"SFC_REDIS_CLUSTER": "perhaps"}, None, "expected true or false"),
    ({"read_count": 0}, {}, None, "read_count: must be at least 1"),
    ({"sweep_interval_ms": 5000, "outage_threshold_ms": 1000}, {}, None,
     "outage_threshold_ms: must be longer"),
    ({}, {}, "read_count = 'x'\n", "read_count: expected an integer"),
    ({}, {}, "no_such_setting = 1\n", "unknown setting 'no_such_setting'"),
    ({}, {}, "read_count = \n", "is not valid TOML"),
])
def test_bad_settings_are_refused_with_one_clear_line(
        tmp_path: Path, kwargs: dict, env: dict, text: str | None, message: str) -> None:
    path = None
    if text is not None:
        path = tmp_path / "bad.toml"
        path.write_text(text)
    with pytest.raises(ConfigError) as e:
        HostConfig.load(path, env=env, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value).strip()


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        HostConfig.load(tmp_path / "nope.toml", env={})
