"""One Codex turn: one ``codex exec`` process followed to its end (see :mod:`.codex`)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from typing import TYPE_CHECKING, Any

import attrs
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import Usage
from braid_actors.providers._cancel import run_watched
from braid_actors.providers._claude_seed import CopyReport
from braid_actors.providers._codex_record import read_codex_turn
from braid_actors.providers._codex_stream import (
    EventMapper,
    Totals,
    failure_message,
    find_rollout,
    is_codex_thread_id,
)
from braid_actors.providers._port import (
    RunControl,
    RunSink,
    SessionInfo,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.workers import WorkerProcess

if TYPE_CHECKING:
    # Only the annotation: a real import would be a cycle (nothing resolves it at run time).
    from braid_actors.providers.codex import CodexProvider  # noqa: TC004


class Silent(Exception):
    pass


def failed(reason: str, usage: Usage, session: str | None) -> TurnResult:
    return TurnResult(
        outcome="failed", reason=reason, usage=usage, cost_usd=None, session_id=session
    )


@attrs.define(eq=False)
class CodexTurn:
    """One turn of one ``codex exec`` process."""

    provider: CodexProvider
    worker: WorkerProcess
    request: TurnRequest
    sink: RunSink
    control: RunControl | None
    baseline: Totals
    seeded: str | None = None
    """The new thread Braid wrote from portable context (run with ``resume``)."""
    report: CopyReport | None = None
    """What a fresh thread was given of the portable context (its receipt's content)."""
    mapper: EventMapper = attrs.Factory(EventMapper)
    session: SessionInfo | None = None
    usage: Usage = attrs.Factory(Usage)
    interrupt_sent: bool = False
    """A cancel is under way (its SIGINT waits for the turn to start)."""
    turn_started: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> TurnResult:
        await self.sink.worker_started(WorkerInfo.of(self.worker.info))
        result = await run_watched(self._guarded, self.control, self._watch_cancel)
        if result is None:
            with trio.CancelScope(shield=True):
                await self.worker.stop(policy=attrs.evolve(self.worker.policy, grace=0.0))
            grace = self.provider.timeouts.cancel_grace
            return attrs.evolve(
                self._failed(
                    f"cancel_unacknowledged: Codex did not exit within {grace:g} s of SIGINT "
                    "and was stopped"
                ),
                cancel_acknowledged=False,
            )
        return result

    async def _watch_cancel(self, control: RunControl, scope: trio.CancelScope) -> None:
        # Codex ignores a SIGINT that lands after it installed its handler but before its
        # turn began — and every later one — so the interrupt waits for ``turn.started``
        # (an exit before that ends the turn too). All within ``cancel_grace``.
        await control.cancel_requested.wait()
        self.interrupt_sent = True
        with trio.move_on_after(self.provider.timeouts.cancel_grace):
            await self.turn_started.wait()
            self.interrupt()
            await trio.sleep_forever()  # until the turn returns (its end cancels this)
        scope.cancel()

    def interrupt(self) -> None:
        """SIGINT to the group: Codex's own interrupt (it aborts its turn and exits)."""
        if self.worker.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.worker.info.pgid, signal.SIGINT)

    async def _guarded(self) -> TurnResult:
        try:
            return await self._run()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return await self._ended_early()
        except Silent as silent:
            with trio.CancelScope(shield=True):
                await self.worker.stop(policy=attrs.evolve(self.worker.policy, grace=0.0))
            return self._failed(str(silent))

    async def _run(self) -> TurnResult:
        timeouts = self.provider.timeouts
        while True:
            seconds = timeouts.idle if self.session is not None else timeouts.startup
            line = await self._receive(seconds)
            if line is None:
                return await self._ended_early()
            result = await self._handle(line)
            if result is not None:
                return result

    async def _receive(self, seconds: float) -> dict[str, Any] | None:
        try:
            with trio.fail_after(seconds):
                return await self.worker.receive()
        except trio.TooSlowError:
            raise Silent(f"worker_unresponsive: Codex printed nothing for {seconds:g} s") from None

    async def _handle(self, line: dict[str, Any]) -> TurnResult | None:
        kind = line.get("type")
        if kind == "thread.started":
            await self._on_thread(line)
        elif kind in ("item.started", "item.updated", "item.completed"):
            for part in self.mapper.item(line):
                await self.sink.part(part)
        elif kind == "turn.started":
            self.turn_started.set()
        elif kind == "error":
            await self.sink.part(self.mapper.error(line))
        elif kind == "turn.completed":
            total = Totals.of(line.get("usage"))
            if total is not None:
                self.usage = total.minus(self.baseline).usage()
            await self.sink.usage(self.usage, None)
            return TurnResult(
                outcome="completed",
                reason=None,
                usage=self.usage,
                cost_usd=None,
                session_id=self._session_id(),
                cancel_acknowledged=True if self.interrupt_sent else None,
            )
        elif kind == "turn.failed":
            if self.interrupt_sent:
                return await self._cancelled()
            return self._failed(f"turn_failed: {failure_message(line)}")
        return None

    async def _on_thread(self, line: dict[str, Any]) -> None:
        thread = line.get("thread_id")
        if not isinstance(thread, str) or not is_codex_thread_id(thread):
            raise ProviderProtocolError("Codex's thread.started names no thread id")
        requested = self.request.session.session_id
        expected = self.seeded if self.seeded is not None else requested
        if expected is not None and thread != expected:
            raise ProviderProtocolError(
                "Codex resumed a different thread",
                details={"requested": expected, "reported": thread},
            )
        self.mapper.thread_id = thread
        trace = find_rollout(self.provider.codex_home, thread)
        context = self.request.context
        receipt = (
            None
            if requested is not None or context is None or self.report is None
            else self.report.receipt(context, runner=self.provider.name, session_id=thread)
        )
        self.session = SessionInfo(
            session_id=thread,
            resumed=requested is not None,
            trace_path=None if trace is None else str(trace),
            receipt=receipt,
        )
        await self.sink.session(self.session)

    async def report_trace(self) -> None:
        """After the turn: report the session again once its rollout exists."""
        if self.session is None or self.session.trace_path is not None:
            return
        trace = find_rollout(self.provider.codex_home, self.session.session_id)
        if trace is not None:
            self.session = attrs.evolve(self.session, trace_path=str(trace))
            await self.sink.session(self.session)

    async def _cancelled(self) -> TurnResult:
        """After SIGINT and the CLI's exit: cancelled, acknowledged only when provable.

        The rollout decides: no turn recorded (the CLI stopped before its turn began, so no
        model request was made) or the turn's ``turn_aborted``: acknowledged. A turn that
        began and records no end was not shown to stop by itself: unacknowledged.
        """
        await self.worker.wait()  # bounded by the cancel watcher's grace
        proven, why = await self._abort_proven()
        return TurnResult(
            outcome="cancelled" if proven else "failed",
            reason=(None if self.control is None else self.control.reason)
            if proven
            else f"cancel_unacknowledged: {why}",
            usage=self.usage,
            cost_usd=None,
            session_id=self._session_id(),
            cancel_acknowledged=proven,
        )

    async def _abort_proven(self) -> tuple[bool, str]:
        thread = self._session_id() or self.seeded or self.request.session.session_id
        path = None if thread is None else find_rollout(self.provider.codex_home, thread)
        if thread is None or path is None:
            return True, "Codex exited before it recorded a thread"
        try:
            turn = await trio.to_thread.run_sync(
                functools.partial(
                    read_codex_turn,
                    path,
                    thread_id=thread,
                    text=self.request.text,
                    after=self.request.session.expected_boundary,
                )
            )
        except (OSError, ValueError) as exc:
            return False, f"the rollout is unreadable: {exc}"
        if not turn.started:
            return True, "Codex exited before its turn began"
        if turn.ending.startswith("aborted"):
            return True, "the rollout records the turn's abort"
        return False, f"Codex exited after SIGINT but {turn.ending}"

    async def _ended_early(self) -> TurnResult:
        if self.interrupt_sent:
            return await self._cancelled()
        returncode: int | None = None
        with trio.move_on_after(self.provider.timeouts.exit_grace):
            returncode = await self.worker.wait()
        how = "closed its output" if returncode is None else f"exited with status {returncode}"
        tail = self.worker.log.text().strip()[-500:]
        suffix = f": {tail}" if tail else ""
        return self._failed(f"worker_exited: Codex {how} before the turn ended{suffix}")

    def _session_id(self) -> str | None:
        return None if self.session is None else self.session.session_id

    def _failed(self, reason: str) -> TurnResult:
        return failed(reason, self.usage, self._session_id())
