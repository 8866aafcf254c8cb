"""``braid headless``: the JSONL command loop of ``headless-protocol.md``.

One JSON object a line in, one a line out. Bad input (malformed JSON, a line over 4 MiB,
an unknown command, bad params) gets an error reply with its own code and the loop goes on;
nothing is written for it. Commands run in arrival order, except long waits (``wait_run``),
which run concurrently so they never hold up later commands. End of input waits for the
replies still owed, then shuts Braid down safely (drain).
"""

from __future__ import annotations

import json
import sys
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import trio

from braid_actors.app import BraidApp, call, error_reply, parse
from braid_actors.errors import (
    BraidError,
    InvalidRequest,
    LineTooLong,
    MalformedJson,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

MAX_LINE = 4 * 1024 * 1024
_OWED_REPLY_GRACE = 2.0
_CHUNK = 65_536


class _TooLong:
    """Marker for a line that exceeded :data:`MAX_LINE` (its bytes were discarded)."""


async def read_lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[bytes | _TooLong, None]:
    """Lines without their newline; a line over the limit yields one ``_TooLong``."""
    buf = bytearray()
    discarding = False
    while True:
        chunk = await stream.receive_some(_CHUNK)
        if not chunk:
            if buf and not discarding:
                yield bytes(buf)
            return
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not discarding:
                    buf += chunk[start:]
                    if len(buf) > MAX_LINE:
                        discarding = True
                        buf.clear()
                        yield _TooLong()
                break
            if discarding:
                discarding = False
            else:
                buf += chunk[start:nl]
                if len(buf) > MAX_LINE:
                    yield _TooLong()
                else:
                    yield bytes(buf)
            buf.clear()
            start = nl + 1


class Writer:
    """Serializes reply lines so concurrent handlers never interleave bytes."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        async with self._lock:
            await self._stream.send_all(line.encode("utf-8"))


def _envelope(line: bytes) -> tuple[Any, str, object]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MalformedJson("the line is not valid JSON") from None
    if not isinstance(message, dict):
        raise InvalidRequest("a request is a JSON object")
    request_id = message.get("id")
    if request_id is not None and not isinstance(request_id, str | int):
        raise InvalidRequest("id must be a string or a number")
    command = message.get("command")
    if not isinstance(command, str):
        raise InvalidRequest("a request needs a string 'command'", details={"id": request_id})
    extra = set(message) - {"id", "command", "params"}
    if extra:
        raise InvalidRequest("unknown envelope fields", details={"fields": sorted(extra)})
    return request_id, command, message.get("params")


async def serve_lines(app: BraidApp, reader: trio.abc.ReceiveStream, writer: Writer) -> None:
    """Run the loop over one input stream until EOF or ``shutdown``."""
    async with trio.open_nursery() as waits:

        async def handle(request_id: Any, command: str, params: object) -> None:
            try:
                result = await call(app, command, params)
            except BraidError as exc:
                await writer.send(error_reply(request_id, exc))
            else:
                await writer.send({"id": request_id, "ok": True, "result": result})

        async with aclosing(read_lines(reader)) as lines:
            async for line in lines:
                if isinstance(line, _TooLong):
                    await writer.send(
                        error_reply(None, LineTooLong("the line is longer than 4 MiB"))
                    )
                    continue
                if not line.strip():
                    continue
                request_id: Any = None
                try:
                    request_id, command, params = _envelope(line)
                    spec, _ = parse(command, params)  # bad params fail here, before anything runs
                except BraidError as exc:
                    await writer.send(error_reply(request_id, exc))
                    continue
                if spec.waits:
                    waits.start_soon(handle, request_id, command, params)
                else:
                    await handle(request_id, command, params)
                if app.stopped.is_set():
                    break
        # EOF or shutdown: settle runs (drain), then give owed wait replies a moment.
        if not app.stopped.is_set():
            await app.shutdown(drain=True)
        waits.cancel_scope.deadline = trio.current_time() + _OWED_REPLY_GRACE


async def run_headless(app: BraidApp) -> None:
    """The loop on this process's standard input and output."""
    stdin = trio.lowlevel.FdStream(_dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(_dup(sys.stdout.fileno()))
    async with stdin, stdout:
        await serve_lines(app, stdin, Writer(stdout))


def _dup(fd: int) -> int:
    import os

    return os.dup(fd)
