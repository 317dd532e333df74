"""The one way a synchronous test runs a coroutine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

RUN_TIMEOUT_S = 60.0
"""How long ``run`` lets a coroutine take before the test fails: a hung test fails in a
minute instead of blocking the suite. A test that needs longer says so
(``run(main(), timeout=120)``)."""


def run(coro: Awaitable[T], timeout: float = RUN_TIMEOUT_S) -> T:
    """Run ``coro`` on a new event loop; ``TimeoutError`` after ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
