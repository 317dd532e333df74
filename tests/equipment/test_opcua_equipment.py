"""Equipment over OPC UA: recipes run against PackML units and OPC UA methods on a real
asyncua server (the example units of ``sfc_host.examples.packml_unit``), with a real
Redis and broker and a whole host (``App``). The unit is the PLC: the host drives its
state machine, never sends a Start twice, holds it on the job's hold, stops it on the
job's end, and reads a failed action's stop reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until
from helpers.opcua_equipment import (
    THREE,
    Plant,
    S,
    equipment_file,
    kill_mid_action,
    recipe,
    response_data,
    secured,
    weigh_jobs,
    weigh_puts,
)
from helpers.servers import free_port

from sfc_host.config import ConfigError
from sfc_host.equipment.opcua.settings import load
from sfc_host.examples.packml_unit import build
from sfc_host.service.app import App


def test_a_recipe_of_three_actions_on_two_units_runs_to_the_end(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path) as p:
            await p.run_job(THREE, "J1")
            await p.wait_state("J1", "Ended_Completed")
            data = response_data(await p.response("J1"))
            assert data["fill.filled"] == 2.5 and data["fill_again.filled"] == 4.0
            assert await p.starts("Filler1") == 2 and await p.starts("Capper1") == 1
            # each unit reset after its work: Idle for the next job
            await wait_until(lambda: p.units["Filler1"].state == "Idle"
                             and p.units["Capper1"].state == "Idle", 5, "the units reset")
            await p.run_job(THREE, "J2")
            await p.wait_state("J2", "Ended_Completed")
            assert await p.starts("Filler1") == 4
    run(main())


def test_a_unit_that_aborts_fails_its_action_with_the_stop_reason(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path) as p:
            await p.units["Capper1"].nodes["fault"].write_value(True)
            await p.run_job(THREE, "J3")
            await p.wait_state("J3", "Aborted")
            assert p.app is not None
            reason = await p.app.host.client.hget(f"sfc:{{{S}}}:order:J3", "reason")
            assert b"unit capper1 went Aborted" in reason
            assert b"fault injected: jam in the infeed" in reason
            assert await p.starts("Filler1") == 1    # the job went no further
    run(main())


def test_mes_pause_holds_the_unit_and_resume_brings_it_back(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, work_s=3.0) as p:
            assert p.app is not None
            wm = recipe([("fill", "com.example.fill.v1", {"setpoint": 1.0})], hold=True)
            await p.run_job(wm, "J4")
            filler = p.units["Filler1"]
            await wait_until(lambda: filler.state == "Execute", 10, "the unit executing")
            # once the command is marked sent (a hold of work not known to be out is
            # answered "not held" by the host itself, and the work goes on)
            await wait_until(lambda: p.app.host.client.hexists(f"sfc:{{{S}}}:job:J4",
                                                               "sent:fill"), 10, "the marker")
            await p.app.host.orders.trigger(S, "J4", "Pause")
            await wait_until(lambda: filler.state == "Held", 10, "the unit held")
            await p.wait_state("J4", "Interrupted")
            await asyncio.sleep(0.3)
            assert filler.state == "Held"
            await p.app.host.orders.trigger(S, "J4", "Resume")
            await wait_until(lambda: filler.state in ("Execute", "Complete", "Idle"), 10,
                             "the unit executing again")
            await p.wait_state("J4", "Ended_Completed")
            assert await p.starts("Filler1") == 1     # Unhold, not a second Start
    run(main())


def test_an_aborted_job_stops_its_unit(redis_url: str, mqtt_url: str,
                                       tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, work_s=5.0) as p:
            assert p.app is not None
            await p.run_job(THREE, "J5")
            filler = p.units["Filler1"]
            await wait_until(lambda: filler.state == "Execute", 10, "the unit executing")
            await p.app.host.orders.trigger(S, "J5", "Abort")
            await wait_until(lambda: filler.state == "Stopped", 10, "the unit stopped")
            await p.wait_state("J5", "Aborted")
    run(main())


def test_a_command_sent_again_is_not_started_twice(redis_url: str, mqtt_url: str,
                                                   tmp_path: Path) -> None:
    """Another host's death has every open command sent again: the unit's command id
    says it took this one, so the host follows it instead of starting it again."""
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, work_s=3.0) as p:
            assert p.app is not None
            await p.run_job(THREE, "J6")
            filler = p.units["Filler1"]
            await wait_until(lambda: filler.state == "Execute", 10, "the unit executing")
            assert await p.app.host.resend_open() == 1
            await p.wait_state("J6", "Ended_Completed")
            assert await p.starts("Filler1") == 2 and await p.starts("Capper1") == 1
    run(main())


def test_a_method_call_action_and_its_bad_status(redis_url: str, mqtt_url: str,
                                                 tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, method=True) as p:
            await weigh_jobs(p)
    run(main())


def test_the_equipment_file_mistakes_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "eq.toml"
    cases = [
        ("[[server]]\nname='a'\nendpoint='http://x'\n", "use opc.tcp://"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\n[[unit]]\nequipment='u'\n"
         "server='b'\nscopes=['s']\nnode='n'\ntypes=['t']\ncommand_id='c'\n",
         "server 'b' is not a [[server]]"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\n[[unit]]\nequipment='u'\n"
         "server='a'\nscopes=['s']\nnode='n'\ntypes=['t']\n", "command_id is a non-empty"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\nsecurity='SignAndEncrypt'\n",
         "certificate and private_key"),
        ("[[thing]]\n", "unknown section 'thing'"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\nuser_certificate='u.der'\n",
         "user_certificate and user_private_key go together"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\nuser_certificate='u.der'\n"
         "user_private_key='u.pem'\nusername='sfc'\n", "a session has one user"),
        ("[[server]]\nname='a'\nendpoint='opc.tcp://h:1'\nuser_certificate='u.der'\n"
         "user_private_key='u.pem'\n", "user_certificate 'u.der' is not a file"),
    ]
    for text, want in cases:
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            load(f)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_work_master_put_is_checked_against_the_bindings(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Over the MES wire, as an MES of the original sends it: a Work Master whose
    method parameters do not match the method's arguments by name and type, or whose
    action type no binding (and no announced station) serves, is refused with the
    compiler's kind of codes; a matching one is stored."""
    from helpers.mes import WM, Mes

    from sfc_host.store.orders import INVALID_REQUEST

    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, method=True) as p, \
                Mes(mqtt_url, scope=S) as mes:
            assert p.app is not None
            text = await weigh_puts(p.app, mqtt_url, 3.5)
            assert "parameter 'Count': expected a whole number for UInt16" in text
            unbound = recipe([("paint", "com.example.paint.v1", {})], wm_id="wm-unbound")
            rep = await mes.call(WM, unbound, scope=S)
            assert rep["data"]["ReturnStatus"] == INVALID_REQUEST, rep
            assert "SFC025" in rep["data"]["Message"] and "com.example.paint.v1" in \
                rep["data"]["Message"]
    run(main())


