"""``WakeOne``: the answer workers' wake-up (one worker a ring, none lost)."""

from __future__ import annotations

import asyncio

from sfc_host.execution.wakeup import WakeOne


async def _waiters(w: WakeOne, n: int) -> tuple[list[asyncio.Task[None]], list[int]]:
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await w.wait()
        woken.append(i)
    tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
    await asyncio.sleep(0)
    return tasks, woken


def test_a_ring_wakes_one_waiter_the_longest_waiting() -> None:
    async def main() -> None:
        w = WakeOne()
        tasks, woken = await _waiters(w, 3)
        w.ring()
        await asyncio.sleep(0.01)
        assert woken == [0]
        w.ring()
        w.ring()
        await asyncio.sleep(0.01)
        assert woken == [0, 1, 2]
        await asyncio.gather(*tasks)
    asyncio.run(main())


def test_a_ring_with_nobody_waiting_is_kept_for_the_next_wait_once() -> None:
    async def main() -> None:
        w = WakeOne()
        w.ring()
        w.ring()                              # still one: rings do not pile up
        await asyncio.wait_for(w.wait(), 1)
        tasks, woken = await _waiters(w, 1)
        await asyncio.sleep(0.01)
        assert woken == []
        w.ring()
        await asyncio.gather(*tasks)
        assert woken == [0]
    asyncio.run(main())


def test_open_wakes_every_waiter_and_lets_later_waits_through() -> None:
    async def main() -> None:
        w = WakeOne()
        tasks, woken = await _waiters(w, 3)
        w.open()
        await asyncio.gather(*tasks)
        assert sorted(woken) == [0, 1, 2]
        await asyncio.wait_for(w.wait(), 1)
        await asyncio.wait_for(w.wait(), 1)
    asyncio.run(main())


def test_a_waiter_cancelled_after_its_ring_passes_it_on() -> None:
    async def main() -> None:
        w = WakeOne()
        tasks, woken = await _waiters(w, 2)
        w.ring()                              # goes to waiter 0 ...
        tasks[0].cancel()                     # ... which is cancelled before it runs
        await asyncio.sleep(0.01)
        assert woken == [1]
        assert tasks[0].cancelled()
        await tasks[1]
    asyncio.run(main())


def test_a_waiter_cancelled_before_any_ring_leaves_no_trace() -> None:
    async def main() -> None:
        w = WakeOne()
        tasks, woken = await _waiters(w, 2)
        tasks[0].cancel()
        await asyncio.sleep(0)
        w.ring()
        await asyncio.sleep(0.01)
        assert woken == [1]
        w.ring()                              # nobody waits: kept
        await asyncio.wait_for(w.wait(), 1)
    asyncio.run(main())
