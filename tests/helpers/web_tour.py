"""The operator's tour of the web view in a real browser, for the browser test and the
screenshot command (``tests/helpers/screenshots.py``): headless chromium driven by
selenium against ``sfc-host run`` with ``web = true`` and ``web_control = true``, real
redis-server and mosquitto, an MES and a station on MQTT. It follows a running job from
the scopes page to its own page, sees its steps turn active and finished without a
reload, pauses and resumes it with the buttons, sees it complete; ``sfc-host web``
beside it shows no buttons and refuses a POST; the hostile-names recipe renders as text.

Without chromium, chromedriver or selenium, importing this module skips (the importing
test module; the screenshot command says why)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import redis.asyncio as aioredis

from helpers.hosts import flush, start_sfc_host, work_master
from helpers.mes import JC, Mes
from helpers.mqtt_station import MqttStation
from helpers.servers import free_port
from helpers.web_helpers import (
    HOSTILE,
    HOSTILE_JOB,
    HOSTILE_STEP,
    hostile_order,
    hostile_work_master,
)
from sfc_host.store.keys import SCOPES, ScopeKeys

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                               "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
S = "line7"
FLOW = "order-4711"           # the job the test follows
GATED = ("com.example.cell.load.v1", "com.example.cell.tighten.v1")

if CHROMIUM is None or DRIVER is None:
    pytest.skip("chromium and chromedriver not found (apt install chromium chromium-driver; "
                ".ci/setup does)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


class Gate:
    """The station's answers: FLOW's load and tighten wait until released; everything
    else (other jobs, hold and release commands) is answered at once."""

    def __init__(self) -> None:
        self.held: list[dict[str, Any]] = []
        self.open = False

    def __call__(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        if not self.open and FLOW in (cmd["id"] or "") and cmd["type"] in GATED:
            self.held.append(cmd)
            return None
        if cmd["type"] == "com.example.cell.tighten.v1":
            return {"Outcome": "completed", "Result": {"torque": 85}}
        if cmd["type"] == "com.example.x.v1":
            return None            # the hostile job stays where it is
        return {}

    async def release(self, station: MqttStation, kind: str, data: dict[str, Any]) -> None:
        for cmd in [c for c in self.held if c["type"] == kind]:
            self.held.remove(cmd)
            await station.reply(cmd, data)


def chrome() -> Any:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # CSP reports, errors
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(DRIVER))


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


def wait_for(driver: Any, what: str, pred: Callable[[Any], Any], timeout: float = 15) -> Any:
    # the page replaces its parts as updates come: an element read may go stale, which
    # Chrome also reports as a node that "does not belong to the document"
    def tried(d: Any) -> Any:
        try:
            return pred(d)
        except WebDriverException as e:
            if "does not belong to the document" in str(e):
                return False
            raise
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(tried, what)


def classes(driver: Any, kind: str, name: str) -> set[str]:
    for g in driver.find_elements(By.CSS_SELECTOR, f"#chart g.{kind}"):
        if g.get_attribute("data-name") == name:
            return set((g.get_attribute("class") or "").split())
    return set()


def order_state(driver: Any) -> str:
    return driver.find_element(By.CSS_SELECTOR, "#summary dd.order-state").text


def press(driver: Any, method: str) -> str:
    """A control button pressed; the message the page then shows."""
    driver.find_element(By.CSS_SELECTOR, f'form.controls button[value="{method}"]').click()
    shown = wait_for(driver, f"the return status of {method}", lambda d: [
        p.text for p in d.find_elements(By.CSS_SELECTOR, "p.flash") if method in p.text])
    return str(shown[0])


def no_alert(driver: Any) -> bool:
    try:
        return driver.switch_to.alert is None
    except NoAlertPresentException:
        return True


async def _setup(redis_url: str) -> None:
    await flush(redis_url)
    r = aioredis.Redis.from_url(redis_url)
    try:
        k = ScopeKeys(S)
        await r.sadd(SCOPES, S)
        await r.set(k.work_master("WM-AXLE"), json.dumps(work_master("tighten_rework",
                                                                      "WM-AXLE")))
        wm = hostile_work_master()
        await r.set(k.work_master(wm["ID"]), json.dumps(wm))
    finally:
        await r.aclose()


async def tour(redis_url: str, mqtt_url: str, workdir: Path, shots: Path) -> None:
    """The operator's tour, every check on the way; screenshots into ``shots``."""
    await _setup(redis_url)
    port, ro_port = free_port(), free_port()
    conf = workdir / "host.toml"
    conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                    f'consumer = "web-browser"\nscopes = ["{S}"]\nmetrics_port = {port}\n'
                    'web = true\nweb_control = true\nmes_acceptance = ["work_master"]\n'
                    "sweep_interval_ms = 50\ndiscover_interval_ms = 100\n")
    host = start_sfc_host(["run", "--config", str(conf)], {}, "host web-browser running")
    viewer = start_sfc_host(["web", "--config", str(conf), "--port", str(ro_port)], {},
                            "web view on")
    gate = Gate()
    driver = await in_thread(chrome)
    base = f"http://127.0.0.1:{port}"
    try:
        async with Mes(mqtt_url, scope=S) as mes, MqttStation(mqtt_url, gate) as station:
            for job, wm in (("order-4709", "WM-AXLE"), ("order-4710", "WM-AXLE"),
                            (FLOW, "WM-AXLE")):
                rep = await mes.call(JC + "StoreAndStart.v2", {"JobOrder": {
                    "JobOrderID": job, "WorkMasterID": [{"ID": wm}], "Priority": 1}})
                assert rep["data"]["ReturnStatus"] == 1, rep
            rep = await mes.call(JC + "StoreAndStart.v2", {"JobOrder": hostile_order()})
            assert rep["data"]["ReturnStatus"] == 1, rep
            await _flow(driver, base, gate, station, shots)
            await _hostile(driver, base)
            await _read_only(driver, f"http://127.0.0.1:{ro_port}")
            await _stops_with_pages_open(base, [host, viewer])
    finally:
        await in_thread(driver.quit)
        for p in (viewer, host):
            p.send_signal(signal.SIGTERM)
        for p in (viewer, host):
            try:
                assert p.wait(15) == 0
            finally:
                if p.poll() is None:
                    p.kill()


