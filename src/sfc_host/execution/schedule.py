"""When each scope is next due for a periodic step (a sweep, a claim): a heap of
monotonic times, so a pass pays for the scopes whose time has come, not for every
scope the host serves."""

from __future__ import annotations

import heapq
import random


def spread(interval_s: float) -> float:
    """A period of about ``interval_s`` (80–100 % of it): scopes added together drift
    apart instead of all coming due in the same pass forever."""
    return interval_s * (0.8 + 0.2 * random.random())


class Schedule:
    """Scope -> the next time (``time.monotonic()`` seconds) it is due. A scope taken by
    ``due`` has no time until the pass that took it gives it one with ``set``; an
    ``earlier`` time noted meanwhile wins over that one (the pass's view of the scope
    may predate it)."""

    __slots__ = ("_at", "_heap", "_taken")

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._taken: dict[str, float] = {}   # taken by a pass: the earliest time noted

    def __contains__(self, scope: str) -> bool:
        return scope in self._at

    def __len__(self) -> int:
        return len(self._at)

    def at(self, scope: str) -> float | None:
        return self._at.get(scope)

    def set(self, scope: str, at: float) -> None:
        noted = self._taken.pop(scope, None)
        if noted is not None and noted < at:
            at = noted
        self._at[scope] = at
        heapq.heappush(self._heap, (at, scope))
        if len(self._heap) > 4 * len(self._at) + 64:
            # entries left behind by set/earlier: rebuilt, so the heap stays O(scopes)
            self._heap = [(t, s) for s, t in self._at.items()]
            heapq.heapify(self._heap)

    def earlier(self, scope: str, at: float) -> None:
        """Due at ``at`` unless it is due sooner already (a scope never scheduled is
        left alone)."""
        cur = self._at.get(scope)
        if cur is not None:
            if at < cur:
                self.set(scope, at)
        elif scope in self._taken and at < self._taken[scope]:
            self._taken[scope] = at

    def due(self, now: float) -> list[str]:
        """Take the scopes whose time is ``now`` or earlier."""
        out: list[str] = []
        heap, at = self._heap, self._at
        while heap and heap[0][0] <= now:
            t, scope = heapq.heappop(heap)
            if at.get(scope) == t:      # else a later set() replaced this entry
                del at[scope]
                self._taken[scope] = float("inf")
                out.append(scope)
        return out

    def discard(self, scope: str) -> None:
        self._at.pop(scope, None)
        self._taken.pop(scope, None)
