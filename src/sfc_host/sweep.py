"""Sweeps: per scope, one script pops the due jobs, queues a ``tick`` for each and
writes the scope's heartbeat. A heartbeat older than the outage threshold means no
host swept the scope for that long (all down, or Redis was): then every job of the
index is ticked with the gap, ``sweep_limit`` jobs per sweep, so the core moves all
open deadlines instead of timing everything out at once."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sfc_host.config import HostConfig
from sfc_host.keys import ScopeKeys
from sfc_host.metrics import Metrics
from sfc_host.scripts import Scripts

log = logging.getLogger("sfc_host.sweep")


class Sweeper:
    def __init__(self, scripts: Scripts, config: HostConfig, metrics: Metrics) -> None:
        self.scripts = scripts
        self.config = config
        self.metrics = metrics

    async def sweep(self, scopes: Sequence[ScopeKeys]) -> int:
        """Sweep the scopes in one pipeline; how many ticks were queued."""
        script = self.scripts["sweep"]
        args = (self.config.sweep_limit, self.config.outage_threshold_ms,
                "1" if self.config.trim_acked else "0")
        results = await self.scripts.run(
            [(script, (k.due, k.heartbeat, k.work, k.shifting, k.shift_gap), args)
             for k in scopes])
        queued = 0
        for k, res in zip(scopes, results, strict=True):
            if isinstance(res, Exception):
                raise res
            _, gap, n, left = (int(x) for x in res)
            queued += n
            if gap:
                self.metrics.inc("outages")
                log.warning("scope %s was not swept for %d ms (outage): every job has its "
                            "deadlines moved by the gap (%d now, %d in the next sweeps)",
                            k.scope, gap, n, left, extra={"scope": k.scope})
        if queued:
            self.metrics.inc("ticks_queued", queued)
        return queued
