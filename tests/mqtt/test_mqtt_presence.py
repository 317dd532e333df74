"""The host's own status on ``{mes}/hosts/{consumer}``: retained online with version and
scopes; the Last Will marks a host that vanished (kill -9) offline; a clean stop says
so itself. Real redis-server, mosquitto and ``sfc-host run``."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from helpers.hosts import flush, start_sfc_host, wait_until

from sfc_host import __version__
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink


def host_toml(tmp_path: Path, redis_url: str, mqtt_url: str, consumer: str) -> Path:
    conf = tmp_path / f"{consumer}.toml"
    conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                    f'consumer = "{consumer}"\nscopes = ["line1"]\n'
                    "mqtt_keepalive_s = 2\n")
    return conf


def mine(seen: list[dict[str, Any]], host: str, online: bool) -> list[dict[str, Any]]:
    """The statuses of ``host`` saying ``online`` (live ones: not the retained copy a
    watcher gets at its subscribe from a run before)."""
    return [s for s in seen if s["host"] == host and s.get("online") is online]


async def statuses(mqtt_url: str, seen: list[dict[str, Any]]) -> MqttLink:
    cfg = HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=mqtt_url, consumer="watcher")
    link = MqttLink(cfg, Metrics())
    link.subscribe("mes/hosts/+", lambda m: seen.append(
        {"retain": m.retain, **json.loads(m.payload)}) if m.payload else None, shared=False)
    await link.start()
    await link.wait_connected()
    return link


def test_the_host_says_it_is_online_and_its_last_will_says_when_it_vanished(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        host = start_sfc_host(["run", "--config", str(host_toml(tmp_path, redis_url, mqtt_url,
                                                              "vanish"))],
                              {}, "host vanish running")
        seen: list[dict[str, Any]] = []
        watcher = await statuses(mqtt_url, seen)
        try:
            # other tests' hosts left their retained statuses on this broker
            await wait_until(lambda: mine(seen, "vanish", True), 10, "online")
            online = mine(seen, "vanish", True)[0]
            assert online["version"] == __version__
            assert online["retain"] and online["client_id"] == "sfc-vanish"
            await wait_until(lambda: any(s.get("scopes") == ["line1"]
                                         for s in mine(seen, "vanish", True)), 10, "scopes")
            host.send_signal(signal.SIGKILL)
            host.wait(10)
            # the broker sees the socket closed at once: the Last Will goes out
            await wait_until(lambda: mine(seen, "vanish", False), 10, "the Last Will")
            gone = mine(seen, "vanish", False)[0]
            assert "Last Will" in gone["reason"]
        finally:
            if host.poll() is None:
                host.kill()
            await watcher.aclose()
        # a client that connects later gets the retained offline status
        late: list[dict[str, Any]] = []
        watcher = await statuses(mqtt_url, late)
        try:
            await wait_until(lambda: [s for s in late if s["host"] == "vanish"], 5,
                             "the retained status")
            last = [s for s in late if s["host"] == "vanish"][-1]
            assert last["online"] is False and last["retain"]
        finally:
            await watcher.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_clean_stop_says_offline_itself(redis_url: str, mqtt_url: str,
                                          tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        host = start_sfc_host(["run", "--config", str(host_toml(tmp_path, redis_url, mqtt_url,
                                                              "tidy"))],
                              {}, "host tidy running")
        seen: list[dict[str, Any]] = []
        watcher = await statuses(mqtt_url, seen)
        try:
            await wait_until(lambda: mine(seen, "tidy", True), 10, "online")
            host.send_signal(signal.SIGTERM)
            assert host.wait(15) == 0
            await wait_until(lambda: mine(seen, "tidy", False), 5, "offline")
            gone = mine(seen, "tidy", False)
            assert [s["reason"] for s in gone] == ["stopped"]     # no Last Will after it
        finally:
            if host.poll() is None:
                host.kill()
            await watcher.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))
