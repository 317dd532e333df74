"""An MES written for the Python original against ``sfc-host run``: real redis-server,
mosquitto and a host process. The MES sends and reads only reference-shaped messages,
under a two-level prefix (``app/jobs``, the original's own), for a one-level and a
dotted scope; it runs jobs to Ended_Completed, pauses, resumes, aborts, clears,
queries by id and by state, and a second MES resyncs from the retained state."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers.aio import run
from helpers.hosts import flush, start_sfc_host, stop_cleanly, wait_until
from helpers.mes import BY_ID, BY_STATE, JC, Mes, configure, ref, same_shape, slow_tighten, store
from helpers.mqtt_station import MqttStation

from sfc_host.isa95 import state_list
from sfc_host.store.orders import NO_ERROR, UNKNOWN_JOB_ORDER_ID

PREFIX = "app/jobs"
SCOPES = ("line1", "line1.cell1")


def start_host(tmp_path: Path, redis_url: str, mqtt_url: str) -> subprocess.Popen[str]:
    conf = tmp_path / "host.toml"
    conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                    f'mes_prefix = "{PREFIX}"\nconsumer = "mes-e2e"\n'
                    "sweep_interval_ms = 50\ndiscover_interval_ms = 100\n")
    return start_sfc_host(["run", "--config", str(conf)], {}, "host mes-e2e running")


def test_an_mes_of_the_original_runs_jobs_through_sfc_host_run(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        host = start_host(tmp_path, redis_url, mqtt_url)
        try:
            async with Mes(mqtt_url, prefix=PREFIX) as mes, MqttStation(mqtt_url, slow_tighten):
                for scope in SCOPES:
                    await configure(mes, scope=scope)
                for scope in SCOPES:
                    # the dotted scope's requests go to app/jobs/line1/cell1/commands
                    for job in (f"{scope}-A", f"{scope}-slow"):
                        rep = await mes.call(JC + "StoreAndStart.v2", store(job), scope=scope)
                        assert rep["data"] == ref("StoreAndStart.reply.json")
                        assert rep["subject"] == scope
                    rep = await mes.call(JC + "Store.v2", store(f"{scope}-B", "Store"),
                                         scope=scope)
                    assert rep["data"] == ref("Store.reply.json")

                for scope in SCOPES:
                    # run to the end: the retained result, the job response by id
                    res = await wait_until(lambda s=scope: mes.retained_json(
                        f"result/{s}-A", s), 15, f"{scope}-A result")
                    same_shape(ref("result.retained.json"), res)
                    assert res["JobState"] == state_list("Ended_Completed")
                    rep = await mes.call(BY_ID, {"JobOrderID": f"{scope}-A"}, scope=scope)
                    assert rep["data"]["JobResponse"] == res
                    # pause and resume a running job, then abort it with a comment
                    slow = f"{scope}-slow"
                    await wait_until(lambda s=scope: mes.retained_json(
                        f"order/{s}-slow", s) and mes.retained_json(
                        f"order/{s}-slow", s)["State"] == state_list("Running"), 15,
                        f"{slow} running")
                    for method in ("Pause", "Resume", "Abort"):
                        req = dict(ref(f"{method}.request.json"), JobOrderID=slow)
                        rep = await mes.call(JC + method + ".v2", req, scope=scope)
                        assert rep["data"]["ReturnStatus"] == NO_ERROR, (method, rep)
                    await wait_until(lambda s=scope: mes.retained_json(
                        f"result/{s}-slow", s), 15, f"{slow} aborted with a response")
                    # events: the scope's levels under the prefix
                    topics = {e["_topic"] for e in mes.events if e["subject"] == scope}
                    assert topics == {f"{PREFIX}/{scope.replace('.', '/')}/events"}
                    # by state: the original's exact state lists
                    rep = await mes.call(BY_STATE, {"JobOrderState": state_list("Aborted")},
                                         scope=scope)
                    assert [r["JobOrderID"] for r in rep["data"]["JobResponses"]] == [slow]
                    # Clear of the ended job: its retained topics go, the id is unknown
                    req = dict(ref("Clear.request.json"), JobOrderID=f"{scope}-A")
                    assert (await mes.call(JC + "Clear.v2", req, scope=scope))["data"] == \
                        ref("Clear.reply.json")
                    await wait_until(lambda s=scope: mes.retained.get(
                        f"{PREFIX}/{s}/order/{s}-A") == b"", 5, "order deleted")
                    rep = await mes.call(JC + "Start.v2", {"JobOrderID": f"{scope}-A"},
                                         scope=scope)
                    assert rep["data"]["ReturnStatus"] == UNKNOWN_JOB_ORDER_ID

                # the state index: one topic level for the scope, as the original
                for scope in SCOPES:
                    idx = await wait_until(lambda s=scope: mes.index(s) == {
                        f"{s}-slow": "Aborted", f"{s}-B": "NotAllowedToStart_Ready"}
                        and mes.retained_json("state-index", s), 5, f"{scope} index")
                    same_shape(ref("state-index.retained.json"), idx)
                    assert idx["scope"] == scope

            # a second MES connecting later resyncs from the retained messages alone
            async with Mes(mqtt_url, prefix=PREFIX) as late:
                for scope in SCOPES:
                    index = await wait_until(lambda s=scope: late.index(s), 5, "resync")
                    assert index == {f"{scope}-slow": "Aborted",
                                     f"{scope}-B": "NotAllowedToStart_Ready"}
                    order = await wait_until(lambda s=scope: late.retained_json(
                        f"order/{s}-B", s), 5, "retained order")
                    assert order["State"] == state_list("NotAllowedToStart_Ready")
                    assert order["JobOrder"] == store(f"{scope}-B", "Store")["JobOrder"]
        finally:
            stop_cleanly(host)
    run(main(), 90)
