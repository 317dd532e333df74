"""Host flows on a real redis-server: pull events, MES pause/resume/abort/stop, equipment
hold and restart, timeouts and retries, markers, recovery, batching."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from helpers import hosts
from helpers.aio import run
from helpers.hosts import (
    Station,
    flush,
    one_step,
    quick_config,
    quiet,
    torque_ok,
    wait_until,
    work_master,
)

from sfc_fast.events import Completed, Held
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

S = "cell"
K = ScopeKeys(S)


start_host = partial(hosts.start_host, scope=S, flush_db=True)


async def order_state(host: Host, job: str) -> str | None:
    o = await host.orders.get(S, job)
    return o["state"] if o else None


async def status(host: Host, job: str) -> str | None:
    v = await host.inspect(S, job)
    return v["status"] if v else None


def test_pull_event_goes_to_the_oldest_wait_and_unmatched_are_counted(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, work_master("axle_fit_qa", "axle"))
        try:
            qa = "com.example.station.qa_result.v1"
            assert not await host.queue_event(S, qa)       # nobody waits yet
            assert host.metrics["events_unmatched"] == 1
            for job in ("A", "B"):
                await host.orders.store_order(S, {"JobOrderID": job,
                                                  "WorkMasterID": [{"ID": "axle"}]},
                                              start=True)
                await wait_until(lambda j=job: host.client.zscore(K.waits(qa), j),
                                 what=f"{job} waits")
            assert await host.queue_event(S, qa, data={"ok": True})
            await wait_until(lambda: host.metrics["events_matched"] == 1, what="matched")
            a = (await host.inspect(S, "A"))["actions"]["camera_qa"]
            b = (await host.inspect(S, "B"))["actions"]["camera_qa"]
            assert a["outcome"] == "completed" and a["result"] == {"ok": True}
            assert b["outcome"] is None            # the younger wait still waits
            assert await host.client.zrange(K.waits(qa), 0, -1) == [b"B"]
            # A type nobody waits for, sent as an entry anyway: counted, acked.
            await host.client.xadd(K.work, {"k": "event", "t": "com.example.none.v1"})
            await wait_until(lambda: host.metrics["events_unmatched"] == 2, what="unmatched")
            await wait_until(lambda: quiet(host), what="quiet")
        finally:
            await host.aclose()
    run(main())


def test_abort_and_stop_end_the_recipe_and_later_answers_are_absorbed(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, work_master("tighten_rework", "wm"))
        try:
            for job in ("A", "B"):
                await host.orders.store_order(S, {"JobOrderID": job,
                                                  "WorkMasterID": [{"ID": "wm"}]},
                                              start=True)
            await wait_until(lambda: len(st.commands) == 2, what="commands")
            await wait_until(lambda: order_state(host, "A"), what="order")
            await wait_until(lambda: _top_is(host, "A", "Running"), what="A running")
            await wait_until(lambda: _top_is(host, "B", "Running"), what="B running")
            await host.orders.trigger(S, "A", "Abort", reason="operator abort")
            await host.orders.trigger(S, "B", "Stop")
            await wait_until(lambda: status(host, "A"), what="A")
            await wait_until(lambda: _status_is(host, "A", "aborted"), what="A aborted")
            await wait_until(lambda: _status_is(host, "B", "stopped"), what="B stopped")
            assert (await host.inspect(S, "A"))["reason"] == "operator abort"
            assert await order_state(host, "A") == "Aborted"
            # Late answers change nothing.
            await host.settle_answers([(S, Completed("A:load_part#1"))])
            assert host.metrics["answers_absorbed"] == 1
            assert await host.client.scard(K.active) == 0
            assert await host.client.zcard(K.due) == 0
        finally:
            await host.aclose()
    run(main())


async def _top_is(host: Host, job: str, top: str) -> bool:
    s = await order_state(host, job)
    return bool(s) and s.split("_")[0] == top


async def _status_is(host: Host, job: str, want: str) -> bool:
    return await status(host, job) == want


def test_pause_holds_equipment_and_resume_restarts_held_work(redis_url: str) -> None:
    async def main() -> None:
        def answer(c: Any) -> Any:
            return False if c.action == "paint" else None   # prime completes at once
        st = Station(answer)
        host = await start_host(redis_url, st, work_master("paint_hold_restart", "paint"))
        try:
            await host.orders.store_order(S, {"JobOrderID": "P",
                                              "WorkMasterID": [{"ID": "paint"}]}, start=True)
            await wait_until(lambda: "P:paint#2" in st.ids(), what="paint sent")
            await wait_until(lambda: quiet(host), what="quiet")
            await host.orders.trigger(S, "P", "Pause")
            await wait_until(lambda: "P:paint#2:hold" in st.ids(), what="hold command")
            hold = st.commands[-1]
            assert hold.type_id == "com.example.booth.paint.hold.v1" and hold.hold
            assert await status(host, "P") == "held"
            await host.settle_answers([(S, Held("P:paint#2:hold"))])
            await host.orders.trigger(S, "P", "Resume")
            await wait_until(lambda: len(st.commands) == 4, what="restart")
            restart = st.commands[-1]
            assert restart.restart and restart.type_id == "com.example.booth.paint.restart.v1"
            assert restart.command_id == "P:paint#3"
            assert await status(host, "P") == "running"
            assert st.ids().count("P:paint#2") == 1
        finally:
            await host.aclose()
    run(main())


def test_hold_of_work_that_never_went_out_is_answered_not_held_by_the_host(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        sink = InProcessSink(maxsize=1)
        st = Station()
        st.sink = sink
        host = await start_host(redis_url, st, work_master("paint_hold_restart", "paint"),
                                flush_db=False)
        try:
            await host.orders.store_order(S, {"JobOrderID": "P",
                                              "WorkMasterID": [{"ID": "paint"}]}, start=True)
            prime = await asyncio.wait_for(sink.queue.get(), 5)
            await sink.queue.put(prime)       # the queue is full from now on
            host.answer(S, Completed(prime.command_id))
            await wait_until(lambda: host.metrics["queue_full"] >= 1, what="paint not queued")
            view = await host.inspect(S, "P")
            assert "sent:paint" not in view["markers"]
            sink.queue.get_nowait()           # room again
            await host.orders.trigger(S, "P", "Pause")
            await wait_until(lambda: host.metrics["hold_answered_not_held"] == 1,
                             what="not held by the host")
            assert sink.queue.empty()         # no hold command went to the equipment
            await host.orders.trigger(S, "P", "Resume")
            again = await asyncio.wait_for(sink.queue.get(), 5)
            assert again.command_id == "P:paint#2" and not again.restart
        finally:
            await host.aclose()
    run(main())


def test_pause_resume_pause_from_two_consumers_ends_held(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        h1 = await start_host(redis_url, st, work_master("tighten_rework", "wm"),
                              consumer="h1")
        h2 = await start_host(redis_url, st, flush_db=False, consumer="h2")
        try:
            for i in range(6):
                await h1.orders.store_order(S, {"JobOrderID": f"J{i}",
                                                "WorkMasterID": [{"ID": "wm"}]},
                                            start=True)
            for i in range(6):
                await wait_until(lambda i=i: _top_is(h1, f"J{i}", "Running"), what="run")
            for i in range(6):
                for t in ("Pause", "Resume", "Pause"):
                    await h1.orders.trigger(S, f"J{i}", t)
            await wait_until(lambda: quiet(h1), what="quiet")
            for i in range(6):
                assert await status(h1, f"J{i}") == "held"
                assert await _top_is(h1, f"J{i}", "Interrupted")
        finally:
            await h1.aclose()
            await h2.aclose()
    run(main())


def test_timeout_retries_with_a_new_id_then_aborts(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        ended: list = []
        host = await start_host(redis_url, st, one_step(1, retries=1), ended=ended)
        try:
            await host.orders.store_order(S, {"JobOrderID": "T",
                                              "WorkMasterID": [{"ID": "quick"}]}, start=True)
            await wait_until(lambda: ended, timeout=8, what="abort")
            assert st.ids() == ["T:work#1", "T:work#2"]
            assert ended[0][1] == "aborted" and "timed out" in ended[0][2]
            await wait_until(lambda: _is_state(host, "T", "Aborted"), what="order aborted")
            assert "timed out" in (await host.orders.get(S, "T"))["reason"]
        finally:
            await host.aclose()
    run(main())


async def _is_state(host: Host, job: str, state: str) -> bool:
    return await order_state(host, job) == state


def test_command_that_never_went_out_is_sent_again_with_its_id_at_its_deadline(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        sink = InProcessSink(maxsize=1)
        st = Station()
        st.sink = sink
        host = await start_host(redis_url, st, one_step(1, retries=0), flush_db=False)
        try:
            await sink.queue.put(None)  # type: ignore[arg-type]  # the queue is full
            await host.orders.store_order(S, {"JobOrderID": "U",
                                              "WorkMasterID": [{"ID": "quick"}]}, start=True)
            await wait_until(lambda: host.metrics["queue_full"] >= 1, what="not queued")
            sink.queue.get_nowait()
            cmd = await asyncio.wait_for(sink.queue.get(), 5)   # after the 1 s deadline
            assert cmd.command_id == "U:work#1"
            view = await host.inspect(S, "U")
            assert view["status"] == "running" and view["actions"]["work"]["attempt"] == 1
        finally:
            await host.aclose()
    run(main())


def test_dispatch_entry_delivered_again_is_not_sent_twice(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, work_master("tighten_rework", "wm"))
        try:
            await host.orders.store_order(S, {"JobOrderID": "J",
                                              "WorkMasterID": [{"ID": "wm"}]}, start=True)
            await wait_until(lambda: st.commands, what="sent")
            await wait_until(lambda: quiet(host), what="quiet")
            await host.client.xadd(K.work, {"k": "dispatch:load_part", "j": "J",
                                            "a": "load_part", "c": "J:load_part#1"})
            await host.client.xadd(K.work, {"k": "dispatch:load_part", "j": "J",
                                            "a": "load_part", "c": "J:load_part#7"})
            await wait_until(lambda: quiet(host), what="handled")
            assert st.ids() == ["J:load_part#1"]
            assert host.metrics["dispatch_already_sent"] == 1
            assert host.metrics["dispatch_skipped"] == 1
        finally:
            await host.aclose()
    run(main())


def test_recovery_repairs_indexes_and_resends_nothing_with_a_deadline(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, work_master("axle_fit_qa", "axle"))
        try:
            await host.orders.store_order(S, {"JobOrderID": "R",
                                              "WorkMasterID": [{"ID": "axle"}]}, start=True)
            await wait_until(lambda: st.commands, what="sent")
            await wait_until(lambda: quiet(host), what="quiet")
            due = await host.client.zscore(K.due, "R")
        finally:
            await host.aclose()
        qa = "com.example.station.qa_result.v1"
        c = host.client.__class__.from_url(redis_url)
        await c.delete(K.due, K.waits(qa))
        await c.sadd(K.active, "ghost")
        await c.aclose()
        st2 = Station(lambda c: False)
        host2 = await start_host(redis_url, st2, flush_db=False)
        try:
            assert host2.metrics["jobs_recovered"] == 1
            assert await host2.client.zscore(K.due, "R") == due
            assert await host2.client.zrange(K.waits(qa), 0, -1) == [b"R"]
            assert await host2.client.smembers(K.active) == {b"R"}
            await asyncio.sleep(0.2)
            assert st2.commands == []
        finally:
            await host2.aclose()
    run(main())


def test_a_batch_costs_the_same_round_trips_at_any_size(redis_url: str) -> None:
    async def main() -> None:
        st = Station(torque_ok)
        await flush(redis_url)
        host = Host(quick_config(redis_url), st.sink, loops=False)
        st.attach(host)
        await host.store.put_work_master(S, work_master("tighten_rework", "wm"))
        await host.add_scope(S)
        await host.start()
        try:
            costs = []
            for n in (10, 100):
                while await host.consume_once(block_ms=0):
                    pass   # drain what the previous batch queued
                for i in range(n):
                    await host.orders.store_order(S, {"JobOrderID": f"N{n}-{i}",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
                before = await _calls(host)
                got = await host.consume_once(block_ms=0)
                after = await _calls(host)
                assert got == n
                costs.append({k: after.get(k, 0) - before.get(k, 0) for k in after})
            small, big = costs
            # Scripts, reads of orders and Work Masters, acks: per batch, not per entry
            # (the orders and Work Masters are read in one pipeline, one command each).
            for cmd in ("evalsha", "xreadgroup", "xack", "xdel"):
                assert small.get(cmd, 0) == big.get(cmd, 0), (cmd, small, big)
        finally:
            await host.aclose()
    run(main())


async def _calls(host: Host) -> dict[str, int]:
    info = await host.client.info("commandstats")
    return {k[len("cmdstat_"):]: v["calls"] for k, v in info.items()}
