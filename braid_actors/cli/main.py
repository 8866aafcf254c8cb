"""The ``braid`` command: ``demo``, ``headless``, ``serve`` and ``journal verify``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from braid_actors.errors import BadRequest, BraidError

# The application (and trio) are imported by the commands that run it: a process that
# only imports this module, as each worker of a parallel ``braid evidence ingest`` does
# (multiprocessing loads the parent's main script in every spawned worker), needs neither.

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


MAX_ACTIVE_ENV = "BRAID_MAX_ACTIVE"


def _max_active_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-active",
        type=int,
        metavar="N",
        help=f"at most N runs active at once (default ${MAX_ACTIVE_ENV}, else unlimited)",
    )


def _parser() -> argparse.ArgumentParser:
    from braid_actors.app import DEFAULT_DRAIN_GRACE

    parser = argparse.ArgumentParser(prog="braid", description="Supervise coding-agent runs.")
    parser.add_argument("--home", type=Path, help="Braid home (default $BRAID_HOME or ~/.braid)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the demo in a temporary home (or --home)")
    headless = sub.add_parser(
        "headless", help="JSONL command loop on stdin/stdout (through the daemon when one runs)"
    )
    headless.add_argument(
        "--in-process", action="store_true", help="never use a running daemon; run Braid here"
    )
    _max_active_arg(headless)
    serve = sub.add_parser("serve", help="run Braid as a daemon on $BRAID_HOME/braid.sock")
    serve.add_argument(
        "--on-shutdown",
        choices=["drain", "cancel"],
        default="drain",
        help="what SIGTERM / SIGINT do with active runs (default drain)",
    )
    serve.add_argument(
        "--drain-grace",
        type=float,
        default=DEFAULT_DRAIN_GRACE,
        metavar="SECONDS",
        help=f"how long a drain waits before cancelling (default {DEFAULT_DRAIN_GRACE:g})",
    )
    _max_active_arg(serve)
    journal = sub.add_parser("journal", help="journal tools")
    jsub = journal.add_subparsers(dest="journal_command", required=True)
    jsub.add_parser("verify", help="integrity report; non-zero exit on any fault")
    from braid_actors.cli import evidence

    evidence.add_parser(sub)
    return parser


def _max_active(value: int | None, env: Mapping[str, str]) -> int | None:
    if value is None and env.get(MAX_ACTIVE_ENV):
        try:
            value = int(env[MAX_ACTIVE_ENV])
        except ValueError:
            raise BadRequest(f"{MAX_ACTIVE_ENV} must be a whole number") from None
    if value is not None and value < 1:
        raise BadRequest("the admission limit (--max-active) must be at least 1")
    return value


async def _headless(home: Path, *, in_process: bool, max_active: int | None) -> None:
    import trio

    from braid_actors.app import open_app
    from braid_actors.cli.client import run_client
    from braid_actors.cli.daemon import connect
    from braid_actors.cli.headless import run_headless

    sock = None if in_process else await connect(home)
    if sock is not None:
        if max_active is not None:
            print("braid: the running daemon's admission limit applies", file=sys.stderr)
        await run_client(sock)
        return
    async with trio.open_nursery() as nursery:
        app = await nursery.start(
            functools.partial(open_app, home, admission_limit=max_active, settle=True)
        )
        await run_headless(app)


def _serve(home: Path, args: argparse.Namespace) -> None:
    import trio

    from braid_actors.cli.daemon import ServeOptions, serve

    options = ServeOptions(
        on_shutdown=args.on_shutdown,
        drain_grace=args.drain_grace,
        max_active=_max_active(args.max_active, os.environ),
    )
    trio.run(serve, home, options)


def _braid_error(group: BaseExceptionGroup[BaseException]) -> BraidError | None:
    """The one Braid error a failed start-up raised through nurseries, if that is all it is."""
    matched, rest = group.split(BraidError)
    if matched is None or rest is not None:
        return None
    leaves: list[BaseException] = []
    pending: list[BaseException] = [matched]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseExceptionGroup):
            pending.extend(item.exceptions)
        else:
            leaves.append(item)
    first = leaves[0]
    return first if isinstance(first, BraidError) else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        try:
            return _run(args)
        except BaseExceptionGroup as group:
            found = _braid_error(group)
            if found is None:
                raise
            raise found from None
    except BraidError as exc:
        from braid_actors.app import error_body

        body = error_body(exc)
        print(f"braid: {body['message']} ({body['code']})", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import trio

    from braid_actors.app import default_home

    if args.command == "demo":
        from braid_actors.cli.demo import run_demo

        return 0 if trio.run(run_demo, args.home) else 1
    home = args.home or default_home()
    if args.command == "headless":
        max_active = _max_active(args.max_active, os.environ)
        trio.run(
            functools.partial(_headless, home, in_process=args.in_process, max_active=max_active)
        )
        return 0
    if args.command == "serve":
        _serve(home, args)
        return 0
    if args.command == "journal" and args.journal_command == "verify":
        from braid_actors.cli.verify import verify_home

        report = verify_home(home)
        print(report.render())
        return 0 if report.ok else 1
    if args.command == "evidence":
        from braid_actors.cli import evidence

        return evidence.run(args, home)
    return 2


if __name__ == "__main__":
    sys.exit(main())