def test_a_server_away_mid_action_is_read_from_the_units_state(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The server goes away while its unit works (its network, a restart of the OPC UA
    stack) and the unit completes meanwhile: the host's session comes back, the unit's
    state says Complete, and the action completes, with no second Start."""
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, work_s=1.5) as p:
            assert p.app is not None and p.server is not None
            one = recipe([("fill", "com.example.fill.v1", {"setpoint": 7.0})], wm_id="wm-1")
            await p.run_job(one, "J9")
            filler = p.units["Filler1"]
            await wait_until(lambda: filler.state == "Execute", 10, "the unit executing")
            await p.server.stop()
            eq = p.app.opcua_equipment
            await wait_until(lambda: eq.not_ready(), 10, "the link seen down")
            assert any("plc1" in line for line in eq.not_ready())
            await wait_until(lambda: filler.state == "Complete", 10, "the unit done")
            await p.server.start()
            await p.wait_state("J9", "Ended_Completed", timeout=30)
            assert response_data(await p.response("J9"))["fill.filled"] == 7.0
            assert await p.starts("Filler1") == 1
    run(main())


def test_a_variables_data_changes_are_pull_events(redis_url: str, mqtt_url: str,
                                                  tmp_path: Path) -> None:
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path) as p:
            assert p.app is not None and p.server is not None
            camera = await p.with_variable_events("Camera1.Passed", field="passed")
            wm = recipe([("fill", "com.example.fill.v1", {"setpoint": 1.0})], wm_id="wm-qa")
            wm["data"]["Steps"].append({"Name": "Qa"})
            wm["data"]["Transitions"].append(
                {"Source": "S0", "Target": "Qa", "Condition": "always"})
            wm["data"]["Actions"].append(
                {"Name": "qa", "Step": "Qa", "Qualifier": "N", "Interaction": "pull_event",
                 "TypeId": "com.example.qa_result.v1", "TimeoutSeconds": 20})
            await p.run_job(wm, "J10")
            value = False
            while not (await p.order_state("J10")).startswith(("Ended", "Aborted")):
                value = not value                  # each write is a data change
                await camera.write_value(value)
                await asyncio.sleep(0.2)
            assert (await p.order_state("J10")).startswith("Ended_Completed")
            assert "qa.passed" in response_data(await p.response("J10"))
    run(main())


def test_a_variables_changes_arrive_once_each_over_a_reconnect(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The server goes away twice; after each connect the host subscribes anew, and
    the first value delivered is the variable's value now: a change made while the link
    was away is one event, the same value as before is none, and each later change is
    one event, not one per reconnect. (No job waits, so every event the host takes is
    counted as unmatched.)"""
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path) as p:
            assert p.app is not None and p.server is not None
            camera = await p.with_variable_events("Camera2.Passed")
            assert p.app is not None
            eq = p.app.opcua_equipment
            metrics = p.app.metrics
            await wait_until(lambda: not eq.not_ready(), 15, "the units bound")
            await asyncio.sleep(0.3)
            assert metrics["events_unmatched"] == 0      # the first value is the state
            await camera.write_value(True)
            await wait_until(lambda: metrics["events_unmatched"] == 1, 10, "one event")
            for value in (False, False):
                await p.server.stop()
                await wait_until(lambda: eq.not_ready(), 10, "the link seen down")
                await camera.write_value(value)      # changed, then not, while away
                await p.server.start()
                await wait_until(lambda: not eq.not_ready(), 30, "the link back")
                await asyncio.sleep(1.0)             # the new subscription's first value
                assert metrics["events_unmatched"] == 2
            for n, value in ((3, True), (4, False)):
                await camera.write_value(value)
                await wait_until(lambda n=n: metrics["events_unmatched"] >= n, 10, "an event")
                await asyncio.sleep(0.5)
                assert metrics["events_unmatched"] == n
    run(main())


