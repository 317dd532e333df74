"""H-13: a recipe whose action types no equipment of the scope serves is a build
error (SFC025) at the Work Master PUT, once the scope's equipment announced what it
serves. Real redis-server and mosquitto for the end-to-end part."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import aiomqtt
import pytest
from helpers.aio import run
from helpers.hosts import wait_until, work_master
from helpers.mes import WM, Mes, order, start_app

from sfc_fast import Graph, compile_recipe
from sfc_host.equipment.capabilities import CODE, Capabilities, parse, unserved
from sfc_host.store.orders import INVALID_REQUEST, NO_ERROR

S = "line1"


def graph(name: str) -> Graph:
    wm = work_master(name)
    return compile_recipe(wm["data"], wm["dataschema"])


def test_unserved_names_every_missing_type_with_its_path() -> None:
    g = graph("paint_hold_restart")
    types = {g.action_info(i)["type_id"] for i in range(len(g.actions))}
    assert unserved(g, types | {g.action_info(i)[f] for i in range(len(g.actions))
                                for f in ("hold_type_id", "restart_type_id")
                                if g.action_info(i)[f]}) == []
    problems = unserved(g, set())
    assert problems and all(p.code == CODE for p in problems)
    assert any(p.path.endswith(".HoldTypeId") for p in problems)
    assert all(p.path.startswith("Actions[") for p in problems)


def test_parse_refuses_what_is_not_a_type_list() -> None:
    assert parse(b"") is None
    assert parse(b'{"TypeIds": ["b", "a", "a"]}') == ["a", "b"]
    for bad in (b"nope", b"[]", b'{"TypeIds": "a"}', b'{"TypeIds": [1]}',
                b'{"TypeIds": [""]}'):
        with pytest.raises(ValueError):
            parse(bad)


def types_of(name: str) -> list[str]:
    g = graph(name)
    return sorted({g.action_info(i)["type_id"] for i in range(len(g.actions))})


async def announce(url: str, equipment: str, payload: bytes) -> None:
    u = urlparse(url)
    async with aiomqtt.Client(u.hostname or "127.0.0.1", u.port or 1883) as c:
        await c.publish(f"equipment/{S}/capabilities/{equipment}", payload, qos=1,
                        retain=True)


def test_work_master_put_checks_the_announced_capabilities(redis_url: str,
                                                          mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        caps = app.mes.capabilities
        tighten = types_of("tighten_rework")
        try:
            async with Mes(mqtt_url) as mes:
                # nothing announced: any type is accepted
                assert (await mes.call(WM, work_master("tighten_rework", "w1")))[
                    "data"]["ReturnStatus"] == NO_ERROR
                await announce(mqtt_url, "press-1", json.dumps({"TypeIds": tighten[:1]})
                               .encode())
                await announce(mqtt_url, "nutrunner", b"not json")
                await wait_until(lambda: caps.served(S), 5, "announcement stored")
                await wait_until(lambda: app.metrics["bad_capabilities"] >= 1, 5, "bad")
                rep = await mes.call(WM, work_master("tighten_rework", "w2"))
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST
                assert f"{CODE} Actions[" in rep["data"]["Message"]
                assert tighten[-1] in rep["data"]["Message"]
                # a second station serves the rest: accepted, and jobs run from it
                await announce(mqtt_url, "nutrunner", json.dumps({"TypeIds": tighten[1:]})
                               .encode())
                await wait_until(lambda: _has(caps, tighten[-1]), 5, "second stored")
                rep = await mes.call(WM, work_master("tighten_rework", "w2"))
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert await mes.status("Store", order("J1", "w2")) == NO_ERROR
                # withdrawn (empty retained): the scope accepts any type again
                for eq in ("press-1", "nutrunner"):
                    await announce(mqtt_url, eq, b"")
                await wait_until(lambda: _none(caps), 5, "withdrawn")
                rep = await mes.call(WM, work_master("paint_hold_restart", "w3"))
                assert rep["data"]["ReturnStatus"] == NO_ERROR
        finally:
            await app.aclose()
    run(main())


async def _has(caps: Capabilities, t: str) -> bool:
    return t in (await caps.served(S) or set())


async def _none(caps: Capabilities) -> bool:
    return await caps.served(S) is None


def test_bad_topics_are_counted(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            u = urlparse(mqtt_url)
            async with aiomqtt.Client(u.hostname or "127.0.0.1", u.port or 1883) as c:
                await c.publish("equipment/bad scope/capabilities/x", b'{"TypeIds":["a"]}',
                                qos=1)
            await wait_until(lambda: app.metrics["bad_capabilities"] >= 1, 5, "counted")
            assert await app.mes.capabilities.served(S) is None
        finally:
            await app.aclose()
        await asyncio.sleep(0)
    run(main())


def test_a_starting_host_asks_the_equipment_to_announce_again(redis_url: str,
                                                              mqtt_url: str) -> None:
    """Some brokers hand retained messages only to a subscription of the exact topic,
    so a host subscribing with a wildcard would miss an announcement made before it
    started: the host asks each scope's equipment, and a station that answers the ask
    (as the example station does) is announced whatever its broker keeps."""
    u = urlparse(mqtt_url)

    async def main() -> None:
        asks: list[bytes] = []
        async with aiomqtt.Client(u.hostname or "127.0.0.1", u.port or 1883,
                                  identifier="cap-station") as c:
            await c.subscribe(f"equipment/{S}/capabilities", qos=1)

            async def station() -> None:
                async for msg in c.messages:
                    asks.append(bytes(msg.payload))      # type: ignore[arg-type]
                    await c.publish(f"equipment/{S}/capabilities/press-1",
                                    json.dumps({"TypeIds": ["com.example.x.v1"]}), qos=1)
            t = asyncio.create_task(station())
            app = await start_app(redis_url, mqtt_url, scopes=[S])
            try:
                await wait_until(lambda: asks, 5, "the host's ask")
                assert json.loads(asks[0]) == {"Announce": True}
                await wait_until(lambda: _has(app.mes.capabilities, "com.example.x.v1"), 5,
                                 "the announcement stored")
            finally:
                await app.aclose()
                t.cancel()
    run(main())