async def _flow(driver: Any, base: str, gate: Gate, station: MqttStation,
                shots: Path) -> None:
    # the scopes page, refreshing itself; from it to the scope's jobs, to the running job
    await in_thread(lambda: driver.get(base + "/"))
    await in_thread(lambda: wait_for(driver, "rates on the scopes page", lambda d: any(
        c.text not in ("", "-") for c in d.find_elements(
            By.CSS_SELECTOR, "table.scopes tbody tr td:nth-child(8)")), 10))
    await in_thread(lambda: driver.save_screenshot(str(shots / "web-scopes.png")))
    await in_thread(lambda: driver.find_element(By.LINK_TEXT, S).click())
    await in_thread(lambda: wait_for(driver, "the jobs table", lambda d: d.find_elements(
        By.LINK_TEXT, FLOW)))
    await in_thread(lambda: driver.save_screenshot(str(shots / "web-jobs.png")))
    await in_thread(lambda: driver.find_element(By.LINK_TEXT, FLOW).click())

    def on_job_page() -> None:
        wait_for(driver, "the live job page", lambda d: d.find_elements(
            By.CSS_SELECTOR, "#live .live-status") and "live" in d.find_element(
            By.CSS_SELECTOR, "#live .live-status").text)
        # a mark in the page's window: it survives only as long as no reload happens
        driver.execute_script("window.sfcMark = 1")
    await in_thread(on_job_page)
    assert await in_thread(lambda: "active" in classes(driver, "step", "Load"))
    assert await in_thread(lambda: "active" in classes(driver, "action", "load_part"))
    # the station answers the load: Load finishes, Tighten turns active, no reload
    await gate.release(station, "com.example.cell.load.v1", {})
    await in_thread(lambda: wait_for(driver, "Load finished and Tighten active", lambda d: (
        "finished" in classes(d, "step", "Load") and "active" in classes(d, "step", "Tighten"))))
    assert await in_thread(lambda: driver.execute_script("return window.sfcMark")) == 1
    # Pause with the button: the MES's return status shown, the order Interrupted
    shown = await in_thread(lambda: press(driver, "Pause"))
    assert shown.startswith("Pause: ReturnStatus 1 (NO_ERROR)"), shown
    await in_thread(lambda: wait_for(driver, "the order Interrupted", lambda d: order_state(
        d).startswith("Interrupted") and "held" in classes(d, "step", "Tighten")))
    shown = await in_thread(lambda: press(driver, "Resume"))
    assert shown.startswith("Resume: ReturnStatus 1 (NO_ERROR)"), shown
    await in_thread(lambda: wait_for(driver, "the order Running again", lambda d: order_state(
        d) == "Running" and "active" in classes(d, "step", "Tighten")))
    await in_thread(lambda: driver.execute_script("window.sfcMark = 2"))
    await in_thread(lambda: driver.save_screenshot(str(shots / "web-job.png")))
    # the tightening answered (every one sent, also one sent again after the resume)
    gate.open = True
    await gate.release(station, "com.example.cell.tighten.v1",
                       {"Outcome": "completed", "Result": {"torque": 85}})
    await in_thread(lambda: wait_for(driver, "the job complete", lambda d: order_state(
        d) == "Ended_Completed" and "finished" in classes(d, "step", "Unload")
        and not classes(d, "step", "Tighten") & {"active", "held"}, 20))
    assert await in_thread(lambda: driver.execute_script("return window.sfcMark")) == 2
    timeline = await in_thread(lambda: driver.find_element(By.ID, "timeline").text)
    assert "tighten completed" in timeline and "unload_part sent" in timeline
    # the strict CSP blocked nothing the pages use, and their script raised nothing
    logs = await in_thread(lambda: driver.get_log("browser"))
    assert not [e for e in logs if e["level"] == "SEVERE"], logs


