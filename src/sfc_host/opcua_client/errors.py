"""The client's exceptions: one root, ``OpcUaError``, under the host's."""

from __future__ import annotations

from sfc_host.errors import SfcHostError
from sfc_host.opcua_client.status_codes import NAMES

__all__ = ["BadStatus", "ChannelError", "OpcUaError", "status_name"]


class OpcUaError(SfcHostError):
    """Anything the OPC UA client raises on purpose."""


class BadStatus(OpcUaError):
    """A server's Bad status code: of a whole service (its ServiceResult, a
    ServiceFault) or of one operation of it. ``code`` is the number, ``name`` its
    symbolic name (``BadNodeIdUnknown``)."""

    def __init__(self, code: int, what: str = "") -> None:
        self.code = code
        self.name = status_name(code)
        super().__init__(f"{what}: {self.name}" if what else self.name)

    def __reduce__(self) -> tuple:
        return type(self), (self.code,)


class ChannelError(OpcUaError, ConnectionError):
    """The connection or its secure channel failed or was closed: every request on it
    fails with this, and the caller connects again."""


def status_name(code: int) -> str:
    """The symbolic name of a status code; its hex form where the name is unknown.
    Only the severity and sub-code bits select the name: the low 16 bits are flags."""
    base = code & 0xFFFF0000
    return NAMES.get(base) or f"0x{code:08X}"
