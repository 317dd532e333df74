"""One request for the operations of one service that callers ask for in the same
event-loop pass.

Forty units that complete in one publish response each read their results and call
Reset in the same pass; sent one by one, that is eighty requests, each framed, sent,
matched and parsed. Collected, it is one Read and one Call. A caller gets its own slice
of the results, in its order; a fault of the whole request (a Bad ServiceResult, the
connection lost, a timeout) fails every caller of the batch. A batch is sent when the
pass ends, or at ``MAX_OPERATIONS`` operations, well under what servers take in one
request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sfc_fast.wire.uabinary import Reader, Writer

MAX_OPERATIONS = 500

Send = Callable[[int, bytes], "asyncio.Future[Reader]"]


class Batch:
    """The pending operations of one service (and one set of its request's options)."""

    def __init__(self, send: Send, type_id: int,
                 write: Callable[[Writer, list[Any]], None],
                 read: Callable[[Reader], list[Any]]) -> None:
        self._send = send
        self._type_id = type_id
        self._write = write
        self._read = read
        self._items: list[Any] = []
        self._waiters: list[tuple[asyncio.Future[list[Any]], int, int]] = []
        self._scheduled = False

    def add(self, items: list[Any]) -> asyncio.Future[list[Any]]:
        """The results of ``items``, once the batch they joined is answered."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        self._waiters.append((fut, len(self._items), len(items)))
        self._items.extend(items)
        if len(self._items) >= MAX_OPERATIONS:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self.flush)
        return fut

    def flush(self) -> None:
        self._scheduled = False
        items, waiters = self._items, self._waiters
        if not items:
            return
        self._items, self._waiters = [], []
        w = Writer()
        self._write(w, items)
        try:
            req = self._send(self._type_id, w.getvalue())
        except Exception as e:      # no channel: every caller hears why
            _fail(waiters, e)
            return
        req.add_done_callback(lambda f: self._answered(f, waiters, len(items)))

    def _answered(self, req: asyncio.Future[Reader],
                  waiters: list[tuple[asyncio.Future[list[Any]], int, int]], n: int) -> None:
        if req.cancelled():
            _fail(waiters, asyncio.CancelledError())
            return
        e = req.exception()
        if e is None:
            try:
                results = self._read(req.result())
                if len(results) != n:
                    raise ValueError(f"{len(results)} results for {n} operations")
            except Exception as bad:   # a response that cannot be read fails its callers
                e = bad
        if e is not None:
            _fail(waiters, e)
            return
        for fut, at, count in waiters:
            if not fut.done():
                fut.set_result(results[at:at + count])


def _fail(waiters: list[tuple[asyncio.Future[list[Any]], int, int]],
          e: BaseException) -> None:
    for fut, _at, _count in waiters:
        if not fut.done():
            fut.set_exception(e)
