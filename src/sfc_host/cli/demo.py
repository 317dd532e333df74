"""``sfc-host demo``: its options; the run itself is ``sfc_host.demo``."""

from __future__ import annotations

import argparse

from sfc_host.cli.common import positive
from sfc_host.demo.run import Options, run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run everything on this machine: Redis, MQTT, hosts, "
                       "a simulated station, jobs")
    p.add_argument("--jobs", type=positive(int), default=200, metavar="N",
                   help="jobs to submit (default 200)")
    p.add_argument("--scopes", type=positive(int), default=4, metavar="N",
                   help="scopes (lines) to spread them over (default 4)")
    p.add_argument("--hosts", type=positive(int), default=1, metavar="N",
                   help="host instances; 1 runs in this process, more as sfc-host run "
                   "processes sharing the work (default 1)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--speed", type=positive(float), default=1.0, metavar="X",
                   help="station speed factor: 10 works ten times faster (default 1)")
    p.add_argument("--parallel", type=positive(int), default=10, metavar="N",
                   help="jobs in progress at once per scope (default 10)")
    p.add_argument("--timeout", type=positive(float), default=None, metavar="S",
                   help="give up on jobs not ended after S seconds (default: from --jobs)")
    p.add_argument("--web", action="store_true",
                   help="serve the web view (read-only) on 127.0.0.1 while the demo runs, "
                   "and after it until Ctrl-C")
    p.add_argument("--web-control", action="store_true",
                   help="with --web: the job pages' Pause, Resume, Abort, Stop and Clear "
                   "buttons")
    p.add_argument("--web-port", type=_port, default=0, metavar="PORT",
                   help="with --web: listen on this port (default: a free one)")
    p.add_argument("--equipment", choices=("mqtt", "opcua"), default="mqtt",
                   help="opcua: the machines are PackML units on an OPC UA server the "
                   "host drives (docs/equipment-opcua.md); the stations publish only "
                   "their sensors' events (default mqtt)")
    p.set_defaults(func=cmd_demo)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 1-65535, got {port}")
    return port


def cmd_demo(args: argparse.Namespace) -> int:
    return run(Options(jobs=args.jobs, scopes=args.scopes, hosts=args.hosts, seed=args.seed,
                       speed=args.speed, parallel=args.parallel, timeout=args.timeout or 0.0,
                       web=args.web, web_control=args.web_control, web_port=args.web_port,
                       equipment=args.equipment))
