"""The built-in ``local`` provider: each turn runs in a fresh local worker process.

Design note. :meth:`LocalProvider.run_turn` starts ``python -m braid_actors.workers.local``
in its own process group, waits (bounded) for ``hello``, sends ``start``, and then maps
every worker message onto the :class:`RunSink` in order, one at a time, so nothing is
reported before the sink has made the previous fact durable. Every wait on the worker has a
deadline; waits on the sink (a human answering a permission) do not. The turn's result
comes only from the worker's ``done``: a worker that ends without one gives a failed
result that says so, never a guessed success; a worker that breaks the protocol raises
:class:`~braid_actors.errors.ProviderProtocolError`. Cancellation asks the worker to
``cancel``, waits a bounded time for its ``done``, then runs the stop ladder; the process
group is gone before the cancellation propagates. The protocol is ``docs/local-runner.md``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from braid_actors.errors import InvalidRequest, ProviderProtocolError
from braid_actors.model import (
    Usage,
)
from braid_actors.providers._cancel import run_watched
from braid_actors.providers._local_fast import fast_parts
from braid_actors.providers._local_fields import (
    count_field,
    optional_text_field,
    outcome_of,
    text_field,
)
from braid_actors.providers._local_reconcile import reconcile_local
from braid_actors.providers._local_spool import QuietSink, SpoolSource, spool_began
from braid_actors.providers._local_start import (
    LocalTimeouts,
    StartPlace,
    context_receipt,
    nothing,
    start_message,
    worker_module_found,
)
from braid_actors.providers._port import (
    Capabilities,
    InteractionAnswer,
    InteractionRequest,
    ReconcileRequest,
    Reconciliation,
    RunControl,
    RunSink,
    SessionClosed,
    SessionInfo,
    SessionProof,
    TurnRequest,
    TurnResult,
    WorkerInfo,
    fork_refusal,
)
from braid_actors.workers import (
    PROTOCOL_VERSION,
    ProcessInfo,
    SessionFileError,
    StopPolicy,
    WorkerProcess,
    control_path,
    is_session_id,
    local_worker_command,
    open_worker,
    read_session,
    session_path,
    spool_path,
    structure_part,
    worker_environment,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping


LOCAL_CAPABILITIES: Final = Capabilities(
    sessions_continue=True,
    sessions_fork=False,
    portable_context=True,
    interaction_kinds=("permission",),
    usage="estimated",
    cost=True,
)
"""What the local runner claims: it continues and proves its own sessions, accepts portable
context, asks permission before shell commands, estimates tokens and reports a real 0 cost."""

_OUTCOMES: Final = frozenset({"completed", "failed", "cancelled"})


@attrs.define(eq=False)
class LocalProvider:
    """The ``local`` runner; sessions live in ``sessions_dir`` as ``<session_id>.jsonl``."""

    sessions_dir: Path
    timeouts: LocalTimeouts = attrs.Factory(LocalTimeouts)
    python: str = sys.executable
    """The interpreter that runs the worker program."""
    spool_dir: Path | None = None
    """Run spools (default ``<sessions_dir>/spool``): see ``_local_spool``."""
    start_limit: int = attrs.field(factory=lambda: 2 * (os.cpu_count() or 1))
    """Most workers starting at once (from spawn to ``hello``); the others wait before
    they are spawned, so the ``startup`` deadline measures one start, not a crowd of them.
    """

    def __attrs_post_init__(self) -> None:
        if self.start_limit < 1:
            raise ValueError("start_limit must be at least 1")

    @functools.cached_property
    def starting(self) -> trio.Semaphore:
        """The workers between spawn and ``hello`` (see :attr:`start_limit`)."""
        return trio.Semaphore(self.start_limit)

    @functools.cached_property
    def spools(self) -> Path:
        """Where the run spools are (worked out once: a restart asks for every run)."""
        return self.spool_dir or self.sessions_dir / "spool"

    @property
    def name(self) -> str:
        return "local"

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    def available(self) -> bool:
        """True when the interpreter exists and can find the worker program."""
        return os.path.exists(self.python) and worker_module_found()

    async def run_turn(
        self, request: TurnRequest, sink: RunSink, control: RunControl | None = None
    ) -> TurnResult:
        """Run one turn in a new worker process (see the module note).

        Raises :class:`~braid_actors.errors.WorkerStartFailed` when the worker can't be
        started and :class:`~braid_actors.errors.ProviderProtocolError` when it breaks the
        protocol; every other ending is a :class:`TurnResult`.
        """
        refused = fork_refusal(request, self.name)  # its sessions have no native fork
        if refused is not None:
            return refused
        timeouts = self.timeouts
        command = local_worker_command(
            self.sessions_dir,
            shell_timeout=timeouts.shell,
            python=self.python,
            spool_dir=self.spools,
            run_id=request.run_id,
            detach_on_eof=True,
        )
        policy = StopPolicy(
            grace=timeouts.exit_grace,
            term_grace=timeouts.term_grace,
            kill_grace=timeouts.kill_grace,
        )
        pipes = control.pipes if control is not None else None
        # A worker's start is mostly its interpreter's imports (~0.3 s of CPU): 500 runs
        # admitted at once spawned 500 of them together, on 2 cores, and some missed the
        # ``startup`` deadline waiting for a core. Spawns wait for a place instead.
        gate = StartPlace(self.starting)
        await gate.take()
        try:
            async with open_worker(
                command, env=worker_environment(), policy=policy, pipes=pipes
            ) as worker:
                turn = _Turn(
                    timeouts=timeouts,
                    worker=worker,
                    request=request,
                    sink=sink,
                    control=control,
                    started=gate.give_back,
                )
                try:
                    result = await turn.run()
                except trio.Cancelled:
                    with trio.CancelScope(shield=True):
                        await turn.cancel_worker()
                    raise
        finally:
            gate.give_back()
        # The worker's stderr, bounded: kept with the run as its log artifact.
        return attrs.evolve(result, worker_log=worker.log.text() or None)

    def spool_started(self, run_id: str) -> bool:
        """True when the run's worker got as far as its session (the turn really began)."""
        return spool_began(spool_path(self.spools, run_id))

    async def reattach(
        self,
        request: TurnRequest,
        root: WorkerInfo,
        *,
        skip: int,
        answers: Mapping[str, InteractionAnswer | None],
        await_pending: Callable[[str], Awaitable[InteractionAnswer]],
        sink: RunSink,
        control: RunControl | None = None,
    ) -> tuple[TurnResult, bool]:
        """Replay the spool of a run whose worker outlived its supervisor, then follow it.

        Returns the result and whether the worker reported its end (``done``); a worker
        that is gone without one gives a failed result and ``False``.
        """
        info = ProcessInfo(
            pid=root.pid, create_time=root.create_time, pgid=root.pgid, command=root.command
        )
        policy = StopPolicy(
            grace=self.timeouts.exit_grace,
            term_grace=self.timeouts.term_grace,
            kill_grace=self.timeouts.kill_grace,
        )
        source = SpoolSource(
            info=info,
            spool=spool_path(self.spools, request.run_id),
            control=control_path(self.spools, request.run_id),
            policy=policy,
        )
        source.prime()
        quiet = QuietSink(sink, skip, answers, await_pending)
        turn = _Turn(
            timeouts=self.timeouts, worker=source, request=request, sink=quiet, control=control
        )
        turn.start_sent.set()
        try:
            result = await turn.run(resume=True)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await turn.cancel_worker()
            raise
        # Not our child: nothing reaps it for us, so see it gone (or stop it) before
        # reporting the end, exactly as a live turn's worker is gone by then.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.timeouts.exit_grace):
                await source.wait()
            await source.stop()
        return result, turn.saw_done

    async def reconcile(self, request: ReconcileRequest, sink: RunSink) -> Reconciliation:
        """Replay the run's spool and follow its worker (:mod:`._local_reconcile`)."""
        return await reconcile_local(self, request, sink)

    async def close_session(self, session_id: str) -> SessionClosed:
        """The local runner holds nothing for a session between turns: its session file
        stays (it is the history's record); Braid only stops continuing it."""
        if not is_session_id(session_id):
            raise InvalidRequest("not a local session id", details={"sessionId": session_id})
        return SessionClosed(session_id, released=False, detail="the session file is left in place")

    async def prove_session(self, session_id: str) -> SessionProof:
        """Read the session file (never modifying it) and report where it ends."""
        if not is_session_id(session_id):
            return SessionProof(session_id, available=False, reason="not a local session id")
        path = session_path(self.sessions_dir, session_id)
        try:
            state = await trio.to_thread.run_sync(read_session, path)
        except SessionFileError as exc:
            return SessionProof(session_id, available=False, reason=f"{exc.code}: {exc.message}")
        except OSError:
            return SessionProof(
                session_id, available=False, reason="session_unreadable: the file can't be read"
            )
        return SessionProof(
            session_id, available=True, last_message_id=state.last_message_id, digest=state.digest
        )


