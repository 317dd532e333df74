"""The ``sfc-host`` command line.

Every command exits 0 when done, 1 when refused or failed (a recipe with problems,
with one line per problem; a server out of reach, one line) and 2 for a user mistake
(a wrong argument, a missing file: one line on stderr); never with a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from sfc_fast import RecipeError
from sfc_host.cli import demo, engine, job, opcua, ops, run, web
from sfc_host.cli.common import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, redis_unreachable
from sfc_host.errors import SfcHostError
from sfc_host.execution.workmaster import UsageError, compile_file

# Command groups of their own module, each with ``register(subparsers)``
_GROUPS = (run, engine, job, ops, demo, web, opcua)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the default prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _check_one(path: str, dataschema: str | None) -> tuple[int, dict[str, Any]]:
    """One file's exit status and result: ``{file, ok, …summary}``, ``{file, ok: false,
    problems}`` for a refused recipe or ``{file, ok: false, error}`` for a file that
    cannot be read (a usage mistake)."""
    try:
        _loaded, graph = compile_file(path, dataschema)
    except UsageError as e:
        return EXIT_USAGE, {"file": path, "ok": False, "error": str(e)}
    except OSError as e:   # stat works but reading does not (permissions, a device)
        return EXIT_USAGE, {"file": path, "ok": False,
                            "error": f"cannot read {path}: {e.strerror or e}"}
    except RecipeError as e:
        return EXIT_PROBLEMS, {"file": path, "ok": False,
                               "problems": [p.to_dict() for p in e.problems]}
    return EXIT_OK, {"file": path, "ok": True, **graph.summary()}


def _check_text(r: dict[str, Any]) -> None:
    path = r["file"]
    if "error" in r:
        print(f"sfc-host: error: {r['error']}", file=sys.stderr)
    elif not r["ok"]:
        n = len(r["problems"])
        print(f"{path}: refused, {n} problem{'s' if n != 1 else ''}")
        for p in r["problems"]:
            print(f"{path}: {p['code']} {p['path']}: {p['message']}")
    else:
        br = r["branches"]
        print(f"{path}: ok, recipe v{r['version']}, {r['steps']} steps, "
              f"{r['actions']} actions, {br} branch{'es' if br != 1 else ''}, "
              f"{r['transitions']} transitions, initial {r['initial']}, "
              f"fingerprint {r['fingerprint']}")


def cmd_recipe_check(args: argparse.Namespace) -> int:
    """Every file is checked and reported, whatever the ones before gave: the exit
    status is the worst (2 a file that cannot be read, 1 a refused recipe)."""
    from sfc_fast import SCHEMAS
    from sfc_host.execution.workmaster import resolve_schema

    schema = None if args.dataschema is None else resolve_schema(args.dataschema)
    if schema is not None and schema not in SCHEMAS:
        # the flag is the user's mistake; a Work Master's own unknown one is a problem
        print(f"sfc-host: error: --dataschema {args.dataschema!r}: one of 1.0.0, 1.1.0 "
              "or the full URI", file=sys.stderr)
        return EXIT_USAGE
    worst = EXIT_OK
    results = []
    for path in args.files:
        code, result = _check_one(path, schema)
        worst = max(worst, code)
        if args.json:
            results.append(result)
        else:
            _check_text(result)
            sys.stdout.flush()   # in file order, also when stderr lines come between
    if args.json:
        print(json.dumps(results, indent=2))
    return worst


def cmd_version(args: argparse.Namespace) -> int:
    from sfc_host.versions import versions, versions_text

    doc = versions()
    print(json.dumps(doc, indent=2) if args.json else versions_text(doc))
    return EXIT_OK


class _VersionAction(argparse.Action):
    """``--version``: the package version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from sfc_host.versions import package_version

        print(f"sfc-host (sfc-fast) {package_version()}")
        parser.exit(EXIT_OK)


class JobNotReadable(SfcHostError):
    """A job that cannot be drawn: unknown, ambiguous, not started, or Redis out of reach
    (one line)."""


