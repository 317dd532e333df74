"""One exception family: every error class of ours is under the root of its half
(``SfcError`` for the core, ``SfcHostError`` beneath it for the host), keeps the built-in
class it had, and a settings error names its setting."""

from __future__ import annotations

import importlib
import inspect
import pickle

import pytest
from helpers import house_plan as plan

from sfc_fast import InvalidTransition, RecipeError, SfcError, StateFormatError
from sfc_fast.graph import GraphFormatError
from sfc_host.config import ConfigError, HostConfig
from sfc_host.errors import SfcHostError, Unreachable
from sfc_host.service import preflight

# modules that need an extra the test run may lack
_EXTRAS = ("asyncua", "opentelemetry", "cryptography")


def _our_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class defined in a module of ours, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for name in sorted(plan.modules()):
        if plan.modules()[name].suffix == ".pxd" or name.endswith("__main__"):
            continue                    # declarations only; the command itself
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if (e.name or "").split(".")[0] in _EXTRAS:
                continue
            raise
        for attr, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == name and not attr.startswith("_")):
                found[f"{name}.{attr}"] = obj
    return found


def test_every_error_of_ours_is_under_the_root_of_its_half() -> None:
    found = _our_exceptions()
    assert len(found) > 30
    wrong = sorted(n for n, cls in found.items() if not issubclass(cls, SfcError))
    assert not wrong, f"not an SfcError: {wrong}"
    host = sorted(n for n, cls in found.items()
                  if n.startswith("sfc_host.") and not issubclass(cls, SfcHostError))
    assert not host, f"not an SfcHostError: {host}"


def test_the_core_errors_keep_their_place_and_their_builtin() -> None:
    for cls in (RecipeError, StateFormatError, GraphFormatError, InvalidTransition):
        assert issubclass(cls, SfcError) and issubclass(cls, ValueError)
        assert not issubclass(cls, SfcHostError)
    assert issubclass(SfcHostError, SfcError)


def test_one_unreachable_and_one_settings_error() -> None:
    assert preflight.Unreachable is Unreachable
    assert issubclass(ConfigError, ValueError)
    from sfc_host.tracing import batch
    assert not hasattr(batch, "BatchSettingError")


@pytest.mark.parametrize(("settings", "setting"), [
    ({"mqtt_qos": 7}, "mqtt_qos"),
    ({"log_format": "xml"}, "log_format"),
    ({"no_such_thing": 1}, "no_such_thing"),
])
def test_a_config_error_names_its_setting(settings: dict, setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        HostConfig.load(env={}, **settings)
    assert caught.value.setting == setting


def test_the_setting_is_read_from_the_message_or_given() -> None:
    assert ConfigError("SFC_MQTT_QOS: expected an integer, got 'x'").setting == "mqtt_qos"
    assert ConfigError("cannot read host.toml: gone").setting is None
    e = ConfigError("OTLP timeout 'x': not milliseconds", "OTEL_EXPORTER_OTLP_TIMEOUT")
    assert (e.setting, str(e)) == ("OTEL_EXPORTER_OTLP_TIMEOUT",
                                   "OTLP timeout 'x': not milliseconds")
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.setting, str(back)) == (ConfigError, e.setting, str(e))
