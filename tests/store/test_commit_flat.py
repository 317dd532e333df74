"""The settler's flat commit (so a completion costs no more with many scopes): the
replies of a batch over several scopes come flat, and what the compare-and-set delivered
is told apart by scope, since entry ids are per stream and two scopes may deliver the
same id. And what that call delivers when older entries stand ahead of its own (a
command sent from its decision saves the host a stream read and a job read)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers.hosts import V110, Station, flush, quick_config

from sfc_fast.events import Completed
from sfc_host.execution.host import Host
from sfc_host.store.keys import ScopeKeys

A, B = "cell-a", "cell-b"


def two_steps() -> dict[str, Any]:
    push = {"Qualifier": "N", "Interaction": "push_command", "TimeoutSeconds": 60}
    return {"ID": "two", "dataschema": V110, "data": {
        "Steps": [{"Name": "One", "Initial": True}, {"Name": "Two"}],
        "Transitions": [{"Source": "One", "Target": "Two", "Condition": "always"}],
        "Actions": [{"Name": "first", "Step": "One", "TypeId": "com.example.first.v1", **push},
                    {"Name": "second", "Step": "Two", "TypeId": "com.example.second.v1",
                     **push}]}}


def test_a_foreign_entry_with_the_id_of_another_scopes_command_is_not_lost(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)        # records the commands, never answers
        host = Host(quick_config(redis_url), st.sink, loops=False)
        st.attach(host)
        for s in (A, B):
            await host.store.put_work_master(s, two_steps())
            await host.add_scope(s)
        await host.start()
        try:
            for s, job in ((A, "J"), (B, "K")):
                await host.orders.store_order(s, {"JobOrderID": job,
                                                  "WorkMasterID": [{"ID": "two"}]},
                                              start=True)
            while await host.consume_once(block_ms=0):
                pass
            assert sorted(st.ids()) == ["J:first#1", "K:first#1"]
            await host.dispatcher.drain()
            # Both streams end at the same id F-0; scope A then holds an entry no one
            # has read, F-1. The next dispatch entries are F-2 in A and F-1 in B: the
            # call delivers F-1 twice, once per scope.
            f = int(time.time() * 1000) + 10_000_000
            for s in (A, B):
                work = ScopeKeys(s).work
                await host.client.xadd(work, {"k": "x"}, id=f"{f}-0")
                await host.client.xdel(work, f"{f}-0")
            await host.client.xadd(ScopeKeys(A).work, {"k": "tick", "j": "J", "a": "",
                                                       "c": ""}, id=f"{f}-1")
            delivered: list[tuple[str, list[bytes]]] = []
            handler = host.settler.on_delivered

            def keep(scope: str, entries: list[Any]) -> None:
                delivered.append((scope, [eid for eid, _ in entries]))
                if handler is not None:
                    handler(scope, entries)
            host.settler.on_delivered = keep
            cmds = {c.scope: c for c in st.commands}
            await host.settle_answers([(A, Completed(cmds[A].command_id, {})),
                                       (B, Completed(cmds[B].command_id, {}))])
            # both commands went out, each from its own scope's entry
            assert sorted((c.job, c.action) for c in st.commands) == [
                ("J", "first"), ("J", "second"), ("K", "first"), ("K", "second")]
            # the foreign entry of A reached the host's own queue, not taken for B's
            assert delivered == [(A, [f"{f}-1".encode()])]
            pending = await host.client.xpending_range(ScopeKeys(B).work, host.config.group,
                                                       "-", "+", 10)
            assert [p["message_id"] for p in pending] in ([], [f"{f}-1".encode()])
        finally:
            await host.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("ahead", [0, 5])
def test_a_command_is_sent_from_its_decision_behind_a_backlog_of_older_entries(
        redis_url: str, ahead: int) -> None:
    """Under load, other writers' entries (an MES burst's starts) stand undelivered
    ahead of what a compare-and-set appends, and a stream read hands out the oldest
    first. The call's read reaches past its own entries by ``read_count``: with up to
    that many older entries ahead, it delivers them and its own, and the command goes
    out from the decision that made it (no stream read, no second job read). With more
    ahead, it delivers the oldest and the command goes out once its entry is read:
    nothing is skipped either way."""
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)        # records the commands, never answers
        host = Host(quick_config(redis_url), st.sink, loops=False)
        st.attach(host)
        await host.store.put_work_master(A, two_steps())
        await host.add_scope(A)
        await host.start()
        try:
            await host.orders.store_order(A, {"JobOrderID": "J",
                                              "WorkMasterID": [{"ID": "two"}]}, start=True)
            while await host.consume_once(block_ms=0):
                pass
            assert st.ids() == ["J:first#1"]
            await host.dispatcher.drain()
            n = host.config.read_count
            work = ScopeKeys(A).work
            backlog = [await host.client.xadd(work, {"k": "tick", "j": "other", "a": "",
                                                     "c": ""}) for _ in range(n + ahead)]
            delivered: list[bytes] = []
            handler = host.settler.on_delivered
            host.settler.on_delivered = lambda s, entries: delivered.extend(
                eid for eid, _ in entries)      # kept, not handled
            await host.settle_answers([(A, Completed(st.commands[0].command_id, {}))])
            if ahead <= 0:
                # sent at once, from the decision, and every older entry came along
                assert st.ids() == ["J:first#1", "J:second#2"]
                assert delivered == backlog
            else:
                # the oldest came, in order; the command waits for its entry's read
                assert st.ids() == ["J:first#1"]
                assert n <= len(delivered) < len(backlog)
                assert delivered == backlog[:len(delivered)]
                host.settler.on_delivered = handler
                while await host.consume_once(block_ms=0):
                    pass
                assert st.ids() == ["J:first#1", "J:second#2"]
        finally:
            await host.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))
