"""The work streams: reading entries with a consumer group, taking over orphaned ones,
acking in bulk, and moving entries that keep failing to the dead stream.

Entry fields: ``k`` kind, ``j`` job (a ``tick``: one or more jobs, one per line), then
per kind ``a`` (action or job transition), ``c`` (command id, or the recipe's reason on
a ``job`` Abort), ``t``/``s``/``r``/``d`` (an event's type, subject, correlation id,
data).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from sfc_host.config import HostConfig
from sfc_host.errors import SfcHostError
from sfc_host.metrics import Metrics
from sfc_host.names import check_job
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.lua_scripts import Scripts
from sfc_host.store.states import pairs

log = logging.getLogger("sfc_host.store.streams")

KINDS = frozenset(("start", "cancel", "hold", "release", "tick", "resume", "event", "job"))
JOB_TRANSITIONS = frozenset(("Run", "Complete", "Abort"))
MAX_FIELD = 1 << 20
MAX_TICK_JOBS = 4096     # a sweep writes at most sweep.TICK_BATCH per entry


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are no JSON: refused here as the MQTT side refuses them
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _short(text: str) -> str:
    # a field may be a megabyte: a log line shows its start
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "…"


class InvalidEntry(SfcHostError, ValueError):
    """An entry no handler can use: logged, counted, acked."""


@dataclass(slots=True)
class Entry:
    scope: str
    id: bytes
    kind: str
    job: str = ""
    action: str = ""
    cid: str = ""
    jobs: list[str] | None = None   # a tick's jobs (job is the first)
    type_id: str = ""
    subject: str | None = None
    correlation: str | None = None
    data: Any = None


def _s(fields: dict[bytes, bytes], name: bytes) -> str | None:
    v = fields.get(name)
    if v is None:
        return None
    if len(v) > MAX_FIELD:
        raise InvalidEntry(f"field {name.decode()} is {len(v)} bytes")
    try:
        return v.decode()
    except UnicodeDecodeError:
        raise InvalidEntry(f"field {name.decode()} is not UTF-8") from None


def parse_entry(scope: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry:
    """Check one entry; ``InvalidEntry`` says why it cannot be used."""
    kind = _s(fields, b"k")
    if kind is None:
        raise InvalidEntry("no kind (field k)")
    if kind.startswith("dispatch:"):
        action = kind[9:]
        cid = _s(fields, b"c") or ""
        job = _s(fields, b"j") or ""
        if not action or not cid or not job:
            raise InvalidEntry("dispatch entry without job, action or command id")
        try:
            check_job(job)
        except ValueError as e:
            raise InvalidEntry(str(e)) from None
        return Entry(scope, entry_id, "dispatch", job, action, cid)
    if kind not in KINDS:
        raise InvalidEntry(f"unknown kind {_short(kind)}")
    if kind == "event":
        t = _s(fields, b"t")
        if not t:
            raise InvalidEntry("event entry without a type (field t)")
        raw = _s(fields, b"d")
        try:
            data = _DECODER.decode(raw) if raw else None
        except (ValueError, RecursionError):  # also a number of over 4300 digits
            raise InvalidEntry("event data is not JSON") from None
        if data is not None and not isinstance(data, dict):
            raise InvalidEntry("event data is not an object")
        return Entry(scope, entry_id, "event", type_id=t, subject=_s(fields, b"s"),
                     correlation=_s(fields, b"r"), data=data)
    job = _s(fields, b"j")
    if not job:
        raise InvalidEntry(f"{kind} entry without a job (field j)")
    jobs = job.split("\n") if kind == "tick" else [job]
    if len(jobs) > MAX_TICK_JOBS:
        raise InvalidEntry(f"tick entry with {len(jobs)} jobs (at most {MAX_TICK_JOBS})")
    try:
        for j in jobs:
            check_job(j)
    except ValueError as e:
        raise InvalidEntry(str(e)) from None
    e = Entry(scope, entry_id, kind, jobs[0])
    if kind == "job":
        e.action = _s(fields, b"a") or ""
        if e.action not in JOB_TRANSITIONS:
            raise InvalidEntry(f"unknown job transition {_short(e.action)}")
        e.cid = _s(fields, b"c") or ""
    elif kind == "tick":
        e.jobs = jobs
    return e


Raw = tuple[str, bytes, dict[bytes, bytes]]


def log_fields(e: Entry) -> dict[str, str]:
    """The fields of structured log lines about an entry: scope, job, and for a dispatch
    the action and command id (a job entry's action is a job order transition)."""
    out = {"scope": e.scope}
    if e.job:
        out["job"] = e.job
    if e.kind == "dispatch":
        out["action"], out["command_id"] = e.action, e.cid
    return out


def _raw_fields(scope: str, eid: bytes, fields: dict[bytes, bytes]) -> dict[str, str]:
    try:
        return log_fields(parse_entry(scope, eid, fields))
    except ValueError:  # InvalidEntry too: only the scope is sure
        return {"scope": scope}


class Streams:
    """Reads, acks, claims and dead-letters work entries of many scopes.

    A pass reads only the scopes marked ``hot`` (``mark``: this host appended entries
    it did not take at once, a sweep queued ticks, the last read of the scope was
    full, the scope is new); every scope is read at least every
    ``full_read_interval_ms`` (entries another process wrote and did not read: a host
    that died first, a tool). So an idle scope costs no command per pass."""

    def __init__(self, client: Any, scripts: Scripts, config: HostConfig,
                 metrics: Metrics, cluster: bool = False) -> None:
        self.client = client
        self.scripts = scripts
        self.config = config
        self.metrics = metrics
        self.cluster = cluster
        self.group = config.group
        self.consumer = config.consumer_name
        self.scopes: dict[str, ScopeKeys] = {}
        self.hot: set[str] = set()
        # scopes with entries this host knows of since their last trim: the sweep trims
        # only these (and every scope when it looks for orphans)
        self.touched: set[str] = set()
        self.ready = asyncio.Event()     # set when a scope turns hot
        self._next_full = 0.0            # time.monotonic() of the next read of every scope
        # scopes a sweep found entries in that are pending longer than the claim threshold
        self.orphans: set[str] = set()
        self._by_stream: dict[bytes, str] = {}
        self._redelivered: set[bytes] = set()   # may have a failure reason stored

    async def add_scope(self, scope: str) -> bool:
        """Serve a scope: create its group (reading from the start of the stream, so
        entries written before any host knew the scope are read). True if new."""
        if scope in self.scopes:
            return False
        k = ScopeKeys(scope)
        await self._create_group(k)
        self.scopes[scope] = k
        self._by_stream[k.work.encode()] = scope
        self.mark(scope)
        return True

    def mark(self, scope: str) -> None:
        """The scope may have entries no consumer has read: read it in the next pass."""
        if scope in self.scopes:
            self.hot.add(scope)
            self.touched.add(scope)
            self.ready.set()

    def wrote(self, scopes: Collection[str], full: Collection[str]) -> None:
        """This host appended entries to these scopes' streams; ``full``: those whose
        delivery to it was full, so entries may wait unread (read them next pass)."""
        self.touched |= self.scopes.keys() & scopes
        for scope in full:
            self.mark(scope)

    async def _create_group(self, k: ScopeKeys) -> None:
        try:
            await self.client.xgroup_create(k.work, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def _wait_ready(self, block_ms: int | None) -> None:
        """Wait (up to ``block_ms``, and not past the next full read) for a hot scope."""
        if self.hot or self.orphans or not block_ms:
            return
        wait = min(block_ms / 1000, self._next_full - time.monotonic())
        if wait > 0:
            self.ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), wait)

    async def read(self, block_ms: int | None = None) -> list[Raw]:
        """New entries of the hot scopes, or of all of them when a full read is due
        (waiting up to ``block_ms`` for a scope to turn hot when none is)."""
        if not self.scopes:
            return []
        await self._wait_ready(block_ms)
        now = time.monotonic()
        if now >= self._next_full:
            self._next_full = now + self.config.full_read_interval_ms / 1000
            keys = list(self.scopes.values())
            self.hot.clear()
        elif self.hot:
            keys = [self.scopes[s] for s in self.hot if s in self.scopes]
            self.hot.clear()
        else:
            return []
        try:
            res = await self._read(keys)
        except BaseException:
            self._next_full = 0.0           # the marks are gone: the next pass reads all
            raise
        if res is None:
            return []
        out: list[Raw] = []
        count = self.config.read_count
        for stream, items in res:
            scope = self._by_stream[stream if isinstance(stream, bytes) else stream.encode()]
            self.touched.add(scope)
            if len(items) >= count:
                self.mark(scope)            # a full batch: more may wait
            for entry_id, fields in items:
                out.append((scope, entry_id, fields))
        return out

    async def _read(self, keys: list[ScopeKeys]) -> list[Any] | None:
        """One read of these scopes' streams; None when it found groups missing."""
        count = self.config.read_count
        if self.cluster:
            res = await self._read_cluster(keys, count)
        else:
            try:
                res = await self._read_standalone(keys, count)
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                # A stream or group was deleted: one read spans these scopes, so their
                # groups are made again (those that exist stay as they are).
                self.metrics.inc("read_errors")
                log.warning("a work stream or group is gone; creating the groups again")
                for k in keys:
                    await self._create_group(k)
                    self.mark(k.scope)
                return None
        return res or []

    async def _read_standalone(self, keys: list[ScopeKeys], count: int) -> list[Any]:
        channel = self.scripts.channel
        if channel is None:
            res: list[Any] = await self.client.xreadgroup(
                self.group, self.consumer, {k.work: ">" for k in keys}, count=count)
            return res
        # on the host's channel (no BLOCK: it never holds the connection)
        return _as_redis_py(await channel.execute(
            "XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count, "STREAMS",
            *[k.work for k in keys], *[">"] * len(keys)))

    async def _read_cluster(self, keys: list[ScopeKeys], count: int) -> list[Any]:
        """One XREADGROUP per scope (streams of two scopes may live on two nodes, and
        one XREADGROUP cannot span slots), all at once: on the host's channel (a write
        per node), else in one pipeline that redis-py splits by node. A scope whose read
        fails does not cost the entries the others delivered: its error is logged and
        counted, a lost group (the stream was deleted) is created again; only when every
        read fails does the pass fail."""
        channel = self.scripts.channel
        if channel is not None:
            # on the host's channel, each read to its stream's node, a write per node
            raw = await channel.execute_many([
                ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count,
                 "STREAMS", k.work, ">") for k in keys])
            replies: list[Any] = [r if isinstance(r, Exception) else _as_redis_py(r)
                                  for r in raw]
        else:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.xreadgroup(self.group, self.consumer, {k.work: ">"}, count=count)
            replies = await pipe.execute(raise_on_error=False)
        res: list[Any] = []
        failed: list[Exception] = []
        for k, r in zip(keys, replies, strict=True):
            if not isinstance(r, Exception):
                if r:
                    res.extend(r)
                continue
            self.metrics.inc("read_errors")
            self.mark(k.scope)          # read it again in the next pass
            if isinstance(r, ResponseError) and "NOGROUP" in str(r):
                log.warning("scope %s: work stream or group gone; creating it again", k.scope,
                            extra={"scope": k.scope})
                await self._create_group(k)
            else:
                log.error("scope %s: reading the work stream failed: %s", k.scope, r,
                          extra={"scope": k.scope})
                failed.append(r)
        if failed and len(failed) == len(keys):
            raise failed[0]
        return res

    def note_orphans(self, scopes: list[str]) -> None:
        """A sweep saw entries pending longer than the claim threshold in these."""
        self.orphans.update(scopes)
        self.ready.set()

    async def claim(self) -> tuple[list[Raw], list[Raw]]:
        """Take over entries idle longer than the claim threshold in the scopes a sweep
        found them in (it looks at most every claim interval per scope; one pipeline):
        ``(to handle, to dead-letter)``."""
        keys = [self.scopes[s] for s in self.orphans if s in self.scopes]
        self.orphans.clear()
        if not keys:
            return [], []
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.xautoclaim(k.work, self.group, self.consumer, self.config.claim_min_idle_ms,
                            "0-0", count=self.config.read_count)
        replies = await pipe.execute(raise_on_error=False)
        handle: list[Raw] = []
        dead: list[Raw] = []
        for k, r in zip(keys, replies, strict=True):
            if isinstance(r, Exception):
                self.metrics.inc("read_errors")
                log.error("scope %s: claiming idle entries failed: %s", k.scope, r,
                          extra={"scope": k.scope})
                if isinstance(r, ResponseError) and "NOGROUP" in str(r):
                    await self._create_group(k)
                continue
            claimed = [(eid, f) for eid, f in r[1] if f is not None]
            if claimed:
                await self._split_claimed(k, claimed, handle, dead)
        return handle, dead

    async def _split_claimed(self, k: ScopeKeys, claimed: list[tuple[bytes, Any]],
                             handle: list[Raw], dead: list[Raw]) -> None:
        """Claimed entries delivered more than ``max_deliveries`` times go to ``dead``."""
        self.metrics.inc("entries_claimed", len(claimed))
        pend = await self.client.xpending_range(k.work, self.group, claimed[0][0],
                                                claimed[-1][0], len(claimed) * 4,
                                                consumername=self.consumer)
        counts = {p["message_id"]: p["times_delivered"] for p in pend}
        for eid, f in claimed:
            if counts.get(eid, 1) > self.config.max_deliveries:
                dead.append((k.scope, eid, f))
            else:
                handle.append((k.scope, eid, f))
                self._redelivered.add(eid)

    async def dead_letter(self, items: list[Raw]) -> None:
        for scope, eid, fields in items:
            k = self.scopes[scope]
            reason = await self.client.hget(k.errors, eid)
            args: list[Any] = [self.group, eid, reason or b"unknown", self.config.max_deliveries]
            for f, v in fields.items():
                args += (f, v)
            await self.scripts.call(self.scripts["dead"], [k.work, k.dead, k.errors], args)
            self.metrics.inc("dead_entries")
            log.error("entry %s of scope %s moved to the dead stream after %d deliveries: %s",
                      eid.decode(), scope, self.config.max_deliveries,
                      (reason or b"unknown").decode(errors="replace"),
                      extra=_raw_fields(scope, eid, fields))

    def noted(self, done: dict[str, list[bytes]]) -> bool:
        """Whether some of these entries came back after a failure whose reason is
        stored (their ack clears it: ``ack``)."""
        again = self._redelivered
        return bool(again) and any(i in again for ids in done.values() for i in ids)

    async def ack(self, done: dict[str, list[bytes]],
                  failed: dict[str, list[tuple[bytes, str]]]) -> None:
        """Ack (and delete) the handled entries, and note why the others failed; one
        pipeline for the whole batch."""
        if not done and not failed:
            return
        cmds: list[tuple[Any, ...]] = []
        for scope, ids in done.items():
            if not ids:
                continue
            k = self.scopes[scope]
            cmds.append(("XACK", k.work, self.group, *ids))  # trimmed by the sweep
            again = [i for i in ids if i in self._redelivered]
            if again:
                cmds.append(("HDEL", k.errors, *again))
                self._redelivered.difference_update(again)
        for scope, errs in failed.items():
            k = self.scopes[scope]
            flat = [x for eid, reason in errs for x in (eid, reason[:2000])]
            if flat:
                cmds.append(("HSET", k.errors, *flat))
        for r in await self.scripts.commands(cmds):
            if isinstance(r, Exception):
                raise r


def _as_redis_py(raw: Any) -> list[Any]:
    """An XREADGROUP reply read on the host's channel as redis-py gives it:
    ``[(stream, [(id, {field: value}), ...]), ...]``."""
    return [(stream, [(eid, pairs(flat) if flat else {}) for eid, flat in items])
            for stream, items in raw or ()]

