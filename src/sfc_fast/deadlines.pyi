from typing import SupportsIndex

class DeadlineIndex:
    """In-process index of (job, deadline_ms), earliest first (docs/design.md#deadline-index).

    O(log n) set/remove; pop_due removes everything due in one pass. Among equal
    deadlines the job set earlier comes first.
    """

    def __init__(self) -> None: ...
    def set(self, job: str, deadline_ms: SupportsIndex) -> None:
        """Insert or move; setting the deadline a job already has keeps its place."""
    def remove(self, job: str) -> bool:
        """False when the job was not indexed."""
    def pop_due(
        self, now_ms: SupportsIndex, limit: SupportsIndex | None = None
    ) -> list[tuple[str, int]]:
        """Remove and return every entry with deadline_ms <= now_ms, earliest first,
        at most limit of them."""
    def peek(self) -> tuple[str, int] | None: ...
    def get(self, job: object) -> int | None: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, job: object) -> bool: ...
