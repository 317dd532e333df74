"""A subscription the broker never answered because the connection ended is no
warning: the reconnect subscribes again (an unsubscribe needs none then). Found at the
end of ``sfc-host demo``: it stops the broker while the stations' script engine still
unsubscribes, and every topic printed a "failed" line after the summary."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import pytest
from helpers.servers import MosquittoServer, ServerMissing

from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink


def test_a_subscription_cut_off_by_the_connection_ending_is_no_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    try:
        broker = MosquittoServer(tmp_path / "mqtt")
    except ServerMissing as e:
        pytest.skip(str(e))
    broker.start()

    async def main() -> None:
        link = MqttLink(HostConfig(mqtt_url=broker.url, consumer="t"), Metrics())
        await link.start()
        try:
            await link.wait_connected()
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGSTOP)       # no SUBACK comes
            link.subscribe("equipment/+/commands", lambda m: None)
            await asyncio.sleep(0.2)
            broker.proc.send_signal(signal.SIGKILL)       # the connection ends
            broker.proc.wait(5)
            for _ in range(100):
                if not link.connected.is_set():
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
        finally:
            await link.aclose()

    with caplog.at_level(logging.DEBUG, logger="sfc_host.mqtt"):
        try:
            asyncio.run(asyncio.wait_for(main(), 30))
        finally:
            broker.stop()
    said = [r for r in caplog.records if "(un)subscribe" in r.getMessage()
            and "equipment/+/commands" in r.getMessage()]
    assert said, "the cut-off subscription was not logged at all"
    assert all(r.levelno == logging.DEBUG for r in said), [r.getMessage() for r in said]
