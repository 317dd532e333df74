"""A start's reads: the Work Master of an order this host stored is read in the same
round trip as the order; a hint the order contradicts is read again, never used."""

from __future__ import annotations

import copy
from typing import Any

from helpers.aio import run
from helpers.hosts import Station, flush, one_step, quick_config, quiet, wait_until

from sfc_host.execution.host import Host

S = "cell"



def two_steps(wm_id: str) -> dict[str, Any]:
    wm = copy.deepcopy(one_step())
    wm["ID"] = wm_id
    wm["data"]["Steps"] = [{"Name": "Work", "Initial": True}, {"Name": "More"}]
    wm["data"]["Transitions"] = [{"Source": "Work", "Target": "More", "Condition": "always"}]
    wm["data"]["Actions"].append({**wm["data"]["Actions"][0], "Name": "more", "Step": "More"})
    return wm


async def started_host(redis_url: str, st: Station, reads: list[list[tuple[str, str]]]
                       ) -> Host:
    await flush(redis_url)
    host = Host(quick_config(redis_url), st.sink)
    st.attach(host)
    await host.store.put_work_master(S, one_step())            # ID "quick"
    await host.store.put_work_master(S, two_steps("twice"))
    await host.add_scope(S)
    read = host.store.work_masters_many

    async def counted(pairs: Any) -> Any:
        if pairs:
            reads.append(list(pairs))
        return await read(pairs)
    host.store.work_masters_many = counted  # type: ignore[method-assign]
    await host.start()
    return host


def test_a_start_reads_the_stored_work_master_with_its_order(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: {"ok": True})
        reads: list[list[tuple[str, str]]] = []
        host = await started_host(redis_url, st, reads)
        try:
            await host.orders.store_order(S, {"JobOrderID": "j1",
                                              "WorkMasterID": [{"ID": "twice"}]}, start=True)
            await wait_until(lambda: len(st.commands) == 2, what="both commands")
            await wait_until(lambda: quiet(host), what="quiet")
            # one read of the Work Master, the hinted one: none after the order's read
            assert reads == [[(S, "twice")]]
            assert [c.action for c in st.commands] == ["work", "more"]
        finally:
            await host.aclose()
    run(main())


def test_a_hint_the_order_contradicts_is_read_again(redis_url: str) -> None:
    async def main() -> None:
        st = Station(lambda c: {"ok": True})
        reads: list[list[tuple[str, str]]] = []
        host = await started_host(redis_url, st, reads)
        try:
            # the hint names another Work Master than the order stored: the order wins
            store = host.orders.store_order

            async def misleading(scope: str, order: Any, **kw: Any) -> str:
                new = await store(scope, order, **kw)
                host.orders._stored_wm[(scope, order["JobOrderID"])] = "quick"
                return new
            host.orders.store_order = misleading  # type: ignore[method-assign]
            await host.orders.store_order(S, {"JobOrderID": "j2",
                                              "WorkMasterID": [{"ID": "twice"}]}, start=True)
            await wait_until(lambda: len(st.commands) == 2, what="both commands")
            await wait_until(lambda: quiet(host), what="quiet")
            assert reads == [[(S, "quick")], [(S, "twice")]]
            assert [c.action for c in st.commands] == ["work", "more"]
        finally:
            await host.aclose()
    run(main())
