from typing import Any

from sfc_fast.recipe import Graph

MAX_STATE_BYTES: int
STATUS_NAMES: tuple[str, ...]

class StateFormatError(ValueError): ...

def state_to_json(graph: Graph, state: bytes) -> dict[str, Any]: ...
def check_state(graph: Graph, state: bytes) -> None: ...
