"""The answer-to-command latency map (job -> when its last answer arrived) drops a job's
entry when the job ends. Dropped only when the job's next command goes out, an entry
would stay for every ended job (a job's last answer has no next command) until 100,000
of them (~15 MB) made the oldest go: ``benchmarks/soak.py`` found the host's RSS growing
by about 1.5 MB a minute at 140 jobs/s that way.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from helpers.hosts import Station, flush, quick_config, torque_ok, wait_until, work_master

from sfc_host.config import HostConfig
from sfc_host.equipment.mqtt_transport import EquipmentIn, MqttSink
from sfc_host.execution.host import Host
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink

SCOPE = "line1"


def test_a_jobs_arrival_entry_goes_when_it_ends(redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        ended: list[str] = []
        station = Station(torque_ok)
        host = station.attach(Host(quick_config(redis_url, scopes=[SCOPE]), station.sink,
                                   on_end=lambda s, j, d: ended.append(j)))
        # the MQTT side's bookkeeping on this host (no connection needed)
        link = MqttLink(HostConfig(consumer="t"), Metrics())
        eq = EquipmentIn(host, link, MqttSink(link))
        try:
            await host.store.put_work_master(SCOPE, work_master("tighten_rework", "wm1"))
            await host.start()
            eq.arrived["J1"] = 1.0              # as on_answer records the last answer
            eq.arrived["other"] = 2.0
            await host.orders.store_order(SCOPE, {"JobOrderID": "J1",
                                                  "WorkMasterID": [{"ID": "wm1"}]},
                                          start=True)
            await wait_until(lambda: ended == ["J1"], 10, "J1 to end")
            assert "J1" not in eq.arrived        # gone with the job
            assert eq.arrived == {"other": 2.0}
        finally:
            await host.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_end_hook_before_it_still_runs() -> None:
    calls: list[Any] = []
    host = Host(HostConfig(), loops=False, on_end=lambda *a: calls.append(a))
    link = MqttLink(HostConfig(consumer="t"), Metrics())
    eq = EquipmentIn(host, link, MqttSink(link))
    eq.arrived["J9"] = 1.0
    assert host.settler.on_end is not None
    done = SimpleNamespace(status="completed", reason=None)   # the Decision's fields read
    host.settler.on_end(SCOPE, "J9", done)
    assert calls == [(SCOPE, "J9", done)] and "J9" not in eq.arrived

    async def close() -> None:
        await host.aclose()
    asyncio.run(close())
