"""Sweeps: per scope, one script pops the due jobs, queues ``tick`` entries for them
(``TICK_BATCH`` jobs an entry) and writes the scope's heartbeat. A heartbeat older than
the outage threshold means no host swept the scope for that long (all down, or Redis
was): then the gap is added to the scope's offset, which moves every open deadline of
the scope at once instead of timing everything out (see ``sweep.lua``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sfc_host.config import HostConfig
from sfc_host.keys import ScopeKeys
from sfc_host.metrics import Metrics
from sfc_host.scripts import Scripts

log = logging.getLogger("sfc_host.sweep")

TICK_BATCH = 32   # jobs per tick entry: one handler batch stays a few thousand jobs


class Sweeper:
    def __init__(self, scripts: Scripts, config: HostConfig, metrics: Metrics) -> None:
        self.scripts = scripts
        self.config = config
        self.metrics = metrics

    async def sweep(self, scopes: Sequence[ScopeKeys]) -> int:
        """Sweep the scopes in one pipeline; how many ticks were queued."""
        script = self.scripts["sweep"]
        args = (self.config.sweep_limit, self.config.outage_threshold_ms,
                "1" if self.config.trim_acked else "0", TICK_BATCH)
        results = await self.scripts.run(
            [(script, (k.due, k.heartbeat, k.work, k.offset), args) for k in scopes])
        queued = 0
        for k, res in zip(scopes, results, strict=True):
            if isinstance(res, Exception):
                raise res
            _, gap, n, offset = (int(x) for x in res)
            queued += n
            if gap:
                self.metrics.inc("outages")
                log.warning("scope %s was not swept for %d ms (outage): every open deadline "
                            "moves by the gap (scope offset now %d ms)", k.scope, gap,
                            offset, extra={"scope": k.scope})
        if queued:
            self.metrics.inc("ticks_queued", queued)
        return queued
