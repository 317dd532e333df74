"""The work streams: reading entries with a consumer group, taking over orphaned ones,
acking in bulk, and moving entries that keep failing to the dead stream.

Entry fields: ``k`` kind, ``j`` job (a ``tick``: one or more jobs, one per line), then
per kind ``a`` (action or job transition), ``c`` (command id, or the recipe's reason on
a ``job`` Abort), ``t``/``s``/``r``/``d`` (an event's type, subject, correlation id,
data).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from sfc_host.config import HostConfig
from sfc_host.keys import ScopeKeys, check_job
from sfc_host.metrics import Metrics
from sfc_host.scripts import Scripts

log = logging.getLogger("sfc_host.stream")

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


class InvalidEntry(ValueError):
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
    """Reads, acks, claims and dead-letters work entries of many scopes."""

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
        self._by_stream: dict[bytes, str] = {}
        self._claimed_at: dict[str, float] = {}
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
        return True

    async def _create_group(self, k: ScopeKeys) -> None:
        try:
            await self.client.xgroup_create(k.work, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def read(self, block_ms: int | None = None) -> list[Raw]:
        """New entries of all scopes (blocking up to ``block_ms`` when none)."""
        if not self.scopes:
            return []
        count = self.config.read_count
        if self.cluster:
            res = await self._read_cluster(count)
        else:
            try:
                res = await self.client.xreadgroup(
                    self.group, self.consumer, {k.work: ">" for k in self.scopes.values()},
                    count=count, block=block_ms or None)   # BLOCK 0 would wait forever
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                # A stream or group was deleted: one read spans every scope, so the
                # groups are made again (those that exist stay as they are).
                self.metrics.inc("read_errors")
                log.warning("a work stream or group is gone; creating the groups again")
                for k in self.scopes.values():
                    await self._create_group(k)
                return []
        out: list[Raw] = []
        for stream, items in res or ():
            scope = self._by_stream[stream if isinstance(stream, bytes) else stream.encode()]
            for entry_id, fields in items:
                out.append((scope, entry_id, fields))
        return out

    async def _read_cluster(self, count: int) -> list[Any]:
        """One non-blocking XREADGROUP per scope (streams of two scopes may live on
        two nodes, and one XREADGROUP cannot span slots), all in one pipeline that
        redis-py splits by node and sends concurrently. A scope whose read fails does
        not cost the entries the others delivered: its error is logged and counted, a
        lost group (the stream was deleted) is created again; only when every read
        fails does the pass fail."""
        keys = list(self.scopes.values())
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

    async def claim(self, scope: str, now: float) -> tuple[list[Raw], list[Raw]]:
        """Take over entries idle longer than the claim threshold (at most every claim
        interval per scope): ``(to handle, to dead-letter)``."""
        last = self._claimed_at.get(scope, 0.0)
        if now - last < self.config.claim_interval_ms / 1000:
            return [], []
        self._claimed_at[scope] = now
        k = self.scopes[scope]
        res = await self.client.xautoclaim(k.work, self.group, self.consumer,
                                           self.config.claim_min_idle_ms, "0-0",
                                           count=self.config.read_count)
        claimed = [(eid, f) for eid, f in res[1] if f is not None]
        if not claimed:
            return [], []
        self.metrics.inc("entries_claimed", len(claimed))
        pend = await self.client.xpending_range(k.work, self.group, claimed[0][0],
                                                claimed[-1][0], len(claimed) * 4,
                                                consumername=self.consumer)
        counts = {p["message_id"]: p["times_delivered"] for p in pend}
        handle: list[Raw] = []
        dead: list[Raw] = []
        for eid, f in claimed:
            if counts.get(eid, 1) > self.config.max_deliveries:
                dead.append((scope, eid, f))
            else:
                handle.append((scope, eid, f))
                self._redelivered.add(eid)
        return handle, dead

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

    async def ack(self, done: dict[str, list[bytes]],
                  failed: dict[str, list[tuple[bytes, str]]]) -> None:
        """Ack (and delete) the handled entries, and note why the others failed; one
        pipeline for the whole batch."""
        if not done and not failed:
            return
        pipe = self.client.pipeline(transaction=False)
        for scope, ids in done.items():
            if not ids:
                continue
            k = self.scopes[scope]
            pipe.xack(k.work, self.group, *ids)   # trimmed by the sweep (sweep.lua)
            again = [i for i in ids if i in self._redelivered]
            if again:
                pipe.hdel(k.errors, *again)
                self._redelivered.difference_update(again)
        for scope, errs in failed.items():
            k = self.scopes[scope]
            mapping = {eid: reason[:2000] for eid, reason in errs}
            if mapping:
                pipe.hset(k.errors, mapping=mapping)
        for r in await pipe.execute(raise_on_error=False):
            if isinstance(r, Exception):
                raise r
