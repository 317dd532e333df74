"""Who may do what on the OPC UA face: the server's certificate, the client trust list,
users and their roles, as plants run OPC UA.

- **The PKI folder** (``opcua_pki_dir``, made by ``sfc-host opcua cert``): ``own/`` the
  server's certificate and key, ``trusted/`` the client certificates an administrator
  trusts (DER or PEM), ``rejected/`` where every refused client certificate is put, for
  an administrator to move to ``trusted/`` (taken at the client's next connection, no
  restart).
- **Users** (``opcua_users_file``, or the ``SFC_OPCUA_USERS`` variable; never in
  host.toml): a line ``name role scrypt$…`` each (name and password), or ``name role
  x509:{SHA-1}`` (an X.509 user token: that certificate, proven by its key), made by
  ``sfc-host opcua user``. ``operator`` may call the methods; ``reader`` may browse,
  read and subscribe.
- **Anonymous sessions** (``opcua_anonymous``): ``browse`` (the default) as a reader,
  or ``none``.

The trust list decides at the secure channel, whose certificate the client proves by
its signature; a session must then name that same certificate (the server checks), so
a trusted certificate named over another application's channel gets nowhere.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding

from sfc_host.errors import SfcHostError
from sfc_host.opcua_server import ANONYMOUS, CERTIFICATE, Identity, NodeId, Refused

log = logging.getLogger("sfc_host.opcua")

OPERATOR = "operator"
READER = "reader"
ROLES = (OPERATOR, READER)
USERS_VARIABLE = "SFC_OPCUA_USERS"
_X509 = re.compile(r"x509:[0-9a-f]{40}")
_CERT_FILE = re.compile(r".*\.(der|pem|crt|cer)")
# scrypt's cost: about 50 ms a check on a plant server, once per session
_N, _R, _P = 2**14, 8, 1
_DER = Encoding.DER

BAD_CERTIFICATE_UNTRUSTED = 0x801A0000
BAD_CERTIFICATE_TIME_INVALID = 0x80140000
BAD_CERTIFICATE_INVALID = 0x80120000
BAD_USER_ACCESS_DENIED = 0x801F0000


class SecurityError(SfcHostError, ValueError):
    """A users file, PKI folder or certificate the face cannot use; says which."""


@dataclass(frozen=True, slots=True)
class HostUser:
    """A session's user: may it call the methods (an operator), or only look."""
    name: str
    may_call: bool = False

# ---- passwords and users


def thumbprint(der: bytes) -> str:
    """A certificate's SHA-1 thumbprint (lower-case hex), as OPC UA names it."""
    return hashlib.sha1(der).hexdigest()   # a name, not a check


