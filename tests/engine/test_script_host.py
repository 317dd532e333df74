"""The script engine inside a host (``scripts_dir``): scripts talk to the real broker
through their own connection (``api.mqtt``, binary CloudEvents readable through the
properties) and drive job orders through the host's job control (``api.jobs``).
Real redis-server and mosquitto."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers.hosts import flush, quick_config, wait_until, work_master

from sfc_host.config import ConfigError
from sfc_host.engine.api import JobsNotConnected, ScriptAPIError
from sfc_host.service.app import App

S = "line1"

# A station as a Mission: it answers every command (binary CloudEvents: the command id
# is a user property) on the fixed response topic, a tightening in tolerance.
STATION = '''
import asyncio
from sfc_host.engine import Variable, mission

seen = Variable("seen", [])

@mission
async def station(api):
    def on_command(topic, payload, props):
        scope = topic.split("/")[1]
        api.vars["seen"] = api.vars["seen"] + [props.get("id")]
        result = {"torque": 85} if props.get("type", "").endswith("tighten.v1") else {}
        api.mqtt.publish(f"equipment/{scope}/responses",
                         {"Outcome": "completed", "Result": result},
                         properties={"specversion": "1.0", "id": "a-" + props["id"],
                                     "source": "station", "type": "answer",
                                     "causationid": props["id"],
                                     "ContentType": "application/json"})
    api.mqtt.subscribe("equipment/+/commands", on_command)
    while True:
        await asyncio.sleep(0.5)
        yield
'''

# Jobs from a Mission: submit, watch, and the refusals as ScriptAPIError.
JOBS = '''
import asyncio
from sfc_host.engine import Variable, mission
from sfc_host.engine.api import ScriptAPIError

report = Variable("report", {})

@mission
async def orders(api, n, scope):
    ids = [await api.jobs.submit({"JobOrderID": "S0", "WorkMasterID": [{"ID": "wm"}]},
                                 scope=scope)]
    out = {"ids": ids}
    # at once, while S0 surely runs (an ended order may be stored anew)
    try:
        await api.jobs.submit({"JobOrderID": "S0", "WorkMasterID": [{"ID": "wm"}],
                               "Priority": 9}, scope=scope)
    except ScriptAPIError as e:
        out["again"] = str(e)
    ids += [await api.jobs.submit({"JobOrderID": f"S{i}", "WorkMasterID": [{"ID": "wm"}]},
                                  scope=scope)
            for i in range(1, n)]
    try:
        await api.jobs.pause("nope", scope=scope)
    except ScriptAPIError as e:
        out["unknown"] = str(e)
    while True:
        views = [await api.jobs.query(j, scope=scope) for j in ids]
        if all(v["JobState"].startswith("Ended") for v in views):
            break
        await asyncio.sleep(0.05)
        yield
    out["states"] = [v["JobState"] for v in views]
    out["responses"] = [v["JobResponse"] is not None for v in views]
    out["missing"] = await api.jobs.query("nope", scope=scope)
    api.vars["report"] = out
'''

# Two overlapping subscriptions of scripts: each sees a message once.
FANOUT = '''
import asyncio
from sfc_host.engine import Variable, mission

got = Variable("got", [])

@mission
async def listen(api):
    api.mqtt.subscribe("cell/#", lambda t, p: api.vars.set("got", api.vars["got"] + ["all"]))
    api.mqtt.subscribe("cell/a", lambda t, p: api.vars.set("got", api.vars["got"] + ["a"]))
    while True:
        await asyncio.sleep(0.5)
        yield
'''


def write(tmp: Path, **scripts: str) -> Path:
    d = tmp / "scripts"
    d.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (d / f"{name}.py").write_text(textwrap.dedent(text))
    return d


async def start(redis_url: str, mqtt_url: str, scripts: Path, **kw: Any) -> App:
    await flush(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, scripts_dir=str(scripts), **kw))
    await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start()
    return app


def test_mission_station_and_job_api(redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """api.jobs submits and queries through the host's job control; a Mission answers
    the host's binary CloudEvent commands through api.mqtt; every job completes."""
    scripts = write(tmp_path, station=STATION, jobs=JOBS)

    async def main() -> None:
        app = await start(redis_url, mqtt_url, scripts, missions=["station"])
        try:
            assert app.engine is not None and app.engine.state == "Running"
            assert not isinstance(app.engine.jobs, JobsNotConnected)
            inst = await app.engine.start_mission("orders", n=5, scope=S)
            assert await inst.join(timeout=30) == "Completed"
            rep = app.engine.vars["report"]
            assert rep["ids"] == [f"S{i}" for i in range(5)]
            assert rep["states"] == ["Ended_Completed"] * 5
            assert rep["responses"] == [True] * 5
            assert rep["missing"] is None
            assert "api.jobs.submit" in rep["again"]
            assert "api.jobs.pause: UNKNOWN_JOB_ORDER_ID" in rep["unknown"]
            assert any(i and i.startswith("S0:tighten") for i in app.engine.vars["seen"])
        finally:
            await app.aclose()
        assert app.engine.state == "Ready"
    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("version", [5, 3])
