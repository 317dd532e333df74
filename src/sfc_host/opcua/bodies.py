"""What the face's status events and order lists carry: each changed order's JobOrder
and JobResponse, encoded once from the JSON the host stores (``structures``)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sfc_fast.wire.uabinary import ExtensionObject
from sfc_host import isa95 as model
from sfc_host.opcua.structures import ConvertError, Structures
from sfc_host.store.keys import ScopeKeys

log = logging.getLogger("sfc_host.opcua")

BUILD_CHUNK = 200           # bodies built between two turns of the event loop
# JobOrder bodies kept by the order's JSON: an order's status events (three a job, and
# the lists' entries) carry the same JobOrder, so it is encoded once, not per change
ORDERS_KEPT = 4096

# an order's change: its new state and its JobOrder's JSON (as the status event had it)
Change = tuple[str, bytes | None]
# a change's encoded JobOrder body and JobResponse
Built = tuple[bytes, ExtensionObject]
Reads = Callable[[Sequence[tuple[Any, ...]]], Awaitable[list[Any]]]


class Bodies:
    """Builds the bodies of changed orders; the stored job responses and the orders'
    times read in one round trip per batch (``reads``: the host's pipelined reads)."""

    structures: Structures          # set once the NodeSet is loaded

    def __init__(self, keys: Callable[[str], ScopeKeys], reads: Reads) -> None:
        self.keys = keys
        self.reads = reads
        self._orders: dict[tuple[str, bytes | None], bytes] = {}

    def order_body(self, job: str, order: bytes | None) -> bytes:
        """A JobOrder's encoded body, by the JSON it is made of (kept: an order's
        changes carry the same JSON)."""
        key = (job, order)
        got = self._orders.get(key)
        if got is None:
            got = self.structures.body("JobOrder", order_doc(job, order))
            if len(self._orders) >= ORDERS_KEPT:
                del self._orders[next(iter(self._orders))]     # the oldest
            self._orders[key] = got
        return got

    async def build(self, changes: Sequence[tuple[str, str, Change]]) -> list[Built | None]:
        """Per change the encoded body of its JobOrder and its JobResponse (the stored
        one with the order's actuals once the job wrote it, else one made from the
        order's times and state); None for one that OPC UA cannot carry (logged)."""
        keys = self.keys
        got = await self.reads([c for scope, job, _ in changes for c in (
            ("GET", keys(scope).response(job)),
            ("HMGET", keys(scope).order(job), "started", "ended"))]) if changes else []
        out: list[Built | None] = []
        structures = self.structures
        for i, (scope, job, (state, order)) in enumerate(changes):
            if i % BUILD_CHUNK == BUILD_CHUNK - 1:
                await asyncio.sleep(0)      # a long batch must not hold the loop
            stored, (started, ended) = got[2 * i], got[2 * i + 1]
            if stored is not None:
                stored = model.with_actuals(bytes(stored), order)
            try:
                out.append((self.order_body(job, order),
                            structures.extension_object("JobResponse", response_doc(
                                job, state, stored, started, ended))))
            except (ConvertError, ValueError, KeyError) as e:
                log.warning("order %s/%s (%s) cannot go over OPC UA (%s): left out of its "
                            "event and the lists", scope, job, state, e,
                            extra={"scope": scope, "job": job})
                out.append(None)
        return out


def order_doc(job: str, body: str | bytes | None) -> dict[str, Any]:
    """A stored or evented JobOrder's JSON, with its id whatever it held."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    doc.setdefault("JobOrderID", job)
    return doc


def response_doc(job: str, state: str, stored: bytes | None, started: bytes | None,
                 ended: bytes | None) -> dict[str, Any]:
    """The job response an event carries: the stored one once the job wrote it, else
    one made from the order's times and the event's state (as
    RequestJobResponseByJobOrderState makes one)."""
    if stored is not None and state.startswith(("Ended", "Aborted")):
        try:
            doc = json.loads(stored)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc
    made: dict[str, Any] = {"JobResponseID": f"{job}-response", "JobOrderID": job}
    if started:
        made["StartTime"] = started.decode()
    if ended:
        made["EndTime"] = ended.decode()
    made["JobState"] = model.state_list(state)
    return made