def test_a_host_killed_mid_action_is_finished_by_another_with_no_second_start(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Two ``sfc-host run`` processes share the units; the one that started a unit is
    killed (SIGKILL) while the unit works. The other takes over the death, sends the
    open command again, reads from the unit that it took that command already, follows
    it to Complete, and runs the job to its end: each unit started once per action."""
    async def main() -> None:
        port = free_port()
        server, units = await build(port, ["Filler1", "Capper1"], 3.0)
        await server.start()

        async def executing() -> bool:
            return bool(units["Filler1"].state == "Execute")

        async def starts(unit: str) -> int:
            return int(await units[unit].nodes["starts"].read_value())
        try:
            await kill_mid_action(redis_url, mqtt_url, tmp_path, port, executing, starts)
        finally:
            await server.stop()
    run(main(), timeout=120)


def test_sign_and_encrypt_with_a_user_and_a_server_certificate_trusted_later(
        redis_url: str, mqtt_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PLC that takes only Basic256Sha256 SignAndEncrypt and a user: the host refuses
    its certificate until an administrator trusts it (kept in rejected/, named in
    /readyz), then connects without a restart and runs a job to its end."""
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        eq_file = equipment_file(tmp_path, port)
        pki, trust = await secured(tmp_path, eq_file, "urn:test:plc1")
        server, units = await build(port, ["Filler1", "Capper1"], 0.05,
                                    certificate=str(pki / "plc.der"),
                                    private_key=str(pki / "plc.pem"),
                                    users={"sfc": "plc-secret-1"})
        await server.start()
        monkeypatch.setenv("PLC1_PASSWORD", "plc-secret-1")
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S], consumer="secure",
                               equipment_opcua=str(eq_file)))
        await app.start(connect_timeout_s=5)
        try:
            eq = app.opcua_equipment
            await wait_until(lambda: any("not in" in line for line in eq.not_ready()), 15,
                             "the untrusted certificate named")
            line = next(line for line in eq.not_ready() if "not in" in line)
            assert "refused and kept in" in line and "\n" not in line
            rejected = list((trust / "rejected").iterdir())
            assert len(rejected) == 1
            rejected[0].rename(trust / rejected[0].name)       # the administrator's step
            await wait_until(lambda: not eq.not_ready(), 30, "the secure session")
            await app.host.store.put_work_master(S, THREE)
            await app.host.orders.store_order(
                S, {"JobOrderID": "SE1", "WorkMasterID": [{"ID": THREE["ID"]}]}, start=True)

            async def ended() -> bool:
                st = await app.host.client.hget(f"sfc:{{{S}}}:order:SE1", "state")
                return bool(st) and st.startswith(b"Ended")
            await wait_until(ended, 20, "the job's end")
            assert await app.host.client.hget(f"sfc:{{{S}}}:order:SE1", "state") == \
                b"Ended_Completed"
            assert int(await units["Filler1"].nodes["starts"].read_value()) == 2
        finally:
            await app.aclose()
            await server.stop()
    run(main(), timeout=90)


