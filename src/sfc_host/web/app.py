"""The web view's routes, added to an aiohttp application: the host's own HTTP endpoint
(``sfc-host run`` with ``web = true``) or the one ``sfc-host web`` serves alone.

    GET  /                              scopes (the table fetched again every 2 s)
    GET  /part/scopes                   that table alone
    GET  /scopes/{scope}/jobs           a page of job orders (?state=&q=&page=&part=1)
    GET  /scopes/{scope}/job?id=J       one job: chart, actions, timeline, order, response
    GET  /scopes/{scope}/live?id=J      its updates (Server-Sent Events)
    POST /scopes/{scope}/control        id, method, csrf: job control (``web_control``)
    GET  /scopes/{scope}/workmasters    the Work Masters, charts and check results
    GET  /login, POST /login            the access token form
    GET  /static/web.js, /static/web.css

Control goes through ``MesControl.job_control``, the MES's own path: the same checks
and ISA-95 return statuses. Without a ``MesControl`` (``sfc-host web``, or
``web_control = false``) there are no buttons and a POST is refused (403).
"""

from __future__ import annotations

import contextlib
import json
import logging
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sfc_host.isa95 import INVALID_REQUEST, NO_ERROR
from sfc_host.mes.codec import Invalid
from sfc_host.metrics import Metrics
from sfc_host.names import check_job, check_scope
from sfc_host.store.orders import OrderError
from sfc_host.store.views import NotFound
from sfc_host.web import pages
from sfc_host.web.live import LiveHub
from sfc_host.web.security import Guard, guard_middleware, redirect, security_headers
from sfc_host.web.views import TOP_STATES, WebData

if TYPE_CHECKING:
    from sfc_host.config import HostConfig
    from sfc_host.mes.control import MesControl

log = logging.getLogger("sfc_host.web")

