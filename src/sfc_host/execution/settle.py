"""Applying events to jobs: read, ``evolve``, compare-and-set; batched per scope.

This is the driver around the pure core: it never decides a rule itself. A batch of
items (one event or a few for a job) costs one read call and one write call per scope,
pipelined across scopes. A lost race reads the job again and evolves anew, up to
``cas_rounds`` times; what still loses is reported as ``conflict`` (a work entry then
stays pending for redelivery; an answer is left to the action's deadline).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter
from typing import Any, Protocol

import msgspec

from sfc_fast import (
    Decision,
    Graph,
    action_results,
    evolve_live,
    job_index,
    join_state,
    open_command,
    sent_markers,
    state_to_json,
)
from sfc_fast.events import BaseEvent, Event, Start, Tick
from sfc_host.config import HostConfig
from sfc_host.isa95 import state_list
from sfc_host.metrics import Metrics
from sfc_host.store.states import Flat, JobRow, Record, Store, pairs, started_at

log = logging.getLogger("sfc_host.execution.settle")

TERMINAL = frozenset(("completed", "aborted", "stopped"))
LIVE = frozenset(("running", "held"))

# Item outcomes
APPLIED = "applied"
ABSORBED = "absorbed"
MISSING = "missing"      # no such job (or its recipe is gone)
CONFLICT = "conflict"    # lost the race cas_rounds times
ERROR = "error"          # the job cannot be evaluated (unreadable state); see .error

Delivered = tuple[bytes, dict[bytes, bytes]]
_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder().decode
EventsFn = Callable[[JobRow, Graph, bytes | None], Sequence[BaseEvent]]


class AttemptSpans(Protocol):
    """Where the attempts and holds a stored write ended go (``tracing.spans``)."""

    def settled(self, scope: str, job: str, trace: str, decisions: Sequence[Decision],
                now_ms: int, started_ms: int) -> None: ...


class Item:
    """Events for one job, settled in order; the outcome is set by ``Settler.settle``."""

    __slots__ = ("decision", "error", "events", "fresh", "graph", "job", "outcome", "putback",
                 "read", "scope", "trace")

    def __init__(self, scope: str, job: str, events: Sequence[BaseEvent] | EventsFn,
                 *, graph: Graph | None = None, putback: bool = False,
                 fresh: bool = False, read: tuple[int, JobRow] | None = None,
                 trace: str = "") -> None:
        self.scope = scope
        self.job = job
        self.events = events
        self.graph = graph          # a Start brings the recipe it pins
        self.trace = trace          # and the trace context of its order ('' = none)
        self.putback = putback      # a tick that writes nothing puts the job back
        self.fresh = fresh          # read the job from Redis (markers needed), not the cache
        # the job as its caller read it just now (server ms, row): no read of its own on
        # the first round (a start's job is read with its order, in one round trip)
        self.read = read
        self.outcome: str | None = None
        self.error: str | None = None
        self.decision: Any = None   # the last Decision of this item

    def __repr__(self) -> str:
        return f"Item({self.scope}/{self.job}, {self.outcome})"


class Fresh:
    """A command to send, with its job's sent markers and run start: one this host just
    made (the markers from its compare-and-set) or one a dispatch entry names."""

    __slots__ = ("command", "entry_id", "hold_marker", "job", "scope", "sent_marker",
                 "started", "trace")

    def __init__(self, scope: str, job: str, command: Any, entry_id: bytes,
                 sent_marker: bytes | None, hold_marker: bytes | None, started: int,
                 trace: str = "") -> None:
        self.scope = scope
        self.job = job
        self.command = command
        self.entry_id = entry_id
        self.sent_marker = sent_marker
        self.hold_marker = hold_marker
        self.started = started
        self.trace = trace          # the job's trace context, carried on by the command


def tick_events(row: JobRow, graph: Graph, state: bytes | None) -> list[BaseEvent]:
    """A sweep's tick, naming the commands that never went out (no matching sent
    marker). An outage's gap is already in the state (``Store.load``)."""
    if state is None:
        return []
    started, open_ = sent_markers(graph, state)
    unsent = [cid for f, cid in open_
              if row.markers.get(f.encode()) != f"{started}:{cid}".encode()]
    return [Tick(unsent)]


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


