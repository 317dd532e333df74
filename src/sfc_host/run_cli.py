"""``sfc-host run``: one host instance (Redis side, MQTT side) until SIGTERM or Ctrl-C.

Settings come from ``--config FILE`` (TOML), then ``SFC_*`` environment variables, then
the flags (``--redis``, ``--mqtt``, ``--scope``). A wrong setting or an unreachable
server is one line and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import uvloop

from sfc_host import logs
from sfc_host.config import ConfigError, HostConfig, without_credentials

EXIT_USAGE = 2
EXIT_UNREACHABLE = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a host instance (Redis and MQTT)")
    p.add_argument("--config", metavar="FILE", help="TOML settings (see docs/interfaces.md)")
    p.add_argument("--redis", metavar="URL", help="Redis URL (default redis://127.0.0.1:6379/0)")
    p.add_argument("--mqtt", metavar="URL", help="MQTT URL (default mqtt://127.0.0.1:1883)")
    p.add_argument("--scope", action="append", metavar="SCOPE",
                   help="serve this scope from the start (more are discovered)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = HostConfig.load(args.config, redis_url=args.redis, mqtt_url=args.mqtt,
                              scopes=args.scope)
    except ConfigError as e:
        print(f"sfc-host: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    level = getattr(logging, cfg.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"sfc-host: error: setting log_level: unknown level {cfg.log_level!r}",
              file=sys.stderr)
        return EXIT_USAGE
    logs.setup(level, cfg.log_format, sys.stderr)
    return int(uvloop.run(_serve(cfg)))


async def _serve(cfg: HostConfig) -> int:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException, ResponseError

    from sfc_host.app import App
    from sfc_host.mqtt import MqttRefused

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        app = App(cfg)
    except ValueError as e:
        print(f"sfc-host: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    redis_at, mqtt_at = without_credentials(cfg.redis_url), without_credentials(cfg.mqtt_url)
    try:
        await app.start()
    except ConfigError as e:  # scripts that do not build, an unknown mission
        await app.aclose()
        print(f"sfc-host: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RedisConnectionError as e:      # also a wrong password (AuthenticationError)
        await app.aclose()
        print(f"sfc-host: error: cannot reach Redis at {redis_at} ({e})", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ResponseError as e:             # e.g. an ACL that lacks a command the host needs
        await app.aclose()
        print(f"sfc-host: error: Redis at {redis_at} refused the host: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except RedisClusterException as e:
        # redis-py says "Cluster mode is not enabled" for any refused CLUSTER SLOTS,
        # most often an ACL user without it
        await app.aclose()
        print(f"sfc-host: error: Redis Cluster at {redis_at}: the nodes could not be "
              f"listed ({e}); an ACL user needs +cluster|slots and +command "
              f"(docs/operations.md, Redis Cluster)", file=sys.stderr)
        return EXIT_UNREACHABLE
    except MqttRefused as e:               # wrong credentials: at once, not after 10 s
        await app.aclose()
        print(f"sfc-host: error: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except TimeoutError:
        why = app.link.last_error
        await app.aclose()
        print(f"sfc-host: error: cannot reach the MQTT broker at {mqtt_at}"
              + (f" ({why})" if why else ""), file=sys.stderr)
        return EXIT_UNREACHABLE
    logging.getLogger("sfc_host").info(
        "host %s running: Redis %s, MQTT %s, %d scopes", cfg.consumer_name, redis_at,
        mqtt_at, len(app.host.streams.scopes))
    await stop.wait()
    await app.aclose()
    return 0
