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

A session's secure channel is checked against the trust list when the session is
activated, not only the certificate its CreateSession names: asyncua checks the latter,
and skips the check when it is empty, so a client could name a trusted certificate (they
are public) over a channel of an untrusted one.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncua import ua
from asyncua.common.utils import ServiceError
from asyncua.crypto.permission_rules import PermissionRuleset, User, UserRole
from asyncua.crypto.truststore import TrustStore
from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions
from asyncua.server.user_managers import UserManager
from asyncua.ua.status_codes import get_name_and_doc
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding

from sfc_host.errors import SfcHostError

log = logging.getLogger("sfc_host.opcua")

OPERATOR = "operator"
READER = "reader"
ROLES = (OPERATOR, READER)
USERS_VARIABLE = "SFC_OPCUA_USERS"
_X509 = re.compile(r"x509:[0-9a-f]{40}")
# the files of trusted/ that asyncua's trust store reads as certificates
_CERT_FILE = re.compile(r".*(der|pem)")
# scrypt's cost: about 50 ms a check on a plant server, once per session
_N, _R, _P = 2**14, 8, 1

# the user of the request being served: a method callback reads it (asyncua gives a
# callback no session); set by the ruleset right before each request is processed
CURRENT_USER: contextvars.ContextVar[User | None] = contextvars.ContextVar(
    "sfc_opcua_user", default=None)


class SecurityError(SfcHostError, ValueError):
    """A users file, PKI folder or certificate the face cannot use; says which."""


@dataclass
class HostUser(User):
    """A session's user: may it call the methods (an operator), or only look."""

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
    stored under ``rejected/``. An empty folder (a plant's first start) trusts nobody."""

    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self.store = TrustStore([pki.trusted], [])
        self._validator = CertificateValidator(
            CertificateValidatorOptions.TRUSTED_VALIDATION
            | CertificateValidatorOptions.PEER_CLIENT, self.store)
        self._seen: tuple[tuple[str, int], ...] | None = None
        self.count = 0      # the certificates trusted now

    async def refresh(self) -> None:
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
        count = sum(1 for name, _ in state if _CERT_FILE.match(name.lower()))
        if count:
            # asyncua's store cannot be made of no certificate: an empty folder is
            # ``count == 0``, which refuses every client without asking the store
            try:
                await self.store.load_trust()
            except Exception as e:
                raise SecurityError(f"setting opcua_pki_dir: a file in {self.pki.trusted} "
                                    f"is not a certificate (DER or PEM): {e}") from None
        self.count = count
        self._seen = state

    async def __call__(self, cert: x509.Certificate, app: ua.ApplicationDescription) -> None:
        """asyncua's certificate validator hook: raises ``ServiceError`` to refuse."""
        try:
            await self.refresh()
        except SecurityError as e:
            log.warning("OPC UA: the trust list was not read again (the last one holds): "
                        "%s", e)
        try:
            if not self.count:
                raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)
            await self._validator.validate(cert, app)
        except Exception as e:
            self.reject(cert, app.ApplicationUri, _why(e))
            raise

    def trusted(self, der: bytes) -> bool:
        """Whether a certificate (DER) is in the trust list."""
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return False
        if self.count and self.store.is_trusted(cert):
            return True
        self.reject(cert, "", "not trusted")
        return False

    def reject(self, cert: x509.Certificate, uri: str, why: str) -> None:
        thumb = cert.fingerprint(hashes.SHA1()).hex()
        path = self.pki.rejected / f"{thumb}.der"
        if not path.exists():
            try:
                path.write_bytes(cert.public_bytes(Encoding.DER))
            except OSError as e:
                log.warning("OPC UA: refused client certificate not stored in %s: %s",
                            path, e)
                return
        log.warning("OPC UA: client certificate %s (%s) refused: %s; stored as %s for an "
                    "administrator to move to trusted/", thumb[:16], uri or "-", why, path)


def _why(e: Exception) -> str:
    """A refusal's reason for the log."""
    if isinstance(e, ServiceError):
        if e.code == ua.StatusCodes.BadCertificateUntrusted:
            return "not trusted"
        return get_name_and_doc(e.code)[0]
    return str(e) or type(e).__name__


# ---- sessions


