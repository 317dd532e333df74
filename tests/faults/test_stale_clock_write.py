"""A host frozen between reading a job (and the server clock) and writing its decision
must not write deadlines from before an outage: the compare-and-set refuses a decision
made on a server time older than the outage threshold, and the job is read (with a
fresh clock) and evolved again.

The ``SIGSTOP of every host`` fault run shows why: both hosts stopped for 3 s with 2 s
action timeouts; one was stopped after ``load.lua`` read a starting job and the server
time, before ``cas.lua`` wrote it. On SIGCONT the other host's sweep saw the old
heartbeat and moved every deadline of the due index by the gap, but the frozen host's
job was not on the index yet: its write came after, with a deadline computed from the
clock read before the outage, so the next sweep would time ``load_part`` out at once
and abort the job.
"""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.hosts import Station, flush, quick_config, work_master

from sfc_host.execution.host import Host

SCOPE = "line1"
OUTAGE_MS = 1000


def test_a_decision_on_a_clock_from_before_an_outage_is_made_again(redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        station = Station(lambda c: False)       # records commands, never answers
        a = Host(quick_config(redis_url, consumer="a", scopes=[SCOPE],
                              outage_threshold_ms=OUTAGE_MS), station.sink, loops=False)
        b = Host(quick_config(redis_url, consumer="b", scopes=[SCOPE],
                              outage_threshold_ms=OUTAGE_MS), loops=False)
        try:
            wm = work_master("tighten_rework", "wm1")
            for act in wm["data"]["Actions"]:
                act["TimeoutSeconds"] = 1
            await a.store.put_work_master(SCOPE, wm)
            await a.start()
            await b.start()
            await b.sweep_once()                            # the heartbeat: now
            real_commit = a.store.commit_flat      # what the settler writes with
            frozen = {"done": False}

            async def frozen_commit(*args: Any, **kw: Any) -> Any:
                # ``a`` freezes after reading the job and the clock: while it is stopped
                # no host sweeps, then ``b`` finds the old heartbeat (an outage), and
                # only then ``a`` writes what it decided.
                if not frozen["done"]:
                    frozen["done"] = True
                    await asyncio.sleep(1.3)
                    assert await b.sweep_once() == 0        # the job is not on the index
                    assert b.metrics["outages"] == 1
                    await asyncio.sleep(0.4)    # the next sweep is no outage
                return await real_commit(*args, **kw)

            a.store.commit_flat = frozen_commit  # type: ignore[method-assign]
            await a.orders.store_order(SCOPE, {"JobOrderID": "J1", "WorkMasterID": [{"ID": "wm1"}]},
                                       start=True)
            while await a.consume_once(block_ms=50):
                pass
            assert frozen["done"]
            # The deadline of load_part is a full timeout after the write, not after
            # the read: the sweeps right after it find nothing due.
            for _ in range(3):
                await b.sweep_once()
                assert b.metrics["outages"] == 1
                while await a.consume_once(block_ms=50):
                    pass
                await asyncio.sleep(0.1)
            view = await a.inspect(SCOPE, "J1")
            assert view is not None
            assert view["status"] == "running", view
            assert view["actions"]["load_part"]["phase"] == "open", view["actions"]
            assert station.ids() == ["J1:load_part#1"]
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