# the job order state a job response reports, by the job's own end
_RESPONSE_STATE = {"completed": "Ended_Completed", "stopped": "Ended_Completed",
                   "aborted": "Aborted"}


def job_response(graph: Graph, state: bytes, now_ms: int, status: str = "completed",
                 reason: str | None = None) -> bytes:
    """The ISA-95 job response (``ISA95JobResponseDataType``) written when a job ends:
    its start and end times, the job state it ended in and every result field of its
    actions (``action.field``); an aborted job's reason as its Description."""
    job, started_ms, results = action_results(graph, state)
    data = []
    for name, raw in results:
        try:
            result = _DECODE(raw)
        except (msgspec.DecodeError, ValueError):
            try:            # NaN and the like, which only the stdlib parser takes
                result = json.loads(raw)
            except ValueError:
                continue    # not JSON: nothing to list, as the readable view shows none
        if isinstance(result, dict):
            for field, value in result.items():
                data.append({"ID": f"{name}.{field}", "Value": value})
    out: dict[str, Any] = {"JobResponseID": f"{job}-response"}
    if status == "aborted" and reason:
        out["Description"] = {"Locale": "en", "Text": reason}
    out.update(JobOrderID=job, StartTime=_iso(started_ms),
               EndTime=_iso(now_ms), JobState=state_list(_RESPONSE_STATE[status]))
    if data:
        out["JobResponseData"] = data
    return _ENCODE.encode(out)


class _Plan:
    """One job's evolved events in a round, before its write is built (``record``: a
    putback's write, made at once)."""

    __slots__ = ("archived", "decisions", "graph", "its", "now", "record", "reset", "row",
                 "scope", "start_graph")

    def __init__(self, scope: str, now: int, its: list[Item], row: JobRow, graph: Graph,
                 decisions: list[Decision], reset: bool, start_graph: Graph | None, archived: bytes,
                 record: Record | None = None) -> None:
        self.scope = scope
        self.now = now
        self.its = its
        self.row = row
        self.graph = graph
        self.decisions = decisions
        self.reset = reset
        self.start_graph = start_graph
        self.archived = archived
        self.record = record


_Key = tuple[str, str]                      # (scope, job)
# one job's write as the commit's replies are read: its items, record, graph, decisions,
# the row it was evolved from and the server time it was decided at
_Written = tuple[list[Item], Record, Graph, list[Decision], JobRow, int]
_DeliveredFlat = list[tuple[str, list[tuple[bytes, list[bytes]]]]]


class _Round:
    """What the phases of one compare-and-set round share: one object a round, so the
    phases add nothing per item."""

    __slots__ = ("decided", "fetched", "first", "read_at", "rows", "stale", "wanted")

    def __init__(self, first: bool, wanted: dict[_Key, list[Item]]) -> None:
        self.first = first
        self.wanted = wanted                    # the round's items by job, in order
        self.rows: dict[_Key, JobRow] = {}      # the row each job is evolved from
        # per scope: the server time its rows were read at (absent: from the cache)
        self.read_at: dict[str, int] = {}
        self.fetched: set[_Key] = set()         # rows read in this round, not cached
        self.stale: list[Item] = []             # items for the next round, read anew
        self.decided = 0    # the oldest server time a decision of this round was made at