def hash_password(password: str) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64), as a users file holds it."""
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return "$".join(("scrypt", str(_N), str(_R), str(_P),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()))


def check_password(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        want = base64.b64decode(digest)
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n),
                             r=int(r), p=int(p), dklen=len(want))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


def parse_users(text: str, where: str) -> dict[str, tuple[str, str]]:
    """``name role hash`` lines (``#`` comments, blank lines) as name -> (role, hash);
    ``SecurityError`` naming the line of a bad one."""
    users: dict[str, tuple[str, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3 or parts[1] not in ROLES or not (
                parts[2].startswith("scrypt$") or _X509.fullmatch(parts[2])):
            raise SecurityError(f"{where}, line {n}: not 'name role scrypt$…' or 'name "
                                f"role x509:SHA-1' with role {' or '.join(ROLES)} "
                                "(sfc-host opcua user makes one)")
        if parts[0] in users:
            raise SecurityError(f"{where}, line {n}: user {parts[0]!r} again")
        users[parts[0]] = (parts[1], parts[2])
    return users


def load_users(path: str, env: Mapping[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """The users of ``opcua_users_file``, or of ``SFC_OPCUA_USERS`` (its lines, or ``;``
    between them) when no file is set; none at all when neither is."""
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise SecurityError(f"setting opcua_users_file: cannot read {path!r}: "
                                f"{e.strerror or e}") from None
        return parse_users(text, path)
    text = (os.environ if env is None else env).get(USERS_VARIABLE, "")
    return parse_users(text.replace(";", "\n"), USERS_VARIABLE)


# ---- the PKI folder


class Pki:
    """The PKI folder's layout."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.cert = self.root / "own" / "cert.der"
        self.key = self.root / "own" / "key.pem"
        self.trusted = self.root / "trusted"
        self.rejected = self.root / "rejected"

    def check(self) -> None:
        """The folder holds what the server needs (``SecurityError`` naming what not)."""
        for f in (self.cert, self.key):
            if not f.is_file():
                raise SecurityError(f"setting opcua_pki_dir: {f} is missing: make the "
                                    "server's certificate with sfc-host opcua cert")
        for d in (self.trusted, self.rejected):
            if not d.is_dir():
                raise SecurityError(f"setting opcua_pki_dir: {d} is not a folder "
                                    "(sfc-host opcua cert makes the layout)")


class TrustList:
    """The trusted client certificates, read again when the folder changed (an
    administrator trusts a rejected certificate by moving it there); refused ones are
    stored under ``rejected/``. An empty folder (a plant's first start) trusts nobody.
    A certificate is trusted when it is in the folder, or signed by a certificate
    there (a plant CA's), and is within its validity."""

    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self._seen: tuple[tuple[str, int], ...] | None = None
        self._trusted: dict[bytes, x509.Certificate] = {}
        self.count = 0      # the certificates trusted now

    def refresh(self) -> None:
        """Read ``trusted/`` again if it changed; ``SecurityError`` naming a file that
        cannot be read (the list read last stays)."""
        try:
            state = tuple(sorted((p.name, p.stat().st_mtime_ns)
                                 for p in self.pki.trusted.iterdir()))
        except OSError as e:
            raise SecurityError(f"setting opcua_pki_dir: cannot read {self.pki.trusted}: "
                                f"{e.strerror or e}") from None
        if state == self._seen:
            return
        trusted: dict[bytes, x509.Certificate] = {}
        for name, _ in state:
            path = self.pki.trusted / name
            if not _CERT_FILE.fullmatch(name.lower()) or not path.is_file():
                continue
            try:
                data = path.read_bytes()
                cert = (x509.load_pem_x509_certificate(data) if data.lstrip().startswith(
                    b"-----") else x509.load_der_x509_certificate(data))
            except (OSError, ValueError) as e:
                raise SecurityError(f"setting opcua_pki_dir: {path} is not a certificate "
                                    f"(DER or PEM): {e}") from None
            trusted[cert.public_bytes(_DER)] = cert
        self._trusted = trusted
        self.count = len(trusted)
        self._seen = state

    def check(self, der: bytes) -> int:
        """Good (0) for a trusted certificate, else why not (the certificate stored
        under ``rejected/`` and the refusal logged)."""
        try:
            self.refresh()
        except SecurityError as e:
            log.warning("OPC UA: the trust list was not read again (the last one holds): "
                        "%s", e)
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            log.warning("OPC UA: a client certificate that is no DER certificate refused")
            return BAD_CERTIFICATE_INVALID
        status, why = self._verdict(der, cert)
        if status:
            self.reject(cert, _uri(cert), why)
        return status

    def _verdict(self, der: bytes, cert: x509.Certificate) -> tuple[int, str]:
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return BAD_CERTIFICATE_TIME_INVALID, "outside its validity"
        if der in self._trusted:
            return 0, ""
        for ca in self._trusted.values():
            if ca.subject == cert.issuer and _signed_by(cert, ca):
                return 0, ""
        return BAD_CERTIFICATE_UNTRUSTED, "not trusted"

    def trusted(self, der: bytes) -> bool:
        """Whether a certificate (DER) is trusted now."""
        return self.check(der) == 0

    def reject(self, cert: x509.Certificate, uri: str, why: str) -> None:
        thumb = thumbprint(cert.public_bytes(_DER))
        path = self.pki.rejected / f"{thumb}.der"
        if not path.exists():
            try:
                path.write_bytes(cert.public_bytes(_DER))
            except OSError as e:
                log.warning("OPC UA: refused client certificate not stored in %s: %s",
                            path, e)
                return
        log.warning("OPC UA: client certificate %s (%s) refused: %s; stored as %s for an "
                    "administrator to move to trusted/", thumb[:16], uri or "-", why, path)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    key = ca.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            assert cert.signature_hash_algorithm is not None
            key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                       cert.signature_hash_algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            assert cert.signature_hash_algorithm is not None
            key.verify(cert.signature, cert.tbs_certificate_bytes,
                       ec.ECDSA(cert.signature_hash_algorithm))
        else:
            return False
    except (InvalidSignature, AssertionError, ValueError):
        return False
    return True


def _uri(cert: x509.Certificate) -> str:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        return ""
    return uris[0] if uris else ""


# ---- sessions


class HostUsers:
    """Who a session's user is: users from the users file, anonymous as configured.
    ``identify`` is the server's hook, called with the token's proofs checked; every
    refusal is logged with why."""

    def __init__(self, users: dict[str, tuple[str, str]], anonymous: str) -> None:
        self.users = users
        self.anonymous = anonymous
        # X.509 users by their certificates' thumbprints
        self.by_certificate = {secret.removeprefix("x509:"): (name, role)
                               for name, (role, secret) in users.items()
                               if secret.startswith("x509:")}

    def identify(self, identity: Identity) -> HostUser:
        if identity.kind == CERTIFICATE:
            mapped = self.by_certificate.get(thumbprint(identity.certificate or b""))
            if mapped is None:
                log.warning("OPC UA: an X.509 user refused: no user has its certificate")
                raise Refused(BAD_USER_ACCESS_DENIED, "an unknown X.509 user")
            return HostUser(mapped[0], mapped[1] == OPERATOR)
        if identity.kind == ANONYMOUS:
            if self.anonymous == "none":
                log.warning("OPC UA: an anonymous session refused (opcua_anonymous = none)")
                raise Refused(BAD_USER_ACCESS_DENIED, "anonymous sessions are off")
            return HostUser("anonymous", self.anonymous == "call")
        name = identity.user_name or ""
        known = self.users.get(name)
        try:
            password = (identity.password or b"").decode()
        except UnicodeDecodeError:
            password = ""
        if known is None or not known[1].startswith("scrypt$") \
                or not check_password(password, known[1]):
            log.warning("OPC UA: user %r refused: unknown user or wrong password", name)
            raise Refused(BAD_USER_ACCESS_DENIED, f"user {name!r} refused")
        return HostUser(name, known[0] == OPERATOR)


def allowed(user: object, what: str, node: NodeId) -> bool:
    """What a session may do: look (browse, read, subscribe) for every user, call for
    an operator; nothing is written over OPC UA."""
    if what == "call":
        if isinstance(user, HostUser) and user.may_call:
            return True
        log.warning("OPC UA: a call by %s refused: may only look",
                    getattr(user, "name", None) or "anonymous")
    return False


def user_name(user: object) -> str:
    """A session's user's name (``anonymous`` for none)."""
    return getattr(user, "name", None) or "anonymous"
