"""An MES that speaks OPC UA against ``sfc-host run`` (real redis-server, mosquitto and
a station), with asyncua's client: it browses to a scope's objects by type, loads the
data types from the server, subscribes to the status events and to ``JobOrderList``,
and drives jobs through every Job Control method; a job driven over MQTT is seen the
same over OPC UA, and a host restart keeps every order.

The client runs in this process and the host in its own: asyncua keeps the structure
classes it makes in one module, so a server in this process would hand the client
classes it never had to load (the unit tests of ``convert`` at the end load the
NodeSet here, after every client test).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from asyncua import Client, ua
from asyncua.common.events import get_filter_from_event_type
from helpers.aio import run
from helpers.health import metric
from helpers.hosts import stop_cleanly, wait_until
from helpers.mes import CFG, JC, answer_all, no_tighten_answer, store
from helpers.mqtt_station import MqttStation
from helpers.opcua import (
    INVALID_STATUS,
    NO_ERROR,
    SCOPE,
    UNABLE,
    UNKNOWN_ID,
    WM,
    Mes95,
    connected,
    free_port,
    order,
    rs,
    running,
    start_host,
)


def test_an_opcua_mes_runs_jobs_through_every_method(redis_url: str, mqtt_url: str,
                                                      tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, \
                MqttStation(mqtt_url, no_tighten_answer) as station:
            mqtt_mes = h.mqtt_mes
            async with connected(h.port) as mes:
                # Store, then Start: the recipe runs on the station to its end
                r = await mes.store("Store", order("A1"))
                assert r.StatusCode.is_good() and rs(r) == NO_ERROR
                assert r.OutputArguments[0].VariantType == ua.VariantType.UInt64
                assert rs(await mes.on_order("Start", "A1")) == NO_ERROR
                tighten = await wait_until(
                    lambda: next((c for c in station.commands
                                  if c["correlationid"] == "A1"
                                  and c["type"] == "com.example.cell.tighten.v1"), None),
                    20, "A1's tightening")
                # Pause and Resume while it runs
                assert rs(await mes.on_order("Pause", "A1")) == NO_ERROR
                await wait_until(lambda: any(s.startswith("Interrupted")
                                             for s in mes.states("A1")), 10,
                                 f"A1 held: {mes.states('A1')}")
                assert rs(await mes.on_order("Resume", "A1")) == NO_ERROR
                await station.reply(tighten, {"Outcome": "completed",
                                              "Result": {"torque": 85}})
                await wait_until(lambda: "Ended_Completed" in mes.states("A1"), 20,
                                 "A1 ended")
                seen = mes.states("A1")
                assert seen[0] == "NotAllowedToStart_Ready" and "Running" in seen, seen
                end = next(e for e in mes.events if e.JobOrder.JobOrderID == "A1"
                           and "_".join(s.StateText.Text for s in e.JobState)
                           == "Ended_Completed")
                # the event's structures arrive decoded, its response with results
                assert end.JobOrder.WorkMasterID[0].ID == WM
                assert end.JobResponse.JobOrderID == "A1"
                assert any(d.ID == "tighten.torque" and d.Value.Value == 85
                           for d in end.JobResponse.JobResponseData)
                # the job response by id, with the order's actuals
                r = await mes.call("RequestJobResponseByJobOrderID",
                                   ua.Variant("A1", ua.VariantType.String))
                response = r.OutputArguments[0].Value
                assert rs(r) == NO_ERROR and response.JobOrderID == "A1"
                assert [s.StateText.Text for s in response.JobState] == ["Ended",
                                                                         "Completed"]
                assert response.EquipmentActuals[0].ID == "STATION-10"
                # refusals: Uncertain, with the ReturnStatus the MQTT face returns
                r = await mes.call("RequestJobResponseByJobOrderID",
                                   ua.Variant("nope", ua.VariantType.String))
                assert r.StatusCode.value == ua.StatusCodes.Uncertain
                # a null JobResponse: asyncua's client reads it as a bodiless object
                none = r.OutputArguments[0].Value
                assert rs(r) == UNKNOWN_ID and getattr(none, "Body", None) is None
                assert rs(await mes.store("Store", order("B1"))) == NO_ERROR
                r = await mes.store("Store", order("B1", Priority=7))
                assert r.StatusCode.value == ua.StatusCodes.Uncertain and rs(r) == UNABLE
                r = await mes.on_order("Pause", "B1")     # not running
                assert r.StatusCode.value == ua.StatusCodes.Uncertain
                assert rs(r) == INVALID_STATUS
                assert rs(await mes.on_order("Start", "zzz")) == UNKNOWN_ID
                # StoreAndStart, then Abort with a comment; Cancel; Clear
                assert rs(await mes.store("StoreAndStart", order("C1"))) == NO_ERROR
                await wait_until(lambda: "Running" in mes.states("C1"), 10, "C1 runs")
                assert rs(await mes.on_order("Abort", "C1", "jammed")) == NO_ERROR
                await wait_until(lambda: any(s.startswith("Aborted")
                                             for s in mes.states("C1")), 10, "C1 aborted")
                assert rs(await mes.on_order("Cancel", "B1")) == NO_ERROR
                assert rs(await mes.on_order("Clear", "A1")) == NO_ERROR
                await wait_until(lambda: "A1" not in mes.listed()
                                 and "C1" in mes.listed(), 10, "the list after Clear")
                # by state: the aborted one
                r = await mes.call("RequestJobResponseByJobOrderState", ua.Variant(
                    [ua.ISA95StateDataType(BrowsePath=ua.RelativePath(),
                                           StateText=ua.LocalizedText("Aborted", "en"),
                                           StateNumber=6)],
                    ua.VariantType.ExtensionObject, is_array=True))
                assert rs(r) == NO_ERROR
                assert [x.JobOrderID for x in r.OutputArguments[0].Value] == ["C1"]
                # a job driven over MQTT is seen the same over OPC UA
                station.answer = answer_all
                rep = await mqtt_mes.call(JC + "StoreAndStart.v2", store("M1"))
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                await wait_until(lambda: "Ended_Completed" in mes.states("M1"), 20,
                                 "M1 seen over OPC UA")
                await wait_until(lambda: mes.listed().get("M1") == "Ended_Completed",
                                 10, "M1 listed")
                # the provider's JobOrderResponseList: a response per listed order
                assert mes.provider is not None
                node = await mes.provider.get_child(f"{mes.jc}:JobOrderResponseList")
                for _ in range(30):
                    responses = {r.JobOrderID: r for r in await node.read_value()}
                    if set(responses) == set(mes.listed()):
                        break
                    await asyncio.sleep(0.1)
                assert set(responses) == set(mes.listed())
                assert [s.StateText.Text for s in responses["M1"].JobState] == [
                    "Ended", "Completed"]
                assert any(d.ID == "tighten.torque" for d in responses["M1"].JobResponseData)
                # ... and one stored over OPC UA sends the MQTT status events
                assert "Ended_Completed" in mqtt_mes.states("A1")
    run(main(), 120)


def test_wrong_arguments_are_bad_invalid_argument_never_unexpected(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url, (SCOPE, "line2")) as h, \
                connected(h.port) as mes, connected(h.port, "line2") as other:
            cases = [
                ("Store", [ua.Variant("not an order", ua.VariantType.String)], 0),
                ("Store", [ua.Variant(42, ua.VariantType.Int32)], 0),
                ("Start", [ua.Variant(7, ua.VariantType.Int32)], 0),
                ("Start", [ua.Variant("A1", ua.VariantType.String),
                           ua.Variant("no texts", ua.VariantType.String)], 1),
                ("RequestJobResponseByJobOrderState",
                 [ua.Variant("Running", ua.VariantType.String)], 0),
                ("Start", [], -1),
            ]
            for name, args, wrong in cases:
                r = await mes.call(name, *args)
                assert r.StatusCode.value == ua.StatusCodes.BadInvalidArgument, name
                if wrong >= 0:
                    assert r.InputArgumentResults[wrong].value == \
                        ua.StatusCodes.BadTypeMismatch
            # a JobOrder checked as strictly as over MQTT: an id the host cannot
            # key, a Work Master the scope does not know, equipment it lacks
            for bad, why in ((order("a{b}"), 2**32), (order("W1", wm="nope"), UNABLE),
                             (ua.ISA95JobOrderDataType(
                                 JobOrderID="E1", WorkMasterID=[
                                     ua.ISA95WorkMasterDataType(ID=WM)],
                                 EquipmentRequirements=[
                                     ua.ISA95EquipmentDataType(ID="nowhere")]),
                              UNABLE)):
                r = await mes.store("Store", bad)
                assert r.StatusCode.value == ua.StatusCodes.Uncertain, bad
                assert rs(r) == why, (bad, rs(r))
            # a method called on another scope's object
            assert other.receiver is not None and mes.receiver is not None
            start = await mes.receiver.get_child(f"{mes.jc}:Start")
            [r] = await mes.client.uaclient.call([ua.CallMethodRequest(
                ObjectId=other.receiver.nodeid, MethodId=start.nodeid,
                InputArguments=[ua.Variant("A1", ua.VariantType.String)])])
            assert r.StatusCode.value == ua.StatusCodes.BadMethodInvalid
    run(main(), 90)


def test_a_client_of_one_host_sees_what_another_host_did(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Two hosts serve the face; an order stored and run through one is seen, event by
    event and in the lists, by a client of the other."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, \
                MqttStation(mqtt_url, answer_all):
            port_b = free_port()
            host_b = start_host(tmp_path, redis_url, mqtt_url, port_b, name="opcua-b")
            try:
                await asyncio.sleep(1.5)        # host B serves the scope too
                async with connected(h.port) as on_a, connected(port_b) as on_b:
                    assert rs(await on_a.store("StoreAndStart", order("X1"))) == NO_ERROR
                    # Each client's events come over its own subscription, so one may
                    # be a publish interval behind the other.
                    await wait_until(lambda: "Ended_Completed" in on_b.states("X1")
                                     and "Ended_Completed" in on_a.states("X1"), 20,
                                     "X1's end seen on hosts A and B")
                    assert on_b.states("X1") == on_a.states("X1")
                    await wait_until(lambda: on_b.listed().get("X1") == "Ended_Completed",
                                     10, "X1 in host B's list")
            finally:
                stop_cleanly(host_b)
    run(main(), 90)


def test_a_host_restart_keeps_every_order(redis_url: str, mqtt_url: str,
                                          tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h:
            async with connected(h.port) as mes:
                for job in ("R1", "R2", "R3"):
                    assert rs(await mes.store("Store", order(job))) == NO_ERROR
                await wait_until(lambda: len(mes.listed()) == 3, 10, "three listed")
            stop_cleanly(h.host)
            h.host = start_host(tmp_path, redis_url, mqtt_url, h.port)
            await asyncio.sleep(0.5)
            async with connected(h.port) as mes:
                await wait_until(lambda: mes.listed() == {
                    j: "NotAllowedToStart_Ready" for j in ("R1", "R2", "R3")}, 10,
                    "the orders after the restart")
                assert rs(await mes.on_order("Start", "R2")) == NO_ERROR
    run(main(), 90)


def test_the_receivers_variables_follow_the_config_messages(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """WorkMaster, EquipmentID, MaterialClassID, MaterialDefinitionID, PersonnelID,
    PhysicalAssetID and MaxDownloadableJobOrders: what the MES configured over MQTT (any
    host may take a config message), kept current."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, connected(h.port) as mes:
            async def read(name: str) -> Any:
                assert mes.receiver is not None
                return await (await mes.receiver.get_child(f"{mes.jc}:{name}")).read_value()

            assert await read("EquipmentID") == ["STATION-10"]
            assert await read("MaterialClassID") == ["AXLE"]
            assert await read("MaterialDefinitionID") == ["AXLE-FRONT-V2"]
            assert await read("PersonnelID") == ["OPERATOR-L1"]
            assert await read("PhysicalAssetID") == ["NUTRUNNER-SN-4711"]
            assert await read("MaxDownloadableJobOrders") == 10_000
            [wm] = await read("WorkMaster")
            assert wm.ID == WM and wm.Parameters[0].ID == "torque_spec"
            assert wm.Parameters[0].Value.Value == 85
            # changes over MQTT: an id deleted, one added, a limit, a Work Master gone
            m = h.mqtt_mes
            await m.call(f"{CFG}equipment.v1", {"ID": "STATION-10"}, method="DELETE")
            await m.call(f"{CFG}equipment.v1", {"ID": "STATION-11"})
            await m.call(f"{CFG}jobacceptance.v1", {"max_downloadable_job_orders": 25})
            await m.call(CFG + "workmaster.v1", {"ID": WM}, method="DELETE")

            async def changed() -> bool:
                return (await read("EquipmentID") == ["STATION-11"]
                        and await read("MaxDownloadableJobOrders") == 25
                        and not await read("WorkMaster"))
            for _ in range(50):
                if await changed():
                    break
                await asyncio.sleep(0.1)
            assert await changed()
    run(main(), 60)


