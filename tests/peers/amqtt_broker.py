"""The pure-Python amqtt broker on a loopback port, in a process of its own, for the
tests (a restart needs a process to stop).

    python amqtt_broker.py PORT

Prints ``amqtt VERSION ready on 127.0.0.1:PORT`` once it listens; SIGTERM or SIGINT
shuts it down and exits 0. In memory only, anonymous clients allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

import amqtt
from amqtt.broker import Broker

SHUTDOWN_S = 2.0


async def main(port: int) -> None:
    config = {"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
              "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                          {"allow_anonymous": True}}}
    broker = Broker(config)
    await broker.start()
    print(f"amqtt {amqtt.__version__} ready on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # amqtt's shutdown does not end while a client keeps publishing: bounded
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(broker.shutdown(), SHUTDOWN_S)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python amqtt_broker.py PORT")
    # amqtt logs every client's coming and going at INFO
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(int(sys.argv[1])))
    sys.stdout.flush()
    # after a shutdown cut short, what amqtt left running holds the interpreter's exit
    os._exit(0)
