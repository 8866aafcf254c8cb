"""Braid's built-in local runner: a deterministic worker program, no network needed.

Run as ``python -m braid_actors.workers.local --sessions DIR``. It speaks the local provider
protocol (JSONL on stdin/stdout; stderr is free-form log), documented in
``docs/local-runner.md``, runs exactly one turn and exits.

Theory of operation. The worker says ``hello``, reads one ``start``, validates it and its
native session (refusing with ``error`` + ``done failed`` before touching any file), then
writes the new user input to the session file, says ``session``, and replies line by line
while a reader task handles ``interaction_response`` and ``cancel`` (and SIGTERM or a closed
stdin, which count as ``cancel``). A cancel cancels the reply's scope, which kills the
shell child's process group if one is running. The turn ends with ``usage`` and ``done``;
the reply is appended to the session file unless the turn was cancelled.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from braid_actors.errors import ProviderProtocolError, WorkerLineTooLong
from braid_actors.model import (
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    new_id,
)
from braid_actors.workers._channel import INPUT_MAX_LINE, Channel
from braid_actors.workers._channel import log as _log
from braid_actors.workers._launch import control_path, spool_path
from braid_actors.workers._quiet import Quiet, catching_sigterm
from braid_actors.workers._session import (
    SessionFileError,
    SessionLine,
    SessionState,
    create_session,
    locked_session,
    session_digest,
    session_path,
)
from braid_actors.workers._shell import run_shell
from braid_actors.workers._start import Start, parse_start
from braid_actors.workers._wire import (
    PROTOCOL_VERSION,
    LineReader,
    encode_message,
    unstructure_part,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

DEFAULT_SHELL_TIMEOUT: Final = 30.0
"""Seconds a ``!`` shell command may run before its process group is killed."""
MAX_SLEEP: Final = 600.0
SLEEP_TICK: Final = 0.25
"""``?sleep`` streams a chunk at least this often (seconds)."""
ECHO_CHUNKS: Final = 3
_SLEEP_RE: Final = re.compile(r"\?sleep\s+([0-9]+(?:\.[0-9]+)?)")
_BURN_RE: Final = re.compile(r"\?burn\s+([0-9]+(?:\.[0-9]+)?)")
_STREAM_RE: Final = re.compile(r"\?stream\s+([0-9]+(?:\.[0-9]+)?)\s+([0-9]+(?:\.[0-9]+)?)")
MAX_STREAM_RATE: Final = 100.0
"""Most part updates per second one ``?stream`` line may send."""
_ALLOC_RE: Final = re.compile(r"\?alloc\s+([0-9]+)")
_AT_RE: Final = re.compile(r"\?at\s+([0-9]+(?:\.[0-9]+)?)")
MAX_BURN: Final = 60.0
"""Most CPU seconds one ``?burn`` line may use."""
MAX_ALLOC_MB: Final = 2048
"""Most MiB one ``?alloc`` line may hold."""


class Refusal(Exception):
    """The turn cannot run: reported as ``error`` then ``done`` failed."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        session_id: str | None = None,
        state: SessionState | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.session_id = session_id
        self.state = state
        """What the session file actually holds, when it could be read."""


@attrs.frozen
class Config:
    sessions: Path
    shell_timeout: float = DEFAULT_SHELL_TIMEOUT
    detach_on_eof: bool = False
    """Keep running when Braid goes away (its pipes close): report to the spool only and
    take controls from the control file, so a restarted supervisor can re-attach."""


# ---- the channel -----------------------------------------------------------------------


# ---- sessions --------------------------------------------------------------------------


def open_session(config: Config, start: Start) -> tuple[str, Path, SessionState, SessionState]:
    """Create or continue the session; return ``(id, path, before, after)`` where ``before``
    is the history the turn sees and ``after`` includes the new user input."""
    user_line = SessionLine(start.user_message_id, "user", start.text)
    if start.session_id is None:
        session_id = new_id("sess")
        path = session_path(config.sessions, session_id)
        history = start.context or ()
        try:
            after = create_session(path, (*history, user_line))
        except OSError:
            raise Refusal("session_unwritable", "the session file can't be created") from None
        return session_id, path, SessionState(history, session_digest(history)), after
    session_id = start.session_id
    path = session_path(config.sessions, session_id)
    try:
        with locked_session(path) as session:
            state = session.read()
            _check_boundary(start, state)
            return session_id, path, state, session.append(state, [user_line])
    except SessionFileError as exc:
        raise Refusal(exc.code, exc.message, session_id=session_id) from None
    except OSError:
        raise Refusal(
            "session_unwritable", "the session file can't be updated", session_id=session_id
        ) from None


