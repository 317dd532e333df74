from typing import Any

from sfc_fast.errors import SfcError

OPCODES: dict[str, int]
REF_KINDS: dict[str, int]
TRIVIALLY_TRUE: frozenset[str]

class ConditionSyntaxError(SfcError, ValueError):
    message: str
    position: int
    def __init__(self, message: str, position: int) -> None: ...

class CondBuilder:
    @property
    def code(self) -> list[int]: ...
    @property
    def offsets(self) -> list[int]: ...
    refs: list[tuple[int, int, tuple[str, ...]]]
    consts: list[str]
    def __init__(self, actions: dict[str, int]) -> None: ...
    def add(self, text: str) -> int: ...
    def tables(self) -> tuple[bytes, bytes]: ...

class CondContext: ...

def lookup_path(value: Any, segs: tuple[str, ...]) -> Any: ...
def truthy_value(v: Any) -> bool: ...
def evaluate(
    text: str,
    *,
    results: dict[str, Any] | None = ...,
    rounds: dict[str, int] | None = ...,
    outcomes: dict[str, str] | None = ...,
    params: dict[str, Any] | None = ...,
    bare: list[dict[str, Any]] | None = ...,
) -> bool: ...
def disassemble(text: str, actions: tuple[str, ...] | list[str] = ...) -> list[str]: ...
