"""Sweeps: per scope, one script pops the due jobs, queues ``tick`` entries for them
(``TICK_BATCH`` jobs an entry) and writes the scope's heartbeat. A heartbeat older than
the outage threshold means no host swept the scope for that long (all down, or Redis
was): then the gap is added to the scope's offset, which moves every open deadline of
the scope at once instead of timing everything out (see ``sweep.lua``).

A pass sweeps only the scopes that are due (``Schedule``): a scope is swept again when
its next deadline comes (the script returns the lowest score left on its index, and
the deadlines this host writes itself are noted with ``note_due``), when its claim
interval has passed (the sweep then also tells whether entries wait to be claimed), and
at the latest after ``HostConfig.idle_sweep_ms``, so that its heartbeat stays fresh
while any host runs and the outage rule keeps its meaning (docs/host.md, "Sweep,
heartbeat and outage")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from sfc_host.config import HostConfig
from sfc_host.execution.schedule import Schedule, spread
from sfc_host.metrics import Metrics
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.lua_scripts import Scripts

log = logging.getLogger("sfc_host.execution.sweep")

TICK_BATCH = 32   # jobs per tick entry: one handler batch stays a few thousand jobs
# scopes one sweep call takes on a single Redis: a call holds Redis for at most a few
# milliseconds when every scope has nothing due (an idle scope is a handful of commands)
SCOPES_PER_CALL = 128
FIELDS = 6        # per scope in the script's reply


class Sweeper:
    def __init__(self, scripts: Scripts, config: HostConfig, metrics: Metrics) -> None:
        self.scripts = scripts
        self.config = config
        self.metrics = metrics
        self.plan = Schedule()      # the next sweep of each served scope
        self.claims = Schedule()    # the next look for entries to claim
        # server clock (ms) minus time.monotonic() (ms), from the last sweep's reply:
        # turns a deadline (server ms) into the host's own clock
        self._skew_ms: float | None = None
        self.on_ticks: Callable[[str], None] | None = None    # a sweep queued ticks there
        self.on_orphans: Callable[[list[str]], None] | None = None   # entries to claim
        # scopes whose stream had entries since its last trim (the host's Streams): a
        # sweep trims only these, and every scope it looks for orphans in
        self.touched: set[str] = set()

    def add(self, scope: str) -> None:
        """A scope served from now on: swept in the next pass; its claims spread over
        one claim interval."""
        if scope not in self.plan:
            self.plan.set(scope, 0.0)
            self.claims.set(scope, time.monotonic()
                            + spread(self.config.claim_interval_ms / 1000))

    def note_due(self, dues: Mapping[str, int]) -> None:
        """This host wrote these deadlines (server ms) to the scopes' due indexes."""
        skew = self._skew_ms
        earlier = self.plan.earlier
        for scope, due_ms in dues.items():
            earlier(scope, 0.0 if skew is None else (due_ms - skew) / 1000)

    async def sweep_due(self, scopes: Mapping[str, ScopeKeys]) -> int:
        """Sweep the served scopes whose time has come; how many ticks were queued."""
        now = time.monotonic()
        claim = set(self.claims.due(now))
        names = list(dict.fromkeys([*self.plan.due(now), *claim]))
        served = [s for s in names if s in scopes]
        for s in names:
            if s not in scopes:           # swept once by name, not served
                self.plan.discard(s)
                self.claims.discard(s)
        if not served:
            return 0
        try:
            return await self.sweep([scopes[s] for s in served], claim)
        except BaseException:
            for s in served:              # not swept: due again in the next pass
                if s not in self.plan:
                    self.plan.set(s, now)
                if s in claim:
                    self.claims.set(s, now)
            raise

    async def sweep(self, scopes: Sequence[ScopeKeys], claim: Collection[str] = ()) -> int:
        """Sweep the scopes (``SCOPES_PER_CALL`` a script call on a single Redis, one
        on a cluster) in one pipeline, looking for entries to claim in those named in
        ``claim``; how many ticks were queued."""
        script = self.scripts["sweep"]
        c = self.config
        per = 1 if c.redis_cluster else SCOPES_PER_CALL
        groups = [scopes[i:i + per] for i in range(0, len(scopes), per)]
        calls = []
        touched = self.touched
        trimmed = {k.scope for k in scopes if k.scope in touched}
        touched.difference_update(trimmed)    # entries written meanwhile mark it again
        for group in groups:
            flags = "".join("2" if k.scope in claim else "1" if k.scope in trimmed else "0"
                            for k in group)
            calls.append((script,
                          [key for k in group for key in (k.due, k.heartbeat, k.work, k.offset)],
                          (c.sweep_limit, c.outage_threshold_ms, "1" if c.trim_acked else "0",
                           TICK_BATCH, c.group, c.claim_min_idle_ms, flags)))
        try:
            results = await self.scripts.run(calls)
            bad = next((r for r in results if isinstance(r, Exception)), None)
            if bad is not None:
                raise bad
        except BaseException:
            touched.update(trimmed)           # not trimmed
            raise
        mono = time.monotonic()
        queued = 0
        orphans: list[str] = []
        for group, res in zip(groups, results, strict=True):
            self._skew_ms = int(res[0]) - mono * 1000
            for i, k in enumerate(group):
                at = 1 + FIELDS * i
                gap, n, offset = (int(x) for x in res[at:at + 3])
                queued += n
                self._plan_next(k.scope, mono, n, offset, res[at + 3])
                if k.scope in claim:
                    self.claims.set(k.scope, mono + spread(c.claim_interval_ms / 1000))
                    if int(res[at + 4]):
                        orphans.append(k.scope)
                if int(res[at + 5]):
                    touched.add(k.scope)      # entries in flight: trimmed next time too
                if n and self.on_ticks is not None:
                    self.on_ticks(k.scope)
                if gap:
                    self.metrics.inc("outages")
                    log.warning("scope %s was not swept for %d ms (outage): every open "
                                "deadline moves by the gap (scope offset now %d ms)", k.scope,
                                gap, offset, extra={"scope": k.scope})
        if queued:
            self.metrics.inc("ticks_queued", queued)
        if orphans and self.on_orphans is not None:
            self.on_orphans(orphans)
        return queued

    def _plan_next(self, scope: str, mono: float, popped: int, offset: int,
                   lowest: bytes | str) -> None:
        if popped >= self.config.sweep_limit:
            at = mono                      # more may be due: the next pass goes on
        else:
            at = mono + spread(self.config.idle_sweep_ms / 1000)
            if lowest not in (b"", ""):
                assert self._skew_ms is not None
                at = min(at, (float(lowest) + offset - self._skew_ms) / 1000)
        self.plan.set(scope, at)
