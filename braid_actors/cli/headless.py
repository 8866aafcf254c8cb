"""``braid headless``: the JSONL command loop of ``headless-protocol.md``.

One JSON object a line in, one a line out. Bad input (malformed JSON, a line over 4 MiB,
an unknown command, bad params) gets an error reply with its own code and the loop goes on;
nothing is written for it. Commands run in arrival order, except long waits (``wait_run``),
which run concurrently so they never hold up later commands.

:func:`serve_session` is one session that never stops Braid (a daemon connection, see
``daemon.py``); :func:`serve_lines` is the in-process loop, whose end of input shuts Braid
down safely (drain). ``subscribe`` is handled here rather than in the command table because
its events go to the session's own writer.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import attrs
import trio

from braid_actors.app import (
    SUBSCRIBE,
    BraidApp,
    Subscription,
    call,
    error_reply,
    parse,
    parse_subscribe,
)
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


@attrs.define(eq=False)
class _Session:
    """One JSONL session: its writer, its owed replies and its subscriptions."""

    app: BraidApp
    writer: Writer
    _work: trio.Nursery | None = None
    _subscriptions: list[Subscription] = attrs.Factory(list)
    _receiving: trio.CancelScope | None = None
    _stopping: bool = False

    async def run(self, reader: trio.abc.ReceiveStream, *, shutdown_at_eof: bool) -> None:
        try:
            async with trio.open_nursery() as outer:
                async with trio.open_nursery() as work:
                    self._work = work
                    outer.start_soon(self._cut_when_stopped, work.cancel_scope)
                    await self._read(reader)
                    if shutdown_at_eof and not self.app.stopped.is_set():
                        await self.app.shutdown(drain=True)
                    # The input is over: subscriptions end (after what they already buffered);
                    # owed replies are still written.
                    self._end_subscriptions()
                outer.cancel_scope.cancel()
        finally:
            for sub in self._subscriptions:
                self.app.events.unsubscribe(sub)

    async def _cut_when_stopped(self, work: trio.CancelScope) -> None:
        """Once Braid has stopped: stop reading, end subscriptions, owed replies get 2 s."""
        await self.app.stopped.wait()
        self._stopping = True
        if self._receiving is not None:
            self._receiving.cancel(reason="Braid stopped")
        self._end_subscriptions()
        work.deadline = min(work.deadline, trio.current_time() + _OWED_REPLY_GRACE)

    def _end_subscriptions(self) -> None:
        for sub in self._subscriptions:
            sub.close()

    async def _read(self, reader: trio.abc.ReceiveStream) -> None:
        assert self._work is not None
        async with aclosing(read_lines(reader)) as lines:
            while not self._stopping:
                # Only the wait for input is cut when Braid stops, never a reply being written.
                line: bytes | _TooLong | None = None
                with trio.CancelScope() as scope:
                    self._receiving = scope
                    line = await anext(lines, None)
                self._receiving = None
                if line is None or self._stopping:
                    return
                await self._line(line)
                if self.app.stopped.is_set():
                    return

    async def _line(self, line: bytes | _TooLong) -> None:
        assert self._work is not None
        writer = self.writer
        if isinstance(line, _TooLong):
            await writer.send(error_reply(None, LineTooLong("the line is longer than 4 MiB")))
            return
        if not line.strip():
            return
        request_id: Any = None
        try:
            request_id, command, params = _envelope(line)
            if command == SUBSCRIBE:
                await self._subscribe(request_id, params)
                return
            spec, _ = parse(command, params)  # bad params fail here, before anything runs
        except BraidError as exc:
            await writer.send(error_reply(request_id, exc))
            return
        if spec.waits:
            self._work.start_soon(self._handle, request_id, command, params)
        else:
            await self._handle(request_id, command, params)

    async def _handle(self, request_id: Any, command: str, params: object) -> None:
        try:
            result = await call(self.app, command, params)
        except BraidError as exc:
            await self.writer.send(error_reply(request_id, exc))
        except Exception as exc:
            # Translated at the edge: the client gets internal_error, never the text.
            print(f"braid: internal error in {command}: {type(exc).__name__}", file=sys.stderr)
            await self.writer.send(error_reply(request_id, exc))
        else:
            await self.writer.send({"id": request_id, "ok": True, "result": result})

    async def _subscribe(self, request_id: Any, params: object) -> None:
        assert self._work is not None
        wanted = parse_subscribe(self.app.state, params)  # bad params raise, nothing starts
        sub = self.app.events.subscribe(
            conversation_id=wanted.conversation_id, run_id=wanted.run_id
        )
        self._subscriptions.append(sub)
        # The reply goes out before the pump starts, so it precedes every event line.
        await self.writer.send(
            {"id": request_id, "ok": True, "result": {"subscriptionId": sub.subscription_id}}
        )
        self._work.start_soon(self._pump, sub)

    async def _pump(self, sub: Subscription) -> None:
        async with sub.receive:
            async for message in sub.receive:
                await self.writer.send(message)
        if sub.dropped:
            await self.writer.send(sub.dropped_message())


async def serve_session(app: BraidApp, reader: trio.abc.ReceiveStream, writer: Writer) -> None:
    """Serve one session until its input ends or Braid stops; never shuts Braid down.

    This is a daemon connection: at end of input its subscriptions end and the replies it
    is still owed (``wait_run``) are written; when Braid stops they get 2 s more.
    """
    await _Session(app, writer).run(reader, shutdown_at_eof=False)


async def serve_lines(app: BraidApp, reader: trio.abc.ReceiveStream, writer: Writer) -> None:
    """Run the loop over one input stream until EOF or ``shutdown``; EOF shuts Braid down.

    At end of input Braid drains (subscriptions keep reporting the drain), then the replies
    still owed get 2 s more.
    """
    await _Session(app, writer).run(reader, shutdown_at_eof=True)


async def run_headless(app: BraidApp) -> None:
    """The loop on this process's standard input and output."""
    stdin = trio.lowlevel.FdStream(_dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(_dup(sys.stdout.fileno()))
    async with stdin, stdout:
        await serve_lines(app, stdin, Writer(stdout))


def _dup(fd: int) -> int:
    return os.dup(fd)