def _check_boundary(start: Start, state: SessionState) -> None:
    actual = state.last_message_id
    if actual != start.expected_boundary:
        raise Refusal(
            "session_mismatch",
            f"the session ends at {actual or 'nothing'}, not at "
            f"{start.expected_boundary or 'nothing'}",
            session_id=start.session_id,
            state=state,
        )
    if start.expected_digest is not None and state.digest != start.expected_digest:
        raise Refusal(
            "session_mismatch",
            "the session's digest differs from the expected digest",
            session_id=start.session_id,
            state=state,
        )
    if state.has_message(start.user_message_id) or state.has_message(start.assistant_message_id):
        raise Refusal(
            "duplicate_message",
            "the session already holds this turn's message ids",
            session_id=start.session_id,
            state=state,
        )


def finish_session(path: Path, start: Start, reply: SessionLine | None) -> SessionState:
    """Append the reply (if any) provided the session still ends at this turn's input."""
    try:
        with locked_session(path) as session:
            state = session.read()
            if reply is None:
                return state
            if state.last_message_id != start.user_message_id:
                raise Refusal(
                    "session_conflict",
                    "another writer changed the session during the turn; the reply was not "
                    "appended",
                    session_id=path.stem,
                    state=state,
                )
            return session.append(state, [reply])
    except SessionFileError as exc:
        raise Refusal(exc.code, exc.message, session_id=path.stem) from None
    except OSError:
        raise Refusal(
            "session_unwritable", "the session file can't be updated", session_id=path.stem
        ) from None


# ---- the turn --------------------------------------------------------------------------


