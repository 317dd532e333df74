"""Job states in Redis: read many jobs of a scope in one call, write them with the
compare-and-set script, markers, compiled recipes pinned by fingerprint.

Reads and writes are batched per scope (one script call settles many jobs, since all
their keys share the scope's slot) and pipelined across scopes: a batch of any size
costs two round trips.

An outage moves every open deadline of a scope by its gap in O(1): the sweep adds the
gap to the scope's offset (``sweep.lua``), the due index holds deadlines minus the
offset, and each job hash records the offset its state has seen (``o``). A job read
here is brought up to the scope's offset (the core's ``Shift``) before anyone sees it,
and the compare-and-set writes it only if the offset did not move meanwhile.

A job's state is kept in two parts (state format 2): the live part in field ``s``,
which every event rewrites, and the archive of settled records that no event reads
again, appended by the compare-and-set that made them as a field of their own,
``h:{hn + 1}``, merged every 32 writes (``hn``: the last field's number; the fields
joined in the order of their numbers are the archive). The
settler evolves the live part alone, so its cost does not grow with the job's history;
a reader of the hash gets both joined (``JobRow.state``).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sfc_fast import Graph, StateFormatError, evolve, evolve_live
from sfc_fast.events import Shift
from sfc_host.store.keys import ScopeKeys, scope_of_work
from sfc_host.store.lua_scripts import Call, Scripts

log = logging.getLogger("sfc_host.store.states")


def pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    """A flat ``[field, value, ...]`` reply (a hash, a stream entry) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


@dataclass(slots=True)
class JobRow:
    """One job hash as read: state, version, graph fingerprint, the sent markers, and
    the scope offset its state is shifted to (see the module docstring).

    ``state`` is the whole document (live part and archive) for readers; ``live`` the
    live part the settler evolves; ``archive`` the archive records, when known (read
    from Redis: ``archive_known``; a cached row has only its live part); ``unsaved``
    archive records made by a catch-up that the next write must append."""

    job: str
    version: bytes = b"0"
    state: bytes | None = None
    fingerprint: str | None = None
    markers: dict[bytes, bytes] = field(default_factory=dict)
    offset: int = 0
    live: bytes | None = None
    archive: bytes = b""
    archive_known: bool = False
    unsaved: bytes = b""
    trace: str = ""         # the trace context its commands carry on ('' = none)

    @property
    def exists(self) -> bool:
        return self.state is not None


ARCHIVE_PREFIX = b"h:"


