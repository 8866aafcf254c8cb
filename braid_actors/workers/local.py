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
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import trio

from braid_actors.errors import ProviderProtocolError, WorkerLineTooLong
from braid_actors.model import (
    new_id,
)
from braid_actors.workers._channel import INPUT_MAX_LINE, Channel
from braid_actors.workers._channel import log as _log
from braid_actors.workers._launch import control_path, spool_path
from braid_actors.workers._quiet import Quiet, catching_sigterm
from braid_actors.workers._reply import Turn
from braid_actors.workers._session import (
    SessionFileError,
    SessionLine,
    SessionState,
    create_session,
    locked_session,
    session_digest,
    session_path,
)
from braid_actors.workers._start import Start, parse_start
from braid_actors.workers._wire import (
    PROTOCOL_VERSION,
    LineReader,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

DEFAULT_SHELL_TIMEOUT: Final = 30.0
"""Seconds a ``!`` shell command may run before its process group is killed."""


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
    with catching_sigterm(channel.input_fd) as quiet:
        turn = Turn(
            channel=channel,
            start=start,
            history=history,
            shell_timeout=config.shell_timeout,
            quiet=quiet,
        )
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