def test_a_filter_on_the_abstract_event_type_receives_the_events(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """An event filter ``OfType ISA95JobOrderStatusEventType`` (the model's abstract
    type, as UaExpert and node-opcua filter) receives the face's events, which are of
    its subtype."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, connected(h.port) as mes:
            got: list[Any] = []

            class Handler:
                def event_notification(self, event: Any) -> None:
                    got.append(event)
            sub = await mes.client.create_subscription(50, Handler())
            abstract = mes.client.get_node(ua.NodeId(1006, mes.jc))
            flt = await get_filter_from_event_type([abstract], where_clause_generation=False)
            flt.WhereClause = ua.ContentFilter(Elements=[ua.ContentFilterElement(
                FilterOperator=ua.FilterOperator.OfType,
                FilterOperands=[ua.LiteralOperand(Value=ua.Variant(abstract.nodeid))])])
            assert mes.provider is not None
            await sub.subscribe_events(mes.provider, abstract, evfilter=flt)
            assert rs(await mes.store("Store", order("F1"))) == NO_ERROR
            await wait_until(lambda: got, 10, "an event through the OfType filter")
            assert got[0].JobOrder.JobOrderID == "F1"
    run(main(), 60)


def test_events_are_built_only_for_a_subscriber(redis_url: str, mqtt_url: str,
                                                tmp_path: Path) -> None:
    """The face raises a scope's status events only while a client takes them (it asks
    asyncua's subscriptions, a private map the [opcua] extra's pin keeps); the lists,
    watched here, follow every change either way."""
    async def main() -> None:
        metrics = free_port()
        async with running(tmp_path, redis_url, mqtt_url,
                           more=f"metrics_port = {metrics}\n") as h:
            async def raised() -> float:
                return await metric(metrics, "sfc_opcua_events_total")
            client = Client(f"opc.tcp://127.0.0.1:{h.port}/sfc-host/")
            async with client:
                await client.load_data_type_definitions()
                mes = Mes95(client)
                await mes.find(SCOPE)
                sub = await client.create_subscription(50, mes)
                assert mes.receiver is not None
                await sub.subscribe_data_change(
                    await mes.receiver.get_child(f"{mes.jc}:JobOrderList"))
                assert rs(await mes.store("Store", order("Q1"))) == NO_ERROR
                await wait_until(lambda: "Q1" in mes.listed(), 10, "Q1 listed")
                assert await raised() == 0
            async with connected(h.port) as mes:
                assert rs(await mes.store("Store", order("Q2"))) == NO_ERROR
                await wait_until(lambda: mes.states("Q2"), 10, "Q2's event")
                assert mes.states("Q1") == [] and await raised() >= 1
    run(main(), 60)


def test_the_lists_are_written_for_a_watcher_or_a_reader_only(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Nobody watches JobOrderList: orders change and the lists are not rewritten; a
    read of them brings them up to date first, so it shows every order stored. A
    monitored item made later gets the current list, then each change."""
    async def main() -> None:
        metrics = free_port()
        async with running(tmp_path, redis_url, mqtt_url,
                           more=f"metrics_port = {metrics}\n") as h:
            async def rewrites() -> float:
                return await metric(metrics, "sfc_opcua_list_seconds_count")

            def ids(entries: Any) -> set[str]:
                return {e.JobOrder.JobOrderID for e in entries or []}
            client = Client(f"opc.tcp://127.0.0.1:{h.port}/sfc-host/")
            async with client:
                await client.load_data_type_definitions()
                mes = Mes95(client)
                await mes.find(SCOPE)
                assert mes.receiver is not None
                node = await mes.receiver.get_child(f"{mes.jc}:JobOrderList")
                await asyncio.sleep(0.5)
                before = await rewrites()
                for job in ("L1", "L2", "L3"):
                    assert rs(await mes.store("Store", order(job))) == NO_ERROR
                await asyncio.sleep(1.0)            # five list intervals
                assert await rewrites() == before
                assert ids(await node.read_value()) >= {"L1", "L2", "L3"}
                assert await rewrites() == before + 1
                assert ids(await node.read_value()) >= {"L1", "L2", "L3"}
                assert await rewrites() == before + 1   # nothing changed since
                sub = await client.create_subscription(50, mes)
                await sub.subscribe_data_change(node)
                assert rs(await mes.store("Store", order("L4"))) == NO_ERROR
                await wait_until(lambda: {"L1", "L4"} <= set(mes.listed()), 10,
                                 "the watched list with L4")
    run(main(), 60)


