"""The web view's guards: the access token, sessions with their CSRF token, the origin
check of a POST, and the response headers (a strict Content-Security-Policy, no
sniffing, no framing, no referrer beyond the site).

With a token configured every request carries it, in ``Authorization: Bearer TOKEN``
or in the cookie a login (the form, or ``?token=`` once) sets; only ``/healthz``,
``/readyz`` (probes), ``/login`` and the static files do without. The cookie holds a
digest of the token, not the token. Comparisons take constant time. Without a token
(a loopback address) a request must be addressed to a loopback name, so that a web
page whose name resolves to 127.0.0.1 cannot read or drive the view (DNS rebinding).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from multidict import CIMultiDict

from sfc_host.config import is_loopback

TOKEN_COOKIE = "sfc_web_auth"
SESSION_COOKIE = "sfc_web_session"
OPEN_PATHS = frozenset(("/healthz", "/readyz", "/login"))
SESSIONS_KEPT = 10_000
# the session a response must set (typed request keys are aiohttp 3.13's, a str before)
NEW_SESSION: Any = web.RequestKey("new_session", str) if hasattr(web, "RequestKey") \
    else "new_session"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def _digest(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class Guard:
    """Per server: the token (may be ""), a secret of this process for CSRF tokens,
    and the flash messages waiting for a session's next page."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._cookie = _digest(token.encode(), "sfc-web-cookie") if token else ""
        self._secret = secrets.token_bytes(32)
        self.flashes: OrderedDict[str, str] = OrderedDict()

    # ---- the access token

    def token_ok(self, given: str) -> bool:
        return bool(self.token) and hmac.compare_digest(given.encode(), self.token.encode())

    def authorised(self, request: web.Request) -> bool:
        if not self.token:
            return True
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and self.token_ok(auth[7:].strip()):
            return True
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self._cookie.encode())

    def set_login(self, response: web.StreamResponse, request: web.Request) -> None:
        response.set_cookie(TOKEN_COOKIE, self._cookie, httponly=True, samesite="Strict",
                            path="/", secure=request.secure)

    # ---- sessions and CSRF

    def session(self, request: web.Request) -> str:
        """The session id of the request (a new one when it has none: the response
        sets it, see ``middleware``)."""
        sid = request.cookies.get(SESSION_COOKIE, "")
        if len(sid) != 43:    # secrets.token_urlsafe(32)
            sid = request.get(NEW_SESSION) or secrets.token_urlsafe(32)
            request[NEW_SESSION] = sid
        return sid

    def csrf(self, request: web.Request) -> str:
        return _digest(self._secret, "csrf:" + self.session(request))

    def csrf_ok(self, request: web.Request, given: str) -> bool:
        if SESSION_COOKIE not in request.cookies:
            return False
        return hmac.compare_digest(given.encode(), self.csrf(request).encode())

    def flash(self, request: web.Request, message: str) -> None:
        sid = self.session(request)
        self.flashes[sid] = message
        self.flashes.move_to_end(sid)
        while len(self.flashes) > SESSIONS_KEPT:
            self.flashes.popitem(last=False)

    def take_flash(self, request: web.Request) -> str | None:
        return self.flashes.pop(request.cookies.get(SESSION_COOKIE, ""), None)


def redirect(location: str) -> web.Response:
    """303 See Other: after a POST or a login the browser GETs ``location``."""
    return web.Response(status=303, headers={"Location": location})


def same_origin(request: web.Request) -> bool:
    """A POST comes from a page of this site: its Origin (or, without one, its Referer)
    names the host the request was sent to. Neither: refused."""
    source = request.headers.get("Origin") or request.headers.get("Referer") or ""
    if not source or source == "null":
        return False
    return urlsplit(source).netloc.lower() == request.host.lower()


def addressed_locally(request: web.Request) -> bool:
    """The request's Host header names this machine's loopback."""
    host = urlsplit("//" + request.host).hostname or ""
    return is_loopback(host)


def guard_middleware(guard: Guard) -> web.middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        path = request.path
        if not (path in OPEN_PATHS or path.startswith("/static/")
                or guard.authorised(request)):
            given = request.query.get("token")
            if request.method == "GET" and given is not None and guard.token_ok(given):
                # once: the cookie from now on, and the token leaves the address bar
                rest = [(k, v) for k, v in request.query.items() if k != "token"]
                response = redirect(str(request.rel_url.with_query(rest)))
                guard.set_login(response, request)
                return response
            if request.method == "GET" and "text/html" in request.headers.get("Accept", ""):
                return redirect(str(request.app.router["login"].url_for().with_query(
                    next=str(request.rel_url))))
            return web.Response(status=401, text="401: an access token is required\n",
                                headers={"WWW-Authenticate": 'Bearer realm="sfc-host"'})
        if not guard.token and path not in OPEN_PATHS and not addressed_locally(request):
            # without a token the view answers only a loopback name: a page of another
            # site whose name was made to point at 127.0.0.1 (DNS rebinding) gets nothing
            return web.Response(status=403, text="403: address this view by a loopback name "
                                "(localhost, 127.0.0.1, [::1]) or set web_token\n")
        if request.method == "POST" and not same_origin(request):
            return web.Response(status=403, text="403: cross-site request refused\n")
        response = await handler(request)
        sid = request.get(NEW_SESSION)
        if sid is not None:
            response.set_cookie(SESSION_COOKIE, sid, httponly=True, samesite="Strict",
                                path="/", secure=request.secure)
        return response
    return middleware


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: on every response, streams and errors included."""
    headers: CIMultiDict[str] = response.headers  # type: ignore[assignment]
    for name, value in HEADERS.items():
        headers.setdefault(name, value)
    if request.path.startswith("/static/"):
        headers.setdefault("Cache-Control", "max-age=300")
    else:
        headers.setdefault("Cache-Control", "no-store")
