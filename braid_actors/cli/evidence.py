"""``braid evidence``: ingest transcripts into the evidence store and show a run's coverage.

```
braid evidence ingest PATH... [--run RUN_ID] [--harness NAME] [--policy basic|detailed]
                              [--redact REGEX]... [--json]
braid evidence show RUN_ID [--json]
braid evidence serve [--port N] [--dashboard-port N]
```

A PATH that is a directory stands for the transcript files under it (``*.jsonl`` and
``*session*.json``, in path order; see ``evidence._paths``). Without ``--run`` the paths go
into one new import run (printed first) and every file is its current execution. Output
names sources, statuses, counts and issue codes only, never a message body, and ends with a
count of files and of sources by status. The exit status is 1 when any source is ``failed``
or ``no_input``, 2 when the command is refused before anything is written.

``serve`` runs the recorded-context HTTP API on 127.0.0.1 (port 0 picks a free one) and,
with ``--dashboard-port``, the dashboard routes; it prints each bound URL once it listens.
Requests need ``Authorization: Bearer`` and the token in ``$BRAID_HOME/evidence.token``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from braid_actors.errors import BraidError
from braid_actors.evidence import (
    HARNESSES,
    PRESETS,
    EvidenceStore,
    serve_evidence,
    transcript_paths,
)
from braid_actors.model import new_id

if TYPE_CHECKING:
    import argparse

_BAD = frozenset({"failed", "no_input"})


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``evidence`` and its subcommands on the ``braid`` parser."""
    evidence = subparsers.add_parser("evidence", help="recorded evidence of runs")
    sub = evidence.add_subparsers(dest="evidence_command", required=True)
    ingest = sub.add_parser("ingest", help="ingest transcript files and print their coverage")
    ingest.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="a transcript file, or a directory"
    )
    ingest.add_argument("--run", dest="run_id", help="run to ingest into (default: a new run)")
    ingest.add_argument("--harness", choices=[*HARNESSES], help="skip format detection")
    ingest.add_argument("--policy", choices=[*PRESETS], help="capture policy of a new run")
    ingest.add_argument(
        "--redact", action="append", default=[], metavar="REGEX", help="extra redaction pattern"
    )
    ingest.add_argument("--json", action="store_true", help="print coverage objects as JSON")
    show = sub.add_parser("show", help="print a run's coverage and stored counts")
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="print the overview as JSON")
    serve = sub.add_parser("serve", help="serve the recorded-context HTTP API on 127.0.0.1")
    serve.add_argument("--port", type=int, default=8574, help="API port (0: any free port)")
    serve.add_argument("--dashboard-port", type=int, help="also serve the dashboard routes")


def run(args: argparse.Namespace, home: Path) -> int:
    """Run an ``evidence`` subcommand against the store under ``home``."""
    try:
        if args.evidence_command == "ingest":
            return _ingest(args, home)
        if args.evidence_command == "show":
            return _show(args, home)
        if args.evidence_command == "serve":
            return _serve(args, home)
    except BraidError as exc:
        print(f"braid: {exc.message} ({exc.code})", file=sys.stderr)
        return 2
    return 2


def _ingest(args: argparse.Namespace, home: Path) -> int:
    paths = transcript_paths(args.paths)  # (refused before the store is opened)
    run_id = args.run_id or new_id("run")
    resume = None if args.run_id else 0
    statuses: Counter[str] = Counter()
    with EvidenceStore.open(home, redaction_patterns=args.redact) as store:
        if not args.json:
            print(f"run {run_id}")
        # Many files (8 MB or more) are prepared by one process per CPU (ingest_many).
        reports = store.ingest_many(
            paths,
            run_id=run_id,
            harness=args.harness,
            policy=args.policy,
            resume_offset=resume,
        )
        for report in reports:
            for source in report.sources:
                coverage = source.coverage
                statuses[coverage["status"]] += 1
                if args.json:
                    print(json.dumps(coverage, ensure_ascii=False, sort_keys=True))
                else:
                    print(_line(coverage, source.summary))
    if not args.json:
        print(_totals(len(paths), statuses))
    return 1 if any(statuses[status] for status in _BAD) else 0


def _totals(files: int, statuses: Counter[str]) -> str:
    """``3 files, 4 sources: ok 3, partial 1`` (statuses in the order they first came)."""
    sources = sum(statuses.values())
    by_status = ", ".join(f"{status} {count}" for status, count in statuses.items())
    return (
        f"{files} file{'s' if files != 1 else ''}, "
        f"{sources} source{'s' if sources != 1 else ''}: {by_status}"
    )


def _show(args: argparse.Namespace, home: Path) -> int:
    with EvidenceStore.open(home) as store:
        overview = store.overview(args.run_id)
    if args.json:
        print(json.dumps(overview, ensure_ascii=False, sort_keys=True))
        return 0
    policy = overview.get("capture_policy", {}).get("preset", "not recorded")
    runtime = overview["runtime_coverage"]["capture"]["status"]
    print(f"run {overview['run_id']}  policy {policy}  runtime capture {runtime}")
    print(
        f"  messages {overview['messages']}  tool calls {overview['tool_calls']}  "
        f"tool results {overview['tool_results']}  snapshots {overview['snapshots']}"
    )
    for coverage in overview["coverage"]:
        print(_line(coverage, {}))
    if overview["has_more_sources"]:
        print("  (more sources than shown)")
    return 0


def _serve(args: argparse.Namespace, home: Path) -> int:
    import trio

    from braid_actors.app import freeze_long_lived

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(
                serve_evidence, home, port=args.port, dashboard_port=args.dashboard_port
            )
            server = await nursery.start(serve)
            # Up: the store and the modules live as long as the process, as braid serve's
            # loaded graph does; full collections stop walking them (docs/architecture.md).
            freeze_long_lived()
            print(f"braid: evidence API on {server.api_url}", flush=True)
            if server.dashboard_url is not None:
                print(f"braid: evidence dashboard on {server.dashboard_url}", flush=True)

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    return 0


def _line(coverage: dict[str, Any], summary: dict[str, int]) -> str:
    source = coverage["source"]
    counts = coverage["counts"]
    span = ""
    if "first_line" in coverage:
        span = f"  lines {coverage['first_line']}-{coverage.get('last_line', '?')}"
    shown = " ".join(
        f"{key} {_count(counts.get(key))}"
        for key in ("read", "parsed", "stored", "duplicates", "failed", "unrecognized", "deferred")
    )
    text = (
        f"{source.get('path', '?')}\n  {source['harness']}  session {source['session_id']}"
        + (f"  agent {source['agent_id']}" if source.get("agent_id") else "")
        + f"  {coverage['status']}{span}\n  {shown}"
    )
    extra = {
        k: summary[k] for k in ("tool_calls", "tool_results", "unmatched_calls") if k in summary
    }
    if extra:
        text += "\n  " + "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in extra.items())
    prior = coverage.get("prior_context")
    if prior:
        text += f"\n  prior context lines {prior['first_line']}-{prior['last_line']}"
    issues = coverage["issues"]
    if issues:
        listed = ", ".join(
            issue["code"] + (f"@{issue['line']}" if "line" in issue else "")
            for issue in issues[:10]
        )
        more = f" (+{len(issues) - 10})" if len(issues) > 10 else ""
        text += f"\n  issues: {listed}{more}"
    return text


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)
