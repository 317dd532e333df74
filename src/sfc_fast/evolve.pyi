from collections.abc import Iterable
from typing import Any

from sfc_fast.events import BaseEvent
from sfc_fast.graph import Graph

MAX_ENTRIES_PER_CALL: int

class Command:
    command_id: str
    action: str
    type_id: str
    parameters: dict[str, Any] | None
    deadline_ms: int | None
    hold: bool
    restart: bool
    job: str
    scope: str
    attempt: int
    def to_dict(self) -> dict[str, Any]: ...

class Decision:
    applied: bool
    state: bytes | None
    archived: bytes
    status: str
    reason: str | None
    work: list[tuple[str, str, str]]
    commands: list[Command]
    job: tuple[str, ...]
    next_deadline: int | None
    waits_added: tuple[str, ...]
    waits_removed: tuple[str, ...]
    @property
    def ended(self) -> list[tuple[str | None, str | None, str, int, int, int, str]]: ...

def evolve(graph: Graph, state: bytes | None, event: BaseEvent, now_ms: int) -> Decision: ...
def evolve_live(graph: Graph, state: bytes | None, event: BaseEvent,
                now_ms: int) -> Decision: ...
def evolve_many(graph: Graph, states: Iterable[bytes | None],
                events: BaseEvent | Iterable[BaseEvent],
                now_ms: int) -> list[Decision | ValueError]: ...
def job_index(graph: Graph, state: bytes) -> tuple[str, int | None, tuple[str, ...]]: ...
def open_command(graph: Graph, state: bytes, action: str) -> Command | None: ...
def sent_markers(graph: Graph, state: bytes) -> tuple[int, tuple[tuple[str, str], ...]]: ...

def job_of_command(command_id: str) -> str: ...