def _both(job: str, params: list[tuple[str, str | int]], equipment: str = "STATION-10"
          ) -> tuple[dict[str, Any], Any]:
    """One order as the MQTT face's request data and as an OPC UA JobOrder."""
    doc = {"JobOrder": {"JobOrderID": job, "WorkMasterID": [{"ID": WM}],
                        "EquipmentRequirements": [{"ID": equipment}],
                        "JobOrderParameters": [{"ID": i, "Value": v} for i, v in params]}}
    return doc, order(job, EquipmentRequirements=[ua.ISA95EquipmentDataType(ID=equipment)],
                      JobOrderParameters=[ua.ISA95ParameterDataType(ID=i, Value=ua.Variant(v))
                                          for i, v in params])


def test_the_same_limits_on_both_faces(redis_url: str, mqtt_url: str,
                                       tmp_path: Path) -> None:
    """An order is refused over OPC UA exactly where the same order is refused over
    MQTT, with the same ReturnStatus, and nothing is stored: its encoded size against
    mqtt_max_payload (its status events must fit), the entries of its lists, the length
    of its strings. An order over mqtt_max_payload never reaches the MQTT face (the
    link passes it over unread, no reply); over OPC UA it is refused the same way."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, connected(h.port) as mes:
            big = "x" * 61_500
            cases: list[tuple[str, list[tuple[str, str | int]], str, int]] = [
                # 17 values of 61,500 characters: the request fits mqtt_max_payload,
                # the order's status events would not
                ("size", [(f"p{i}", big) for i in range(17)], "STATION-10", 2**32),
                # 998 parameters, a Work Master and a requirement: 1,000 entries
                ("entries", [(f"p{i}", i) for i in range(998)], "STATION-10", NO_ERROR),
                ("entries+1", [(f"p{i}", i) for i in range(999)], "STATION-10", 2**32),
                ("long id", [], "S" * 257, 2**32),
                ("long value", [("p", "v" * 65_537)], "STATION-10", 2**32),
            ]
            for n, (what, params, equipment, want) in enumerate(cases):
                doc, _ = _both(f"M{n}", params, equipment)
                rep = await h.mqtt_mes.call(JC + "Store.v2", doc)
                _, ua_order = _both(f"U{n}", params, equipment)
                r = await mes.store("Store", ua_order)
                assert (rep["data"]["ReturnStatus"], rs(r)) == (want, want), what
                if want != NO_ERROR:
                    assert r.StatusCode.value == ua.StatusCodes.Uncertain, what
                    for job in (f"M{n}", f"U{n}"):
                        assert rs(await mes.on_order("Start", job)) == UNKNOWN_ID, job
            assert "mqtt_max_payload" in h.mqtt_mes.replies[
                next(iter(h.mqtt_mes.replies))]["data"].get("Message", "mqtt_max_payload")
            # 2 MB: the MQTT face never reads it; OPC UA refuses it as too large
            doc, ua_order = _both("B1", [(f"p{i}", big) for i in range(34)])
            rid = await h.mqtt_mes.send(JC + "Store.v2", doc)
            r = await mes.store("Store", ua_order)
            assert r.StatusCode.value == ua.StatusCodes.Uncertain and rs(r) == 2**32
            await asyncio.sleep(1)
            assert rid not in h.mqtt_mes.replies
            assert rs(await mes.on_order("Start", "B1")) == UNKNOWN_ID
    run(main(), 120)


def test_an_order_opc_ua_cannot_carry_leaves_the_others_listed(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The MQTT face takes any integer Priority (as the original does); OPC UA's is an
    Int16. An order of Priority 40,000 is left out of the OPC UA lists and events, said
    in the log, and the orders around it are listed and raised as ever."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, connected(h.port) as mes:
            # P0 starts a rewrite of the lists; P1 and P2 are stored while it rests,
            # so the next rewrite takes both at once
            for job, priority in (("P0", 1), ("P1", 40_000), ("P2", 3)):
                doc, _ = _both(job, [])
                doc["JobOrder"]["Priority"] = priority
                rep = await h.mqtt_mes.call(JC + "Store.v2", doc)
                assert rep["data"]["ReturnStatus"] == NO_ERROR
            await wait_until(lambda: {"P0", "P2"} <= set(mes.listed()), 10, "P2 listed")
            await wait_until(lambda: mes.states("P2"), 10, "P2's event")
            assert "P1" not in mes.listed() and mes.states("P1") == []
    run(main(), 60)


def test_a_second_store_of_a_running_order_is_refused_on_both_faces(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """A Store of the id of a running order with another order is refused
    (UNABLE_TO_ACCEPT_JOB_ORDER) over OPC UA as over MQTT, and changes nothing; the
    same order again is a repeat (an MES whose reply was lost): Good, nothing changes."""
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, connected(h.port) as mes:
            # no station answers: the job stays Running
            assert rs(await mes.store("StoreAndStart", order("R1"))) == NO_ERROR
            await wait_until(lambda: "Running" in mes.states("R1"), 10, "R1 runs")
            r = await mes.store("Store", order("R1", Priority=7))
            assert r.StatusCode.value == ua.StatusCodes.Uncertain and rs(r) == UNABLE
            doc = {"JobOrder": {"JobOrderID": "R1", "WorkMasterID": [{"ID": WM}],
                                "EquipmentRequirements": [{"ID": "STATION-10"}],
                                "Priority": 7}}
            assert await h.mqtt_mes.status("Store", doc) == UNABLE
            # the same order again, by either face: a repeat
            del doc["JobOrder"]["Priority"]
            for method in ("Store", "StoreAndStart"):
                assert rs(await mes.store(method, order("R1"))) == NO_ERROR, method
                assert await h.mqtt_mes.status(method, doc) == NO_ERROR, method
            await asyncio.sleep(0.5)
            assert mes.states("R1")[-1] == "Running" and mes.states("R1").count("Running") == 1
            assert mes.listed()["R1"] == "Running"
    run(main(), 90)


# ---- the conversions, with the NodeSet loaded in this process (after the client tests)


def test_the_changes_of_lists_nobody_reads_are_bounded(
        redis_url: str, mqtt_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``PENDING_MAX`` changes of lists nobody watches or reads, the face
    keeps none and loads the lists afresh at the next read: memory does not grow with
    the orders a host runs, and the read still shows every order."""
    from helpers.hosts import flush, one_step, quick_config

    from sfc_host.opcua import lists as lists_module
    from sfc_host.service.app import App

    monkeypatch.setattr(lists_module, "PENDING_MAX", 3)

    async def main() -> None:
        await flush(redis_url)
        cfg = quick_config(redis_url, mqtt_url=mqtt_url, scopes=[SCOPE], consumer="lists",
                           opcua=True, opcua_security=["None"],
                           opcua_endpoint=f"opc.tcp://127.0.0.1:{free_port()}/x/")
        async with App(cfg) as app:
            face = app.opcua
            assert face is not None
            await app.host.store.put_work_master(SCOPE, one_step())
            await wait_until(lambda: SCOPE in face.lists.scopes, 10, "the scope's objects")
            lists = face.lists.scopes[SCOPE]
            await face.lists.rewrite(SCOPE)         # loaded from Redis: nothing pending
            assert lists.loaded_at > 0 and not lists.stale
            for i in range(8):
                await app.host.orders.store_order(
                    SCOPE, {"JobOrderID": f"B{i}", "WorkMasterID": [{"ID": "quick"}]},
                    start=False)
            await wait_until(lambda: lists.loaded_at < 0, 10, "the changes let go")
            assert len(lists.changed) <= 3 and not lists.prebuilt
            await face.lists.rewrite(SCOPE)
            assert {f"B{i}" for i in range(8)} <= set(lists.listed)
    run(main(), 60)
