"""Recovery at host start: list the running jobs of each scope, repair the due, active
and waits indexes from their states, and give each a ``Resume`` (the core re-issues
a restart for held work whose hold is closed and dispatches again only what has no
deadline). A job that cannot be evaluated is logged, not dead-lettered."""

from __future__ import annotations

import logging

from sfc_fast import evolve_live, job_index
from sfc_fast.events import Resume
from sfc_host.execution.settle import LIVE, Settler
from sfc_host.metrics import Metrics
from sfc_host.store.states import Record, Store

log = logging.getLogger("sfc_host.execution.recovery")

CHUNK = 256


async def recover_scope(store: Store, settler: Settler, metrics: Metrics, scope: str) -> int:
    """Recover one scope; how many jobs were looked at."""
    k = store.keys(scope)
    seen = 0
    cursor = 0
    while True:
        cursor, members = await store.client.sscan(k.active, cursor, count=CHUNK)
        jobs = [m.decode() for m in members]
        if jobs:
            seen += len(jobs)
            await _recover(store, settler, metrics, scope, jobs)
        if cursor == 0:
            return seen


async def _recover(store: Store, settler: Settler, metrics: Metrics, scope: str,
                   jobs: list[str]) -> None:
    now, rows = (await store.load({scope: jobs}))[scope]
    records: list[Record] = []
    for job in jobs:
        row = rows[job]
        if row.state is None or row.fingerprint is None:
            records.append(Record(job, row.version, None, None, False))  # stale member
            continue
        graph = await store.graph(scope, row.fingerprint)
        if graph is None:
            metrics.inc("recovery_errors")
            log.error("recovery: job %s/%s: recipe %s is not stored", scope, job,
                      row.fingerprint, extra={"scope": scope, "job": job})
            continue
        try:
            status, deadline, waits = job_index(graph, row.live)
            if status not in LIVE:
                records.append(Record(job, row.version, None, None, False,
                                      waits=[("-", t, 0) for t in waits]))
                continue
            d = evolve_live(graph, row.live, Resume(), now)
        except ValueError as e:
            metrics.inc("recovery_errors")
            log.error("recovery: job %s/%s cannot be evaluated: %s", scope, job, e,
                      extra={"scope": scope, "job": job})
            continue
        if d.applied:
            rec = settler._record(scope, now, row, graph, [d], False, None,
                                  row.unsaved + d.archived)
            have = {t for sign, t, _ in rec.waits if sign == "-"}
            rec.waits = [("+", t, now) for t in waits if t not in have] + rec.waits
        else:
            rec = Record(job, row.version, None, deadline, True,
                         waits=[("+", t, now) for t in waits], offset=row.offset)
        records.append(rec)
        metrics.inc("jobs_recovered")
    if records:
        # A lost race means another host moved the job meanwhile: it is being run.
        await store.commit({scope: records})
