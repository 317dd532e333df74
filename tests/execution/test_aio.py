"""``sfc_host.aio.reap``: a cancelled task's end is consumed, the waiter's own cancel
is not (the ``suppress(CancelledError)`` idiom's hole, which left a Ctrl-C unheard)."""

from __future__ import annotations

import asyncio

import pytest

from sfc_host.aio import cancel_and_reap, reap


async def _forever() -> None:
    await asyncio.sleep(3600)


async def _fails() -> None:
    raise ValueError("the task's own failure")


def test_a_cancelled_task_and_a_failed_one_end_quietly() -> None:
    async def main() -> None:
        t = asyncio.ensure_future(_forever())
        await asyncio.sleep(0)
        t.cancel()
        await reap(t)
        assert t.cancelled()
        f = asyncio.ensure_future(_fails())
        await reap(f)
        assert isinstance(f.exception(), ValueError)
        await reap(None)
    asyncio.run(main())


def test_a_cancel_of_the_waiter_goes_on_up() -> None:
    """A shutdown that waits for a task which ignores its cancel for a while, and is
    itself cancelled meanwhile: the waiter ends cancelled, and the task was cancelled
    with it."""
    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)      # a slow cleanup

    async def main() -> None:
        inner = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)

        async def shutdown() -> str:
            inner.cancel()
            await reap(inner)
            return "went on as if nothing happened"

        waiter = asyncio.ensure_future(shutdown())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert waiter.cancelled()
        await asyncio.sleep(0)
        assert inner.done()
    asyncio.run(main())


def test_cancel_and_reap_ends_them_all() -> None:
    async def main() -> None:
        tasks = [asyncio.ensure_future(_forever()) for _ in range(3)]
        await asyncio.sleep(0)
        await cancel_and_reap([*tasks, None])
        assert all(t.cancelled() for t in tasks)
    asyncio.run(main())