async def _hostile(driver: Any, base: str) -> None:
    url = f"{base}/scopes/{S}/job?id={quote(HOSTILE_JOB, safe='')}"
    await in_thread(lambda: driver.get(url))
    await in_thread(lambda: wait_for(driver, "the hostile job's chart", lambda d: d.find_elements(
        By.CSS_SELECTOR, "#chart g.step")))
    await asyncio.sleep(0.6)     # a live update or two have come in
    assert await in_thread(lambda: no_alert(driver))
    assert await in_thread(lambda: driver.find_element(By.TAG_NAME, "h1").text) == \
        f"Job {HOSTILE_JOB}"
    assert await in_thread(lambda: driver.find_elements(By.TAG_NAME, "img")) == []
    assert await in_thread(lambda: len(driver.find_elements(By.TAG_NAME, "script"))) == 1
    assert await in_thread(lambda: "active" in classes(driver, "step", HOSTILE))
    assert await in_thread(lambda: "finished" in classes(driver, "step", HOSTILE_STEP))


async def _stops_with_pages_open(base: str, procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM with live pages open (the browser's on the read-only view, a stream on
    the host): each process ends its streams and exits 0 within seconds."""
    async with aiohttp.ClientSession() as session, \
            session.get(f"{base}/scopes/{S}/live", params={"id": FLOW}) as r:
        assert (await r.content.readline()).startswith(b"data: ")
        t0 = time.monotonic()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert await in_thread(lambda p=p: p.wait(10)) == 0
        assert time.monotonic() - t0 < 5
        # the host's stream ended with it (no more updates, no hang)
        rest = await asyncio.wait_for(r.content.read(), 5)
        assert b"data: " not in rest


async def _read_only(driver: Any, base: str) -> None:
    await in_thread(lambda: driver.get(f"{base}/scopes/{S}/job?id={FLOW}"))
    await in_thread(lambda: wait_for(driver, "the read-only job page", lambda d: order_state(
        d) == "Ended_Completed"))
    assert await in_thread(lambda: driver.find_elements(By.TAG_NAME, "button")) == []
    status = await in_thread(lambda: driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"fetch('/scopes/{S}/control', {{method: 'POST', body: new URLSearchParams("
        f"{{id: '{FLOW}', method: 'Clear', csrf: 'x'}})}}).then(r => done(r.status));"))
    assert status == 403
