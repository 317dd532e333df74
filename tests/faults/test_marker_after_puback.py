"""Regression: a command counts as sent (its sent marker is written) only once the
broker has it.

Found by ``kill -9`` fault runs (seed 20 of ``benchmarks/reliability.py``, and every
run of ``kill9_stalled_broker``): ``MqttSink.send`` said True as soon as a command was
in the host's own outgoing queue, so the dispatcher wrote the marker and acked the
entry while the command could still be waiting for its turn (up to 256 QoS 1 messages
unacknowledged at once) or in the socket. A host killed then took the command with it,
and the marker kept every other host from sending it: the action timed out (a retry
with a new id, or an aborted job). Now ``send`` waits for the PUBACKs (at most
``ACK_WAIT_S``); a command not acknowledged by then is reported unsent (no marker: its
entry is taken over if the host dies first, or the deadline sends the same id again).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from hosts import work_master
from servers import MosquittoServer, ServerMissing

from sfc_fast import Command, compile_recipe, evolve
from sfc_fast.events import Start
from sfc_host import equipment_mqtt
from sfc_host.config import HostConfig
from sfc_host.equipment_mqtt import MqttSink
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink


def command(n: int) -> Command:
    """The first command (``load_part``) of job ``J{n}``."""
    wm = work_master("tighten_rework")
    d = evolve(compile_recipe(wm["data"], wm["dataschema"]), None, Start(f"J{n}", "line1"),
               1_000)
    return d.commands[0]


def test_a_command_the_broker_has_not_acknowledged_is_not_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        broker = MosquittoServer(tmp_path / "mqtt")
    except ServerMissing as e:
        pytest.skip(str(e))
    broker.start()
    monkeypatch.setattr(equipment_mqtt, "ACK_WAIT_S", 0.5)

    async def main() -> None:
        link = MqttLink(HostConfig(mqtt_url=broker.url, consumer="t"), Metrics())
        await link.start()
        try:
            await link.wait_connected()
            sink = MqttSink(link)
            assert await sink.send([command(1)]) == [True]       # acknowledged
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGSTOP)              # no PUBACK comes
            try:
                assert await sink.send([command(2)]) == [False]
                assert link.metrics["mqtt_unacked_commands"] == 1
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            assert await sink.send([command(3)]) == [True]
        finally:
            await link.aclose()

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        broker.stop()