def join_archive(fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The archive records of the ``h:{n}`` fields, in the order of their numbers (the
    order they were written; gaps where pieces were merged)."""
    parts = sorted((int(k[len(ARCHIVE_PREFIX):]), v) for k, v in fields)
    return b"".join(v for _, v in parts)


def archive_of(job_hash: dict[bytes, bytes]) -> bytes:
    """The archive records of a job hash read whole (HGETALL)."""
    return join_archive((k, v) for k, v in job_hash.items() if k.startswith(ARCHIVE_PREFIX))


def whole_state(job_hash: dict[bytes, bytes]) -> bytes | None:
    """The whole state document of a job hash read whole: live part and archive."""
    state = job_hash.get(b"s")
    return None if state is None else state + archive_of(job_hash)


def _row(job: str, flat: list[bytes], whole: bool = True) -> JobRow:
    """A job hash's flat fields as a row; ``whole``: every field was read, else only
    the live part, version, fingerprint and offset (no archive, no markers)."""
    r = JobRow(job, archive_known=whole)
    archive: list[tuple[bytes, bytes]] = []
    for i in range(0, len(flat), 2):
        k, v = flat[i], flat[i + 1]
        if k == b"s":
            r.state = v
        elif k == b"v":
            r.version = v
        elif k == b"g":
            r.fingerprint = v.decode()
        elif k == b"o":
            r.offset = int(v)
        elif k == b"t":
            r.trace = v.decode("utf-8", "replace")
        elif k.startswith(ARCHIVE_PREFIX):
            archive.append((k, v))
        elif k == b"hn":
            pass                    # the last archive field's number (cas.lua's)
        else:
            r.markers[k] = v
    r.live = r.state
    if archive and r.state is not None:
        r.archive = join_archive(archive)
        r.state = r.state + r.archive
    return r


@dataclass(slots=True)
class Record:
    """One job's writes for the compare-and-set script."""

    job: str
    expected: bytes
    state: bytes | None            # None: index only
    due: int | None                # the next deadline (server ms), None: off the index
    active: bool | None            # None: leave the active set
    waits: list[tuple[str, str, int]] = field(default_factory=list)  # (sign, type, since)
    entries: list[tuple[str, str, str]] = field(default_factory=list)
    fingerprint: str = ""
    graph: bytes | None = None
    reset: bool = False
    response: str | bytes | None = None
    offset: int = 0                # the scope offset the state is shifted to
    archive: bytes = b""           # archive records to append (written with the state)
    trace: str = ""                # the job's trace context ('' = keep what is stored)


def started_at(state: bytes) -> int:
    """The start time in a state document (the varint after the 16-byte header): the
    run a sent marker belongs to (``{startedAt}:{commandId}``)."""
    v = shift = 0
    i = 16
    while True:
        b = state[i]
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v
        shift += 7
        i += 1


_NO_MARKERS: dict[bytes, bytes] = {}   # shared, never written: cached rows carry no markers


class ServerClock:
    """The server's clock, read with every load and sweep and carried forward on the
    monotonic clock in between: the host's own wall clock never decides a time."""

    def __init__(self) -> None:
        self._server_ms = 0
        self._mono = 0.0

    def sync(self, server_ms: int) -> None:
        self._server_ms = server_ms
        self._mono = time.monotonic()

    @property
    def synced(self) -> bool:
        return self._server_ms > 0

    def now_ms(self) -> int:
        return self._server_ms + int((time.monotonic() - self._mono) * 1000)


# A cached job keeps its archive up to this size: the records of its settled actions,
# which only its end reads (for the job response); a longer one is read then.
CACHED_ARCHIVE_MAX = 16_384


class StateCache:
    """The states this host wrote or read last, so that an answer can be evolved without
    reading its job first. A stale entry is harmless: the compare-and-set refuses it
    and the job is read again.

    Entries are tuples of bytes and str, which the garbage collector stops tracking:
    100,000 cached jobs add nothing to a full collection.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._rows: OrderedDict[tuple[str, str],
                                tuple[bytes, bytes, str | None, int, bytes | None, str]] = \
            OrderedDict()
        self.hits = 0

    def get(self, scope: str, job: str) -> JobRow | None:
        r = self._rows.get((scope, job))
        if r is None:
            return None
        self.hits += 1
        archive = r[4]
        return JobRow(job, r[0], r[1], r[2], _NO_MARKERS, r[3], live=r[1],
                      archive=archive or b"", archive_known=archive is not None, trace=r[5])

    def put(self, scope: str, row: JobRow) -> None:
        """Keep the row's live part (what the settler evolves), and its archive when
        known and at most ``CACHED_ARCHIVE_MAX`` bytes (a job's end then builds its
        response without reading it). A row with archive records not yet written is
        not kept: evolved from the cache, they would be lost."""
        key = (scope, row.job)
        rows = self._rows
        if self.size <= 0 or row.live is None or row.unsaved:
            rows.pop(key, None)
            return
        if key in rows:
            rows.move_to_end(key)
        archive = row.archive if row.archive_known and \
            len(row.archive) <= CACHED_ARCHIVE_MAX else None
        rows[key] = (row.version, row.live, row.fingerprint, row.offset, archive, row.trace)
        if len(rows) > self.size:
            rows.popitem(last=False)

    def drop(self, scope: str, job: str) -> None:
        self._rows.pop((scope, job), None)

    def __len__(self) -> int:
        return len(self._rows)


#: A sent marker to write: (scope, job, field, value)
Mark = tuple[str, str, str, str]
#: Store.commit_flat's reply: versions, markers, counts, (scope, delivered entries)
Flat = tuple[list[int], list[Any], list[int], list[tuple[str, list[tuple[bytes, list[bytes]]]]]]


@dataclass(slots=True)
class Committed:
    """What one scope's compare-and-set call reports."""

    versions: list[int]
    marks: list[Any]          # per dispatch entry written: id, sent marker, hold marker
    delivered: list[tuple[bytes, list[bytes]]]   # entry id, its fields and values


class GraphCache:
    """Compiled recipes by fingerprint (LRU), read from the scope when missing.

    A job pins its recipe by fingerprint, so editing a Work Master never changes a
    running job, and no event reparses a recipe.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._graphs: OrderedDict[str, Graph] = OrderedDict()
        self.stored: set[tuple[str, str]] = set()   # (scope, fingerprint) known in Redis
        self.misses = 0

    def get(self, fp: str) -> Graph | None:
        g = self._graphs.get(fp)
        if g is not None:
            self._graphs.move_to_end(fp)
        return g

    def put(self, graph: Graph) -> Graph:
        fp = graph.fingerprint
        self._graphs[fp] = graph
        self._graphs.move_to_end(fp)
        while len(self._graphs) > self.size:
            self._graphs.popitem(last=False)
        return graph


class Store:
    def __init__(self, client: Any, scripts: Scripts, graphs: GraphCache,
                 cache_size: int = 0, group: str = "sfc-host", cluster: bool = False) -> None:
        self.group = group
        self.cluster = cluster
        self.client = client
        self.scripts = scripts
        self.graphs = graphs
        self.cache = StateCache(cache_size)
        self.clock = ServerClock()
        # order changes and job responses are stamped in the scope's outbox (a host
        # that publishes them to an MES sets this: nothing else would empty it)
        self.outbox = False
        self._keys: dict[str, ScopeKeys] = {}

    def keys(self, scope: str) -> ScopeKeys:
        k = self._keys.get(scope)
        if k is None:
            k = self._keys[scope] = ScopeKeys(scope)
        return k

    # ---- reading

    def _calls_by_slot(self, scopes: Sequence[str]) -> list[list[str]]:
        """Scopes that may share one script call: all of them on a single Redis, one
        per call on a cluster (a call must stay within one slot)."""
        if self.cluster:
            return [[s] for s in scopes]
        return [list(scopes)] if scopes else []

    async def load(self, wanted: dict[str, Sequence[str]],
                   lean: dict[str, Sequence[str]] | None = None
                   ) -> dict[str, tuple[int, dict[str, JobRow]]]:
        """Read jobs of several scopes: ``{scope: (server now ms, {job: row})}``.

        The jobs of ``lean`` (read in the same round trip) come without their archive
        and sent markers, as a cached row does (``archive_known`` false): the fields an
        event is evolved from, at a cost that does not grow with the job's history. A
        job in both is read whole."""
        groups, calls = self._load_calls(wanted)
        if not lean:
            return await self._loaded(wanted, groups, await self.scripts.run(calls))
        for s in lean.keys() & wanted.keys():
            whole = set(wanted[s])
            lean = {**lean, s: [j for j in lean[s] if j not in whole]}
        lgroups, lcalls = self._load_calls(lean, True)
        results = await self.scripts.run(calls + lcalls)
        out = await self._loaded(wanted, groups, results[:len(calls)])
        for s, (now, rows) in (await self._loaded(lean, lgroups, results[len(calls):],
                                                  False)).items():
            if s in out:
                out[s][1].update(rows)
            else:
                out[s] = (now, rows)
        return out

    async def orders_and_jobs(self, pairs: Sequence[tuple[str, str]],
                              wanted: dict[str, Sequence[str]]
                              ) -> tuple[list[dict[str, str] | None],
                                         dict[str, tuple[int, dict[str, JobRow]]]]:
        """``orders_many(pairs)`` and ``load(wanted)`` in one pipeline (starts read
        their orders and their jobs in one round trip)."""
        hgroups, hcalls = self._hashes_calls([(s, self.keys(s).order(j)) for s, j in pairs])
        lgroups, lcalls = self._load_calls(wanted)
        results = await self.scripts.run(hcalls + lcalls)
        flats = self._hashes_read(len(pairs), hgroups, results[:len(hcalls)])
        return ([_order(f) for f in flats],
                await self._loaded(wanted, lgroups, results[len(hcalls):]))

    def _load_calls(self, wanted: dict[str, Sequence[str]], lean: bool = False
                    ) -> tuple[list[list[str]], list[Call]]:
        scopes = [s for s, jobs in wanted.items() if jobs]
        groups = self._calls_by_slot(scopes)
        calls: list[Call] = []
        for group in groups:
            keys = [self.keys(s).offset for s in group]
            for s in group:
                k = self.keys(s)
                keys += [k.job(j) for j in wanted[s]]
            calls.append((self.scripts["load"], keys, (len(group), b"1" if lean else b"0")))
        return groups, calls

    async def _loaded(self, wanted: dict[str, Sequence[str]], groups: list[list[str]],
                      results: Sequence[Any], whole: bool = True
                      ) -> dict[str, tuple[int, dict[str, JobRow]]]:
        out: dict[str, tuple[int, dict[str, JobRow]]] = {}
        cache = self.cache
        for group, res in zip(groups, results, strict=True):
            if isinstance(res, Exception):
                raise res
            now = int(res[0])
            self.clock.sync(now)
            i = 1 + len(group)
            for gi, s in enumerate(group):
                offset = int(res[1 + gi])
                rows = {}
                for j in wanted[s]:
                    r = rows[j] = _row(j, res[i], whole)
                    i += 1
                    if r.offset != offset:
                        await self._catch_up(s, r, offset, now)
                    if r.state is not None:
                        cache.put(s, r)
                out[s] = (now, rows)
        return out

    async def _catch_up(self, scope: str, row: JobRow, offset: int, now: int) -> None:
        """Shift a row's state by the outages it has not seen (rare: once per job and
        outage). The stored state stays as it is until the job is next written; a
        state that cannot be shifted is left for the caller to report."""
        if row.state is None or row.live is None or offset < row.offset:
            row.offset = offset         # no state (or a reset offset): nothing to move
            return
        graph = await self.graph(scope, row.fingerprint) if row.fingerprint else None
        if graph is None:
            return
        try:
            d = evolve_live(graph, row.live, Shift(offset - row.offset), now)
        except ValueError:
            return
        if d.applied:
            row.live = d.state
            row.unsaved += d.archived
            row.archive += d.archived
            row.state = row.live + row.archive
        row.offset = offset

    async def hashes(self, keys: Sequence[tuple[str, str]]) -> list[list[bytes]]:
        """Many hashes ``(scope, key)`` read whole, as flat field-value lists (empty for
        a missing one), in one ``load.lua`` call per slot group: one reply parsed in C,
        where a pipeline of HGETALLs costs redis-py a parse and a dict per hash."""
        groups, calls = self._hashes_calls(keys)
        return self._hashes_read(len(keys), groups, await self.scripts.run(calls))

    def _hashes_calls(self, keys: Sequence[tuple[str, str]]
                      ) -> tuple[list[list[int]], list[Call]]:
        by_scope: dict[str, list[int]] = {}
        for i, (scope, _) in enumerate(keys):
            by_scope.setdefault(scope, []).append(i)
        groups = [[i for s in group for i in by_scope[s]]
                  for group in self._calls_by_slot(list(by_scope))]
        load = self.scripts["load"]
        return groups, [(load, [keys[i][1] for i in g], (0,)) for g in groups]

    @staticmethod
    def _hashes_read(n: int, groups: list[list[int]],
                     results: Sequence[Any]) -> list[list[bytes]]:
        out: list[list[bytes]] = [[] for _ in range(n)]
        for g, res in zip(groups, results, strict=True):
            if isinstance(res, Exception):
                raise res
            for i, flat in zip(g, res[1:], strict=True):
                out[i] = flat
        return out

    async def read_archives(self, jobs: Sequence[tuple[str, str]]
                            ) -> list[tuple[bytes, bytes]]:
        """Jobs' versions and archive records as stored (for rows from the cache), in
        one call."""
        out = []
        for flat in await self.hashes([(s, self.keys(s).job(j)) for s, j in jobs]):
            h = pairs(flat)
            out.append((h.get(b"v", b"0"), archive_of(h)))
        return out

    async def graph(self, scope: str, fp: str) -> Graph | None:
        g = self.graphs.get(fp)
        if g is not None:
            return g
        self.graphs.misses += 1
        raw = await self.client.get(self.keys(scope).graph(fp))
        if raw is None:
            return None
        g = Graph.from_bytes(raw)
        self.graphs.stored.add((scope, fp))
        return self.graphs.put(g)

    async def now_ms(self) -> int:
        sec, usec = await self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    # ---- writing

    def cas_call(self, groups: Sequence[tuple[str, Sequence[Record], bool]],
                 not_after: int = 0, deliver: tuple[str, str, int] | None = None) -> Call:
        """One compare-and-set call over ``(scope, records, delivers)`` groups, written
        only up to the server time ``not_after`` (ms; 0: any time); the new entries of
        the groups that deliver go to ``deliver`` (consumer group, consumer, count)."""
        # the offsets first (read first in the script); a scope's and a job's keys are
        # each named once a call, so only the keys records may share are looked up
        sk = [self.keys(s) for s, _, _ in groups]
        keys: list[Any] = [k.offset for k in sk]
        index: dict[str, int] = {}

        def ki(name: str) -> int:
            i = index.get(name)
            if i is None:
                keys.append(name)
                i = index[name] = len(keys)
            return i

        args: list[Any] = [len(groups), not_after, *(deliver or (b"", b"", 0))]
        for k, (_, records, delivers) in zip(sk, groups, strict=True):
            n = len(keys)
            keys += (k.due, k.active, k.work)
            args += (n + 1, n + 2, n + 3, b"1" if delivers and deliver else b"0",
                     len(records))
            job_key = k.jobs
            for r in records:
                keys.append(job_key + r.job)
                args += (len(keys), r.job, r.expected,
                         b"" if r.state is None else r.state, r.fingerprint)
                if r.graph is not None:
                    args += (ki(k.graph(r.fingerprint)), r.graph)
                else:
                    args += (0, b"")
                args += (b"1" if r.reset else b"0",
                         b"" if r.due is None else r.due - r.offset, r.offset,
                         b"" if r.active is None else (b"1" if r.active else b"0"),
                         len(r.waits))
                for sign, t, since in r.waits:
                    args += (sign, ki(k.waits(t)), since)
                args.append(len(r.entries))
                for e in r.entries:
                    args += e
                if r.response is not None:
                    args += (ki(k.response(r.job)), r.response, ki(k.results),
                             ki(k.outbox) if self.outbox else 0)
                else:
                    args += (0, b"", 0, 0)
                args += (r.archive, r.trace)
        return (self.scripts["cas"], keys, args)

    async def commit(self, batches: dict[str, Sequence[Record]],
                     deliver: tuple[str, str, int] | None = None,
                     serves: Any = None, not_after: int = 0) -> dict[str, Committed]:
        """Write records of several scopes; per scope the new versions (0 = lost race,
        or the server clock was past ``not_after`` ms: decided too long ago), the
        markers of the dispatch entries written, and (with ``deliver`` = group,
        consumer, count) the scope's new entries, now pending on that consumer."""
        versions, marks, counts, delivered = await self.commit_flat(
            batches, deliver, serves, not_after)
        got = dict(delivered)
        out: dict[str, Committed] = {}
        vi = mi = 0
        for s, m in zip([s for s, recs in batches.items() if recs], counts, strict=True):
            n = len(batches[s])
            out[s] = Committed(versions[vi:vi + n], marks[mi:mi + 3 * m], got.get(s, []))
            vi += n
            mi += 3 * m
        return out

    async def commit_flat(self, batches: dict[str, Sequence[Record]],
                          deliver: tuple[str, str, int] | None = None,
                          serves: Any = None, not_after: int = 0) -> Flat:
        """``commit`` flat over the scopes, in the order of ``batches``: the new
        version of every record, the markers of every dispatch entry written, per
        scope the number of its dispatch entries, and the entries delivered as
        ``(scope, entries)`` in the reply's order (a scope's stream once at most).
        With one job a scope, per-scope containers were most of the host's work."""
        scopes = [s for s, recs in batches.items() if recs]
        groups = self._calls_by_slot(scopes)
        calls = [self.cas_call([(s, batches[s], serves is None or serves(s)) for s in group],
                               not_after, deliver) for group in groups]
        results = await self.scripts.run(calls)
        versions: list[int] = []
        marks: list[Any] = []
        counts: list[int] = []
        delivered: list[tuple[str, list[tuple[bytes, list[bytes]]]]] = []
        for group, res in zip(groups, results, strict=True):
            if isinstance(res, Exception):
                raise res
            vs, ms, cs, raw = res
            if 0 in vs:
                drop = self.cache.drop
                it = iter(vs)
                for s in group:
                    for r in batches[s]:
                        if next(it) == 0:
                            drop(s, r.job)
            versions += vs
            marks += ms
            counts += cs
            if raw:
                for stream, items in raw:
                    delivered.append((scope_of_work(stream), items))
        return versions, marks, counts, delivered

    async def write_markers(self, marks: Sequence[Mark],
                            acks: Sequence[tuple[str, bytes]] = (),
                            lazy: bool = False) -> None:
        """Write sent markers ``(scope, job, field, value)`` (only while a state exists),
        then ack the ``(scope, entry id)`` entries of the scopes' work streams, in that
        order (a marker is never behind its entry's ack): one call on a single Redis,
        one per scope on a cluster. ``lazy``: the call may wait a moment for another
        request to go with (``Scripts.call``). Flat lists, not one per scope: with one
        job a scope, per-scope containers were most of the host's work here."""
        if self.cluster:
            per: dict[str, tuple[list[Mark], list[tuple[str, bytes]]]] = {}
            for m in marks:
                per.setdefault(m[0], ([], []))[0].append(m)
            for a in acks:
                per.setdefault(a[0], ([], []))[1].append(a)
            calls = [self._marker_call(m, a) for m, a in per.values()]
        else:
            calls = [self._marker_call(marks, acks)] if marks or acks else []
        for res in await self.scripts.run(calls, lazy):
            if isinstance(res, Exception):
                raise res

    def _marker_call(self, marks: Sequence[Mark], acks: Sequence[tuple[str, bytes]]) -> Call:
        keys: list[Any] = []
        fv: list[Any] = []
        scope, prefix = None, ""
        for s, job, name, value in marks:
            if s != scope:          # a batch's markers come mostly in runs of one scope
                scope, prefix = s, self.keys(s).jobs
            keys.append(prefix + job)
            fv += (name, value)
        n = len(keys)
        by_scope: dict[str, list[bytes]] = {}
        for s, eid in acks:
            ids = by_scope.get(s)
            if ids is None:
                by_scope[s] = [eid]
            else:
                ids.append(eid)
        tail: list[Any] = [self.group]
        for s, ids in by_scope.items():
            keys.append(self.keys(s).work)
            tail.append(len(ids))
            tail += ids
        return (self.scripts["marker"], keys, [n, *fv, *tail])

    # ---- work masters and orders (plain hashes; the order script changes orders)

    async def put_work_master(self, scope: str, wm: dict[str, Any]) -> None:
        wm_id = wm.get("ID")
        if not isinstance(wm_id, str) or not wm_id:
            raise ValueError("a Work Master needs a non-empty string ID")
        k = self.keys(scope)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(k.work_master(wm_id), json.dumps(wm))
        pipe.sadd(k.work_masters, wm_id)
        await pipe.execute()

    async def delete_work_master(self, scope: str, wm_id: str) -> bool:
        k = self.keys(scope)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(k.work_master(wm_id))
        pipe.srem(k.work_masters, wm_id)
        deleted, _ = await pipe.execute()
        return bool(deleted)

    async def work_master_ids(self, scope: str) -> list[str]:
        """The scope's Work Master ids, sorted (``work_master_ids``)."""
        return await work_master_ids(self.client, scope)

    async def work_master(self, scope: str, wm_id: str) -> bytes | None:
        raw: bytes | None = await self.client.get(self.keys(scope).work_master(wm_id))
        return raw

    async def orders_many(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, str] | None]:
        """Several job orders in one pipeline (None for a missing one)."""
        if not pairs:
            return []
        flats = await self.hashes([(s, self.keys(s).order(j)) for s, j in pairs])
        return [_order(f) for f in flats]

    async def work_masters_many(self, pairs: Sequence[tuple[str, str]]) -> list[bytes | None]:
        if not pairs:
            return []
        got = await self.scripts.commands([("GET", self.keys(scope).work_master(wm_id))
                                           for scope, wm_id in pairs])
        for r in got:
            if isinstance(r, Exception):
                raise r
        return got

    async def order(self, scope: str, job: str) -> dict[str, str] | None:
        raw = await self.client.hgetall(self.keys(scope).order(job))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}


