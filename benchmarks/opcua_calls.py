"""OPC UA calls per second: the host's face against a bare asyncua server, in turns.

    python benchmarks/opcua_calls.py                       # the figures of benchmarks.md
    python benchmarks/opcua_calls.py --calls 200 --rounds 1   # a smoke run

Both servers run in a process of their own, as a plant runs them, with the same
security (Basic256Sha256 SignAndEncrypt, an operator with a password, the client's
certificate in ``trusted/``) and are driven by the same asyncua client from this
process:

- the host: ``sfc-host run`` with ``opcua = true``, on a local redis-server and
  mosquitto started here, the reference's Work Master and catalogs configured over MQTT;
- the bare server: asyncua's server, made as a plant would make it with asyncua (the
  same certificate, security and user, the client's certificate checked against
  ``trusted/``, the Job Control NodeSet loaded), with the scope's two objects and their
  methods linked to callbacks that do nothing but answer ReturnStatus 1: the floor of
  the OPC UA stack the face ran on before it had a server of its own.

Each round measures, on one server and then the other: ``--calls`` Stores of new orders,
Starts of those orders, and RequestJobResponseByJobOrderID of an ended order, one call
at a time on one session and then spread over ``--sessions`` sessions at once. Calls/s,
and the server process's CPU per call (from /proc). Goal: the host at >= 0.7x the bare
server's calls/s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from asyncua import Client, ua

SCOPE = "line1"
WM = "WM-AXLE-FIT"          # the reference's Work Master (helpers.mes.configure)
JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/"
OWN_URI = "urn:sfc-fast:opcua"
PASSWORD = "bench-pass-1"
OPS = ("Store", "Start", "RequestJobResponseByJobOrderID")
SE = ua.MessageSecurityMode.SignAndEncrypt
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


# ---- the bare server (run as `opcua_calls.py --bare CONFIG`)


async def bare(config_path: str) -> None:
    from asyncua import Server
    from asyncua.crypto.permission_rules import User, UserRole
    from asyncua.crypto.truststore import TrustStore
    from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions
    from asyncua.server.user_managers import UserManager

    from sfc_host.config import HostConfig
    from sfc_host.opcua.methods import ID_METHODS, ORDER_METHODS, QUERIES
    from sfc_host.opcua.security import Pki, check_password, load_users
    from sfc_host.opcua.server import PROVIDER_TYPE, RECEIVER_TYPE, nodeset_path

    config = HostConfig.load(config_path)
    users = load_users(config.opcua_users_file)

    class Users(UserManager):
        def get_user(self, iserver: Any, username: str | None = None,
                     password: str | None = None, certificate: Any = None) -> User | None:
            known = users.get(username or "")
            if known is None or not check_password(password or "", known[1]):
                return None
            return User(role=UserRole.User, name=username)

    pki = Pki(config.opcua_pki_dir)
    server = Server(user_manager=Users())
    await server.init()
    server.set_endpoint(config.opcua_endpoint)
    await server.load_certificate(str(pki.cert))
    await server.load_private_key(str(pki.key))
    store = TrustStore([pki.trusted], [])
    await store.load_trust()
    server.set_certificate_validator(CertificateValidator(
        CertificateValidatorOptions.TRUSTED_VALIDATION
        | CertificateValidatorOptions.PEER_CLIENT, store))
    server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
    server.set_identity_tokens([ua.UserNameIdentityToken])
    await server.import_xml(str(nodeset_path()))
    jc = await server.get_namespace_index(JC_URI)
    own = await server.register_namespace(OWN_URI)
    folder = await server.nodes.objects.add_folder(ua.NodeId("Scopes", own),
                                                   ua.QualifiedName("Scopes", own))
    top = await folder.add_folder(ua.NodeId(SCOPE, own), ua.QualifiedName(SCOPE, own))
    done = [ua.Variant(1, ua.VariantType.UInt64)]
    none = [ua.Variant(None, ua.VariantType.ExtensionObject), *done]

    async def answer(parent: ua.NodeId, *args: Any) -> list[ua.Variant]:
        return done

    async def query(parent: ua.NodeId, *args: Any) -> list[ua.Variant]:
        return none
    for name, kind, methods in (("JobOrderControl", RECEIVER_TYPE, ORDER_METHODS + ID_METHODS),
                                ("JobOrderResults", PROVIDER_TYPE, QUERIES)):
        obj = await top.add_object(ua.NodeId(f"{SCOPE}.{name}", own),
                                   ua.QualifiedName(name, own),
                                   objecttype=ua.NodeId(kind, jc))
        for m in methods:
            node = await obj.get_child(f"{jc}:{m}")
            server.link_method(node, query if m in QUERIES else answer)
    async with server:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# ---- the client


class Session:
    """One client session on a server: the scope's objects and their methods."""

    def __init__(self, url: str, certs: Path) -> None:
        self.client = Client(url, timeout=30)
        self.client.application_uri = "urn:bench:client"
        self.certs = certs
        self.calls: dict[str, tuple[ua.NodeId, ua.NodeId]] = {}

    async def open(self) -> None:
        from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
        c = self.client
        await c.set_security(SecurityPolicyBasic256Sha256, str(self.certs / "client.der"),
                             str(self.certs / "client.pem"), mode=SE)
        c.set_user("op")
        c.set_password(PASSWORD)
        await c.connect()
        await c.load_data_type_definitions()
        own = await c.get_namespace_index(OWN_URI)
        jc = await c.get_namespace_index(JC_URI)
        for obj, names in (("JobOrderControl", ("Store", "Start", "StoreAndStart", "Abort")),
                           ("JobOrderResults", ("RequestJobResponseByJobOrderID",))):
            node = c.get_node(ua.NodeId(f"{SCOPE}.{obj}", own))
            for name in names:
                self.calls[name] = (node.nodeid, (await node.get_child(f"{jc}:{name}")).nodeid)

    async def close(self) -> None:
        await self.client.disconnect()

    async def call(self, name: str, *args: ua.Variant) -> int:
        obj, method = self.calls[name]
        [r] = await self.client.uaclient.call([ua.CallMethodRequest(
            ObjectId=obj, MethodId=method, InputArguments=list(args))])
        if r.StatusCode.is_bad():
            raise RuntimeError(f"{name}: {r.StatusCode}")
        return int(r.OutputArguments[-1].Value)

    async def op(self, name: str, job: str) -> int:
        none = ua.Variant([], ua.VariantType.LocalizedText, is_array=True)
        if name in ("Store", "StoreAndStart"):
            order = ua.ISA95JobOrderDataType(
                JobOrderID=job, WorkMasterID=[ua.ISA95WorkMasterDataType(ID=WM)],
                EquipmentRequirements=[ua.ISA95EquipmentDataType(ID="STATION-10")])
            return await self.call(name, ua.Variant(order, ua.VariantType.ExtensionObject),
                                   none)
        if name == "RequestJobResponseByJobOrderID":
            return await self.call(name, ua.Variant(job, ua.VariantType.String))
        return await self.call(name, ua.Variant(job, ua.VariantType.String), none)


