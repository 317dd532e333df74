"""Waiting for a task the host cancelled, without swallowing a cancel of the waiter.

``task.cancel()`` then ``with suppress(CancelledError): await task`` is the usual idiom,
and it has a hole: if the waiter itself is cancelled during that ``await`` (a Ctrl-C,
a shutdown's timeout), the suppress swallows that cancel too, and the waiter goes on as
if nothing happened. ``reap`` tells the two apart with ``Task.cancelling()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def reap(task: asyncio.Future[Any] | None) -> None:
    """Wait until ``task`` is done; its cancel and its errors end here (its owner logs
    what matters), a cancel of the caller goes on up."""
    if task is None:
        return
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise
    except Exception:
        pass


async def cancel_and_reap(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    """Cancel every task, then ``reap`` each."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    for t in live:
        await reap(t)
