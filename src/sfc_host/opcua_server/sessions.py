"""Sessions (IEC 62541 Part 4 §5.6): made by CreateSession, bound to a user by
ActivateSession, ended by CloseSession or by their timeout.

What is proved here: on a secure channel, the client's signature over our certificate
and the nonce we gave it last; a user name's password, decrypted with our key where it
came encrypted; an X.509 user's signature by its certificate's key. Who a user *is*
(a known name, the right password, a certificate on the list) is the server owner's to
say, through ``identify``; a refusal is a status and a line for the log.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sfc_fast.wire.uabinary import NodeId
from sfc_host.errors import SfcHostError
from sfc_host.opcua_client import (
    MODE_NONE,
    SecurityError,
    decrypt_secret,
    first_certificate,
    verify_signature,
)
from sfc_host.opcua_server.channel import ServerChannel

BAD_SECURITY_CHECKS_FAILED = 0x80130000
BAD_SESSION_ID_INVALID = 0x80250000
BAD_SESSION_NOT_ACTIVATED = 0x80270000
BAD_IDENTITY_TOKEN_INVALID = 0x80200000
BAD_IDENTITY_TOKEN_REJECTED = 0x80210000
BAD_USER_ACCESS_DENIED = 0x801F0000
BAD_APPLICATION_SIGNATURE_INVALID = 0x80580000
BAD_USER_SIGNATURE_INVALID = 0x80570000
BAD_TOO_MANY_SESSIONS = 0x80560000

MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 10_000.0, 3_600_000.0
MAX_SESSIONS = 1000

ANONYMOUS, USER_NAME, CERTIFICATE = 0, 1, 2     # UserTokenType


@dataclass(frozen=True, slots=True)
class Identity:
    """A user identity token, its proofs checked: what ``identify`` decides on."""
    kind: int                       # ANONYMOUS, USER_NAME or CERTIFICATE
    policy_id: str
    user_name: str | None = None
    password: bytes | None = None
    certificate: bytes | None = None
    channel_certificate: bytes | None = None    # the secure channel's client certificate
    secure: bool = False                        # the channel signs (and encrypts)


@dataclass(frozen=True, slots=True)
class UserToken:
    """A user identity token as ActivateSession carries it, before its proofs."""
    kind: int
    policy_id: str
    user_name: str | None = None
    secret: bytes | None = None         # a password, encrypted where ``algorithm`` says
    algorithm: str = ""
    certificate: bytes | None = None


class Refused(SfcHostError):
    """A session or a user refused: a status and a line for the log."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(slots=True)
class Session:
    session_id: NodeId
    token: NodeId                   # the authentication token requests carry
    name: str
    timeout_s: float
    channel: ServerChannel
    nonce: bytes
    client_certificate: bytes | None
    user: Any = None
    activated: bool = False
    last_seen: float = 0.0
    browse_points: dict[bytes, Any] | None = None


_ids = itertools.count(1)