_IDLE_REFRESH: Final = 1.0
"""Most seconds between two moves of a stream's idle deadline."""


class _Silent(Exception):
    """The worker said nothing within a deadline (internal: becomes a failed result)."""


@attrs.define(eq=False)
class _Turn:
    """One conversation with one worker process."""

    timeouts: LocalTimeouts
    worker: WorkerProcess | SpoolSource
    request: TurnRequest
    sink: RunSink
    session: SessionInfo | None = None
    usage: Usage = attrs.Factory(Usage)
    cost_usd: float | None = None
    last_error: tuple[str, str] | None = None
    control: RunControl | None = None
    cancel_sent: bool = False
    start_sent: trio.Event = attrs.Factory(trio.Event)
    started: Callable[[], None] = nothing
    """Called once the worker's ``hello`` came (or its start failed)."""

    saw_done: bool = False

    async def run(self, *, resume: bool = False) -> TurnResult:
        result = await run_watched(lambda: self._run(resume), self.control, self._watch_cancel)
        if result is None:  # the cancel went unanswered: stop it by force
            with trio.CancelScope(shield=True):
                await self.cancel_worker()
            return attrs.evolve(
                self._failed(
                    "cancel_unacknowledged: the local worker did not confirm the cancel within "
                    f"{self.timeouts.cancel_grace:g} s and was stopped"
                ),
                cancel_acknowledged=False,
            )
        if self.cancel_sent:
            return attrs.evolve(result, cancel_acknowledged=result.outcome == "cancelled")
        return result

    async def _watch_cancel(self, control: RunControl, turn_scope: trio.CancelScope) -> None:
        await control.cancel_requested.wait()
        # Never before ``start``: the worker must see the turn it is asked to cancel.
        await self.start_sent.wait()
        self.cancel_sent = True
        # If it is already going, its ending (or its silence) is the answer.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.worker.send({"type": "cancel"})
        await trio.sleep(self.timeouts.cancel_grace)
        turn_scope.cancel()

    async def _run(self, resume: bool = False) -> TurnResult:
        if resume:
            return await self._loop()
        await self.sink.worker_started(WorkerInfo.of(self.worker.info))
        try:
            try:
                hello = await self._receive(self.timeouts.startup)
            finally:
                self.started()
            if hello is None:
                return await self._ended_early()
            if hello["type"] != "hello" or hello.get("protocol") != PROTOCOL_VERSION:
                raise ProviderProtocolError(
                    "the worker did not open with a hello for this protocol version",
                    details={"type": hello["type"], "protocol": PROTOCOL_VERSION},
                )
            await self.worker.send(start_message(self.request))
            self.start_sent.set()
            return await self._messages()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return await self._ended_early()  # its stdin closed: it is gone or going
        except _Silent as silent:
            with trio.CancelScope(shield=True):
                await self.cancel_worker()
            return self._failed(str(silent))

    async def _messages(self) -> TurnResult:
        # One idle deadline for the whole stream, moved before each receive (a scope per
        # message costs more than anything else done per message).
        with trio.CancelScope() as idle:
            refresh = min(_IDLE_REFRESH, self.timeouts.idle / 10)
            session = lambda: self.session  # noqa: E731
            idle_s = self.timeouts.idle
            with fast_parts(self.worker, self.sink, session, idle, idle_s, refresh):
                result = await self._stream(idle)
        if idle.cancelled_caught:
            raise _Silent(
                f"worker_unresponsive: the local worker sent nothing for {self.timeouts.idle:g} s"
            )
        return result

    async def _stream(self, idle: trio.CancelScope) -> TurnResult:
        refreshed = -math.inf
        while True:
            message = self._buffered()
            if message is None:
                # Moving a deadline costs more than a message: it is moved at most once a
                # second (a tenth of the idle time if shorter), so "idle" may end up to that
                # much early (a second of 120 s by default).
                now = trio.current_time()
                if now - refreshed >= min(_IDLE_REFRESH, self.timeouts.idle / 10):
                    idle.deadline, refreshed = now + self.timeouts.idle, now
                message = await self.worker.receive()
            if message is not None and message["type"] == "interaction":
                # Waiting for an answer is not idleness: no deadline until the next receive.
                idle.deadline, refreshed = math.inf, -math.inf
            if message is None:
                return await self._ended_early()
            if message["type"] == "hello" and isinstance(self.worker, SpoolSource):
                continue  # a replayed spool starts with the worker's hello
            if (
                message["type"] == "part"
                and isinstance(self.sink, QuietSink)
                and self.session is not None
                and self.sink.skip_parts(1)
            ):
                continue  # already journaled: nothing to decode or report
            result = await self._handle(message)
            if result is not None:
                return result

    async def _loop(self) -> TurnResult:
        """A re-attached turn: the spool from its start, then whatever the worker adds."""
        try:
            return await self._messages()
        except _Silent as silent:
            with trio.CancelScope(shield=True):
                await self.cancel_worker()
            return self._failed(str(silent))

    def _buffered(self) -> dict[str, Any] | None:
        """The next message a replayed spool already holds, if any (no waiting)."""
        if isinstance(self.worker, SpoolSource):
            sink = self.sink
            skip = sink.skip_parts if isinstance(sink, QuietSink) and self.session else None
            return self.worker.buffered(skip)
        return None

    async def _receive(self, seconds: float) -> dict[str, Any] | None:
        if isinstance(self.worker, SpoolSource) and (ready := self.worker.buffered()):
            return ready
        try:
            with trio.fail_after(seconds):
                return await self.worker.receive()
        except trio.TooSlowError:
            raise _Silent(
                f"worker_unresponsive: the local worker sent nothing for {seconds:g} s"
            ) from None

    async def cancel_worker(self) -> None:
        """Cooperative cancel, then the stop ladder; bounded; call it shielded."""

        async def ask() -> None:
            await self.worker.send({"type": "cancel"})
            while (message := await self.worker.receive()) is not None:
                if message["type"] == "done":
                    return

        policy = attrs.evolve(self.worker.policy, grace=self.timeouts.cancel_grace)
        await self.worker.stop(ask, policy=policy)

    async def _ended_early(self) -> TurnResult:
        """The worker closed its output without ``done``: report how it ended."""
        returncode: int | None = None
        with trio.move_on_after(self.timeouts.exit_grace):
            returncode = await self.worker.wait()
        if returncode is None:
            return self._failed(
                "worker_exited: the local worker closed its output before it reported the end "
                "of the turn"
            )
        how = (
            f"was ended by signal {-returncode}"
            if returncode < 0
            else f"exited with status {returncode}"
        )
        return self._failed(
            f"worker_exited: the local worker {how} before it reported the end of the turn"
        )

    def _failed(self, reason: str) -> TurnResult:
        return TurnResult(
            outcome="failed",
            reason=reason,
            usage=self.usage,
            cost_usd=self.cost_usd,
            session_id=None if self.session is None else self.session.session_id,
        )

    # ---- messages ----------------------------------------------------------------------

    async def _handle(self, message: dict[str, Any]) -> TurnResult | None:
        kind = message["type"]
        if kind == "session":
            await self._on_session(message)
        elif kind == "part":
            self._require_session(kind)
            await self.sink.part(structure_part(message.get("part")))
        elif kind == "interaction":
            self._require_session(kind)
            await self._on_interaction(message)
        elif kind == "usage":
            self._require_session(kind)
            await self._on_usage(message)
        elif kind == "error":
            self.last_error = (text_field(message, "code"), text_field(message, "message"))
        elif kind == "done":
            return self._on_done(message)
        else:
            raise ProviderProtocolError(
                "the worker sent a message type this protocol does not have",
                details={"type": kind},
            )
        return None

    def _require_session(self, kind: str) -> None:
        if self.session is None:
            raise ProviderProtocolError(
                "the worker sent a message before naming its session", details={"type": kind}
            )

    async def _on_session(self, message: dict[str, Any]) -> None:
        if self.session is not None:
            raise ProviderProtocolError("the worker named its session twice")
        session_id = text_field(message, "sessionId")
        resumed = message.get("resumed")
        path = optional_text_field(message, "path")
        requested = self.request.session.session_id
        if not is_session_id(session_id) or not isinstance(resumed, bool):
            raise ProviderProtocolError("the worker's session message is malformed")
        if resumed != (requested is not None) or (requested not in (None, session_id)):
            raise ProviderProtocolError(
                "the worker's session does not match the requested one",
                details={"requested": requested, "reported": session_id, "resumed": resumed},
            )
        context = self.request.context
        receipt = (
            None
            if requested is not None or context is None
            else context_receipt(context, session_id)
        )
        self.session = SessionInfo(
            session_id=session_id, resumed=resumed, trace_path=path, receipt=receipt
        )
        await self.sink.session(self.session)

    async def _on_interaction(self, message: dict[str, Any]) -> None:
        interaction_id = text_field(message, "interactionId")
        kind = text_field(message, "kind")
        subject = message.get("subject")
        if kind not in LOCAL_CAPABILITIES.interaction_kinds or not isinstance(subject, dict):
            raise ProviderProtocolError(
                "the worker asked an interaction it does not declare", details={"kind": kind}
            )
        answer = await self.sink.interaction(
            InteractionRequest(interaction_id=interaction_id, kind=kind, subject=subject)
        )
        await self.worker.send(
            {
                "type": "interaction_response",
                "interactionId": interaction_id,
                "allow": answer.allow,
                "message": answer.message,
            }
        )

    async def _on_usage(self, message: dict[str, Any]) -> None:
        if message.get("source") != "estimate":
            raise ProviderProtocolError("the local worker's usage must be labelled estimate")
        cost = message.get("costUsd")
        if cost is not None and (not isinstance(cost, int | float) or isinstance(cost, bool)):
            raise ProviderProtocolError("the worker's costUsd is not a number")
        if cost is not None and cost < 0:
            raise ProviderProtocolError("the worker's costUsd is negative")
        self.usage = Usage(
            input_tokens=count_field(message, "inputTokens"),
            output_tokens=count_field(message, "outputTokens"),
            source="estimate",
        )
        self.cost_usd = None if cost is None else float(cost)
        await self.sink.usage(self.usage, self.cost_usd)

    def _on_done(self, message: dict[str, Any]) -> TurnResult:
        self.saw_done = True
        outcome = message.get("outcome")
        if outcome not in _OUTCOMES:
            raise ProviderProtocolError("the worker's done has no known outcome")
        if outcome == "completed" and self.session is None:
            raise ProviderProtocolError("the worker completed a turn without naming its session")
        reason = optional_text_field(message, "reason")
        if reason is None and outcome != "completed" and self.last_error is not None:
            reason = f"{self.last_error[0]}: {self.last_error[1]}"
        session_id = optional_text_field(message, "sessionId")
        if self.session is not None and session_id != self.session.session_id:
            raise ProviderProtocolError("the worker's done names a different session")
        return TurnResult(
            outcome=outcome_of(outcome),
            reason=reason,
            usage=self.usage,
            cost_usd=self.cost_usd,
            session_id=session_id,
            session_boundary=optional_text_field(message, "sessionBoundary"),
            session_digest=optional_text_field(message, "sessionDigest"),
        )
