"""Sending commands to equipment: the command sink interface, an in-process sink, and
the dispatcher that turns ``dispatch:{action}`` entries into sent commands.

A command goes out only if its id is the action's open one now (``open_command``),
and not if the sent marker ``sent:{action} = {startedAt}:{commandId}`` already says
so, nor while this host is sending it already (its marker waits for the broker's
acknowledgement: an entry taken over meanwhile finds no marker yet). The marker is
written after the sink has the command away: a crash in between sends that id twice
(receivers deduplicate by id), and no command is ever lost. A hold command for work
that never went out is answered "not held" by the host itself.

Markers (with the acks of their entries) are written by ``MarkerWriter``, off the
sending path: the settle that made a command goes on once the command is queued; the
dispatcher follows a sink's acknowledgements (``AckedSink``: the broker's PUBACKs) and
hands the acknowledged commands' markers to the writer, whose calls ride the channel's
next write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, cast

from sfc_fast import Command, open_command
from sfc_fast.events import NotHeld
from sfc_host.execution.settle import Fresh, Item, Settler
from sfc_host.metrics import Metrics
from sfc_host.store.client import REDIS_FAILURES
from sfc_host.store.states import Mark, Store, started_at

log = logging.getLogger("sfc_host.execution.dispatch")


class CommandSink(Protocol):
    """Where commands go (the MQTT link implements it).

    ``send`` queues the commands and returns, per command, whether it was queued
    (False: the queue was full; the action's deadline dispatches it again).
    """

    async def send(self, commands: Sequence[Command]) -> Sequence[bool]: ...


class AckedSink(Protocol):
    """A sink that says when each command reached its receiver (the MQTT sink: the
    broker's PUBACK). The dispatcher then follows the acknowledgements instead of
    awaiting them: the settle that made the commands goes on at once. ``traces``, beside
    the commands, are their jobs' trace contexts ('' none), which the sink carries on."""

    ack_wait_s: float

    def publish(self, commands: Sequence[Command],
                traces: Sequence[str] = ()) -> list[asyncio.Future[None] | None]: ...

    def unacked(self, n: int) -> None: ...


class _Acks:
    """One batch's acknowledgements: when the last is in (or after ``wait_s``) the
    batch's markers go to the marker writer."""

    __slots__ = ("done", "futures", "left", "timer")

    def __init__(self, futures: list[asyncio.Future[None] | None],
                 done: Callable[[_Acks], None], wait_s: float) -> None:
        self.futures = futures
        self.done = done
        waiting = [f for f in futures if f is not None and not f.done()]
        self.left = len(waiting)
        self.timer: asyncio.TimerHandle | None = None
        if not waiting:
            done(self)
            return
        self.timer = asyncio.get_running_loop().call_later(wait_s, self._finish)
        for f in waiting:
            f.add_done_callback(self._one)

    def _one(self, _: asyncio.Future[None]) -> None:
        self.left -= 1
        if self.left == 0:
            self._finish()

    def _finish(self) -> None:
        if self.left < 0:       # finished already: a late acknowledgement changes nothing
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.left = -1
        self.done(self)


class InProcessSink:
    """Commands to an in-process callback or queue (tests, benchmarks, the demo)."""

    def __init__(self, on_command: Callable[[Command], Any] | None = None,
                 maxsize: int = 0) -> None:
        self.on_command = on_command
        self.queue: asyncio.Queue[Command] = asyncio.Queue(maxsize)
        self.sent = 0
        self.full = 0

    async def send(self, commands: Sequence[Command]) -> list[bool]:
        out = []
        for c in commands:
            if self.on_command is not None:
                self.on_command(c)
                ok = True
            else:
                try:
                    self.queue.put_nowait(c)
                    ok = True
                except asyncio.QueueFull:
                    ok = False
            if ok:
                self.sent += 1
            else:
                self.full += 1
            out.append(ok)
        return out


class MarkerWriter:
    """Writes sent markers and entry acks in the background, one call at a time, each
    with everything handed over since the last (``Store.write_markers``, lazy: it goes
    out with the channel's next request). A batch's commands stay this host's
    "sending" ones until their markers are written, so a sweep or an entry taken over
    meanwhile does not send them again. A failed write is logged and counted
    (``marker_errors``): its commands then count as unsent (their deadlines or a
    takeover send the same ids again), its entries stay pending; nothing is lost."""

    def __init__(self, store: Store, metrics: Metrics,
                 release: Callable[[Iterable[tuple[str, str]]], None]) -> None:
        self.store = store
        self.metrics = metrics
        self.release = release
        self._marks: list[Mark] = []
        self._acks: list[tuple[str, bytes]] = []      # (scope, entry id)
        self._held: list[tuple[str, str]] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, marks: Sequence[Mark], acks: Sequence[tuple[str, bytes]],
            held: Iterable[tuple[str, str]]) -> None:
        self._marks += marks
        self._acks += acks
        self._held.extend(held)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def pending(self) -> bool:
        return self._task is not None

    async def drain(self) -> None:
        """Until everything handed over is written (or failed): tests, and closing."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._marks or self._acks or self._held:
                marks, acks, held = self._marks, self._acks, self._held
                self._marks, self._acks, self._held = [], [], []
                try:
                    if marks or acks:
                        await self.store.write_markers(marks, acks, lazy=True)
                except REDIS_FAILURES as e:   # counted; the deadlines send them again
                    self.metrics.inc("marker_errors")
                    log.warning("%d sent markers and %d entry acks not written (%s): "
                                "those commands count as unsent, those entries stay "
                                "pending", len(marks), len(acks), e)
                finally:
                    self.release(held)
        finally:
            self._task = None


class Dispatcher:
    def __init__(self, store: Store, settler: Settler, sink: CommandSink,
                 metrics: Metrics) -> None:
        self.store = store
        self.settler = settler
        self.sink = sink
        self.metrics = metrics
        # (scope, job) -> when the pull event it is taking arrived (perf_counter), only
        # while that event settles: its command then feeds event_to_command_seconds
        self.event_arrived: dict[tuple[str, str], float] = {}
        # (scope, command id) of the commands this host is sending: from the sink (and
        # the broker's acknowledgements of their batch) to their markers
        self._sending: set[tuple[str, str]] = set()
        self.markers = MarkerWriter(store, metrics, self._sending.difference_update)
        # a sink that reports each command's acknowledgement: followed, not awaited
        self._acked_sink: AckedSink | None = (
            cast(AckedSink, sink) if callable(getattr(sink, "publish", None)) else None)
        self._batches = 0            # sent batches whose acknowledgements are awaited
        self._idle: asyncio.Event | None = None     # set when the last of them is in

    async def send_fresh(self, fresh: Sequence[Fresh]) -> None:
        """Send commands this host just made (their entries are pending on it), then
        write their markers and ack their entries in one call."""
        await self._send(fresh, [(f.scope, f.entry_id) for f in fresh])

    async def dispatch(self, entries: Sequence[tuple[str, str, str, str]]) -> None:
        """Send the commands of ``(scope, job, action, command_id)`` entries read from
        the stream (the caller acks them): only a command that is still the action's
        open one, read from the job's state now."""
        if not entries:
            return
        wanted: dict[str, list[str]] = {}
        for scope, job, _, _ in entries:
            jobs = wanted.setdefault(scope, [])
            if job not in jobs:
                jobs.append(job)
        rows = await self.store.load(wanted)
        items: list[Fresh] = []
        seen: set[tuple[str, str]] = set()
        for scope, job, action, cid in entries:
            row = rows[scope][1][job]
            if row.state is None or row.fingerprint is None or (scope, cid) in seen:
                self.metrics.inc("dispatch_skipped")
                continue
            graph = await self.store.graph(scope, row.fingerprint)
            if graph is None:
                self.metrics.inc("dispatch_skipped")
                log.error("job %s/%s: recipe %s is not stored; %s not sent", scope, job,
                          row.fingerprint, cid, extra={"scope": scope, "job": job,
                                                       "action": action, "command_id": cid})
                continue
            cmd = open_command(graph, row.live or row.state, action)   # open ones are live
            if cmd is None or cmd.command_id != cid:
                self.metrics.inc("dispatch_skipped")   # settled, superseded or ended
                continue
            seen.add((scope, cid))
            items.append(Fresh(scope, job, cmd, b"", row.markers.get(f"sent:{action}".encode()),
                               row.markers.get(f"sent:{action}:hold".encode()),
                               started_at(row.state), row.trace))
        await self._send(items, [])

    def _event_latency(self, commands: Sequence[Command], queued: Sequence[bool]) -> None:
        now = time.perf_counter()
        for c, ok in zip(commands, queued, strict=True):
            t = self.event_arrived.pop((c.scope, c.job), None) if ok else None
            if t is not None:
                self.metrics.observe("event_to_command_seconds", now - t)

    async def resend(self, items: Sequence[Fresh]) -> int:
        """Send commands whose markers may say they went out: a dead host's open
        attempts (``handover``), whose answers may have died with it. Each item carries
        no marker of its own command, so it goes out unless this host is sending it
        now; how many went to the sink."""
        return await self._send(items, [])

    async def _send(self, items: Sequence[Fresh], acks: list[tuple[str, bytes]]) -> int:
        """The one sending path: skip what the marker says went out, answer a hold of
        work that never went out as not held, queue the rest, then hand the markers of
        what was queued (and ``acks``) to the marker writer; how many were queued."""
        to_send: list[Command] = []
        sent: list[Fresh] = []
        not_held: list[Item] = []
        sending = self._sending
        for f in items:
            cmd = f.command
            cid = cmd.command_id
            if (f.hold_marker if cmd.hold else f.sent_marker) == f"{f.started}:{cid}".encode():
                self.metrics.inc("dispatch_already_sent")
                continue
            if cmd.hold and f.sent_marker != f"{f.started}:{cid[:-5]}".encode():
                not_held.append(Item(f.scope, f.job, [NotHeld(cid)]))
                self.metrics.inc("hold_answered_not_held")
                continue
            if (f.scope, cid) in sending:
                # Sent by this host now: its entry, idle while the batch waited for the
                # broker, was taken over and came back here. That send writes the marker
                # (or leaves the id to its deadline); a second publish would be one more
                # copy once the broker had acknowledged the first.
                self.metrics.inc("dispatch_sending")
                continue
            sending.add((f.scope, cid))
            to_send.append(cmd)
            sent.append(f)
        handed = False
        try:
            acked_sink = self._acked_sink if to_send else None
            if acked_sink is not None:
                futures = acked_sink.publish(to_send, [f.trace for f in sent])
                if self.event_arrived:
                    self._event_latency(to_send, [f is not None for f in futures])
                self._batches += 1
                _Acks(futures, lambda b: self._acked(b, sent, acks), acked_sink.ack_wait_s)
                handed = True
            else:
                queued = await self.sink.send(to_send) if to_send else []
                if self.event_arrived:
                    self._event_latency(to_send, queued)
                handed = self._hand_over(sent, queued, acks)
        finally:
            if not handed:
                sending.difference_update((f.scope, f.command.command_id) for f in sent)
        if not_held:
            await self.settler.settle(not_held)
        return len(to_send)

    def _acked(self, batch: _Acks, sent: list[Fresh], acks: list[tuple[str, bytes]]) -> None:
        """A batch's acknowledgements are in, or its wait is over: the acknowledged
        commands' markers (and the batch's entry acks) go to the marker writer."""
        self._batches -= 1
        # cancelled: the broker refused it (a PUBACK with an error code)
        queued = [f is not None and f.done() and not f.cancelled() for f in batch.futures]
        late = sum(1 for f in batch.futures if f is not None and not f.done())
        if late and self._acked_sink is not None:
            self._acked_sink.unacked(late)
        try:
            if self._hand_over(sent, queued, acks):
                return
        except Exception:       # never raised into the loop's callback
            log.exception("markers of %d commands not handed over", len(sent))
        self._sending.difference_update((f.scope, f.command.command_id) for f in sent)
        if not self._batches and self._idle is not None:
            self._idle.set()

    def _hand_over(self, sent: list[Fresh], queued: Sequence[bool],
                   acks: list[tuple[str, bytes]]) -> bool:
        """Hand the markers of the queued commands, and ``acks``, to the marker writer;
        False when there is nothing to write (the caller lets the commands go)."""
        marks: list[Mark] = []
        for f, ok in zip(sent, queued, strict=True):
            if ok:
                cmd = f.command
                field = f"sent:{cmd.action}:hold" if cmd.hold else f"sent:{cmd.action}"
                marks.append((f.scope, f.job, field, f"{f.started}:{cmd.command_id}"))
            else:
                self.metrics.inc("queue_full")
        if sent:
            self.metrics.inc("commands_sent", len(marks))
        if not marks and not acks:
            return False
        self.markers.add(marks, acks, [(f.scope, f.command.command_id) for f in sent])
        if not self._batches and self._idle is not None:
            self._idle.set()
        return True

    async def drain(self) -> None:
        """Until every batch sent has its acknowledgements (or its wait is over) and
        their markers are written: closing, and tests."""
        while self._batches:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            await self._idle.wait()
        await self.markers.drain()