@attrs.define(eq=False)
class Turn:
    """One reply: emits parts, asks permissions, runs shell commands; cancellable."""

    config: Config
    channel: Channel
    start: Start
    history: SessionState
    """The session as the turn found it (before its user input)."""
    quiet: Quiet | None = None
    """Waits outside trio while no input or signal can need another task."""
    parts: dict[str, Part] = attrs.Factory(dict)
    """Latest version of each emitted part, in first-emission order."""
    ended: tuple[str, str] | None = None
    """Set by :meth:`abort`: the outcome and reason that interrupted the reply."""
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    _index: int = 0
    _waiting: dict[str, trio.Event] = attrs.Factory(dict)
    _answers: dict[str, tuple[bool, str | None]] = attrs.Factory(dict)
    _held_memory: list[bytearray] = attrs.Factory(list)

    def abort(self, outcome: str, reason: str) -> None:
        if self.ended is None:
            self.ended = (outcome, reason)
            self.scope.cancel(reason=reason)

    async def run(self) -> tuple[str, str | None]:
        """Reply to every input line; return ``(outcome, reason)``."""
        result: tuple[str, str | None] = ("completed", None)
        with self.scope:
            result = await self._reply()
        if self.scope.cancelled_caught and self.ended is not None:
            return self.ended
        return result

    # -- bookkeeping

    @property
    def _stem(self) -> str:
        mid = self.start.assistant_message_id
        return mid[4:] if mid.startswith("msg_") else mid

    def _next_index(self) -> int:
        self._index += 1
        return self._index

    async def _emit(self, part: Part) -> None:
        self.parts[part.part_id] = part
        await self.channel.send("part", part=unstructure_part(part))

    def reply_line(self) -> SessionLine:
        texts = [p.text for p in self.parts.values() if isinstance(p, TextPart)]
        return SessionLine(self.start.assistant_message_id, "assistant", "\n".join(texts))

    def output_chars(self) -> int:
        total = 0
        for part in self.parts.values():
            if isinstance(part, TextPart | ReasoningPart):
                total += len(part.text)
            elif isinstance(part, ToolResultPart):
                total += len(part.summary)
        return total

    def answer(self, msg: dict[str, Any]) -> None:
        """Deliver an ``interaction_response``; raise for one that answers nothing."""
        interaction_id = msg.get("interactionId")
        allow = msg.get("allow")
        message = msg.get("message")
        if not isinstance(interaction_id, str) or interaction_id not in self._waiting:
            raise ProviderProtocolError("interaction_response names no pending interaction")
        if not isinstance(allow, bool) or not (message is None or isinstance(message, str)):
            raise ProviderProtocolError("interaction_response needs allow (bool) and message")
        self._answers[interaction_id] = (allow, message)
        self._waiting.pop(interaction_id).set()

    # -- the reply

    async def _reply(self) -> tuple[str, str | None]:
        lines = [line.strip() for line in self.start.text.splitlines() if line.strip()]
        if not lines:
            await self._stream(TextPart, "You said nothing.")
        for line in lines:
            sleep = _SLEEP_RE.fullmatch(line)
            if line.startswith("!") and line[1:].strip():
                await self._shell(line[1:].strip())
            elif line == "?think":
                await self._think(len(lines))
            elif line == "?fail":
                return "failed", "failed_by_request: the input asked the local runner to fail"
            elif sleep is not None and float(sleep.group(1)) <= MAX_SLEEP:
                await self._sleep(float(sleep.group(1)))
            elif (
                (stream := _STREAM_RE.fullmatch(line))
                and float(stream.group(1)) <= MAX_SLEEP
                and 0 < float(stream.group(2)) <= MAX_STREAM_RATE
            ):
                await self._stream_for(float(stream.group(1)), float(stream.group(2)))
            elif (burn := _BURN_RE.fullmatch(line)) and float(burn.group(1)) <= MAX_BURN:
                await self._burn(float(burn.group(1)))
            elif (alloc := _ALLOC_RE.fullmatch(line)) and int(alloc.group(1)) <= MAX_ALLOC_MB:
                await self._alloc(int(alloc.group(1)))
            elif (at := _AT_RE.fullmatch(line)) and float(at.group(1)) - time.time() <= MAX_SLEEP:
                await self._wait_until(float(at.group(1)))
            else:
                await self._stream(TextPart, f"You said: {line} ({self._held()})")
        return "completed", None

    def _held(self) -> str:
        count = len(self.history.lines)
        noun = "message" if count == 1 else "messages"
        return f"{count} earlier {noun} in this session"

    async def _stream(self, cls: type[TextPart] | type[ReasoningPart], text: str) -> None:
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        chunks = min(ECHO_CHUNKS, len(text))
        for n in range(1, chunks + 1):
            await self._emit(cls(part_id=part_id, text=text[: len(text) * n // chunks]))
            await trio.lowlevel.checkpoint()

    async def _think(self, line_count: int) -> None:
        await self._stream(
            ReasoningPart,
            f"Thinking about {line_count} input line(s) with {self._held()}.",
        )

    async def _sleep(self, seconds: float) -> None:
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        ticks = max(1, math.ceil(seconds / SLEEP_TICK))
        text = f"Sleeping {seconds:g} s"
        for _ in range(ticks):
            await trio.sleep(seconds / ticks)
            text += "."
            await self._emit(TextPart(part_id=part_id, text=text))
        await self._emit(TextPart(part_id=part_id, text=text + " done."))

    async def _stream_for(self, seconds: float, rate: float) -> None:
        """Send ``rate`` updates of one growing text part per second for ``seconds``."""
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        count = max(1, int(seconds * rate))
        # A phase of its own within one period: many workers sharing one start line (`?at`)
        # then do not all wake at the same instant.
        start = trio.current_time() + random.random() / rate - 1 / rate
        # The text is "Streaming" and dots: JSON needs no escape in it, so each line is the
        # encoded part around the text's bytes (a test checks this equals encode_message).
        head, tail = _text_part_line(part_id)
        text = "Streaming"
        try:
            for n in range(1, count + 1):
                due = start + n / rate
                # The hot path: a tick with no input and no signal never enters trio.
                if self.quiet is None or self.channel.detached or not self.quiet.wait_until(due):
                    await trio.sleep_until(due)
                text += "."
                await self.channel.send_line(head + text.encode("ascii") + tail)
        finally:
            if text != "Streaming":
                self.parts[part_id] = TextPart(part_id=part_id, text=text)

    async def _wait_until(self, wall: float) -> None:
        """Send nothing until the wall clock reads ``wall`` (a start line for many workers)."""
        await trio.sleep(max(0.0, wall - time.time()))

    async def _burn(self, cpu_seconds: float) -> None:
        """Really use ``cpu_seconds`` of CPU (busy work), staying responsive to cancel."""
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        goal = time.process_time() + cpu_seconds
        spins = 0
        while time.process_time() < goal:
            deadline = time.process_time() + 0.05
            while time.process_time() < deadline:
                spins += 1
            await trio.lowlevel.checkpoint()
        await self._emit(TextPart(part_id=part_id, text=f"Burned {cpu_seconds:g} CPU s."))

    async def _alloc(self, mib: int) -> None:
        """Really hold ``mib`` MiB of touched memory until the turn ends."""
        block = bytearray(mib * 1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1  # touch every page so it counts in RSS
        self._held_memory.append(block)
        await self._emit(
            TextPart(
                part_id=f"part_{self._stem}_{self._next_index():03d}", text=f"Holding {mib} MiB."
            )
        )
        await trio.sleep(0.5)  # long enough for the supervisor to observe it

    async def _shell(self, command: str) -> None:
        index = self._next_index()
        request_id = f"part_{self._stem}_{index:03d}"
        await self._emit(
            ToolRequestPart(
                part_id=request_id, name="shell", input={"command": command},
                call_id=f"shell_{index}",
            )
        )  # fmt: skip
        interaction_id = f"int_{self._stem}_{index:03d}"
        allow, message = await self._ask(interaction_id, {"tool": "shell", "command": command})
        result_id = f"part_{self._stem}_{self._next_index():03d}"
        if not allow:
            summary = "Permission denied." + (f" {message}" if message else "")
            await self._emit(
                ToolResultPart(
                    part_id=result_id, request_part_id=request_id, status="denied",
                    summary=summary,
                )
            )  # fmt: skip
            return
        result = await run_shell(command, self.start.workspace, self.config.shell_timeout)
        await self._emit(
            ToolResultPart(
                part_id=result_id,
                request_part_id=request_id,
                status="ok" if result.exit_code == 0 else "error",
                summary=result.summary,
                truncated=result.truncated,
                exit_code=result.exit_code,
            )
        )

    async def _ask(self, interaction_id: str, subject: dict[str, Any]) -> tuple[bool, str | None]:
        event = trio.Event()
        self._waiting[interaction_id] = event
        await self.channel.send(
            "interaction", interactionId=interaction_id, kind="permission", subject=subject
        )
        await event.wait()
        return self._answers.pop(interaction_id)


_TEXT_MARK: Final = "<<the text>>"


def _text_part_line(part_id: str) -> tuple[bytes, bytes]:
    """The protocol line of a text part ``part_id`` split where its (escape-free) text goes."""
    part = unstructure_part(TextPart(part_id=part_id, text=_TEXT_MARK))
    line = encode_message({"type": "part", "part": part})
    head, tail = line.split(_TEXT_MARK.encode())
    return head, tail


# ---- the program -----------------------------------------------------------------------


async def serve(config: Config, channel: Channel) -> None:
    """Run the protocol for one turn on ``channel``."""
    await channel.send("hello", protocol=PROTOCOL_VERSION, pid=os.getpid())
    try:
        first = await channel.receive()
    except (ProviderProtocolError, WorkerLineTooLong) as exc:
        await _refuse(channel, Refusal("bad_message", exc.message))
        return
    if first is None:
        _log("stdin closed before start")
        return
    if first["type"] == "cancel":
        await _done(channel, "cancelled", "cancelled: Braid cancelled before the turn started")
        return
    try:
        if first["type"] != "start":
            raise ProviderProtocolError(f"expected start, got {first['type']}")
        start = parse_start(first)
    except ProviderProtocolError as exc:
        await _refuse(channel, Refusal("bad_message", exc.message))
        return
    try:
        if not start.workspace.is_dir():
            raise Refusal("bad_workspace", "the workspace is not a directory")
        session_id, path, history, _after = open_session(config, start)
    except Refusal as refusal:
        await _refuse(channel, refusal)
        return
    _log(f"turn {start.turn_id}: session {session_id} ({len(history.lines)} earlier messages)")
    await channel.send(
        "session", sessionId=session_id, resumed=start.session_id is not None, path=str(path)
    )
    with catching_sigterm() as quiet:
        quiet.watch_input(channel.input_fd)
        turn = Turn(config=config, channel=channel, start=start, history=history, quiet=quiet)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, channel, turn)
            nursery.start_soon(_watch_signals, turn, quiet)
            outcome, reason = await turn.run()
            nursery.cancel_scope.cancel(reason="turn ended")
    final: SessionState | None
    try:
        final = finish_session(path, start, None if outcome == "cancelled" else turn.reply_line())
    except Refusal as refusal:
        await channel.send("error", code=refusal.code, message=refusal.message)
        outcome, reason, final = "failed", f"{refusal.code}: {refusal.message}", refusal.state
    input_chars = sum(len(line.text) for line in history.lines) + len(start.text)
    await channel.send(
        "usage",
        inputTokens=math.ceil(input_chars / 4),
        outputTokens=math.ceil(turn.output_chars() / 4),
        source="estimate",
        costUsd=0.0,
    )
    await _done(channel, outcome, reason, session_id=session_id, state=final)


async def _pump(channel: Channel, turn: Turn) -> None:
    """Read Braid's messages during the turn."""
    while True:
        try:
            msg = await channel.receive()
        except WorkerLineTooLong as exc:
            await channel.send("error", code="line_too_long", message=exc.message)
            turn.abort("failed", f"line_too_long: {exc.message}")
            return
        except ProviderProtocolError as exc:
            await channel.send("error", code="bad_message", message=exc.message)
            continue
        if msg is None:
            turn.abort("cancelled", "cancelled: Braid closed the worker's input")
            return
        if msg["type"] == "cancel":
            turn.abort("cancelled", "cancelled: Braid asked the worker to cancel")
            return
        try:
            if msg["type"] != "interaction_response":
                raise ProviderProtocolError(f"unexpected message type {msg['type']} during a turn")
            turn.answer(msg)
        except ProviderProtocolError as exc:
            if channel.detached:
                # A re-attached supervisor re-delivers every recorded answer; one this
                # worker already had is expected, not an error.
                continue
            await channel.send("error", code="bad_message", message=exc.message)


async def _watch_signals(turn: Turn, quiet: Quiet) -> None:
    while True:
        await trio.lowlevel.wait_readable(quiet.signal_fd)
        if quiet.take_signals():
            turn.abort("cancelled", "cancelled: the worker received SIGTERM")


async def _refuse(channel: Channel, refusal: Refusal) -> None:
    _log(f"refused: {refusal.code}")
    await channel.send("error", code=refusal.code, message=refusal.message)
    await _done(
        channel,
        "failed",
        f"{refusal.code}: {refusal.message}",
        session_id=refusal.session_id,
        state=refusal.state,
    )


async def _done(
    channel: Channel,
    outcome: str,
    reason: str | None,
    *,
    session_id: str | None = None,
    state: SessionState | None = None,
) -> None:
    await channel.send(
        "done",
        outcome=outcome,
        reason=reason,
        sessionId=session_id,
        sessionBoundary=None if state is None else state.last_message_id,
        sessionDigest=None if state is None else state.digest,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m braid_actors.workers.local")
    parser.add_argument("--sessions", type=Path, required=True, help="session directory")
    parser.add_argument("--shell-timeout", type=float, default=DEFAULT_SHELL_TIMEOUT)
    parser.add_argument("--spool", type=Path, help="directory of run spools (with --run)")
    parser.add_argument("--run", help="the run id; names the spool and control files")
    parser.add_argument(
        "--detach-on-eof", action="store_true", help="keep running when Braid goes away"
    )
    args = parser.parse_args(argv)
    if (args.spool is None) != (args.run is None):
        parser.error("--spool and --run go together")
    config = Config(
        sessions=args.sessions, shell_timeout=args.shell_timeout, detach_on_eof=args.detach_on_eof
    )
    spool_fd = None
    control = None
    if args.spool is not None:
        args.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        spool_fd = os.open(
            spool_path(args.spool, args.run), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        control = control_path(args.spool, args.run)
    # The protocol owns the original stdin/stdout; fd 0 becomes /dev/null and fd 1 the log,
    # so a stray print or an inherited descriptor can never corrupt the framing.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)

    async def run() -> None:
        channel = Channel(
            reader=LineReader(trio.lowlevel.FdStream(proto_in), max_line=INPUT_MAX_LINE),
            out=trio.lowlevel.FdStream(proto_out),
            input_fd=proto_in,
            spool_fd=spool_fd,
            control=control,
            detach_on_eof=config.detach_on_eof,
        )
        await serve(config, channel)

    # Everything imported so far lives as long as the process: the collector need not scan
    # it again. Unfrozen, each gen-2 pass walked the whole import graph (tens of thousands
    # of objects), which cost a streaming worker about 100 us per part update.
    gc.freeze()
    status = 0
    try:
        trio.run(run)
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        _log("Braid closed the protocol pipe")
        status = 3
    return status


if __name__ == "__main__":
    sys.exit(main())