async def measure(sessions: list[Session], pid: int, name: str, jobs: list[str]
                  ) -> tuple[float, float]:
    """``name`` for each of ``jobs``, spread over the sessions, each session one call at
    a time: calls/s and the server's CPU µs a call."""
    share = [jobs[i::len(sessions)] for i in range(len(sessions))]

    async def one(s: Session, mine: list[str]) -> None:
        for job in mine:
            rs = await s.op(name, job)
            if rs != 1:
                raise RuntimeError(f"{name} {job}: ReturnStatus {rs}")
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    await asyncio.gather(*(one(s, m) for s, m in zip(sessions, share, strict=True)))
    secs, cpu = time.perf_counter() - t0, cpu_s(pid) - cpu0
    return len(jobs) / secs, cpu / len(jobs) * 1e6


class Target:
    """A server under test: its process, URL and the sessions open on it."""

    def __init__(self, name: str, proc: subprocess.Popen[str], url: str) -> None:
        self.name = name
        self.proc = proc
        self.url = url
        self.sessions: list[Session] = []


async def round_on(t: Target, args: argparse.Namespace, r: int,
                   rows: dict[tuple[str, str, int], list[tuple[float, float]]]) -> None:
    for n in dict.fromkeys((1, args.sessions)):
        jobs = [f"{t.name[0]}{r}-{n}-{i}" for i in range(args.calls)]
        if "Start" in args.ops and "Store" not in args.ops:
            await measure(t.sessions[:n], t.proc.pid, "Store", jobs)     # untimed
        for name in args.ops:
            on = jobs if name != "RequestJobResponseByJobOrderID" else ["ended"] * args.calls
            got = await measure(t.sessions[:n], t.proc.pid, name, on)
            rows.setdefault((t.name, name, n), []).append(got)


def _cli(*args: str, stdin: str = "") -> str:
    p = subprocess.run([sys.executable, "-m", "sfc_host", *args], input=stdin,
                       capture_output=True, text=True, timeout=60)
    if p.returncode:
        raise RuntimeError(f"sfc-host {' '.join(args)}: {p.stderr}")
    return p.stdout


def _wait_line(proc: subprocess.Popen[str], stream: Any, marker: str,
               timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if marker in line:
            return
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"{marker!r} not seen")


