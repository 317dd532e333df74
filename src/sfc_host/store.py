"""Job states in Redis: read many jobs of a scope in one call, write them with the
compare-and-set script, markers, compiled recipes pinned by fingerprint.

Reads and writes are batched per scope (one script call settles many jobs, since all
their keys share the scope's slot) and pipelined across scopes: a batch of any size
costs two round trips.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sfc_fast import Graph, StateFormatError
from sfc_host.keys import ScopeKeys
from sfc_host.scripts import Call, Scripts

log = logging.getLogger("sfc_host.store")


@dataclass(slots=True)
class JobRow:
    """One job hash as read: state, version, graph fingerprint and the sent markers."""

    job: str
    version: bytes = b"0"
    state: bytes | None = None
    fingerprint: str | None = None
    markers: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return self.state is not None


def _row(job: str, flat: list[bytes]) -> JobRow:
    r = JobRow(job)
    for i in range(0, len(flat), 2):
        k, v = flat[i], flat[i + 1]
        if k == b"s":
            r.state = v
        elif k == b"v":
            r.version = v
        elif k == b"g":
            r.fingerprint = v.decode()
        else:
            r.markers[k] = v
    return r


@dataclass(slots=True)
class Record:
    """One job's writes for the compare-and-set script."""

    job: str
    expected: bytes
    state: bytes | None            # None: index only
    due: int | None
    active: bool | None            # None: leave the active set
    waits: list[tuple[str, str, int]] = field(default_factory=list)  # (sign, type, since)
    entries: list[tuple[str, str, str]] = field(default_factory=list)
    fingerprint: str = ""
    graph: bytes | None = None
    reset: bool = False
    response: str | None = None


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
    def __init__(self, client: Any, scripts: Scripts, graphs: GraphCache) -> None:
        self.client = client
        self.scripts = scripts
        self.graphs = graphs
        self._keys: dict[str, ScopeKeys] = {}

    def keys(self, scope: str) -> ScopeKeys:
        k = self._keys.get(scope)
        if k is None:
            k = self._keys[scope] = ScopeKeys(scope)
        return k

    # ---- reading

    async def load(self, wanted: dict[str, Sequence[str]]
                   ) -> dict[str, tuple[int, dict[str, JobRow]]]:
        """Read jobs of several scopes: ``{scope: (server now ms, {job: row})}``."""
        scopes = [s for s, jobs in wanted.items() if jobs]
        calls: list[Call] = []
        for s in scopes:
            k = self.keys(s)
            calls.append((self.scripts["load"], [k.job(j) for j in wanted[s]], ()))
        results = await self.scripts.run(calls)
        out: dict[str, tuple[int, dict[str, JobRow]]] = {}
        for s, res in zip(scopes, results, strict=True):
            if isinstance(res, Exception):
                raise res
            jobs = wanted[s]
            out[s] = (int(res[0]), {j: _row(j, res[i + 1]) for i, j in enumerate(jobs)})
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

    def cas_call(self, scope: str, records: Sequence[Record]) -> Call:
        k = self.keys(scope)
        keys: list[Any] = [k.due, k.active, k.work]
        index: dict[str, int] = {}

        def ki(name: str) -> int:
            i = index.get(name)
            if i is None:
                keys.append(name)
                i = index[name] = len(keys)
            return i

        args: list[Any] = [len(records)]
        for r in records:
            args += (ki(k.job(r.job)), r.job, r.expected,
                     b"" if r.state is None else r.state, r.fingerprint)
            if r.graph is not None:
                args += (ki(k.graph(r.fingerprint)), r.graph)
            else:
                args += (0, b"")
            args += (b"1" if r.reset else b"0",
                     b"" if r.due is None else r.due,
                     b"" if r.active is None else (b"1" if r.active else b"0"),
                     len(r.waits))
            for sign, t, since in r.waits:
                args += (sign, ki(k.waits(t)), since)
            args.append(len(r.entries))
            for e in r.entries:
                args += e
            if r.response is not None:
                args += (ki(k.response(r.job)), r.response)
            else:
                args += (0, b"")
        return (self.scripts["cas"], keys, args)

    async def commit(self, batches: dict[str, Sequence[Record]]) -> dict[str, list[int]]:
        """Write records of several scopes; per scope the new versions (0 = lost race)."""
        scopes = [s for s, recs in batches.items() if recs]
        results = await self.scripts.run([self.cas_call(s, batches[s]) for s in scopes])
        out: dict[str, list[int]] = {}
        for s, res in zip(scopes, results, strict=True):
            if isinstance(res, Exception):
                raise res
            out[s] = [int(v) for v in res]
        return out

    async def write_markers(self, marks: dict[str, list[tuple[str, str, str]]]) -> None:
        """Write sent markers ``(job, field, value)`` per scope (only while a state exists)."""
        calls: list[Call] = []
        for s, items in marks.items():
            if not items:
                continue
            k = self.keys(s)
            keys = [k.job(j) for j, _, _ in items]
            args: list[str] = []
            for _, f, v in items:
                args += (f, v)
            calls.append((self.scripts["marker"], keys, args))
        for res in await self.scripts.run(calls):
            if isinstance(res, Exception):
                raise res

    # ---- work masters and orders (plain hashes; the order script changes orders)

    async def put_work_master(self, scope: str, wm: dict[str, Any]) -> None:
        wm_id = wm.get("ID")
        if not isinstance(wm_id, str) or not wm_id:
            raise ValueError("a Work Master needs a non-empty string ID")
        await self.client.set(self.keys(scope).work_master(wm_id), json.dumps(wm))

    async def delete_work_master(self, scope: str, wm_id: str) -> bool:
        return bool(await self.client.delete(self.keys(scope).work_master(wm_id)))

    async def work_master(self, scope: str, wm_id: str) -> bytes | None:
        raw: bytes | None = await self.client.get(self.keys(scope).work_master(wm_id))
        return raw

    async def orders_many(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, str] | None]:
        """Several job orders in one pipeline (None for a missing one)."""
        if not pairs:
            return []
        pipe = self.client.pipeline(transaction=False)
        for scope, job in pairs:
            pipe.hgetall(self.keys(scope).order(job))
        out: list[dict[str, str] | None] = []
        for raw in await pipe.execute():
            out.append({k.decode(): v.decode() for k, v in raw.items()} if raw else None)
        return out

    async def work_masters_many(self, pairs: Sequence[tuple[str, str]]) -> list[bytes | None]:
        if not pairs:
            return []
        pipe = self.client.pipeline(transaction=False)
        for scope, wm_id in pairs:
            pipe.get(self.keys(scope).work_master(wm_id))
        return list(await pipe.execute())

    async def order(self, scope: str, job: str) -> dict[str, str] | None:
        raw = await self.client.hgetall(self.keys(scope).order(job))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}


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