def test_a_unit_in_execute_past_the_deadline_is_stopped(redis_url: str, mqtt_url: str,
                                                        tmp_path: Path) -> None:
    """The action's deadline passes while the unit still works: with a retry left the
    unit is stopped and started again for the new attempt; with none the job aborts and
    the unit is stopped."""
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path, work_s=2.5) as p:
            wm = recipe([("fill", "com.example.fill.v1", {"setpoint": 1.0})], wm_id="wm-slow")
            wm["data"]["Actions"][0].update(TimeoutSeconds=1, Retries=1)
            await p.run_job(wm, "J11")
            filler = p.units["Filler1"]
            await wait_until(lambda: filler.state == "Execute", 10, "the unit executing")
            # each attempt times out after 1 s: the unit is stopped, then started anew
            await p.wait_state("J11", "Aborted", timeout=20)
            assert p.app is not None
            reason = await p.app.host.client.hget(f"sfc:{{{S}}}:order:J11", "reason")
            assert b"timed out" in reason and b"attempt 2" in reason, reason
            assert await p.starts("Filler1") == 2
            await wait_until(lambda: filler.state == "Stopped", 10, "the unit stopped")
    run(main())


def test_run_check_reads_the_equipment_file_as_the_start_does(tmp_path: Path) -> None:
    import subprocess
    import sys

    eq = tmp_path / "eq.toml"
    eq.write_text("[[server]]\nname = 'plc1'\nendpoint = 'opc.tcp://127.0.0.1:4841'\n"
                  "[[unit]]\nequipment = 'filler1'\nserver = 'plc1'\nscopes = ['line1']\n"
                  "node = 'ns=2;s=Filler1'\ntypes = ['com.example.fill.v1']\n")
    conf = tmp_path / "host.toml"
    conf.write_text(f'equipment_opcua = "{eq}"\n')

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sfc_host", "run", "--config", str(conf),
                               "--check"], capture_output=True, text=True, timeout=60)
    bad = check()
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "unit[0]: command_id is a non-empty string" in bad.stderr
    eq.write_text(eq.read_text() + "command_id = 'ns=2;s=Filler1.CommandId'\n")
    good = check()
    assert good.returncode == 0, good.stderr
    assert "OPC UA equipment: 1 server, 1 unit, 0 methods, 0 event sources" in good.stdout
