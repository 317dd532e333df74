"""A wake-up that reaches one waiter per ring.

Several answer workers wait for the same queue. An ``asyncio.Event`` wakes every one
of them for each answer, and all but one find the queue empty: at moderate rates most
of the host's passes were such empty ones, each a task and a few loop callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class WakeOne:
    """``ring`` wakes the longest-waiting waiter; with none waiting, the next ``wait``
    returns at once (a ring is never lost). ``open`` wakes every waiter and lets every
    later ``wait`` through (closing)."""

    __slots__ = ("_is_open", "_pending", "_waiters")

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pending = False     # rung while nobody waited
        self._is_open = False

    def ring(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._pending = True

    def open(self) -> None:
        self._is_open = True
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def wait(self) -> None:
        if self._is_open:
            return
        if self._pending:
            self._pending = False
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            else:
                self.ring()       # woken and cancelled in one pass: the ring goes on
            raise
