"""``python -m tools.model_stub --script FILE [--port N]``: serve a script by hand.

Prints the server's URL on the first line of stdout, then serves until interrupted (or
``--lifetime`` seconds). ``--record FILE`` appends every request as one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import trio

from tools.model_stub._script import Script, ScriptError, load_script
from tools.model_stub._server import ModelStub, RecordedRequest, serve_model_stub


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.model_stub", description=__doc__)
    parser.add_argument("--script", type=Path, help="JSON script (default: no steps)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument(
        "--lifetime", type=float, default=3600.0, help="stop after this many seconds"
    )
    parser.add_argument("--record", type=Path, help="append each request to this JSONL file")
    return parser


async def _serve(script: Script, args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        stub: ModelStub = await nursery.start(
            lambda task_status: serve_model_stub(
                script, port=args.port, lifetime=args.lifetime, task_status=task_status
            )
        )
        if args.record is not None:
            record: Path = args.record

            def write(request: RecordedRequest) -> None:
                with record.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(request.to_json()) + "\n")

            stub.on_request = write
        print(stub.url, flush=True)
        print(
            f"ANTHROPIC_BASE_URL={stub.url}  OpenAI base_url={stub.openai_base_url}",
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        script = load_script(args.script) if args.script else Script()
    except (OSError, ScriptError) as exc:
        print(f"model stub: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_serve, script, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