class HostUsers(UserManager):
    """Users from the users file; anonymous as configured; the channel's certificate
    checked against the trust list (with ``trust``)."""

    def __init__(self, users: dict[str, tuple[str, str]], anonymous: str,
                 trust: TrustList | None) -> None:
        self.users = users
        self.anonymous = anonymous
        self.trust = trust
        # X.509 users by their certificates' thumbprints
        self.by_certificate = {secret.removeprefix("x509:"): (name, role)
                               for name, (role, secret) in users.items()
                               if secret.startswith("x509:")}

    def get_user(self, iserver: Any, username: str | None = None,
                 password: str | None = None, certificate: Any = None) -> User | None:
        """``certificate``: an X.509 user token's (its signature checked by asyncua),
        else the secure channel's: empty on a channel with security None, which has
        no certificate to check. Every refusal is logged with why."""
        der = bytes(certificate) if certificate else None
        who = username if username is not None else "anonymous"
        if username is None and der is not None:
            mapped = self.by_certificate.get(thumbprint(der))
            if mapped is not None:
                return HostUser(role=UserRole.User, name=mapped[0],
                                may_call=mapped[1] == OPERATOR)
        if self.trust is not None and der is not None and not self.trust.trusted(der):
            log.warning("OPC UA: a session of %s refused: its certificate is not trusted",
                        who)
            return None
        if username is None:
            if self.anonymous == "none":
                log.warning("OPC UA: an anonymous session refused (opcua_anonymous = none)")
                return None
            return HostUser(role=UserRole.User, name="anonymous",
                            may_call=self.anonymous == "call")
        known = self.users.get(username)
        if known is None or not known[1].startswith("scrypt$") \
                or not check_password(password or "", known[1]):
            log.warning("OPC UA: user %r refused: unknown user or wrong password", username)
            return None
        return HostUser(role=UserRole.User, name=username, may_call=known[0] == OPERATOR)


_CALL = ua.NodeId(ua.ObjectIds.CallRequest_Encoding_DefaultBinary)
_LOOKING = frozenset(ua.NodeId(i) for i in (
    ua.ObjectIds.CreateSessionRequest_Encoding_DefaultBinary,
    ua.ObjectIds.CloseSessionRequest_Encoding_DefaultBinary,
    ua.ObjectIds.ActivateSessionRequest_Encoding_DefaultBinary,
    ua.ObjectIds.ReadRequest_Encoding_DefaultBinary,
    ua.ObjectIds.BrowseRequest_Encoding_DefaultBinary,
    ua.ObjectIds.BrowseNextRequest_Encoding_DefaultBinary,
    ua.ObjectIds.GetEndpointsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.FindServersRequest_Encoding_DefaultBinary,
    ua.ObjectIds.TranslateBrowsePathsToNodeIdsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.CreateSubscriptionRequest_Encoding_DefaultBinary,
    ua.ObjectIds.ModifySubscriptionRequest_Encoding_DefaultBinary,
    ua.ObjectIds.DeleteSubscriptionsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.TransferSubscriptionsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.CreateMonitoredItemsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.ModifyMonitoredItemsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.DeleteMonitoredItemsRequest_Encoding_DefaultBinary,
    ua.ObjectIds.PublishRequest_Encoding_DefaultBinary,
    ua.ObjectIds.RepublishRequest_Encoding_DefaultBinary,
    ua.ObjectIds.CloseSecureChannelRequest_Encoding_DefaultBinary,
    ua.ObjectIds.SetMonitoringModeRequest_Encoding_DefaultBinary,
    ua.ObjectIds.SetPublishingModeRequest_Encoding_DefaultBinary,
    ua.ObjectIds.RegisterNodesRequest_Encoding_DefaultBinary,
    ua.ObjectIds.UnregisterNodesRequest_Encoding_DefaultBinary,
))


class HostRules(PermissionRuleset):
    """What a session may do: look (browse, read, subscribe) for every user, call for
    an operator; nothing is written or added over OPC UA. Notes each request's user
    for the method callbacks (``CURRENT_USER``)."""

    def check_validity(self, user: User, action_type_id: ua.NodeId, body: Any) -> bool:
        CURRENT_USER.set(user)
        if action_type_id == _CALL:
            allowed = isinstance(user, HostUser) and user.may_call
            if not allowed:
                log.warning("OPC UA: a call by %s refused: may only look",
                            getattr(user, "name", None) or "anonymous")
            return allowed
        return action_type_id in _LOOKING


def user_name() -> str:
    """The name of the user of the request being served (``anonymous`` for none)."""
    user = CURRENT_USER.get()
    return (user.name if user is not None else None) or "anonymous"
