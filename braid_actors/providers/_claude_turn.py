"""One Claude Code turn: the conversation with one CLI process (see :mod:`.claude_code`)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import Usage
from braid_actors.providers._cancel import run_watched
from braid_actors.providers._claude_seed import Seed
from braid_actors.providers._claude_stream import (
    CostBase,
    StreamMapper,
    is_claude_session_id,
    result_usage,
    session_file,
)
from braid_actors.providers._port import (
    InteractionRequest,
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
    from braid_actors.providers.claude_code import ClaudeCodeProvider  # noqa: TC004


class Silent(Exception):
    pass


def failed(reason: str, usage: Usage, cost: float | None, session: str | None) -> TurnResult:
    return TurnResult(
        outcome="failed", reason=reason, usage=usage, cost_usd=cost, session_id=session
    )


@attrs.define(eq=False)
class ClaudeTurn:
    """One conversation with one CLI process."""

    provider: ClaudeCodeProvider
    worker: WorkerProcess
    request: TurnRequest
    sink: RunSink
    control: RunControl | None
    seeded: str | None = None
    """The new session Braid wrote from portable context (run with ``--resume``)."""
    lead: list[dict[str, Any]] = attrs.Factory(list)
    """Copied context blocks sent before the new input, in its message."""
    seed: Seed | None = None
    cost_base: CostBase | None = None
    """The resumed (or forked) session's running cost before this turn (see CostBase)."""
    """The plan a fresh session's portable context was copied by (its report: the receipt)."""
    mapper: StreamMapper = attrs.Factory(StreamMapper)
    session: SessionInfo | None = None
    usage: Usage = attrs.Factory(Usage)
    cost: float | None = None
    started: trio.Event = attrs.Factory(trio.Event)
    interrupt_sent: bool = False
    interrupt_answered: bool = False
    cancel_requests: int = 0

    async def run(self) -> TurnResult:
        await self.sink.worker_started(WorkerInfo.of(self.worker.info))
        result = await run_watched(self._guarded, self.control, self._watch_cancel)
        if result is None:
            with trio.CancelScope(shield=True):
                await self.worker.stop(policy=attrs.evolve(self.worker.policy, grace=0.0))
            grace = self.provider.timeouts.cancel_grace
            return attrs.evolve(
                self._failed(
                    f"cancel_unacknowledged: Claude Code did not end its turn within {grace:g} s "
                    "of the interrupt and was stopped"
                ),
                cancel_acknowledged=False,
            )
        return result

    async def _watch_cancel(self, control: RunControl, scope: trio.CancelScope) -> None:
        await control.cancel_requested.wait()
        await self.started.wait()
        self.interrupt_sent = True
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.worker.send(
                {
                    "type": "control_request",
                    "request_id": f"braid-interrupt-{self.request.turn_id}",
                    "request": {"subtype": "interrupt"},
                }
            )
        await trio.sleep(self.provider.timeouts.cancel_grace)
        scope.cancel()

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
        await self.worker.send(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [*self.lead, {"type": "text", "text": self.request.text}],
                },
                "parent_tool_use_id": None,
                "session_id": self.seeded or self.request.session.session_id or "",
            }
        )
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
            raise Silent(
                f"worker_unresponsive: Claude Code printed nothing for {seconds:g} s"
            ) from None

    async def _handle(self, line: dict[str, Any]) -> TurnResult | None:
        kind = line["type"]
        if kind == "system" and line.get("subtype") == "init":
            await self._on_init(line)
        elif kind == "stream_event":
            part = self.mapper.stream_event(line.get("event"))
            if part is not None:
                await self.sink.part(part)
        elif kind == "assistant":
            for part in self.mapper.assistant(line):
                await self.sink.part(part)
        elif kind == "user":
            for part in self.mapper.user(line):
                await self.sink.part(part)
        elif kind == "control_request":
            await self._on_control_request(line)
        elif kind == "control_response":
            response = line.get("response")
            if isinstance(response, dict) and str(response.get("request_id", "")).startswith(
                "braid-interrupt-"
            ):
                self.interrupt_answered = response.get("subtype") == "success"
        elif kind == "result":
            return await self._on_result(line)
        return None

    async def _on_init(self, line: dict[str, Any]) -> None:
        session_id = line.get("session_id")
        if not isinstance(session_id, str) or not is_claude_session_id(session_id):
            raise ProviderProtocolError("Claude Code's init names no session id")
        requested = self.request.session.session_id
        fork = self.request.session.fork
        resumed = requested is not None and not fork
        expected = self.seeded if self.seeded is not None else requested if resumed else None
        if expected is not None and session_id != expected:
            raise ProviderProtocolError(
                "Claude Code resumed a different session",
                details={"requested": expected, "reported": session_id},
            )
        trace = session_file(self.provider.config_dir, self.request.workspace, session_id)
        context = self.request.context
        receipt = (
            None
            if requested is not None or context is None or self.seed is None
            else self.seed.report.receipt(context, runner=self.provider.name, session_id=session_id)
        )
        self.session = SessionInfo(
            session_id=session_id, resumed=resumed, trace_path=str(trace), receipt=receipt
        )
        await self.sink.session(self.session)
        self.started.set()

    async def _on_control_request(self, line: dict[str, Any]) -> None:
        request_id = line.get("request_id")
        body = line.get("request")
        if not isinstance(request_id, str) or not isinstance(body, dict):
            raise ProviderProtocolError("Claude Code sent a malformed control request")
        if body.get("subtype") != "can_use_tool":
            await self.worker.send(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": request_id,
                        "error": f"Braid does not handle {body.get('subtype')!r}",
                    },
                }
            )
            return
        tool_input = body.get("input")
        original: dict[str, Any] = tool_input if isinstance(tool_input, dict) else {}
        tool_use_id = body.get("tool_use_id")
        subject: dict[str, Any] = {
            "tool": body.get("tool_name"),
            "input": original,
            "tool_use_id": tool_use_id,
        }
        if isinstance(original.get("command"), str):
            subject["command"] = original["command"]
        if isinstance(body.get("description"), str):
            subject["description"] = body["description"]
        answer = await self.sink.interaction(
            InteractionRequest(interaction_id=request_id, kind="permission", subject=subject)
        )
        decision: dict[str, Any]
        if answer.allow:
            decision = {"behavior": "allow", "updatedInput": original}
        else:
            if isinstance(tool_use_id, str):
                self.mapper.denied.add(tool_use_id)
            decision = {"behavior": "deny", "message": answer.message or "Denied through Braid."}
        await self.worker.send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": decision},
            }
        )

    async def _on_result(self, line: dict[str, Any]) -> TurnResult:
        self.usage, self.cost = result_usage(line, self.cost_base)
        await self.sink.usage(self.usage, self.cost)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            stdin = self.worker.process.stdin
            if stdin is not None:
                await stdin.aclose()  # no more input: the CLI exits
        outcome: Literal["completed", "failed", "cancelled"] = "completed"
        reason: str | None = None
        acknowledged: bool | None = None
        if self.interrupt_sent:
            # It ended its turn after the interrupt: acknowledged (a turn that finished
            # first stays completed).
            acknowledged = True
            if line.get("is_error") or line.get("subtype") != "success":
                outcome, reason = "cancelled", self.control_reason()
        elif line.get("is_error"):
            outcome = "failed"
            reason = _error_reason(line)
        return TurnResult(
            outcome=outcome,
            reason=reason,
            usage=self.usage,
            cost_usd=self.cost,
            session_id=None if self.session is None else self.session.session_id,
            cancel_acknowledged=acknowledged,
        )

    def control_reason(self) -> str | None:
        return None if self.control is None else self.control.reason

    async def _ended_early(self) -> TurnResult:
        returncode: int | None = None
        with trio.move_on_after(self.provider.timeouts.exit_grace):
            returncode = await self.worker.wait()
        how = "closed its output" if returncode is None else f"exited with status {returncode}"
        tail = self.worker.log.text().strip()[-500:]
        suffix = f": {tail}" if tail else ""
        return self._failed(f"worker_exited: Claude Code {how} before its result{suffix}")

    def _failed(self, reason: str) -> TurnResult:
        return failed(
            reason, self.usage, self.cost, None if self.session is None else self.session.session_id
        )


def _error_reason(line: dict[str, Any]) -> str:
    code = line.get("terminal_reason") or line.get("subtype") or "error"
    message = line.get("result")
    if not isinstance(message, str) or not message:
        errors = line.get("errors")
        message = "; ".join(map(str, errors)) if isinstance(errors, list) else "the turn failed"
    status = line.get("api_error_status")
    prefix = f"{code} ({status})" if status is not None else str(code)
    return f"{prefix}: {message}"