class Settler:
    """Evolves and stores jobs in batches.

    After a successful write, the commands the new states issue go straight to the
    dispatcher (the compare-and-set delivered their entries to this host); other entries
    it delivered go to ``on_delivered`` (the host's local queue).
    """

    def __init__(self, store: Store, config: HostConfig, metrics: Metrics,
                 on_end: Callable[[str, str, Any], None] | None = None) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.on_end = on_end
        # more listeners of a job's end (scope, job, decision): the MES side publishes
        # the job response of an order that ended before the job did
        self.end_listeners: list[Callable[[str, str, Any], None]] = []
        self.dispatcher: Any = None
        self.on_delivered: Callable[[str, list[Delivered]], None] | None = None
        self.serves: Callable[[str], bool] = lambda scope: False
        # the host's schedule, once a commit: the earliest deadline it wrote per scope
        # (server ms); the scopes it appended entries to, and those of them whose
        # delivery was full (some entries may wait unread)
        self.on_due: Callable[[dict[str, int]], None] | None = None
        self.on_work: Callable[[set[str], set[str]], None] | None = None
        # the spans of the attempts and holds each stored write ended (setting otel)
        self.spans: AttemptSpans | None = None
        # evolve time and calls since the last flush to the evolve_seconds histogram:
        # timed per job's loop, not per call, so the hot path gains no Python call
        self._evolve_s = 0.0
        self._evolve_n = 0

    async def settle(self, items: Sequence[Item]) -> None:
        pending = list(items)
        for rnd in range(self.config.cas_rounds):
            if not pending:
                return
            pending = await self._round(pending, rnd == 0)
            if pending:
                self.metrics.inc("cas_retries", len(pending))
        for it in pending:
            it.outcome = CONFLICT
            self.metrics.inc("cas_conflicts")
            log.warning("job %s/%s: lost the race %d times; left for later", it.scope, it.job,
                        self.config.cas_rounds, extra={"scope": it.scope, "job": it.job})

    async def _round(self, items: list[Item], first: bool) -> list[Item]:
        """One compare-and-set round over ``items``; the items to try again."""
        r = _Round(first, self._group(items))
        await self._read_rows(r)
        evolved = await self._check_archives(r, await self._evolve_jobs(r))
        batches, plans = self._build_writes(evolved)
        self._count_round(r)
        if not batches:
            return r.stale
        versions, marks, _, delivered = await self._commit(r, batches)
        made, dues, wrote = self._take_replies(r, plans, versions, marks)
        self._schedule(dues, wrote, delivered)
        await self._send(made, delivered)
        return r.stale

    @staticmethod
    def _group(items: list[Item]) -> dict[_Key, list[Item]]:
        """The round's items by job, in their order. Keyed flat by (scope, job), not per
        scope: with one job a scope, per-scope containers would be most of a round's own
        work. First, as every later phase works job by job."""
        wanted: dict[_Key, list[Item]] = {}
        for it in items:
            it.outcome = None
            key = (it.scope, it.job)
            same = wanted.get(key)
            if same is None:
                wanted[key] = [it]
            else:
                same.append(it)
        return wanted

    async def _read_rows(self, r: _Round) -> None:
        """The row each job is evolved from: on the first round the one its caller read,
        else the cached one (this host wrote it last; a stale one loses the
        compare-and-set and is read on the next round); what is left is read from Redis
        in one call. A ``fresh`` job (a sweep's tick needs the sent markers) is read
        whole, any other lean: what a cached row holds, at a cost that does not grow
        with the job's history (an answer routed to another host than the last
        writer's). Before evolving, which needs every row and its server time."""
        first, rows, read_at, fetched = r.first, r.rows, r.read_at, r.fetched
        cache = self.store.cache
        to_load: dict[str, list[str]] = {}
        to_lean: dict[str, list[str]] = {}
        for key, its in r.wanted.items():
            if len(its) == 1:
                fresh, pre = its[0].fresh, its[0].read
            else:
                fresh = any(it.fresh for it in its)
                pre = next((it.read for it in its if it.read is not None), None)
            if first and not fresh:
                if pre is not None:
                    if pre[0] > read_at.get(key[0], 0):
                        read_at[key[0]] = pre[0]
                    rows[key] = pre[1]
                    fetched.add(key)
                    continue
                row = cache.get(key[0], key[1])
                if row is not None:
                    rows[key] = row
                    continue
            target = to_load if fresh else to_lean
            jobs = target.get(key[0])
            if jobs is None:
                target[key[0]] = [key[1]]
            else:
                jobs.append(key[1])
        if to_load or to_lean:
            loaded = await self.store.load(to_load, to_lean)
            for s, (now, got) in loaded.items():
                read_at[s] = now
                for job, row in got.items():
                    rows[(s, job)] = row
                    if first:
                        fetched.add((s, job))

    async def _evolve_jobs(self, r: _Round) -> list[_Plan]:
        """Each job's events evolved at its scope's read time (one clock reading for all
        jobs from the cache), and the oldest of those times, which bounds the commit.
        A cached job to which nothing applied goes to ``stale``: only a state just read
        proves that nothing applies; one from the cache may be behind. After the rows
        are read, before the archives, which only ending jobs need."""
        first, rows, read_at, fetched, stale = r.first, r.rows, r.read_at, r.fetched, r.stale
        evolved: list[_Plan] = []
        decided = 0
        clock = self.store.clock
        cached_now = 0
        for key, its in r.wanted.items():
            s = key[0]
            now = read_at.get(s, 0)
            if not now:
                if not cached_now:
                    cached_now = clock.now_ms() if clock.synced else await self.store.now_ms()
                now = cached_now
            if not decided or now < decided:
                decided = now
            p = await self._plan(s, now, rows[key], its)
            if ((p is None or not p.decisions) and first and key not in fetched
                    and all(it.outcome != ERROR for it in its)):
                stale.extend(its)
                continue
            if p is not None:
                evolved.append(p)
        r.decided = decided
        return evolved

    async def _check_archives(self, r: _Round, evolved: list[_Plan]) -> list[_Plan]:
        """The archives of ending jobs evolved from a cached row, read in one call for
        the whole round (not one round trip per ending job): the job response of an
        ending job lists every result. A row behind its hash (another host wrote since)
        leaves ``evolved`` for ``stale``, to be read and evolved anew. After evolving,
        as only the decisions tell which jobs end; before the writes, which hold the
        job response."""
        ending = [p for p in evolved if p.decisions and p.decisions[-1].status in TERMINAL
                  and not p.reset and not p.row.archive_known]
        if not ending:
            return evolved
        got_archives = await self.store.read_archives([(p.scope, p.row.job) for p in ending])
        behind: set[int] = set()
        for p, (version, archive) in zip(ending, got_archives, strict=True):
            if version != p.row.version:
                behind.add(id(p))
                r.stale.extend(p.its)
            else:
                p.row.archive, p.row.archive_known = archive, True
        if behind:
            return [p for p in evolved if id(p) not in behind]
        return evolved

    def _build_writes(self, evolved: list[_Plan]
                      ) -> tuple[dict[str, list[Record]], dict[str, list[_Written]]]:
        """Each evolved job's write, batched per scope for the commit, and beside it
        what reading the commit's replies needs, in the same order (the replies come
        flat in the order of the batches). No Redis call: the last step before the
        commit."""
        batches: dict[str, list[Record]] = {}
        plans: dict[str, list[_Written]] = {}
        for p in evolved:
            rec = p.record if p.record is not None else self._record(
                p.scope, p.now, p.row, p.graph, p.decisions, p.reset, p.start_graph,
                p.archived)
            if p.start_graph is not None:
                rec.trace = next((it.trace for it in p.its if it.trace), "")
            batches.setdefault(p.scope, []).append(rec)
            plans.setdefault(p.scope, []).append((p.its, rec, p.graph, p.decisions, p.row,
                                                  p.now))
        return batches, plans

    def _count_round(self, r: _Round) -> None:
        """The round's evolve time and its cache rereads into the metrics: once a round
        (evolve calls are timed per job's loop, not per call, so the hot path gains no
        Python call), after every evolve of the round and before the commit's wait."""
        if self._evolve_n:
            # each call of the batch counts once, at the batch's mean time per call
            n, self._evolve_n = self._evolve_n, 0
            self.metrics.observe_n("evolve_seconds", self._evolve_s / n, n)
            self._evolve_s = 0.0
        if r.stale:
            # read on the next round, which takes nothing from the cache
            self.metrics.inc("cache_rereads", len(r.stale))

    async def _commit(self, r: _Round, batches: dict[str, list[Record]]) -> Flat:
        """Every write of the round in one compare-and-set call per scope, pipelined, with
        the delivery of this host's new work entries in the same round trip. A decision
        older than the outage threshold when it reaches Redis (the host was frozen in
        between) may predate an outage whose sweep did not see this job yet: its
        deadlines would not move by the gap. It is not written; it is read and decided
        again."""
        c = self.config
        return await self.store.commit_flat(
            batches, (c.group, c.consumer_name, c.read_count), self.serves,
            not_after=r.decided + c.outage_threshold_ms)

    def _take_replies(self, r: _Round, plans: dict[str, list[_Written]], versions: list[int],
                      marks_flat: list[Any]) -> tuple[list[Fresh], dict[str, int], set[str]]:
        """The commit's replies, flat over the scopes in the order of ``plans`` (no
        per-scope containers): a lost write's items go to ``stale`` for the next round; a
        stored one updates the cache and the stored recipes, tells the end listeners of
        a job that ended, and yields the commands to send, the earliest deadline per
        scope and the scopes with new entries. Right after the commit, before anything
        leaves the host, so the cache holds each new state before its commands go
        out."""
        retry = r.stale
        cache = self.store.cache
        on_end, end_listeners = self.on_end, self.end_listeners
        spans = self.spans
        stored = self.store.graphs.stored
        marks = iter(marks_flat)
        made: list[Fresh] = []
        dues: dict[str, int] = {}        # per scope: the earliest deadline written
        wrote: set[str] = set()          # the scopes with new entries
        vi = 0
        for s, lst in plans.items():
            for its, rec, graph, decisions, row, now in lst:
                v = versions[vi]
                vi += 1
                if v == 0:
                    retry.extend(its)
                    continue
                due = rec.due
                if due is not None:
                    was = dues.get(s)
                    if was is None or due < was:
                        dues[s] = due
                if rec.entries:
                    wrote.add(s)
                    self._fresh(s, rec, graph, decisions, marks, made, rec.trace or row.trace)
                if rec.graph is not None:
                    stored.add((s, rec.fingerprint))
                if rec.state is not None:
                    # the archive as stored now, when this host knows all of it
                    known = rec.reset or row.archive_known
                    before = b"" if rec.reset or not known else \
                        row.archive[:len(row.archive) - len(row.unsaved)]
                    cache.put(s, JobRow(rec.job, str(v).encode(), rec.state, graph.fingerprint,
                                        offset=rec.offset, live=rec.state,
                                        archive=before + rec.archive if known else b"",
                                        archive_known=known, trace=rec.trace or row.trace))
                if spans is not None and decisions and (rec.trace or row.trace):
                    spans.settled(s, rec.job, rec.trace or row.trace, decisions, now,
                                  started_at(rec.state) if rec.state is not None
                                  and decisions[-1].status in TERMINAL else 0)
                if on_end is not None or end_listeners:
                    for it in its:
                        d = it.decision
                        if it.outcome == APPLIED and d.status in TERMINAL:
                            if on_end is not None:
                                on_end(s, it.job, d)
                            for listener in end_listeners:
                                listener(s, it.job, d)
        return made, dues, wrote

    def _schedule(self, dues: dict[str, int], wrote: set[str], delivered: _DeliveredFlat
                  ) -> None:
        """The host's schedule learns the deadlines and the new work the commit wrote;
        a scope whose delivery was full may have entries waiting unread. Before the
        commands go out, which may take a while."""
        if dues and self.on_due is not None:
            self.on_due(dues)
        if wrote and self.on_work is not None:
            n = self.config.read_count
            self.on_work(wrote, {s for s, got in delivered if len(got) >= n and s in wrote})

    async def _send(self, made: list[Fresh], delivered: _DeliveredFlat) -> None:
        """Commands whose entries the commit delivered to this host go out now (commands
        without a delivered entry are read later); any other entry it delivered is
        handled like one read from the stream. The usual case, checked first: it
        delivered exactly the entries just written, in the same order. Last, as sending
        waits on the broker."""
        fresh = made
        if [(f.scope, f.entry_id) for f in made] != [
                (s, eid) for s, got in delivered for eid, _ in got]:
            # entry ids are per stream: two scopes may deliver the same id
            ids = {(s, eid) for s, got in delivered for eid, _ in got}
            fresh = [f for f in made if (f.scope, f.entry_id) in ids]
            ours = {(f.scope, f.entry_id) for f in fresh}
            for s, got in delivered:
                rest = [(eid, pairs(flat)) for eid, flat in got if (s, eid) not in ours]
                if rest and self.on_delivered is not None:
                    self.on_delivered(s, rest)
        if fresh and self.dispatcher is not None:
            await self.dispatcher.send_fresh(fresh)

    @staticmethod
    def _fresh(scope: str, rec: Record, graph: Graph, decisions: list[Decision],
               marks: Iterator[Any], out: list[Fresh], trace: str) -> None:
        cmds = None
        started = 0
        for kind, _, cid in rec.entries:
            if not kind.startswith("dispatch:"):
                continue
            eid, m1, m2 = next(marks), next(marks), next(marks)
            if cmds is None:
                cmds = {c.command_id: c for d in decisions for c in d.commands}
                started = started_at(rec.state) if rec.state is not None else 0
            cmd = cmds.get(cid)
            if cmd is None or rec.state is None:
                continue
            if len(decisions) > 1:
                # a later event of the same batch may have settled it
                cur = open_command(graph, rec.state, cmd.action)
                if cur is None or cur.command_id != cid:
                    continue
            out.append(Fresh(scope, rec.job, cmd, eid, m1 or None, m2 or None, started, trace))

    async def _plan(self, scope: str, now: int, row: JobRow,
                    its: list[Item]) -> _Plan | None:
        start_graph = next((it.graph for it in its if it.graph is not None), None)
        state = row.live
        archived = row.unsaved      # archive records to append with this write
        reset = False
        graph: Graph | None = None
        if start_graph is not None:
            graph = start_graph
            if state is not None and row.fingerprint != graph.fingerprint:
                state, absorbed, issued = await self._replaced(scope, row, its)
                if absorbed:
                    return None
                reset = True        # the job hash of the other recipe goes
                if issued:
                    # the new recipe cannot read the ended state: its Start carries
                    # the ended run's command count, so no command id comes again
                    for it in its:
                        if isinstance(it.events, (list, tuple)):
                            it.events = [Start(ev.job, ev.scope, ev.params, ev.order or None,
                                               commands_before=issued)
                                         if isinstance(ev, Start) else ev for ev in it.events]
        elif row.fingerprint is not None:
            graph = await self.store.graph(scope, row.fingerprint)
        if graph is None:
            for it in its:
                if state is None:
                    it.outcome = MISSING
                else:
                    it.outcome, it.error = ERROR, f"recipe {row.fingerprint} is not stored"
            return None
        decisions: list[Decision] = []
        calls = 0
        t0 = perf_counter()
        try:
            for it in its:
                it.outcome = ABSORBED
                evs = it.events if isinstance(it.events, (list, tuple)) else it.events(
                    row, graph, state)
                for ev in evs:
                    if state is None and not isinstance(ev, Start):
                        it.outcome = MISSING
                        continue
                    d = evolve_live(graph, state, ev, now)
                    calls += 1
                    it.decision = d
                    if d.applied:
                        if isinstance(ev, Start) and state is not None:
                            reset = True
                            archived = b""      # the ended run's archive goes with it
                        archived += d.archived
                        state = d.state
                        decisions.append(d)
                        it.outcome = APPLIED
        except ValueError as e:  # StateFormatError and a state of another recipe
            for it in its:
                it.outcome, it.error = ERROR, f"{type(e).__name__}: {e}"
            self.metrics.inc("state_errors")
            log.error("job %s/%s cannot be evaluated: %s", scope, row.job, e,
                      extra={"scope": scope, "job": row.job})
            return None
        finally:
            self._evolve_s += perf_counter() - t0
            self._evolve_n += calls
        if not decisions:
            if any(it.putback for it in its):
                return _Plan(scope, now, its, row, graph, [], reset, start_graph, archived,
                             self._putback(row, its))
            return None
        return _Plan(scope, now, its, row, graph, decisions, reset, start_graph, archived)

    async def _replaced(self, scope: str, row: JobRow,
                        its: list[Item]) -> tuple[bytes | None, bool, int]:
        """A Start on a job stored with another recipe: absorbed while it runs or for a
        repeat of the same order; else the ended job is replaced (a re-stored id), and
        the count of commands the ended run issued comes back (0: not known)."""
        old = await self.store.graph(scope, row.fingerprint) if row.fingerprint else None
        if old is not None and row.state is not None:
            try:
                view = state_to_json(old, row.state)
            except ValueError:
                view = None
            if view is not None:
                start = next(ev for it in its if isinstance(it.events, (list, tuple))
                             for ev in it.events if isinstance(ev, Start))
                if view["status"] in LIVE or (view["order"] and view["order"] == start.order):
                    for it in its:
                        it.outcome = ABSORBED
                    return row.state, True, 0
                return None, False, int(view.get("commands_issued") or 0)
        return None, False, 0

    def _putback(self, row: JobRow, its: list[Item]) -> Record:
        nd = next((it.decision.next_deadline for it in its
                   if it.putback and it.decision is not None), None)
        return Record(row.job, row.version, None, nd, None, offset=row.offset)

    def _record(self, scope: str, now: int, row: JobRow, graph: Graph,
                decisions: list[Decision], reset: bool, start_graph: Graph | None,
                archived: bytes = b"") -> Record:
        """The write of ``decisions`` (made by ``evolve_live``): the live part, and
        ``archived``, the archive records to append (a catch-up's included)."""
        last = decisions[-1]
        rec = Record(row.job, row.version, last.state, last.next_deadline,
                     last.status in LIVE, reset=reset, offset=row.offset, archive=archived)
        waits = rec.waits
        for d in decisions:
            for t in d.waits_removed:
                waits.append(("-", t, 0))
            for t in d.waits_added:
                waits.append(("+", t, now))
            for kind, action, cid in d.work:
                if kind == "job" and action == "Abort" and d.reason:
                    cid = d.reason  # the order keeps the recipe's reason
                rec.entries.append((kind, action, cid))
        if last.status in TERMINAL:
            gone: set[str] = set()
            if row.state is not None and not reset:
                with contextlib.suppress(ValueError):
                    gone.update(job_index(graph, row.state)[2])
            for d in decisions:
                gone.update(d.waits_added)
            waits.extend(("-", t, 0) for t in sorted(gone))
            # the whole state: what was archived before (row.archive holds the unsaved
            # part too) and what this write appends after it
            before = b"" if reset else row.archive[:len(row.archive) - len(row.unsaved)]
            whole = join_state(last.state, before + archived)
            rec.response = job_response(graph, whole, now, last.status, last.reason)
        if start_graph is not None:
            rec.fingerprint = start_graph.fingerprint
            if (scope, rec.fingerprint) not in self.store.graphs.stored:
                rec.graph = start_graph.to_bytes()
        return rec

    # ---- pull events: the oldest matching wait takes it

    async def match_event(self, scope: str, ev: Event, candidates: Sequence[str],
                          arrived: float | None = None) -> str | None:
        """Give ``ev`` to the first candidate (oldest wait first) that takes it; the job
        id, or None. A candidate that lost a race is read again; then the next one.
        ``arrived`` (perf_counter) times the taker's command, when this settle sends it."""
        waiting = self.dispatcher.event_arrived if self.dispatcher is not None else None
        for job in candidates:
            it = Item(scope, job, [ev])
            if arrived is None or waiting is None:
                await self.settle([it])
            else:
                waiting[(scope, job)] = arrived
                try:
                    await self.settle([it])
                finally:
                    waiting.pop((scope, job), None)
            if it.outcome == APPLIED:
                return job
        return None
