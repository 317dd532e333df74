"""The test harness itself: the fixtures give real servers that answer their protocols."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest
import redis.asyncio as aioredis
from servers import RedisServer, ServerMissing


def test_redis_fixture_is_a_real_redis_server(redis_url: str) -> None:
    async def main() -> None:
        async with aioredis.Redis.from_url(redis_url) as r:
            assert await r.ping()
            await r.set("harness:probe", "1")
            assert await r.get("harness:probe") == b"1"
            info = await r.info("server")
            assert int(str(info["redis_version"]).split(".")[0]) >= 6
            await r.delete("harness:probe")

    asyncio.run(main())


def test_mosquitto_fixture_routes_a_message(mosquitto_server) -> None:
    async def main() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto_server.port,
                                  identifier="harness-test") as c:
            await c.subscribe("harness/probe", qos=1)
            await c.publish("harness/probe", b"hello", qos=1)
            async with asyncio.timeout(5):
                async for msg in c.messages:
                    assert msg.payload == b"hello"
                    break

    asyncio.run(main())


def test_private_redis_keeps_data_across_restart_with_aof(make_redis) -> None:
    server = make_redis(aof=True)

    async def write() -> None:
        async with aioredis.Redis.from_url(server.url) as r:
            await r.set("k", "v")
            await r.execute_command("BGREWRITEAOF")
            await asyncio.sleep(0.3)

    async def read() -> bytes | None:
        async with aioredis.Redis.from_url(server.url) as r:
            return await r.get("k")

    asyncio.run(write())
    server.restart()
    assert asyncio.run(read()) == b"v"


def test_missing_binary_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerMissing, match="redis-server not found"):
        RedisServer(tmp_path / "r")
