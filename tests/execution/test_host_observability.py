"""What a host tells about itself: the evolve and event-to-command histograms, the bound
of the answer queue while Redis is away, and structured (JSON) log lines."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import aiomqtt
from helpers import hosts
from helpers.aio import run
from helpers.hosts import Station, flush, quick_config, wait_until, work_master
from helpers.recipes import QA, event_then_work

from sfc_fast.events import Completed
from sfc_host import logs
from sfc_host.config import ConfigError, HostConfig
from sfc_host.execution.host import Host
from sfc_host.mqtt.cloudevents import CloudEvent, encode_structured

S = "obs"

start_host = partial(hosts.start_host, scope=S)


# ---- histograms


def test_evolve_seconds_counts_every_evolve_call(redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: {"torque": 85} if c.action == "tighten" else None)
        host = await start_host(redis_url, st, work_master("tighten_rework", "tr"))
        try:
            await host.orders.store_order(S, {"JobOrderID": "J1",
                                              "WorkMasterID": [{"ID": "tr"}]}, start=True)
            await wait_until(lambda: host.metrics["answers_applied"] >= 1, what="an answer")
            h = host.metrics.histograms["evolve_seconds"]
            # the Start and every answer were evolved: one observation per evolve call
            assert h.count >= 1 + host.metrics["answers_applied"]
            assert 0 < h.sum < h.count * 0.1 and h.cumulative()[-1] == h.count
            text = host.metrics.exposition()
            assert "# TYPE sfc_evolve_seconds histogram" in text
            assert f"sfc_evolve_seconds_count {h.count}" in text
        finally:
            await host.aclose()

    run(main())


def test_event_to_command_seconds_times_a_pull_event_to_its_jobs_command(
        redis_url: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        st = Station(lambda c: False)
        host = await start_host(redis_url, st, event_then_work())
        try:
            await host.orders.store_order(S, {"JobOrderID": "E1",
                                              "WorkMasterID": [{"ID": "evwork"}]},
                                          start=True)
            k = host.store.keys(S)
            await wait_until(lambda: host.client.zscore(k.waits(QA), "E1"), what="the wait")
            t0 = time.perf_counter()
            assert await host.queue_event(S, QA, data={"ok": True})
            await wait_until(lambda: [c for c in st.commands if c.action == "work"],
                             what="the work command")
            took = time.perf_counter() - t0
            h = host.metrics.histograms["event_to_command_seconds"]
            assert h.count == 1 and 0 < h.sum <= took
            assert not host.dispatcher.event_arrived and not host.work.event_arrived
            # an event no command follows (nobody waits) records nothing
            assert not await host.queue_event(S, QA)
            assert host.metrics.histograms["event_to_command_seconds"].count == 1
        finally:
            await host.aclose()

    run(main())


# ---- the answer queue while Redis is away


def test_the_answer_queue_is_bounded_while_redis_is_away(make_redis: Any, caplog: Any) -> None:
    server = make_redis()

    async def main() -> None:
        host = Host(quick_config(server.url, answer_queue_max=10, answer_workers=1),
                    Station().sink)
        await host.add_scope(S)
        await host.start()
        try:
            server.stop()
            with caplog.at_level(logging.WARNING, logger="sfc_host"):
                for i in range(25):
                    host.answer(S, Completed(f"J{i}:work#1", None))
                assert len(host._answers) <= 10
                assert host.metrics["answers_dropped"] == 15
                # the newest stay: a dropped answer's deadline sends its command again
                assert host._answers[-1][1].command_id == "J24:work#1"
                await asyncio.sleep(0.3)   # the worker fails on the missing Redis meanwhile
                for i in range(25, 40):
                    host.answer(S, Completed(f"J{i}:work#1", None))
                assert len(host._answers) <= 10
            full = [r for r in caplog.records if "answer queue full" in r.getMessage()]
            assert len(full) >= 1 and full[0].levelno == logging.WARNING
            assert host.metrics["answers_dropped"] >= 15
        finally:
            await host.aclose()

    run(main())


def test_answer_queue_max_is_a_setting() -> None:
    assert HostConfig().answer_queue_max == 100_000
    assert HostConfig.load(env={"SFC_ANSWER_QUEUE_MAX": "500"}).answer_queue_max == 500
    try:
        HostConfig(answer_queue_max=0)
    except ConfigError as e:
        assert "answer_queue_max" in str(e)
    else:
        raise AssertionError("answer_queue_max = 0 accepted")


# ---- logs


def _record(msg: str, *args: Any, **extra: Any) -> logging.LogRecord:
    r = logging.LogRecord("sfc_host.execution.settle", logging.WARNING, __file__, 1, msg, args,
                          None)
    r.__dict__.update(extra)
    r.created = 1796289304.12  # 2026-12-03T09:15:04.120Z
    return r


def test_the_json_formatter_writes_one_object_with_the_job_fields() -> None:
    f = logs.JsonFormatter()
    line = f.format(_record("job %s/%s: lost the race %d times", "line1", "J7", 4,
                            job="J7", scope="line1", action="tighten",
                            command_id="J7:tighten#2"))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-12-03T09:15:04.120Z", "level": "WARNING",
        "logger": "sfc_host.execution.settle",
        "message": "job line1/J7: lost the race 4 times", "job": "J7", "scope": "line1",
        "action": "tighten", "command_id": "J7:tighten#2"}
    # no fields on the record, none in the line; a traceback is one field
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        r = _record("failed")
        r.exc_info = sys.exc_info()
    doc = json.loads(f.format(r))
    assert set(doc) == {"time", "level", "logger", "message", "exception"}
    assert "RuntimeError: boom" in doc["exception"]


def test_no_log_line_carries_a_url_password() -> None:
    r = _record("cannot reach %s", "redis://user:s3cret@db:6379/0", scope="x")
    for f in (logs.JsonFormatter(), logs.TextFormatter()):
        line = f.format(r)
        assert "s3cret" not in line and "redis://user:***@db:6379/0" in line
    assert logs.redact("mqtts://:pw@broker:8883 and redis://h:1/0") == \
        "mqtts://:***@broker:8883 and redis://h:1/0"
    assert logs.redact("no url here") == "no url here"


def test_log_format_is_a_setting() -> None:
    assert HostConfig().log_format == "text"
    assert HostConfig(log_format="json").log_format == "json"
    try:
        HostConfig(log_format="xml")
    except ConfigError as e:
        assert "log_format" in str(e)
    else:
        raise AssertionError("log_format = xml accepted")


def test_a_refused_answer_is_a_json_line_with_its_fields(redis_url: str, mqtt_url: str,
                                                         tmp_path: Path) -> None:
    """``sfc-host run`` with ``log_format = "json"``: an answer with an unknown Outcome and
    one whose command id names no job, each one JSON line with scope, job, action and
    command id as fields."""
    scope = "obsjson"
    conf = tmp_path / "host.toml"
    conf.write_text(f'[host]\nredis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                    f'consumer = "obs-json"\nlog_format = "json"\nscopes = ["{scope}"]\n')
    p = subprocess.Popen([sys.executable, "-m", "sfc_host", "run", "--config", str(conf)],
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert p.stderr is not None
        first = json.loads(p.stderr.readline())
        while "running" not in first["message"]:
            first = json.loads(p.stderr.readline())
        assert first["level"] == "INFO" and first["logger"] == "sfc_host"
        assert first["time"].endswith("Z") and len(first["time"]) == 24

        async def answer() -> None:
            host, port = mqtt_url.removeprefix("mqtt://").rsplit(":", 1)
            async with aiomqtt.Client(host, int(port)) as c:
                for cid, outcome in (("J9:screw#1", "bogus"), ("nojob", "completed")):
                    ev = CloudEvent(id=f"a-{cid}", source="test", type="answer",
                                    data={"Outcome": outcome},
                                    extensions={"causationid": cid})
                    await c.publish(f"equipment/{scope}/responses", encode_structured(ev),
                                    qos=1)

        asyncio.run(asyncio.wait_for(answer(), 10))
        lines: list[dict[str, Any]] = []
        while len(lines) < 2:
            doc = json.loads(p.stderr.readline())
            if doc["level"] == "WARNING":
                lines.append(doc)
        bad, unknown = lines
        assert "unknown Outcome 'bogus'" in bad["message"]
        assert bad["scope"] == scope and bad["job"] == "J9" and bad["action"] == "screw"
        assert bad["command_id"] == "J9:screw#1" and bad["logger"] == "sfc_host.execution.dispatch"
        assert "names no job" in unknown["message"]
        assert unknown["scope"] == scope and unknown["command_id"] == "nojob"
        assert "job" not in unknown
    finally:
        p.terminate()
        p.wait(15)