class Sessions:
    """The server's sessions by authentication token."""

    def __init__(self, identify: Callable[[Identity], Any],
                 on_close: Callable[[Session], None]) -> None:
        self._identify = identify
        self._on_close = on_close
        self._by_token: dict[NodeId, Session] = {}
        self._loop = asyncio.get_running_loop()
        self._sweep = self._loop.call_later(1.0, self._expire)

    def __len__(self) -> int:
        return len(self._by_token)

    def __iter__(self) -> Any:
        return iter(list(self._by_token.values()))

    def create(self, channel: ServerChannel, name: str, timeout_ms: float,
               client_certificate: bytes | None) -> Session:
        if len(self._by_token) >= MAX_SESSIONS:
            raise Refused(BAD_TOO_MANY_SESSIONS, f"{MAX_SESSIONS} sessions open already")
        sec = channel.security
        # on a secure channel, the certificate CreateSession names must be the channel's
        if sec is not None and sec.mode != MODE_NONE and (
                not client_certificate or channel.client_certificate is None
                or first_certificate(client_certificate)
                != first_certificate(channel.client_certificate)):
            raise Refused(BAD_SECURITY_CHECKS_FAILED,
                          "CreateSession names another certificate than the channel's")
        timeout = min(max(timeout_ms or MAX_TIMEOUT_MS, MIN_TIMEOUT_MS), MAX_TIMEOUT_MS)
        session = Session(NodeId(next(_ids), 1), NodeId(os.urandom(32), 0), name,
                          timeout / 1000, channel, os.urandom(32), client_certificate,
                          last_seen=self._loop.time())
        self._by_token[session.token] = session
        return session

    def activate(self, channel: ServerChannel, token: NodeId,
                 client_signature: bytes | None, user_token: UserToken,
                 user_signature: bytes | None, server_certificate: bytes | None,
                 private_key: Any) -> Session:
        """Check the proofs and the user; the session is then the user's, bound to
        ``channel``, with a new nonce."""
        session = self._by_token.get(token)
        if session is None:
            raise Refused(BAD_SESSION_ID_INVALID, "ActivateSession of an unknown session")
        sec = channel.security
        secure = sec is not None and sec.mode != MODE_NONE
        if secure:
            if channel.client_certificate is None or session.client_certificate is None \
                    or first_certificate(channel.client_certificate) != \
                    first_certificate(session.client_certificate):
                raise Refused(BAD_SECURITY_CHECKS_FAILED,
                              "ActivateSession on a channel of another application")
            assert server_certificate is not None
            try:
                verify_signature(channel.client_certificate, client_signature or b"",
                                 server_certificate + session.nonce,
                                 "the client's signature")
            except SecurityError as e:
                raise Refused(BAD_APPLICATION_SIGNATURE_INVALID, str(e)) from None
        identity = self._proved(user_token, user_signature, session, server_certificate,
                                private_key, channel, secure)
        user = self._identify(identity)
        if session.activated and session.channel is not channel and \
                session.user != user:
            raise Refused(BAD_IDENTITY_TOKEN_REJECTED,
                          "a session moved to another channel with another user")
        session.user = user
        session.activated = True
        session.channel = channel
        session.nonce = os.urandom(32)
        session.last_seen = self._loop.time()
        return session

    def _proved(self, token: UserToken, signature: bytes | None, session: Session,
                server_certificate: bytes | None, private_key: Any,
                channel: ServerChannel, secure: bool) -> Identity:
        password = token.secret
        if token.kind == USER_NAME and password is not None and token.algorithm:
            if private_key is None:
                raise Refused(BAD_IDENTITY_TOKEN_INVALID,
                              "an encrypted password on a server without a key")
            try:
                password = decrypt_secret(private_key, password, session.nonce)
            except SecurityError as e:
                raise Refused(BAD_IDENTITY_TOKEN_INVALID, f"the password: {e}") from None
        if token.kind == CERTIFICATE:
            if not token.certificate or server_certificate is None:
                raise Refused(BAD_IDENTITY_TOKEN_INVALID, "an X.509 user without a "
                              "certificate, or on a server without one")
            try:
                verify_signature(token.certificate, signature or b"",
                                 server_certificate + session.nonce, "the user's signature")
            except SecurityError as e:
                raise Refused(BAD_USER_SIGNATURE_INVALID, str(e)) from None
        return Identity(token.kind, token.policy_id, token.user_name, password,
                        token.certificate if token.kind == CERTIFICATE else None,
                        channel.client_certificate, secure)

    def find(self, channel: ServerChannel, token: NodeId, activated: bool = True) -> Session:
        """The session of a request's token, on this channel (and activated, but to
        close it)."""
        session = self._by_token.get(token)
        if session is None or session.channel is not channel:
            raise Refused(BAD_SESSION_ID_INVALID, "a request of no session of this channel")
        if activated and not session.activated:
            raise Refused(BAD_SESSION_NOT_ACTIVATED, "a request of a session not activated")
        session.last_seen = self._loop.time()
        return session

    def close(self, token: NodeId) -> Session | None:
        session = self._by_token.pop(token, None)
        if session is not None:
            self._on_close(session)
        return session

    def close_all(self) -> None:
        self._sweep.cancel()
        for token in list(self._by_token):
            self.close(token)

    def _expire(self) -> None:
        now = self._loop.time()
        for token, s in list(self._by_token.items()):
            if now - s.last_seen > s.timeout_s:
                self.close(token)
        self._sweep = self._loop.call_later(1.0, self._expire)

