"""The OPC UA face's security as plants run it, against ``sfc-host run``: the PKI
folder and users made by ``sfc-host opcua cert`` and ``sfc-host opcua user``,
Basic256Sha256 SignAndEncrypt and Sign, users with roles, anonymous sessions that may
only look, an untrusted client refused and its certificate kept for an administrator
to trust, and no security None offered."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asyncua import Client, ua
from asyncua.ua.uaerrors import UaStatusCodeError
from helpers.aio import run
from helpers.hosts import flush, stop_cleanly
from helpers.opcua import SE, SIGN, Site, host_cli, order, rs


async def _refused(site: Site, **kw: Any) -> str:
    """The status a connection is refused with."""
    with pytest.raises((UaStatusCodeError, OSError, TimeoutError)) as e:
        async with site.client(**kw):
            pass
    return type(e.value).__name__ + ": " + str(e.value)


def test_the_security_matrix(redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        site = Site(tmp_path, redis_url, mqtt_url)
        await site.make()
        host = await site.start()
        assert "OPC UA on" in site.checked and "3 users, anonymous browse" in site.checked
        try:
            # an operator over SignAndEncrypt, and over Sign: calls go through
            async with site.client() as mes:
                assert rs(await mes.store("Store", order("S1"))) == 1
                # a query, which an MES may poll: answered, logged at DEBUG only
                got = await mes.call("RequestJobResponseByJobOrderID",
                                     ua.Variant("S1", ua.VariantType.String))
                assert got.StatusCode.is_good() or got.StatusCode.is_uncertain()
            async with site.client(mode=SIGN) as mes:
                assert rs(await mes.on_order("Cancel", "S1")) == 1
            # an X.509 user token: alice may call
            async with site.client(user=None, x509_user="alice") as mes:
                assert rs(await mes.store("Store", order("S4"))) == 1
            # ... a certificate nobody is: refused
            why = await _refused(site, user=None, x509_user="evil")
            assert "BadUserAccessDenied" in why, why
            for p in (site.pki / "rejected").iterdir():
                p.unlink()      # evil's, refused as a user: not what the next check counts
            # a wrong password
            why = await _refused(site, password="wrong-pass")
            assert "BadUserAccessDenied" in why, why
            # a reader: looks, subscribes; a call is refused, the method's result
            # BadUserAccessDenied
            denied = ua.StatusCodes.BadUserAccessDenied
            async with site.client(user="viewer") as mes:
                assert await mes.receiver.read_browse_name()   # type: ignore[union-attr]
                assert (await mes.store("Store", order("S2"))).StatusCode.value == denied
            # anonymous: the same
            async with site.client(user=None) as mes:
                assert (await mes.on_order("Start", "S1")).StatusCode.value == denied
            # an untrusted client is refused, its certificate kept for the administrator
            why = await _refused(site, cert="evil")
            assert "BadSecurityChecksFailed" in why or "BadUserAccessDenied" in why, why
            rejected = list((site.pki / "rejected").iterdir())
            assert len(rejected) == 1
            # ... also when its CreateSession names no certificate, or a trusted one
            # (certificates are public): its channel's certificate decides
            good = (tmp_path / "clients" / "good.der").read_bytes()
            for forge in (b"", good):
                why = await _refused(site, cert="evil", forge=forge)
                assert "BadUserAccessDenied" in why or "BadSecurityChecksFailed" in why, why
            # ... who trusts it: the next connection goes through, no restart
            shutil.move(rejected[0], site.pki / "trusted" / rejected[0].name)
            async with site.client(cert="evil") as mes:
                assert rs(await mes.store("Store", order("S3"))) == 1
            # no security None on offer
            endpoints = await Client(site.url).connect_and_get_server_endpoints()
            assert {e.SecurityMode for e in endpoints} == {SE, SIGN}
        finally:
            stop_cleanly(host)
        assert host.stderr is not None
        log = host.stderr.read()
        assert "OPC UA Store in line1 by op: ReturnStatus 1" in log
        assert "OPC UA Store in line1 by alice: ReturnStatus 1" in log
        assert "a call by viewer refused" in log
        assert "OPC UA RequestJobResponseByJobOrderID" not in log
    run(main(), 120)


def test_the_first_start_with_an_empty_trust_list(redis_url: str, mqtt_url: str,
                                                  tmp_path: Path) -> None:
    """As docs/opcua.md sets a host up: ``opcua cert`` leaves ``trusted/`` empty, and the
    host starts with it, refusing every client until the administrator trusts one (no
    restart). ``run --check`` makes the server the start makes, so it cannot pass where
    the start fails: a file in ``trusted/`` that is no certificate stops both."""
    async def main() -> None:
        await flush(redis_url)
        site = Site(tmp_path, redis_url, mqtt_url)
        await site.make(trust_good=False)
        trusted = site.pki / "trusted"
        assert not list(trusted.iterdir())
        host = await site.start()
        try:
            for cert in ("good", "evil"):
                why = await _refused(site, cert=cert)
                assert "BadSecurityChecksFailed" in why or "BadUserAccessDenied" in why, why
            rejected = {p.name: p for p in (site.pki / "rejected").iterdir()}
            assert len(rejected) == 2
            good = next(p for p in rejected.values()
                        if p.read_bytes() == (tmp_path / "clients" / "good.der").read_bytes())
            shutil.move(good, trusted / good.name)
            async with site.client() as mes:
                assert rs(await mes.store("Store", order("T1"))) == 1
            why = await _refused(site, cert="evil")
            assert "BadSecurityChecksFailed" in why or "BadUserAccessDenied" in why, why
            # the last trusted certificate taken away: nobody again
            (trusted / good.name).unlink()
            why = await _refused(site)
            assert "BadSecurityChecksFailed" in why or "BadUserAccessDenied" in why, why
        finally:
            stop_cleanly(host)
        assert host.stderr is not None
        log = host.stderr.read()
        assert "refused: not trusted" in log and "OPC UA Store in line1 by op" in log
        (trusted / "junk.der").write_bytes(b"not a certificate")
        for args in (("run", "--check"), ("run",)):
            got = host_cli(*args, "--config", str(site.conf))
            assert got.returncode == 2, (args, got.stderr[-2000:])
            assert "is not a certificate" in got.stderr.strip().splitlines()[-1], got.stderr
    run(main(), 120)


def test_security_none_beside_sign_and_encrypt(redis_url: str, mqtt_url: str,
                                               tmp_path: Path) -> None:
    """``opcua_security = ["None", "SignAndEncrypt"]`` on loopback with anonymous calls:
    a None channel has no certificate to check, so its anonymous and user-name sessions
    go through (a reader still may only look, a wrong password is refused and logged);
    the secure endpoint still checks the trust list."""
    async def main() -> None:
        await flush(redis_url)
        site = Site(tmp_path, redis_url, mqtt_url,
                    'opcua_security = ["None", "SignAndEncrypt"]\nopcua_anonymous = "call"\n')
        await site.make()
        host = await site.start()
        try:
            endpoints = await Client(site.url).connect_and_get_server_endpoints()
            assert {e.SecurityMode for e in endpoints} == {SE, ua.MessageSecurityMode.None_}
            async with site.client(mode=None, user=None) as mes:
                assert rs(await mes.store("Store", order("N1"))) == 1
            async with site.client(mode=None) as mes:
                assert rs(await mes.on_order("Start", "N1")) == 1
            async with site.client(mode=None, user="viewer") as mes:
                assert (await mes.store("Store", order("N2"))).StatusCode.value == \
                    ua.StatusCodes.BadUserAccessDenied
            why = await _refused(site, mode=None, password="wrong-pass")
            assert "BadUserAccessDenied" in why, why
            async with site.client() as mes:
                assert rs(await mes.store("Store", order("N3"))) == 1
            why = await _refused(site, cert="evil")
            assert "BadSecurityChecksFailed" in why or "BadUserAccessDenied" in why, why
        finally:
            stop_cleanly(host)
        assert host.stderr is not None
        log = host.stderr.read()
        assert "OPC UA Store in line1 by anonymous: ReturnStatus 1" in log
        assert "OPC UA Start in line1 by op: ReturnStatus 1" in log
        assert "user 'op' refused: unknown user or wrong password" in log
        assert "a call by viewer refused" in log
    run(main(), 120)


def test_a_certificate_for_another_server_stops_the_start_in_one_line(
        tmp_path: Path, redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        site = Site(tmp_path, redis_url, mqtt_url)
        await site.make()
        # the same folder for a host of another name: its URI differs
        other = tmp_path / "other.toml"
        other.write_text(site.conf.read_text().replace('consumer = "secure"',
                                                       'consumer = "other"'))
        got = host_cli("run", "--check", "--config", str(other))
        assert got.returncode == 2
        [line] = got.stderr.strip().splitlines()
        assert "urn:sfc-fast:127.0.0.1:other" in line and "sfc-host opcua cert --force" in line
        # a users file with a bad line
        site.users.write_text("op admin nothash\n")
        got = host_cli("run", "--check", "--config", str(site.conf))
        assert got.returncode == 2 and "line 1" in got.stderr
        # None off loopback without opcua_allow_insecure
        bad = tmp_path / "bad.toml"
        bad.write_text(site.conf.read_text().replace("127.0.0.1:", "0.0.0.0:") +
                       'opcua_security = ["None"]\n')
        got = host_cli("run", "--check", "--config", str(bad))
        assert got.returncode == 2 and "opcua_allow_insecure" in got.stderr
    run(main(), 60)


def test_opcua_without_the_extra_is_refused_in_one_line(tmp_path: Path) -> None:
    """As if the extra's cryptography were not installed: ``opcua = true`` stops the
    host before it connects anywhere, in one line that says what to install."""
    code = """
import importlib.abc, sys
class NoCrypto(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoCrypto())
from sfc_host.config import ConfigError, HostConfig
from sfc_host.service.app import App
try:
    App(HostConfig(opcua=True, opcua_security=["None"]))
except ConfigError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("refused: setting opcua: the OPC UA face's crypto "
                                  "(cryptography) is not installed: pip install "
                                  "'sfc-fast[opcua]'"), \
        out.stdout
