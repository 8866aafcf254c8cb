"""The ``braid`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from braid_actors.app import default_home, error_body, open_app
from braid_actors.errors import BraidError

if TYPE_CHECKING:
    from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braid", description="Supervise coding-agent runs.")
    parser.add_argument("--home", type=Path, help="Braid home (default $BRAID_HOME or ~/.braid)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the demo in a temporary home (or --home)")
    sub.add_parser("headless", help="JSONL command loop on stdin/stdout")
    journal = sub.add_parser("journal", help="journal tools")
    jsub = journal.add_subparsers(dest="journal_command", required=True)
    jsub.add_parser("verify", help="integrity report; non-zero exit on any fault")
    return parser


async def _headless(home: Path) -> None:
    from braid_actors.cli.headless import run_headless

    async with trio.open_nursery() as nursery:
        app = await nursery.start(open_app, home)
        await run_headless(app)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from braid_actors.cli.demo import run_demo

            return 0 if trio.run(run_demo, args.home) else 1
        home = args.home or default_home()
        if args.command == "headless":
            trio.run(_headless, home)
            return 0
        if args.command == "journal" and args.journal_command == "verify":
            from braid_actors.cli.verify import verify_home

            report = verify_home(home)
            print(report.render())
            return 0 if report.ok else 1
    except BraidError as exc:
        body = error_body(exc)
        print(f"braid: {body['message']} ({body['code']})", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