async def read_job_picture(config: Any, job: str, scope: str | None = None,
                           timeout_s: float = 15.0) -> tuple[Any, dict[str, Any]]:
    """The recipe a job runs (pinned by fingerprint) and its state view, read from Redis
    as ``sfc-host inspect`` reads it. Nothing is written."""
    from redis.exceptions import RedisClusterException, RedisError

    from sfc_host.config import without_credentials
    from sfc_host.names import InvalidName, check_job, check_scope
    from sfc_host.store.client import connect
    from sfc_host.store.states import GraphCache
    from sfc_host.store.views import Ambiguous, NotFound, find_scope, read_job

    try:
        check_job(job)
        if scope is not None:
            check_scope(scope)
    except InvalidName as e:
        raise JobNotReadable(str(e)) from None
    client = connect(config)

    async def read() -> tuple[Any, dict[str, Any]]:
        sc = scope if scope is not None else await find_scope(client, job)
        graphs = GraphCache(2)
        view = await read_job(client, sc, job, graphs)
        if view["state"] is None:
            raise JobNotReadable(f"job {job!r} in scope {sc!r}: "
                                 f"{view['state_error'] or 'not started yet, no state to draw'}")
        return graphs.get(view["fingerprint"]), view["state"]

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except (NotFound, Ambiguous) as e:
        raise JobNotReadable(str(e)) from None
    except (RedisError, RedisClusterException, OSError, TimeoutError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        # the cause tells a server out of reach (exit 1) from a mistake (exit 2)
        raise JobNotReadable(f"cannot read from Redis at "
                             f"{without_credentials(config.redis_url)} ({why})") from e
    finally:
        await client.aclose()


def _diagram_usage(message: str) -> int:
    print(f"sfc-host: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_recipe_diagram(args: argparse.Namespace) -> int:
    """Mermaid (default) or, with ``--svg``, an SVG picture; with ``--job`` the picture
    of a running job's recipe, its active and finished steps coloured. Every mistake is
    one line and exit 2 (a recipe with problems too: ``recipe check`` lists them); a
    Redis out of reach is one line and exit 1."""
    from pathlib import Path

    from sfc_host.charts.mermaid import to_mermaid

    if args.job is None and any(v is not None for v in (args.scope, args.config, args.redis)):
        return _diagram_usage("--scope, --config and --redis go with --job")
    if args.job is not None and args.svg is None:
        return _diagram_usage("--job needs --svg OUT (the Mermaid output shows no job)")
    if args.file is None and args.job is None:
        return _diagram_usage("give a recipe FILE, or --job JOB to draw a job's recipe")
    graph = None
    if args.file is not None:
        try:
            _, graph = compile_file(args.file, args.dataschema)
        except UsageError as e:
            return _diagram_usage(str(e))
        except RecipeError as e:
            p = e.problems[0]
            n = len(e.problems)
            return _diagram_usage(f"{args.file}: refused, {n} problem{'s' if n != 1 else ''} "
                                  f"(first: {p.code} {p.path}: {p.message}); "
                                  "'sfc-host recipe check' lists them")
    view = None
    if args.job is not None:
        from sfc_host.config import ConfigError, HostConfig

        try:
            cfg = HostConfig.load(args.config, redis_url=args.redis)
            job_graph, view = asyncio.run(read_job_picture(cfg, args.job, args.scope))
        except (ConfigError, JobNotReadable) as e:
            if redis_unreachable(e.__cause__):   # failed, not the user's mistake
                print(f"sfc-host: error: {e}", file=sys.stderr)
                return EXIT_PROBLEMS
            return _diagram_usage(str(e))
        if graph is not None and graph.fingerprint != job_graph.fingerprint:
            return _diagram_usage(
                f"{args.file} is not the recipe job {args.job!r} runs (fingerprint "
                f"{graph.fingerprint[:12]}, the job's {job_graph.fingerprint[:12]}); "
                "leave FILE out to draw the job's own")
        graph = job_graph
    if args.svg is None:
        sys.stdout.write(to_mermaid(graph))
        return EXIT_OK
    from sfc_host.charts.svg import to_svg

    title = Path(args.file).stem if args.file is not None else None
    text = to_svg(graph, view, title=title)
    if args.svg == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(args.svg).write_text(text, encoding="utf-8")
    except OSError as e:
        return _diagram_usage(f"cannot write {args.svg}: {e.strerror or e}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sfc-host", description="sfc-fast recipe-execution host")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    recipe = sub.add_parser("recipe", help="check or draw recipes")
    rsub = recipe.add_subparsers(dest="recipe_command", metavar="ACTION", parser_class=_Parser)
    rsub.required = True
    check = rsub.add_parser("check", help="compile recipes and print a summary or the problems")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a Work Master JSON ({data, dataschema}) or a bare recipe")
    check.add_argument("--dataschema", metavar="URI",
                       help="format of a bare recipe: 1.0.0, 1.1.0 or the full URI")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.set_defaults(func=cmd_recipe_check)
    diagram = rsub.add_parser("diagram", help="draw a recipe: a Mermaid flowchart, or an SVG "
                              "picture (with a running job's steps coloured)")
    diagram.add_argument("file", metavar="FILE", nargs="?",
                         help="the recipe (leave out with --job: the job's own recipe)")
    diagram.add_argument("--dataschema", metavar="URI")
    diagram.add_argument("--svg", metavar="OUT", help="write an SVG picture ('-': stdout)")
    diagram.add_argument("--job", metavar="JOB", help="colour this job's active and finished "
                         "steps (read from Redis; needs --svg)")
    diagram.add_argument("--scope", metavar="S", help="the job's scope (default: the one "
                         "scope that holds it)")
    diagram.add_argument("--config", metavar="FILE", help="host settings (TOML) for Redis")
    diagram.add_argument("--redis", metavar="URL", help="Redis URL (over the config's)")
    diagram.set_defaults(func=cmd_recipe_diagram)

    version = sub.add_parser("version", help="the versions of the package, Python, the "
                             "client libraries and the compiled core")
    version.add_argument("--json", action="store_true", help="print them as JSON")
    version.set_defaults(func=cmd_version)

    for group in _GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("sfc-host: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
