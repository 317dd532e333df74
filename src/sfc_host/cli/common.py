"""What every ``sfc-host`` command shares: exit codes, argument types, the common
options, loading the settings, and turning a user's mistake into one line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sfc_host.config import ConfigError, HostConfig, without_credentials
from sfc_host.execution.workmaster import UsageError
from sfc_host.names import check_scope
from sfc_host.store.views import NotFound

EXIT_OK = 0
EXIT_PROBLEMS = 1     # refused, failed, or a server out of reach
EXIT_REFUSED = EXIT_PROBLEMS
EXIT_USAGE = 2        # the user's mistake: one line


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` greater than 0, else a one-line error."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return v
    return parse


def redis_unreachable(e: BaseException | None) -> bool:
    """Whether a Redis client error means the server could not be reached (a refused or
    timed-out connection; on a cluster, no start-up node answering) rather than a
    wrong setting (a password, a server that is no cluster node)."""
    from redis.exceptions import AuthenticationError, RedisClusterException
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(e, AuthenticationError):
        return False
    if isinstance(e, RedisConnectionError | RedisTimeoutError | OSError | TimeoutError):
        return True
    return isinstance(e, RedisClusterException) and redis_unreachable(e.__cause__)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def error(msg: str, code: int = EXIT_USAGE) -> int:
    print(f"sfc-host: error: {one_line(msg)}", file=sys.stderr)
    return code


def common_args(p: argparse.ArgumentParser, *, mqtt: bool, redis: bool,
            scope: bool = True) -> None:
    p.add_argument("--config", metavar="FILE", help="the hosts' TOML settings")
    if mqtt:
        p.add_argument("--mqtt", metavar="URL", help="MQTT broker URL (overrides the config)")
        p.add_argument("--timeout", type=positive(float), default=10.0, metavar="SECONDS",
                       help="how long to wait for the host's reply (default 10)")
    if redis:
        p.add_argument("--redis", metavar="URL", help="Redis URL (overrides the config)")
    if scope:
        p.add_argument("--scope", metavar="SCOPE",
                       help="the scope (default: the config's only scope)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def load_config(args: argparse.Namespace) -> HostConfig:
    return HostConfig.load(args.config, mqtt_url=getattr(args, "mqtt", None),
                           redis_url=getattr(args, "redis", None))


def scope_of(args: argparse.Namespace, cfg: HostConfig) -> str:
    if args.scope:
        return check_scope(args.scope)
    if len(cfg.scopes) == 1:
        return check_scope(cfg.scopes[0])
    raise UsageError("--scope is required (the config names "
                     f"{len(cfg.scopes) or 'no'} scopes)")


def guarded(args: argparse.Namespace, body: Callable[[HostConfig], Awaitable[int]]) -> int:
    """Run ``body`` with the settings; every user mistake becomes one line and exit 2."""
    from redis.exceptions import RedisClusterException, RedisError

    from sfc_host.mes.client import MesError

    try:
        cfg = load_config(args)
    except ConfigError as e:
        return error(str(e))
    try:
        return asyncio.run(body(cfg))
    except (UsageError, ConfigError, MesError, NotFound) as e:
        return error(str(e))
    except (RedisError, RedisClusterException) as e:
        if redis_unreachable(e):   # a server out of reach: failed, not the user's mistake
            return error(f"cannot reach Redis at {without_credentials(cfg.redis_url)}: {e}",
                          EXIT_REFUSED)
        return error(f"Redis at {without_credentials(cfg.redis_url)}: {e}")
    except OSError as e:
        return error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
    except ValueError as e:   # bad names and URLs (InvalidName is one)
        return error(str(e))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart; None shows as '-'."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)
