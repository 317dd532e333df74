from typing import Any

class BaseEvent:
    kind: int

class Start(BaseEvent):
    job: str
    scope: str
    params: dict[str, Any] | None
    order: str
    commands_before: int
    def __init__(self, job: str, scope: str, params: dict[str, Any] | None = ...,
                 order: str | None = ..., commands_before: int = ...) -> None: ...

class Completed(BaseEvent):
    command_id: str
    result: dict[str, Any] | None
    def __init__(self, command_id: str, result: dict[str, Any] | None = ...) -> None: ...

class Failed(BaseEvent):
    command_id: str
    reason: str
    def __init__(self, command_id: str, reason: str | None = ...) -> None: ...

class Held(BaseEvent):
    command_id: str
    def __init__(self, command_id: str) -> None: ...

class NotHeld(BaseEvent):
    command_id: str
    def __init__(self, command_id: str) -> None: ...

class Event(BaseEvent):
    type_id: str
    subject: str | None
    correlation_id: str | None
    data: dict[str, Any] | None
    def __init__(self, type_id: str, subject: str | None = ..., correlation_id: str | None = ...,
                 data: dict[str, Any] | None = ...) -> None: ...

class Tick(BaseEvent):
    unsent: frozenset[str]
    def __init__(self, unsent: Any = ...) -> None: ...

class Cancel(BaseEvent):
    reason: str
    stop: bool
    def __init__(self, reason: str | None = ..., stop: bool = ...) -> None: ...

class Hold(BaseEvent):
    def __init__(self) -> None: ...

class Release(BaseEvent):
    def __init__(self) -> None: ...

class Resume(BaseEvent):
    def __init__(self) -> None: ...

class Shift(BaseEvent):
    gap_ms: int
    def __init__(self, gap_ms: int) -> None: ...
