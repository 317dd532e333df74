"""Live job pages over Server-Sent Events, cheap for the host however many are open.

One poller per job, shared by every page that shows it: it looks at the job at most
``1 / POLL_S`` times a second while anyone watches (a cheap probe of its versions; the
whole job only when they moved), and stops with the last viewer. A
viewer keeps only the newest update it has not sent yet (updates coalesce: a slow
browser never queues them), and an update goes out only when the view changed. On
shutdown every stream ends at once, so a host with pages open still stops promptly.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from sfc_host.aio import cancel_and_reap

log = logging.getLogger("sfc_host.web")

POLL_S = 0.25            # a job is read at most 4 times a second
KEEPALIVE_S = 5.0        # a comment this often: a closed page is noticed on the write

# read(key) -> (what to compare, what to send): the payload without and with its
# ever-changing parts (the server's clock)
Reader = Callable[[tuple[str, str]], Awaitable[tuple[str, str]]]
# probe(key) -> something that changes whenever the payload may have: a cheap read
# first, and the whole one only when it changed
Probe = Callable[[tuple[str, str]], Awaitable[object]]


@dataclass(eq=False)
class _Viewer:
    pending: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Feed:
    viewers: set[_Viewer] = field(default_factory=set)
    last: str | None = None          # the compared form of the last payload sent
    payload: str | None = None
    probed: object = None            # the probe's answer at the last whole read
    task: asyncio.Task[None] | None = None


class LiveHub:
    def __init__(self, read: Reader, probe: Probe | None = None, poll_s: float = POLL_S,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self.read = read
        self.probe = probe
        self.poll_s = poll_s
        self.keepalive_s = keepalive_s
        self.feeds: dict[tuple[str, str], _Feed] = {}
        self.closing = asyncio.Event()
        self.polls = 0               # polls done (tests look)
        self.reads = 0               # whole reads among them

    async def subscribe(self, key: tuple[str, str]) -> AsyncIterator[str | None]:
        """The payloads for one page, newest first come; None when a keep-alive is due.
        Ends when the hub closes."""
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = _Feed()
        viewer = _Viewer(pending=feed.payload)
        if viewer.pending is not None:
            viewer.wake.set()
        feed.viewers.add(viewer)
        if feed.task is None:
            feed.task = asyncio.create_task(self._poll(key, feed), name=f"web-live-{key}")
        closing = asyncio.create_task(self.closing.wait())
        try:
            while not self.closing.is_set():
                woke = asyncio.create_task(viewer.wake.wait())
                done, _ = await asyncio.wait((woke, closing), timeout=self.keepalive_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                woke.cancel()
                if self.closing.is_set():
                    return
                if woke not in done:
                    yield None
                    continue
                viewer.wake.clear()
                payload, viewer.pending = viewer.pending, None
                if payload is not None:
                    yield payload
        finally:
            closing.cancel()
            feed.viewers.discard(viewer)
            if not feed.viewers and self.feeds.get(key) is feed:
                del self.feeds[key]
                if feed.task is not None:
                    feed.task.cancel()

    async def _poll(self, key: tuple[str, str], feed: _Feed) -> None:
        while feed.viewers and not self.closing.is_set():
            self.polls += 1
            try:
                probed = await self.probe(key) if self.probe is not None else None
                if probed is not None and probed == feed.probed:
                    await asyncio.sleep(self.poll_s)
                    continue
                compared, payload = await self.read(key)
                self.reads += 1
                feed.probed = probed
            except asyncio.CancelledError:
                raise
            except Exception as e:   # Redis away: the page says so and polling goes on
                log.debug("web: reading %s failed: %s", key, e)
                compared = payload = json.dumps({"error": str(e)[:200] or type(e).__name__})
                feed.probed = None
            if compared != feed.last:
                feed.last, feed.payload = compared, payload
                for v in feed.viewers:
                    v.pending = payload      # a newer one replaces one not sent yet
                    v.wake.set()
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        """End every stream and poller (the server's shutdown)."""
        self.closing.set()
        tasks = [f.task for f in self.feeds.values() if f.task is not None]
        await cancel_and_reap(tasks)
