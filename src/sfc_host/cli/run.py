"""``sfc-host run``: one host instance (Redis side, MQTT side) until SIGTERM or Ctrl-C.

Settings come from ``--config FILE`` (TOML), then ``SFC_*`` environment variables, then
the flags (``--redis``, ``--mqtt``, ``--scope``). A wrong setting is one line and exit 2,
an unreachable server one line and exit 1, never a traceback. SIGTERM or SIGINT ends it
at any moment, also during the start-up. ``--check`` validates the settings, scripts and
missions (``--connect``: and reaches the servers) without starting, and prints only
what it found: the summary on stdout, or the problem's one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import uvloop

from sfc_host import logs
from sfc_host.cli.common import error
from sfc_host.config import ConfigError, HostConfig, without_credentials
from sfc_host.service.preflight import describe_failure

if TYPE_CHECKING:
    from sfc_host.service.app import App

CLOSE_S = 1.5            # a host stopped during its start-up closes within this


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a host instance (Redis and MQTT)")
    p.add_argument("--config", metavar="FILE", help="TOML settings (see docs/interfaces.md)")
    p.add_argument("--redis", metavar="URL", help="Redis URL (default redis://127.0.0.1:6379/0)")
    p.add_argument("--mqtt", metavar="URL", help="MQTT URL (default mqtt://127.0.0.1:1883)")
    p.add_argument("--scope", action="append", metavar="SCOPE",
                   help="serve this scope from the start (more are discovered)")
    p.add_argument("--check", action="store_true",
                   help="check the settings, scripts and missions, then exit (0 ok, 2 not)")
    p.add_argument("--connect", action="store_true",
                   help="with --check: also reach Redis and the broker (exit 1 when not)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    if args.connect and not args.check:
        return error("--connect goes with --check")
    try:
        cfg = HostConfig.load(args.config, redis_url=args.redis, mqtt_url=args.mqtt,
                              scopes=args.scope)
    except ConfigError as e:
        return error(str(e))
    handler = logs.setup(logging.getLevelName(cfg.log_level.upper()), cfg.log_format,
                         sys.stderr)
    if args.check:
        # a check says what it found and nothing else: the log lines of what it runs to
        # find out (the script engine's build, the broker link's attempts) are no
        # findings, and a problem is the one line _check prints
        handler.setLevel(logging.CRITICAL + 1)
        return int(uvloop.run(_check(cfg, args.connect)))
    return int(uvloop.run(_serve(cfg)))


async def _check(cfg: HostConfig, connect: bool) -> int:
    from sfc_host.service.preflight import check_config, check_servers

    try:
        print(await check_config(cfg))
        if connect:
            print(await check_servers(cfg))
    except Exception as e:
        failure = describe_failure(e, cfg)
        if failure is None:
            raise
        return error(failure[1], failure[0])
    return 0


async def _serve(cfg: HostConfig) -> int:
    from sfc_host.service.app import App

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        app = App(cfg)
    except ValueError as e:
        return error(str(e))
    log = logging.getLogger("sfc_host")
    starting = asyncio.create_task(app.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # a signal during the start-up (a connect attempt, say): leave now
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await _close(app)
        log.info("host %s stopped during its start-up", cfg.consumer_name)
        _leave_now_if_threads_linger(0)
        return 0
    stopped.cancel()
    e = starting.exception()
    if e is not None:
        why = app.link.last_error
        await _close(app)
        failure = describe_failure(e, cfg, why)
        if failure is None:
            raise e
        return error(failure[1], failure[0])
    log.info("host %s running: Redis %s, MQTT %s, %d scopes", cfg.consumer_name,
             without_credentials(cfg.redis_url), without_credentials(cfg.mqtt_url),
             len(app.host.streams.scopes))
    await stop.wait()
    await app.aclose()
    return 0


async def _close(app: App) -> None:
    """Close a host whose start did not finish, within ``CLOSE_S`` (it has nothing that
    must be saved: it took no message)."""
    try:
        await asyncio.wait_for(app.aclose(), CLOSE_S)
    except TimeoutError:
        logging.getLogger("sfc_host").warning("the host did not close within %.1f s",
                                              CLOSE_S)
    except Exception:
        logging.getLogger("sfc_host").exception("closing the host failed")


def _leave_now_if_threads_linger(code: int) -> None:
    """A script build (or a connect attempt) runs in a worker thread no signal can
    interrupt, and the interpreter's exit would wait for it: a script sleeping at its
    import would hold a stopped host for as long. The host took no message and has
    nothing to save, so it leaves at once."""
    if threading.active_count() > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
