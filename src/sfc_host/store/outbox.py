"""The MES outbox: the orders of a scope whose newest state the broker may not have yet.

``sfc:{S}:outbox`` is a hash, order id -> stamp (the server time in µs of the write).
The script that writes an order (``order.lua``) or a job response (``cas.lua``) stamps
the order in the same step, so a host that dies right after a change cannot take the
change's publishing with it. A publisher reads the stamp with the state it publishes
and takes the order out only once the broker acknowledged what it published, and only
if the stamp is still the one it read: a change written meanwhile keeps its stamp until
its own publish. (Two writes stamped in the same µs leave no room between them for a
read, which would see both.) What is left there (a host died, the broker refused or
never acknowledged) any host publishes again; a retained message sent twice is
harmless, so at least once is exact enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sfc_host.store.keys import ScopeKeys
from sfc_host.store.lua_scripts import Scripts

CHUNK = 512        # orders read in one script call (each call holds Redis)

@dataclass(slots=True)
class OrderRow:
    """An order as its retained messages are made from it."""

    job: str
    exists: bool
    state: str | None
    order: bytes | None
    ended: bool                  # it was Ended or Aborted (so EndState means cleared)
    trace: str                   # its trace context (``tracing.stored``; '' none)
    token: str                   # drawn at each Store: names the job's run in its trace
    response: bytes | None
    stamp: bytes | None          # None: not in the outbox

    @property
    def cleared(self) -> bool:
        return not self.exists or (self.state == "EndState" and self.ended)


def _text(raw: bytes | None) -> str:
    return raw.decode("ascii", "replace") if raw else ""


class Outbox:
    """The outbox of every scope, through the host's scripts (``outbox_read.lua``,
    ``outbox_take.lua``: loaded, called and loaded again as every other script)."""

    def __init__(self, scripts: Scripts) -> None:
        self.scripts = scripts
        self.client = scripts.client

    async def read(self, k: ScopeKeys, jobs: Sequence[str]) -> list[OrderRow]:
        """Each order's state, job response and stamp, read together: a stamp that is
        still there later means no change was written after what was read."""
        rows: list[OrderRow] = []
        for i in range(0, len(jobs), CHUNK):
            part = jobs[i:i + CHUNK]
            keys = [k.outbox]
            for job in part:
                keys += (k.order(job), k.response(job))
            raw = await self.scripts.call(self.scripts["outbox_read"], keys, part)
            for n, job in enumerate(part):
                exists, state, order, ended, trace, token, response, stamp = \
                    raw[8 * n:8 * n + 8]
                rows.append(OrderRow(job, bool(exists),
                                     state.decode() if state is not None else None,
                                     order, bool(ended), _text(trace), _text(token),
                                     bytes(response) if response is not None else None,
                                     stamp))
        return rows

    async def take(self, k: ScopeKeys, stamps: Sequence[tuple[str, bytes]]) -> int:
        """Take out the orders whose stamp is still the one read; how many went."""
        n = 0
        for i in range(0, len(stamps), CHUNK):
            args: list[Any] = []
            for job, stamp in stamps[i:i + CHUNK]:
                args += (job, stamp)
            n += int(await self.scripts.call(self.scripts["outbox_take"], [k.outbox], args))
        return n

    async def leftovers(self, keys: Sequence[ScopeKeys], before_us: int | None,
                        index_us_per_order: int = 0) -> dict[str, list[str]]:
        """Per scope, the orders stamped before ``before_us`` (server µs; None: all),
        and before the scope's index interval on top of that (``index_us_per_order``
        per order in the index: a publisher takes a stamp out only after the next
        index), in one pipeline. The outbox holds only what is on its way, so reading
        it whole is cheap; an idle scope's costs a read of a missing key."""
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k.outbox)
            pipe.zcard(k.index_order)
        raw = await pipe.execute()
        found: dict[str, list[str]] = {}
        for i, k in enumerate(keys):
            stamps, orders = raw[2 * i], raw[2 * i + 1]
            before = None if before_us is None else before_us - orders * index_us_per_order
            jobs = sorted(j.decode() for j, s in stamps.items()
                          if before is None or int(s) < before)
            if jobs:
                found[k.scope] = jobs
        return found
