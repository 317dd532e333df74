"""Notes of the SFC host seed that no other test shows through the host, on a real
redis-server (docs/PARITY.md): a held job keeps its waits, an event for a wait begun
before the hold is recorded while the step stays active, a hold's time is the server
clock when the host applies it (not its entry's), and a start entry that waited past
its first timeout still sends the command with a whole timeout."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from helpers import hosts
from helpers.aio import run
from helpers.hosts import Station, flush, quick_config, quiet, wait_until
from helpers.recipes import QA, event_then_work

from sfc_fast import SCHEMA_V100
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

S = "held"
K = ScopeKeys(S)


def one_step(timeout_s: int) -> dict[str, Any]:
    return {"ID": "quick", "dataschema": SCHEMA_V100, "data": {
        "Steps": [{"Name": "Work", "Initial": True}], "Transitions": [],
        "Actions": [{"Name": "work", "Step": "Work", "Qualifier": "N",
                     "Interaction": "push_command", "TypeId": "com.example.work.v1",
                     "TimeoutSeconds": timeout_s}]}}


async def server_ms(host: Host) -> int:
    secs, micros = await host.client.time()
    return int(secs) * 1000 + int(micros) // 1000


start_host = partial(hosts.start_host, scope=S)


async def view(host: Host, job: str) -> dict[str, Any]:
    v = await host.inspect(S, job)
    assert v is not None
    return v


def test_an_event_for_a_wait_begun_before_the_hold_is_recorded_and_routed_on_release(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, event_then_work())
        try:
            await host.orders.store_order(S, {"JobOrderID": "J",
                                              "WorkMasterID": [{"ID": "evwork"}]}, start=True)
            await wait_until(lambda: host.client.zscore(K.waits(QA), "J"), what="J waits")
            await wait_until(lambda: quiet(host), what="quiet")
            await host.orders.trigger(S, "J", "Pause")
            await wait_until(lambda: quiet(host), what="hold applied")
            assert (await view(host, "J"))["status"] == "held"
            # the hold removed no wait: the event is queued, not dropped as unmatched
            assert await host.client.zscore(K.waits(QA), "J") is not None
            assert await host.queue_event(S, QA, data={"lot": 7})
            await wait_until(lambda: host.metrics["events_matched"] == 1, what="matched")
            v = await view(host, "J")
            assert v["actions"]["qa"]["outcome"] == "completed"
            assert v["actions"]["qa"]["result"] == {"lot": 7}
            # recorded, but the step stays active and nothing goes out until the release
            assert v["status"] == "held" and v["active_steps"] == ["Wait"]
            assert st.commands == []
            await host.orders.trigger(S, "J", "Resume")
            await wait_until(lambda: [c.action for c in st.commands] == ["work"],
                             what="the next step's command")
            v = await view(host, "J")
            assert v["status"] == "running" and v["active_steps"] == ["Work"]
            assert host.metrics["events_unmatched"] == 0
        finally:
            await host.aclose()
    run(main())


def test_a_hold_takes_the_server_time_when_applied_not_its_entry_time(
        redis_url: str) -> None:
    """The Pause is written while no host runs and applied 1.5 s later: the hold begins
    then, so the release moves the open deadline by the time the job was really held."""
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)
        # no outage in a 1.5 s gap: the outage rule would move the deadline too
        host = await start_host(redis_url, st, event_then_work(), outage_threshold_ms=10_000)
        try:
            await host.orders.store_order(S, {"JobOrderID": "J",
                                              "WorkMasterID": [{"ID": "evwork"}]}, start=True)
            await wait_until(lambda: host.client.zscore(K.waits(QA), "J"), what="J waits")
            assert await host.queue_event(S, QA)
            await wait_until(lambda: [c.action for c in st.commands] == ["work"], what="work")
            await wait_until(lambda: quiet(host), what="quiet")
            before = (await view(host, "J"))["actions"]["work"]["deadline_ms"]
        finally:
            await host.aclose()

        writer = Host(quick_config(redis_url), loops=False)   # an MES request, no host
        try:
            await writer.scripts.load()
            paused_at = await server_ms(writer)
            await writer.orders.trigger(S, "J", "Pause")
        finally:
            await writer.aclose()
        await asyncio.sleep(1.5)

        host = await start_host(redis_url, st, event_then_work(), outage_threshold_ms=10_000)
        try:
            await wait_until(lambda: quiet(host), what="hold applied")
            v = await view(host, "J")
            assert v["status"] == "held"
            assert v["held_ms"] >= paused_at + 1400, (v["held_ms"], paused_at)
            await asyncio.sleep(0.3)
            await host.orders.trigger(S, "J", "Resume")
            await wait_until(lambda: quiet(host), what="release applied")
            v = await view(host, "J")
            assert v["status"] == "running" and v["held_ms"] is None
            moved = v["actions"]["work"]["deadline_ms"] - before
            # by the 0.3 s the host held it; the entries' times would give 1.8 s
            assert 250 <= moved < 1200, moved
            assert [c.action for c in st.commands] == ["work"]   # not sent again
        finally:
            await host.aclose()
    run(main())


def test_a_start_entry_that_waited_past_its_first_timeout_still_sends_the_command(
        redis_url: str) -> None:
    """The order is stored and started while no host runs and waits in the stream longer
    than its action's 1 s timeout: the start reads the server clock, so the command goes
    out with a whole timeout instead of the attempt expiring unsent."""
    async def main() -> None:
        await flush(redis_url)
        writer = Host(quick_config(redis_url), loops=False)   # the MES, no host running
        try:
            await writer.scripts.load()
            await writer.store.put_work_master(S, one_step(timeout_s=1))
            await writer.add_scope(S)
            await writer.orders.store_order(S, {"JobOrderID": "J",
                                                "WorkMasterID": [{"ID": "quick"}]},
                                            start=True)
        finally:
            await writer.aclose()
        await asyncio.sleep(1.5)
        st = Station(lambda c: False)
        host = Host(quick_config(redis_url, outage_threshold_ms=10_000), st.sink)
        st.attach(host)
        await host.start()
        try:
            await wait_until(lambda: st.commands, what="the command")
            sent_at = await server_ms(host)
            assert [c.command_id for c in st.commands] == ["J:work#1"]
            v = await view(host, "J")
            assert v["status"] == "running"
            assert v["actions"]["work"]["deadline_ms"] >= sent_at + 800
        finally:
            await host.aclose()
    run(main())
