"""The test harness itself: the fixtures give real servers that answer their protocols."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest
import redis.asyncio as aioredis
from helpers.servers import RedisClusterServer, RedisServer, ServerMissing
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ClusterCrossSlotError, RedisClusterException


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


def test_redis_cluster_fixture_spreads_keys_and_refuses_cross_slot_scripts(
        redis_cluster: RedisClusterServer) -> None:
    assert len(redis_cluster.ports) == 3
    assert redis_cluster.startup_nodes == [("127.0.0.1", p) for p in redis_cluster.ports]
    script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])"

    async def main() -> None:
        rc = RedisCluster.from_url(redis_cluster.url)
        try:
            await rc.initialize()
            keys = [f"harness:cluster:{i}" for i in range(30)]
            for k in keys:
                await rc.set(k, k)
            owners = {rc.get_node_from_key(k).port for k in keys}
            assert owners == set(redis_cluster.ports)  # every master holds some of them
            assert [await rc.get(k) for k in keys] == [k.encode() for k in keys]

            same = ["{scope1}:state", "{scope1}:count"]
            assert await rc.eval(script, 2, *same, "on") == 1
            assert await rc.eval(script, 2, *same, "on") == 2
            assert await rc.get("{scope1}:state") == b"on"

            other = ["{scope1}:state", "{scope2}:count"]
            with pytest.raises(RedisClusterException, match="same key slot"):
                await rc.eval(script, 2, *other, "off")  # the client refuses it already
            # sent anyway, the server refuses it: the CROSSSLOT reply
            with pytest.raises(ClusterCrossSlotError):
                await rc.execute_command("EVAL", script, 2, *other, "off",
                                         target_nodes=rc.get_node_from_key(other[0]))
            assert await rc.get("{scope1}:state") == b"on"
            assert await rc.exists("{scope2}:count") == 0
            await rc.delete(*keys, *same)
        finally:
            await rc.aclose()

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
