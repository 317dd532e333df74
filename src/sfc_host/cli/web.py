"""``sfc-host web --config F``: the web view alone, read-only against Redis (no MQTT, no
job control), e.g. on a control-room PC. It listens on ``metrics_host:metrics_port``
(``--host``/``--port`` override them) under the same access rules as ``sfc-host run``
with ``web = true``: beyond loopback only with an access token. SIGTERM or Ctrl-C ends
it (open pages' streams end with it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from sfc_host import logs
from sfc_host.cli.common import EXIT_PROBLEMS, EXIT_USAGE, error
from sfc_host.config import ConfigError, HostConfig, check_web_access, without_credentials

log = logging.getLogger("sfc_host.web")
SHUTDOWN_S = 1.0
PING_S = 10.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("web", help="serve the web view alone (read-only against Redis)")
    p.add_argument("--config", metavar="FILE", help="the hosts' TOML settings")
    p.add_argument("--redis", metavar="URL", help="Redis URL (overrides the config)")
    p.add_argument("--host", metavar="ADDRESS", help="listen here (default: metrics_host)")
    p.add_argument("--port", type=int, metavar="PORT", help="listen on this port "
                   "(default: metrics_port)")
    p.set_defaults(func=cmd_web)


def cmd_web(args: argparse.Namespace) -> int:
    try:
        cfg = HostConfig.load(args.config, redis_url=args.redis, metrics_host=args.host,
                              metrics_port=args.port)
        cfg.check_files()
        check_web_access(cfg, "sfc-host web")
    except ConfigError as e:
        return error(str(e), EXIT_USAGE)
    logs.setup(logging.getLevelName(cfg.log_level.upper()), cfg.log_format, sys.stderr)
    import uvloop

    return int(uvloop.run(serve(cfg)))


async def serve(cfg: HostConfig, stop: asyncio.Event | None = None) -> int:
    from sfc_host.store.client import REDIS_FAILURES, connect
    from sfc_host.web.app import WebView

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = connect(cfg)
    try:
        try:
            await asyncio.wait_for(client.ping(), PING_S)
        except REDIS_FAILURES as e:
            return error(f"cannot reach Redis at {without_credentials(cfg.redis_url)} "
                          f"({e or type(e).__name__})", EXIT_PROBLEMS)
        app = web.Application()
        app.router.add_get("/healthz", _healthz)
        WebView(client, cfg).install(app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        try:
            await web.TCPSite(runner, cfg.metrics_host, cfg.metrics_port).start()
        except OSError as e:
            await runner.cleanup()
            return error(f"cannot listen on {cfg.metrics_host}:{cfg.metrics_port}: "
                          f"{e.strerror or e}", EXIT_USAGE)
        host = f"[{cfg.metrics_host}]" if ":" in cfg.metrics_host else cfg.metrics_host
        log.info("web view on http://%s:%d/ (read-only), Redis %s", host, cfg.metrics_port,
                 without_credentials(cfg.redis_url))
        await stop.wait()
        await runner.cleanup()
        log.info("web view stopped")
        return 0
    finally:
        await client.aclose()


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")