STATIC = {"web.js": "text/javascript", "web.css": "text/css"}
MAX_SEARCH = 256


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def _errors(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """A bad name is 400, an unknown job 404, Redis away 503: one line on a page."""
    from redis.exceptions import RedisError

    try:
        return await handler(request)
    except NotFound as e:
        return _html(pages.error_page(404, str(e)), 404)
    except ValueError as e:     # InvalidName: a scope or job id no key can have
        return _html(pages.error_page(400, str(e)), 400)
    except (RedisError, OSError) as e:
        log.warning("web: %s: Redis: %s", request.path, e)
        return _html(pages.error_page(503, f"Redis cannot be read: {e}"), 503)


class WebView:
    """The view of one server. ``control`` None: read-only."""

    def __init__(self, client: Any, config: HostConfig, *, metrics: Metrics | None = None,
                 control: MesControl | None = None) -> None:
        self.data = WebData(client, config.group, config.outage_threshold_ms, metrics,
                            config.trace_url)
        self.guard = Guard(config.web_access_token())
        self.control = control
        self.hub = LiveHub(self.live_payload, probe=self.live_probe)
        pkg = resources.files("sfc_host.web") / "static"
        self.static = {name: (pkg / name).read_bytes() for name in STATIC}

    def install(self, app: web.Application) -> None:
        app.middlewares.extend((guard_middleware(self.guard), _errors))
        app.on_response_prepare.append(security_headers)
        app.on_shutdown.append(self._shutdown)
        r = app.router
        r.add_get("/", self.scopes_page)
        r.add_get("/part/scopes", self.scopes_part)
        r.add_get("/scopes/{scope}/jobs", self.jobs_page)
        r.add_get("/scopes/{scope}/job", self.job_page)
        r.add_get("/scopes/{scope}/live", self.live)
        r.add_post("/scopes/{scope}/control", self.control_post)
        r.add_get("/scopes/{scope}/workmasters", self.work_masters_page)
        r.add_get("/login", self.login_form, name="login")
        r.add_post("/login", self.login_post)
        r.add_get("/static/{name}", self.static_file)

    async def _shutdown(self, app: web.Application) -> None:
        await self.hub.close()

    # ---- pages

    async def scopes_page(self, request: web.Request) -> web.Response:
        return _html(pages.scopes_page(await self.data.scopes()))

    async def scopes_part(self, request: web.Request) -> web.Response:
        return _html(pages.scopes_part(await self.data.scopes()))

    async def jobs_page(self, request: web.Request) -> web.Response:
        scope = check_scope(request.match_info["scope"])
        q = request.query
        state = q.get("state", "")
        if state not in ("", *TOP_STATES):
            raise ValueError(f"unknown state {state!r} (one of {', '.join(TOP_STATES)})")
        try:
            page = int(q.get("page", "1"))
        except ValueError:
            page = 1
        d = await self.data.jobs(scope, state=state, search=q.get("q", "")[:MAX_SEARCH],
                                 page=page)
        return _html(pages.jobs_part(d) if q.get("part") else pages.jobs_page(d))

    async def job_page(self, request: web.Request) -> web.Response:
        scope = check_scope(request.match_info["scope"])
        job = check_job(request.query.get("id", ""))
        v = await self.data.job(scope, job)
        csrf = self.guard.csrf(request) if self.control is not None else None
        return _html(pages.job_page(v, csrf=csrf, message=self.guard.take_flash(request)))

    async def work_masters_page(self, request: web.Request) -> web.Response:
        scope = check_scope(request.match_info["scope"])
        return _html(pages.work_masters_page(scope, await self.data.work_masters(scope)))

    # ---- live

    async def live_probe(self, key: tuple[str, str]) -> object:
        return await self.data.job_versions(*key)

    async def live_payload(self, key: tuple[str, str]) -> tuple[str, str]:
        """A job page's update: what changes in it, as JSON (compared without the
        server's clock, which the page needs for its countdowns). A job not there (yet,
        or any more) is said so, and read again only when the probe sees it move."""
        try:
            v = await self.data.job(*key)
        except NotFound as e:
            gone = json.dumps({"error": str(e)})
            return gone, gone
        st = v.get("state") or {}
        body = {"order_state": v.get("order_state"), "status": v.get("status"),
                "held": st.get("held_ms") is not None, "steps": v["step_classes"],
                "actions": v["action_classes"], "parts": pages.live_parts(v)}
        compared = json.dumps(body, sort_keys=True)
        return compared, compared[:-1] + f', "server_ms": {int(v["server_ms"])}}}'

    async def live(self, request: web.Request) -> web.StreamResponse:
        scope = check_scope(request.match_info["scope"])
        job = check_job(request.query.get("id", ""))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            async with contextlib.aclosing(self.hub.subscribe((scope, job))) as updates:
                async for payload in updates:
                    if request.transport is None or request.transport.is_closing():
                        break
                    await resp.write(b": keep-alive\n\n" if payload is None
                                     else f"data: {payload}\n\n".encode())
        return resp

    # ---- control

    async def control_post(self, request: web.Request) -> web.Response:
        if self.control is None:
            return _html(pages.error_page(403, "job control is off here (web_control)"), 403)
        scope = check_scope(request.match_info["scope"])
        form = await request.post()
        if not self.guard.csrf_ok(request, str(form.get("csrf", ""))):
            return _html(pages.error_page(403, "the form has expired: open the page again"),
                         403)
        job = check_job(str(form.get("id", "")))
        method = str(form.get("method", ""))
        if method not in pages.CONTROLS:
            raise ValueError(f"unknown method {method!r}")
        data = {"JobOrderID": job,
                "Comment": [{"Locale": "en", "Text": f"{method} from the web view"}]}
        try:
            res = await self.control.job_control(scope, method, data)
            message = pages.control_message(method, NO_ERROR, f"now {res['JobState']}")
        except (Invalid, OrderError) as e:
            message = pages.control_message(method, e.status, str(e))
        except ValueError as e:
            message = pages.control_message(method, INVALID_REQUEST, str(e))
        log.info("web: %s of %s in %s from %s: %s", method, job, scope, request.remote,
                 message, extra={"scope": scope, "job": job})
        self.guard.flash(request, message)
        return redirect(pages.job_url(scope, job))

    # ---- login and static files

    async def login_form(self, request: web.Request) -> web.Response:
        return _html(pages.login_page(next_url=_local(request.query.get("next", "/"))))

    async def login_post(self, request: web.Request) -> web.Response:
        form = await request.post()
        next_url = _local(str(form.get("next", "/")))
        if not self.guard.token_ok(str(form.get("token", ""))):
            return _html(pages.login_page("wrong token", next_url), 401)
        response = redirect(next_url)
        self.guard.set_login(response, request)
        return response

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            return web.Response(status=404, text="404: Not Found\n")
        return web.Response(body=self.static[name], content_type=STATIC[name],
                            charset="utf-8")


def _local(target: str) -> str:
    """Only a path of this site to go on to after a login (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") \
        and "\\" not in target else "/"
