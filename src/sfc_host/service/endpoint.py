"""The host's HTTP endpoint, on aiohttp: ``/metrics`` (Prometheus text format 0.0.4),
``/healthz`` (200 while the process serves) and ``/readyz`` (200 only when the host
is ready, else 503 saying what is not); with an ``extension`` more routes beside them
(the web view of ``sfc_host.web``, ``web = true``).

aiohttp parses and bounds the requests, answers a wrong method 405 and an unknown path
404, and runs every request on its own: a scraper that misbehaves cannot disturb the
host. ``port=0`` binds an ephemeral port (the bound one is in ``port``); the host
itself treats a configured 0 as "off".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from sfc_host.metrics import CONTENT_TYPE, Metrics, check_labels

log = logging.getLogger("sfc_host.metrics")
_request_log = logging.getLogger("sfc_host.metrics.http")

# What is not ready yet, as short phrases ("redis: not connected"); empty when ready.
Readiness = Callable[[], Awaitable[list[str]]]
# Adds more routes (and their middlewares) to the application: the web view.
Extension = Callable[[web.Application], None]
SHUTDOWN_S = 1.0         # a request still running at close is cut after this


def _bad_request_quietly(record: logging.LogRecord) -> bool:
    """aiohttp logs a malformed request (a port scanner, a typo) at ERROR with a
    traceback; here it is one DEBUG line. Other faults stay as they are."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True
    record.msg, record.args, record.exc_info = f"{record.getMessage()}: {exc}", (), None
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return _request_log.isEnabledFor(logging.DEBUG)


_request_log.addFilter(_bad_request_quietly)


class HttpEndpoint:
    def __init__(self, metrics: Metrics, host: str = "127.0.0.1", port: int = 0, *,
                 prefix: str = "sfc_", labels: Mapping[str, str] | None = None,
                 readiness: Readiness | None = None,
                 extension: Extension | None = None) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.prefix = prefix
        self.labels = check_labels(labels or {})   # a bad name fails here, not per scrape
        self.readiness = readiness
        self.extension = extension
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The metrics URL (``/healthz`` and ``/readyz`` beside it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Bind and serve; ``OSError`` when the address cannot be bound."""
        if self._runner is not None:
            raise RuntimeError("HTTP endpoint already started")
        if host is not None:
            self.host = host
        if port is not None:
            self.port = port
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if self.extension is not None:
            self.extension(app)
        # no access log: a scrape every few seconds is no news
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_S, logger=_request_log)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("HTTP endpoint on %s (/metrics, /healthz, /readyz%s)", self.url,
                 ", the web view on /" if self.extension is not None else "")

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> HttpEndpoint:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            text = self.metrics.exposition(self.prefix, self.labels)
        except Exception:  # a broken exposition answers 500, the host goes on
            log.exception("metrics endpoint: exposition failed")
            return web.Response(status=500, text="internal error\n")
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            missing = await self.readiness() if self.readiness is not None else []
        except Exception as e:
            log.exception("readiness check failed")
            missing = [f"the readiness check failed ({e})"]
        if missing:
            return web.Response(status=503, text="not ready: " + "; ".join(missing) + "\n")
        return web.Response(text="ready\n")
