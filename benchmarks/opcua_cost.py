"""What the OPC UA face costs a host: a scope's JobOrderList and JobOrderResponseList
rewritten with many orders, and one status event, without and with a subscriber.

    python benchmarks/opcua_cost.py                  # 10,000 orders
    python benchmarks/opcua_cost.py --orders 1000 --events 200

A host (``App``, ``opcua = true``, security None on loopback) on a local redis-server
and mosquitto started here; ``--orders`` orders stored in one scope through the host's
job control; then, timed: building both lists from Redis, writing them with no
subscriber and with one (an asyncua client in this process subscribed to both), and
``--events`` status events raised, again without and with a subscriber. The face waits
ten times a rewrite's time before the next one: the figures say how often a scope's
lists can follow its orders.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from asyncua import Client, ua
from helpers.hosts import work_master
from helpers.servers import MosquittoServer, RedisServer

from sfc_fast.wire.uabinary import EXTENSION_OBJECT, Variant
from sfc_host.config import HostConfig
from sfc_host.opcua.lists import COST_FACTOR
from sfc_host.service.app import App

SCOPE = "line1"
PORT = 48431


async def fill(app: App, n: int) -> None:
    for i in range(0, n, 500):
        await asyncio.gather(*(app.mes.job_control(SCOPE, "Store", {"JobOrder": {
            "JobOrderID": f"J{j:06d}", "WorkMasterID": [{"ID": "wm"}], "Priority": 1,
            "JobOrderParameters": [{"ID": "qty", "Value": j % 50}]}})
            for j in range(i, min(n, i + 500))))


async def lists(app: App) -> tuple[float, float, int]:
    """Seconds to build the two lists, to write them; the orders listed."""
    face = app.opcua
    lists = face.lists.scopes[SCOPE]
    t0 = time.perf_counter()
    listed = await face.lists.read_all(SCOPE)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    entries = [listed[j] for j in sorted(listed)]
    orders = [e[0] for e in entries]
    for node, value in ((lists.order_list, orders),
                        (lists.response_list, [e[1] for e in entries])):
        face.server.space.set_value(node, Variant(EXTENSION_OBJECT, value))
    return built, time.perf_counter() - t0, len(orders)


async def events(app: App, n: int) -> float:
    """The CPU seconds a status event costs, on average over ``n`` raised in batches
    as the face raises them (each batch's responses read in one round trip; its
    structures encoded once, whatever the subscribers)."""
    face = app.opcua
    order = b'{"JobOrderID":"J000001","WorkMasterID":[{"ID":"wm"}]}'
    changes = [(SCOPE, f"J{i % 1000:06d}", ("Running", order)) for i in range(n)]
    t0 = time.process_time()
    for i in range(0, n, 256):
        await face._raise_batch(changes[i:i + 256])
    return (time.process_time() - t0) / n


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis, broker = RedisServer(Path(tmp) / "r"), MosquittoServer(Path(tmp) / "m")
        redis.start()
        broker.start()
        try:
            cfg = HostConfig(redis_url=redis.url, mqtt_url=broker.url, consumer="bench",
                             opcua=True, opcua_security=["None"],
                             opcua_endpoint=f"opc.tcp://127.0.0.1:{PORT}/sfc-host/",
                             opcua_list_interval_ms=3_600_000,
                             max_job_orders=args.orders + 10)
            app = App(cfg)
            await app.host.store.put_work_master(SCOPE, work_master("tighten_rework", "wm"))
            await app.host.add_scope(SCOPE)
            await app.start()
            try:
                await run(app, args)
            finally:
                await app.aclose()
        finally:
            broker.stop()
            redis.stop()


async def run(app: App, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    await fill(app, args.orders)
    print(f"OPC UA face's cost, Python {sys.version.split()[0]}; {args.orders:,} orders "
          f"stored in {time.perf_counter() - t0:.1f} s")
    rows: dict[str, list[Any]] = {}
    for _ in range(args.rounds):
        built, written, listed = await lists(app)
        rows.setdefault("none", []).append((built, written))
    rows["events none"] = [await events(app, args.events)]
    client = Client(f"opc.tcp://127.0.0.1:{PORT}/sfc-host/", timeout=60)
    async with client:
        own = await client.get_namespace_index("urn:sfc-fast:opcua")
        jc = await client.get_namespace_index("http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/")
        sub = await client.create_subscription(100, _Quiet())
        receiver = client.get_node(ua.NodeId(f"{SCOPE}.JobOrderControl", own))
        provider = client.get_node(ua.NodeId(f"{SCOPE}.JobOrderResults", own))
        await sub.subscribe_data_change([await receiver.get_child(f"{jc}:JobOrderList"),
                                         await provider.get_child(f"{jc}:JobOrderResponseList")])
        await sub.subscribe_events(provider, client.get_node(
            ua.NodeId("SfcJobOrderStatusEventType", own)))
        for _ in range(args.rounds):
            built, written, listed = await lists(app)
            rows.setdefault("one", []).append((built, written))
        rows["events one"] = [await events(app, args.events)]
    med = statistics.median
    for who in ("none", "one"):
        b = med(r[0] for r in rows[who])
        w = med(r[1] for r in rows[who])
        print(f"lists of {listed:,} orders, {who} subscribed: built in {b * 1000:,.0f} ms, "
              f"written in {w * 1000:,.0f} ms; rewritten at most every "
              f"{COST_FACTOR * (b + w):,.1f} s")
    print(f"a status event: {rows['events none'][0] * 1e6:,.0f} µs with no subscriber, "
          f"{rows['events one'][0] * 1e6:,.0f} µs with one")


class _Quiet:
    def datachange_notification(self, *args: Any) -> None:
        pass

    def event_notification(self, *args: Any) -> None:
        pass


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--orders", type=int, default=10_000)
    p.add_argument("--events", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(p.parse_args()))
