"""The root of the host's exceptions, and the two families every part of the host raises:
a setting that cannot be used (``ConfigError``) and a server that cannot be reached
(``Unreachable``).

``SfcHostError`` derives from the core's root (``sfc_fast.errors.SfcError``): one
``except SfcError`` takes whatever sfc-fast raises on purpose, and never a bug. Each
family keeps the built-in class it had (``ConfigError`` is still a ``ValueError``), so
code that caught the built-in goes on working. The other families (``MqttError``,
``OrderError``, ``MesError``, ...) live beside the code that raises them, each an
``SfcHostError``; docs/architecture.md draws the tree.
"""

from __future__ import annotations

import re

from sfc_fast import SfcError

__all__ = ["ConfigError", "SfcError", "SfcHostError", "Unreachable"]

# How a message names its setting: "setting mqtt_qos: ...", "SFC_MQTT_QOS: ...",
# "unknown setting 'x'"; the raise sites keep their wording and the name is read from it
_NAMED = re.compile(r"^(?:setting (?P<setting>\w+)\b|SFC_(?P<env>\w+):|"
                    r"unknown setting '(?P<unknown>[^']+)')")


class SfcHostError(SfcError):
    """An error the host raises on purpose: a setting, a server, an order, a message,
    a script. A bug is never an ``SfcHostError``."""


class ConfigError(SfcHostError, ValueError):
    """A setting that cannot be used (unknown name, wrong type, out of range, a file or
    variable it names that is wrong). ``setting`` names it: a setting of the host
    (``mqtt_qos``), or an environment variable read beside the settings
    (``OTEL_BSP_MAX_QUEUE_SIZE``); None when the message names none (an unreadable
    settings file)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        if setting is None and (m := _NAMED.match(message)):
            setting = m["setting"] or m["unknown"] or m["env"].lower()
        self.setting = setting

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.setting)


class Unreachable(SfcHostError):
    """A server (Redis, the broker) that cannot be reached or refuses the host, said in
    one line."""
