"""``sfc-host opcua``: what the OPC UA face needs before it starts.

- ``sfc-host opcua cert --config F``: the PKI folder (``opcua_pki_dir``): ``own/`` with
  the server's key and a self-signed certificate naming its application URI (from
  ``opcua_endpoint``'s host and the consumer name) and host names, ``trusted/`` and
  ``rejected/``. An existing certificate is kept unless ``--force``.
- ``sfc-host opcua user NAME [--role operator|reader]``: a users-file line for NAME,
  the password read from the terminal (or one line of standard input).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from sfc_host.cli.common import EXIT_PROBLEMS, EXIT_USAGE, error
from sfc_host.config import ConfigError, HostConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("opcua", help="the OPC UA face's certificate and users")
    osub = p.add_subparsers(dest="opcua_cmd", required=True)
    cert = osub.add_parser("cert", help="make the PKI folder and the server's certificate")
    cert.add_argument("--config", metavar="FILE", help="the host's TOML settings")
    cert.add_argument("--pki", metavar="DIR", help="the PKI folder (default: opcua_pki_dir)")
    cert.add_argument("--days", type=int, default=3650,
                      help="how long the certificate is valid (default 3650)")
    cert.add_argument("--force", action="store_true", help="replace an existing certificate")
    cert.set_defaults(func=cmd_cert)
    user = osub.add_parser("user", help="a users-file line (password from the terminal)")
    user.add_argument("name", help="the user name (no spaces)")
    user.add_argument("--role", choices=("operator", "reader"), default="operator",
                      help="operator: may call the methods; reader: may only look")
    user.add_argument("--certificate", metavar="FILE",
                      help="an X.509 user: the user's certificate (DER or PEM), no password")
    user.set_defaults(func=cmd_user)


def cmd_cert(args: argparse.Namespace) -> int:
    try:
        cfg = HostConfig.load(args.config)
    except ConfigError as e:
        return error(str(e), EXIT_USAGE)
    root = args.pki or cfg.opcua_pki_dir
    if not root:
        return error("no PKI folder: set opcua_pki_dir or give --pki DIR", EXIT_USAGE)
    if args.days < 1:
        return error("--days: at least 1", EXIT_USAGE)
    from sfc_host.opcua.security import Pki
    from sfc_host.opcua.server import application_uri

    pki = Pki(root)
    uri = application_uri(cfg)
    if pki.cert.exists() and not args.force:
        print(f"{pki.cert} exists: kept (--force makes a new one)")
        return 0
    try:
        for d in (pki.cert.parent, pki.trusted, pki.rejected):
            d.mkdir(parents=True, exist_ok=True)
        host = urlsplit(cfg.opcua_endpoint).hostname or ""
        thumb = asyncio.run(_make(pki, uri, host, cfg.consumer or "sfc-host", args.days))
    except OSError as e:
        return error(f"cannot write {root}: {e.strerror or e}", EXIT_PROBLEMS)
    print(f"{pki.cert}: {uri}, SHA-1 {thumb}; trust clients by putting their "
          f"certificates in {pki.trusted}")
    return 0


async def _make(pki: object, uri: str, host: str, consumer: str, days: int) -> str:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from sfc_host.opcua.security import Pki
    assert isinstance(pki, Pki)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    for name in dict.fromkeys((host, socket.gethostname())):
        if name and name not in ("0.0.0.0", "::"):
            names.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sfc-host {consumer}"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sfc-fast")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=True, key_encipherment=True,
                data_encipherment=True, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    pki.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pki.key.chmod(0o600)
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    return cert.fingerprint(hashes.SHA1()).hex()   # the thumbprint OPC UA names it by


def cmd_user(args: argparse.Namespace) -> int:
    if not args.name or any(c.isspace() for c in args.name) or args.name.startswith("#"):
        return error(f"user name {args.name!r}: no spaces, not starting with #", EXIT_USAGE)
    if args.certificate:
        return _x509_user(args.name, args.role, args.certificate)
    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            return error("the passwords differ", EXIT_USAGE)
    else:
        password = sys.stdin.readline().rstrip("\n")
    if len(password) < 8:
        return error("the password is shorter than 8 characters", EXIT_USAGE)
    from sfc_host.opcua.security import hash_password

    print(f"{args.name} {args.role} {hash_password(password)}")
    return 0


def _x509_user(name: str, role: str, path: str) -> int:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from sfc_host.opcua.security import thumbprint

    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        return error(f"cannot read {path}: {e.strerror or e}", EXIT_USAGE)
    try:
        cert = x509.load_der_x509_certificate(raw)
    except ValueError:
        try:
            cert = x509.load_pem_x509_certificate(raw)
        except ValueError:
            return error(f"{path} is not a certificate (DER or PEM)", EXIT_USAGE)
    print(f"{name} {role} x509:{thumbprint(cert.public_bytes(Encoding.DER))}")
    return 0
