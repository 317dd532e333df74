"""The web view's screenshots in docs/img/, made anew.

    .venv/bin/python tests/helpers/screenshots.py [--out DIR] [--redis URL --mqtt URL]

It runs the operator's tour of ``tests/helpers/web_tour.py`` (headless chromium against
``sfc-host run``, with every check of the test) on a redis-server and a mosquitto it
starts itself, or on the servers given (the Redis database is flushed), and copies the
pictures into ``--out`` (default docs/img/) only when the whole tour passed. The test
runs the same tour through ``main`` and keeps its pictures in a temporary folder, so a
test run never changes the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:      # run as a script: tests/ for ``helpers``
    sys.path.insert(0, str(ROOT / "tests"))
SHOTS = ("web-scopes.png", "web-jobs.png", "web-job.png")
TOUR_TIMEOUT_S = 120


@contextlib.contextmanager
def _servers(redis: str | None, mqtt: str | None, workdir: Path) -> Iterator[tuple[str, str]]:
    """The URLs given, or a redis-server and a mosquitto started for the tour."""
    from helpers.servers import MosquittoServer, RedisServer

    with contextlib.ExitStack() as stack:
        urls = []
        for given, cls in ((redis, RedisServer), (mqtt, MosquittoServer)):
            if given:
                urls.append(given)
                continue
            server = cls(workdir / cls.__name__)
            server.start()
            stack.callback(server.stop)
            urls.append(server.url)
        yield urls[0], urls[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="screenshots.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img",
                    help="where the pictures go (default: docs/img)")
    ap.add_argument("--redis", help="a Redis URL to use instead of starting redis-server")
    ap.add_argument("--mqtt", help="a broker URL to use instead of starting mosquitto")
    args = ap.parse_args(argv)
    try:
        from helpers.web_tour import tour
    except pytest.skip.Exception as e:          # no chromium or selenium here
        print(f"screenshots.py: {e.msg}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="sfc-screenshots-") as tmp:
        work = Path(tmp)
        shots = work / "img"
        shots.mkdir()
        with _servers(args.redis, args.mqtt, work) as (redis_url, mqtt_url):
            asyncio.run(asyncio.wait_for(tour(redis_url, mqtt_url, work, shots),
                                         TOUR_TIMEOUT_S))
        args.out.mkdir(parents=True, exist_ok=True)
        for name in SHOTS:
            shutil.copyfile(shots / name, args.out / name)
    print(f"screenshots.py: {', '.join(SHOTS)} written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
