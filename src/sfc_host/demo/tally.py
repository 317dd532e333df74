"""The demo's jobs and what became of them: the run fills the tally from the MES status
events (and from Redis, for jobs no event ended); the report only reads it.

A module of its own so that the run and the report both depend on it and not on each
other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from sfc_host.store.keys import ScopeKeys


@dataclass
class Job:
    id: str
    recipe: str
    scope: str
    pause_at_s: float = 0.0     # > 0: the MES pauses it this long after the start
    pause_for_s: float = 0.0
    paused: bool = False
    state: str = ""
    reason: str = ""
    ended_at: float = 0.0


@dataclass
class Tally:
    jobs: dict[str, Job] = field(default_factory=dict)
    started_at: float = 0.0
    ended: int = 0
    completed: int = 0
    last_end: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    def end(self, job_id: str, state: str, reason: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.ended_at:
            return
        job.state, job.reason, job.ended_at = state, reason, time.monotonic()
        self.ended += 1
        self.completed += state.startswith("Ended")
        self.last_end = job.ended_at
        self.slots[job.scope].release()
        self.changed.set()

    def on_status(self, data: dict[str, Any]) -> None:
        state = str(data.get("JobState") or "")
        if state.startswith(("Ended", "Aborted")):
            self.end(str(data.get("JobOrderID")), state, str(data.get("Reason") or ""))

    async def reconcile(self, redis_url: str) -> None:
        """End the jobs whose order Redis has as ended, though no status event said so
        (status events are best effort: dropped when a host's queue is nearly full)."""
        open_jobs = [j for j in self.jobs.values() if not j.ended_at]
        if not open_jobs:
            return
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            pipe = client.pipeline(transaction=False)
            for j in open_jobs:
                pipe.hmget(ScopeKeys(j.scope).order(j.id), "state", "reason")
            for j, (state, reason) in zip(open_jobs, await pipe.execute(), strict=True):
                if state and state.startswith(("Ended", "Aborted")):
                    self.end(j.id, state, reason or "")
        finally:
            await client.aclose()