async def ended_order(s: Session, redis_url: str) -> None:
    """The order ``ended``, for the queries: stored and started, aborted once its job
    runs (an order aborted before its job started has no job response), and waited
    for until its job response is there."""
    from redis.asyncio import Redis

    from sfc_host.store.keys import ScopeKeys
    k = ScopeKeys(SCOPE)
    r = Redis.from_url(redis_url)
    try:
        await s.op("StoreAndStart", "ended")
        for _ in range(400):
            if await r.exists(k.job("ended")):
                break
            await asyncio.sleep(0.025)
        await s.op("Abort", "ended")
        for _ in range(400):
            if await s.op("RequestJobResponseByJobOrderID", "ended") == 1:
                return
            await asyncio.sleep(0.025)
        raise RuntimeError("the aborted order 'ended' has no job response after 10 s")
    finally:
        await r.aclose()


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("asyncua").setLevel(logging.ERROR)    # a session's warnings
    from asyncua.crypto.cert_gen import setup_self_signed_certificate
    from cryptography.x509.oid import ExtendedKeyUsageOID
    from helpers.hosts import flush
    from helpers.mes import Mes, configure
    from helpers.servers import MosquittoServer, RedisServer

    from sfc_host.demo.servers import free_port

    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        redis, broker = RedisServer(tmp / "redis"), MosquittoServer(tmp / "mqtt")
        redis.start()
        broker.start()
        procs: list[subprocess.Popen[str]] = []
        try:
            await flush(redis.url)
            ports = {"host": free_port(), "bare": free_port()}
            confs = {}
            for name, port in ports.items():
                conf = tmp / f"{name}.toml"
                conf.write_text(
                    f'redis_url = "{redis.url}"\nmqtt_url = "{broker.url}"\n'
                    'consumer = "bench"\nopcua = true\n'
                    f'opcua_endpoint = "opc.tcp://127.0.0.1:{port}/sfc-host/"\n'
                    f'opcua_pki_dir = "{tmp / "pki"}"\nopcua_users_file = "{tmp / "users"}"\n'
                    'opcua_security = ["SignAndEncrypt"]\nmax_job_orders = 1000000\n')
                confs[name] = conf
            _cli("opcua", "cert", "--config", str(confs["host"]))
            (tmp / "users").write_text(_cli("opcua", "user", "op", stdin=PASSWORD + "\n"))
            await setup_self_signed_certificate(
                tmp / "client.pem", tmp / "client.der", "urn:bench:client", "localhost",
                [ExtendedKeyUsageOID.CLIENT_AUTH], {"commonName": "bench"})
            shutil.copy(tmp / "client.der", tmp / "pki" / "trusted" / "client.der")
            host = subprocess.Popen([sys.executable, "-m", "sfc_host", "run", "--config",
                                     str(confs["host"])], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
            procs.append(host)
            _wait_line(host, host.stderr, "host bench running")
            # the host's log goes to a file from here: a full pipe would stop it
            assert host.stderr is not None
            log = open(os.environ.get("OPCUA_CALLS_LOG") or tmp / "host.log", "w")  # noqa: SIM115
            drain = asyncio.get_running_loop().run_in_executor(
                None, shutil.copyfileobj, host.stderr, log)
            async with Mes(broker.url) as mqtt_mes:
                await configure(mqtt_mes)
            bare_p = subprocess.Popen([sys.executable, __file__, "--bare", str(confs["bare"])],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(bare_p)
            _wait_line(bare_p, bare_p.stdout, "ready")
            await asyncio.sleep(1.5)        # the host's objects of the scope
            targets = [Target(n, p, f"opc.tcp://127.0.0.1:{ports[n]}/sfc-host/")
                       for n, p in (("host", host), ("bare", bare_p))]
            for t in targets:
                for _ in range(args.sessions):
                    s = Session(t.url, tmp)
                    await s.open()
                    t.sessions.append(s)
            # an ended order, for the queries: stored, started and aborted
            s = targets[0].sessions[0]
            await ended_order(s, redis.url)
            rows: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
            for r in range(args.rounds):
                for t in targets if r % 2 == 0 else targets[::-1]:
                    await round_on(t, args, r, rows)
            for t in targets:
                for s in t.sessions:
                    await s.close()
            report(args, rows)
            for p in procs:
                p.terminate()
                p.wait(15)
            await drain
            log.close()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            broker.stop()
            redis.stop()


def report(args: argparse.Namespace,
           rows: dict[tuple[str, str, int], list[tuple[float, float]]]) -> None:
    med = statistics.median
    print(f"OPC UA calls, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"Basic256Sha256 SignAndEncrypt, a user with a password; {args.calls} calls a "
          f"measure, {args.rounds} rounds in turns (medians)")
    print(f"{'call':<34} {'sessions':>8} {'host calls/s':>13} {'bare calls/s':>13} "
          f"{'ratio':>6} {'host µs CPU':>12} {'bare µs CPU':>12}")
    for name in args.ops:
        for n in dict.fromkeys((1, args.sessions)):
            h, b = rows[("host", name, n)], rows[("bare", name, n)]
            hr, br = med(x[0] for x in h), med(x[0] for x in b)
            print(f"{name:<34} {n:>8} {hr:>13,.0f} {br:>13,.0f} {hr / br:>5.2f}x "
                  f"{med(x[1] for x in h):>12,.0f} {med(x[1] for x in b):>12,.0f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="calls a measure")
    p.add_argument("--sessions", type=int, default=8, help="sessions at once")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", nargs="+", choices=OPS, default=OPS,
                   help="the calls to measure (Start alone: the orders stored untimed)")
    p.add_argument("--bare", metavar="CONFIG", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.bare:
        asyncio.run(bare(a.bare))
    else:
        asyncio.run(main(a))
