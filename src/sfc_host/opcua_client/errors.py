"""The client's exceptions: one root, ``OpcUaError``, under the host's."""

from __future__ import annotations

from sfc_host.errors import SfcHostError

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

    The names come from asyncua's table of the specification's codes when asyncua is
    installed (the ``opcua`` extra, which brings the client too); only the severity and
    sub-code bits of the code select the name, as the low 16 bits are flags."""
    base = code & 0xFFFF0000
    if base == 0:
        return "Good"
    name = _names().get(base)
    return name if name else f"0x{code:08X}"


_NAMES: dict[int, str] | None = None


def _names() -> dict[int, str]:
    global _NAMES
    if _NAMES is None:
        try:
            from asyncua.ua import status_codes
            table = {v: k for k, v in vars(status_codes.StatusCodes).items()
                     if isinstance(v, int) and not k.startswith("_")}
        except ImportError:
            table = {}
        _NAMES = table
    return _NAMES