def _order(flat: list[bytes]) -> dict[str, str] | None:
    """An order hash from its flat field-value list (None: no such order)."""
    return dict(zip(map(bytes.decode, flat[::2]), map(bytes.decode, flat[1::2]),
                    strict=True)) if flat else None


def caught_up(graph: Graph, state: bytes, gap: int, now: int) -> bytes:
    """A state with the outages' ``gap`` (ms) it has not seen applied; ``ValueError``
    (``StateFormatError``) for a state that cannot be read."""
    if gap <= 0:
        return state
    d = evolve(graph, state, Shift(gap), now)
    return d.state if d.applied else state


def decode_or_none(graph: Graph, state: bytes | None, fn: Any) -> Any:
    """``fn(graph, state)``, or None when the state cannot be read (logged by callers)."""
    if state is None:
        return None
    try:
        return fn(graph, state)
    except (StateFormatError, ValueError):
        return None


def iter_chunks(items: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


async def work_master_ids(client: Any, scope: str) -> list[str]:
    """A scope's Work Master ids, sorted, from its set of them. Work Masters stored
    before the scope had the set are found by their keys once (a scan of the keyspace)
    and added to it."""
    k = ScopeKeys(scope)
    ids = {_decoded(m) for m in await client.smembers(k.work_masters)}
    if not ids:
        prefix = k.work_master("")
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
        async for key in client.scan_iter(match=pattern, count=500):
            ids.add(_decoded(key)[len(prefix):])
        if ids:
            await client.sadd(k.work_masters, *ids)
    return sorted(ids)


def _decoded(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