def test_overlapping_script_subscriptions_deliver_once(redis_url: str, mqtt_url: str,
                                                       tmp_path: Path, version: int) -> None:
    """MQTT 5 brokers send one copy per matching subscription (told apart by
    subscription identifiers), 3.1.1 brokers one copy: either way each script
    subscription sees the message once."""
    scripts = write(tmp_path, listen=FANOUT)

    async def main() -> None:
        app = await start(redis_url, mqtt_url, scripts, missions=["listen"],
                          mqtt_version=version)
        try:
            assert app.engine is not None
            await asyncio.sleep(0.3)        # the live subscriptions reach the broker
            app.link.publish_nowait("cell/a", b"x")
            app.link.publish_nowait("cell/b", b"y")
            await wait_until(lambda: len(app.engine.vars["got"]) >= 3, 5, "deliveries")
            await asyncio.sleep(0.3)
            assert sorted(app.engine.vars["got"]) == ["a", "all", "all"]
        finally:
            await app.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_scripts_that_do_not_build_stop_the_start(redis_url: str, mqtt_url: str,
                                                  tmp_path: Path) -> None:
    scripts = write(tmp_path, broken="def oops(:\n")

    async def main() -> None:
        await flush(redis_url)
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scripts_dir=str(scripts)))
        try:
            with pytest.raises(ConfigError, match=r"broken\.py:1"):
                await app.start()
        finally:
            await app.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_engine_without_host_refuses_jobs() -> None:
    async def main() -> None:
        with pytest.raises(ScriptAPIError, match="not connected to job control"):
            await JobsNotConnected().stop("J1", scope=S)
    asyncio.run(main())


def test_host_loops_are_built_in_tasks_of_the_engine(redis_url: str, mqtt_url: str) -> None:
    """The host's loops run as built-in Tasks of the engine, so the engine's Stop stops
    the host's work (an order stored after it is not started; docs/design.md#script-engine)."""
    async def main() -> None:
        await flush(redis_url)
        app = App(quick_config(redis_url, mqtt_url=mqtt_url))
        await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
        await app.host.add_scope(S)
        await app.start()
        try:
            names = {f"host.{n}" for n, _ in app.host.passes()}
            assert {"host.consume", "host.sweep", "host.answers0"} <= names
            assert names <= set(app.engine.tasks)
            assert all(app.engine.tasks[n].state == "Running" for n in names)
            await app.host.orders.store_order(S, {"JobOrderID": "T1",
                                                  "WorkMasterID": [{"ID": "wm"}]},
                                              start=True)
            await wait_until(lambda: _job_running(app, "T1"), 10, "T1 started")
            app.host.begin_close()
            await app.engine.stop()
            assert app.engine.state == "Ready"
            assert all(app.engine.tasks[n].state == "Stopped" for n in names)
            await app.host.orders.store_order(S, {"JobOrderID": "T2",
                                                  "WorkMasterID": [{"ID": "wm"}]},
                                              start=True)
            await asyncio.sleep(0.5)
            assert not await _job_running(app, "T2")
        finally:
            await app.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))


async def _job_running(app: App, job: str) -> bool:
    return await app.host.client.exists(app.host.store.keys(S).job(job)) == 1


BAD_FILTERS = '''
import asyncio
from sfc_host.engine import Variable, mission
from sfc_host.engine.api import ScriptAPIError

errors = Variable("errors", [])

@mission
async def picky(api):
    for f in ("", "a\\x00b", "cell/#/x", "x" * 70000):
        try:
            api.mqtt.subscribe(f, lambda topic, payload: None)
        except ScriptAPIError as e:
            api.vars.set("errors", api.vars["errors"] + [str(e)[-60:]])
    api.mqtt.subscribe("cell/+", lambda topic, payload: api.vars.set(
        "errors", api.vars["errors"] + ["got " + topic]))
    while True:
        await asyncio.sleep(0.5)
        yield
'''


def test_a_script_s_bad_topic_filter_raises_at_once_and_the_link_serves_on(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """A filter with U+0000, an empty one, one with # inside or over 64 KiB would end the
    scripts' link task silently at the next reconnect, so the script gets a
    ScriptAPIError at once instead and its good subscription keeps working."""
    scripts = write(tmp_path, picky=BAD_FILTERS)

    async def main() -> None:
        app = await start(redis_url, mqtt_url, scripts, missions=["picky"])
        try:
            assert app.engine is not None
            await wait_until(lambda: len(app.engine.vars["errors"]) >= 4, 5, "errors")
            await asyncio.sleep(0.3)
            app.link.publish_nowait("cell/a", b"x")
            await wait_until(lambda: "got cell/a" in app.engine.vars["errors"], 5, "got")
            errors = app.engine.vars["errors"][:4]
            assert all("topic filter" in e for e in errors), errors
            assert app.script_link is not None and app.script_link.listening
        finally:
            await app.aclose()
    asyncio.run(asyncio.wait_for(main(), 30))
