"""The ``claude_code`` provider: each turn runs the real Claude Code CLI.

Design note. A turn starts ``claude -p --input-format stream-json --output-format
stream-json --verbose --include-partial-messages --permission-prompt-tool stdio`` (plus
``--model``, ``--resume SESSION``, ``--fork-session``) in its own process group through
:func:`~braid_actors.workers.open_worker`, with ``HOME`` set to :attr:`ClaudeCodeProvider.home`
(the CLI's config dir is ``$HOME/.claude``) and an environment built from scratch. It
writes one stream-json ``user`` message to stdin and keeps stdin open for control
messages until the ``result`` line, then closes it and the CLI exits.

* ``system``/``init`` names the session: reported with ``trace_path`` =
  ``$HOME/.claude/projects/<workspace, non-alphanumerics as ->/<session>.jsonl``.
* ``stream_event`` deltas and ``assistant`` blocks become text / reasoning / tool_request
  parts (``<api message id>:<block index>``), ``user`` tool results become tool_result
  parts; see :mod:`._claude_stream`.
* ``control_request`` ``can_use_tool`` becomes a ``permission`` interaction; the answer goes
  back as a ``control_response`` (allow: ``updatedInput`` = the original input; deny: a
  message). Other control requests are answered with an error.
* ``result`` gives the usage (raw counts) and ``total_cost_usd``; ``is_error`` a failed
  result with the CLI's message.
* A cancel request sends ``control_request`` ``interrupt``; the CLI answering it and
  ending its turn (a ``result``) within the grace acknowledges the cancel, else the group
  is stopped and the cancel is unacknowledged.

Continuing a session first reads its transcript (:meth:`ClaudeCodeProvider.prove_session`):
the last main-chain message uuid must equal ``expected_boundary``; an unreadable transcript
is unverified and refused.

A fresh session with portable context (the CLI can't be seeded through typed stream-json
assistant input) is written as a new native transcript by :mod:`._claude_seed` (a new
session id, one uuid-chained record per copied message) and then run with ``--resume`` on
it and only the new input; it is reported as a new session with copied context
(``resumed`` false), its ``trace_path`` the transcript Braid wrote.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import Usage
from braid_actors.providers._cancel import run_watched
from braid_actors.providers._claude_seed import CopyReport, Seed, plan_seed, write_records
from braid_actors.providers._claude_stream import (
    StreamMapper,
    find_session_file,
    is_claude_session_id,
    read_claude_session,
    result_usage,
    session_file,
)
from braid_actors.providers._port import (
    Capabilities,
    InteractionRequest,
    RunControl,
    RunSink,
    SessionInfo,
    SessionProof,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.workers import StopPolicy, WorkerProcess, open_worker

CLAUDE_CODE_CAPABILITIES: Final = Capabilities(
    sessions_continue=True,
    sessions_fork=True,
    portable_context=True,
    interaction_kinds=("permission",),
    usage="reported",
    cost=True,
)

MAX_LINE: Final = 32 * 1024 * 1024


@attrs.frozen
class ClaudeTimeouts:
    """Deadlines (seconds) for everything the provider waits for from the CLI."""

    startup: float = 60.0
    """From spawn to ``system``/``init``."""
    idle: float = 300.0
    """Between two lines of output (not while Braid answers a permission)."""
    cancel_grace: float = 5.0
    """After the interrupt request, for the CLI's ``result``."""
    exit_grace: float = 5.0
    """After ``result`` (stdin closed), for the CLI to exit by itself."""
    term_grace: float = 2.0
    kill_grace: float = 2.0


class _Silent(Exception):
    pass


@attrs.define(eq=False)
class ClaudeCodeProvider:
    """Claude Code as a Braid runner; its config and sessions live under ``home``."""

    bin: str
    home: Path
    base_url: str | None = None
    """``ANTHROPIC_BASE_URL`` (null: the CLI's default endpoint)."""
    env: dict[str, str] = attrs.Factory(dict)
    """Extra variables (an API key, proxies, ``CLAUDE_CODE_MAX_RETRIES``)."""
    model: str | None = None
    timeouts: ClaudeTimeouts = ClaudeTimeouts()

    @property
    def name(self) -> str:
        return "claude_code"

    @property
    def capabilities(self) -> Capabilities:
        return CLAUDE_CODE_CAPABILITIES

    @property
    def config_dir(self) -> Path:
        return self.home / ".claude"

    def available(self) -> bool:
        path = Path(self.bin)
        return path.is_file() and os.access(path, os.X_OK)

    def environment(self) -> dict[str, str]:
        """The CLI's environment, from scratch: nothing of this machine's config leaks in."""
        home = self.home
        dirs = {
            "HOME": home,
            "XDG_CONFIG_HOME": home / ".config",
            "XDG_CACHE_HOME": home / ".cache",
            "XDG_DATA_HOME": home / ".local" / "share",
            "XDG_STATE_HOME": home / ".local" / "state",
            "TMPDIR": home / "tmp",
        }
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        env = {name: str(path) for name, path in dirs.items()}
        env.update(
            PATH=os.environ.get("PATH", "/usr/bin:/bin"),
            LANG="C.UTF-8",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_TELEMETRY="1",
            DISABLE_AUTOUPDATER="1",
        )
        if self.base_url is not None:
            env["ANTHROPIC_BASE_URL"] = self.base_url
        env.update(self.env)
        return env

    def command(self, request: TurnRequest, seeded: str | None = None) -> list[str]:
        """The CLI's argv; ``seeded``: the new session Braid wrote from portable context."""
        argv = [
            self.bin,
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--permission-prompt-tool",
            "stdio",
        ]
        model = request.model or self.model
        if model is not None:
            argv += ["--model", model]
        if seeded is not None:
            argv += ["--resume", seeded]
        elif request.session.session_id is not None:
            argv += ["--resume", request.session.session_id]
            if request.options.get("fork_session"):
                argv.append("--fork-session")
        return argv

    async def run_turn(
        self, request: TurnRequest, sink: RunSink, control: RunControl | None = None
    ) -> TurnResult:
        """Run one turn in a new CLI process (see the module note)."""
        refusal = await self._check_session(request)
        if refusal is not None:
            return _failed(refusal, Usage(), None, request.session.session_id)
        seed_id, seed = await self._seed(request)
        timeouts = self.timeouts
        policy = StopPolicy(
            grace=timeouts.exit_grace,
            term_grace=timeouts.term_grace,
            kill_grace=timeouts.kill_grace,
        )
        async with open_worker(
            self.command(request, seed_id),
            cwd=request.workspace,
            env=self.environment(),
            policy=policy,
            max_line=MAX_LINE,
        ) as worker:
            turn = _Turn(
                self, worker, request, sink, control, seeded=seed_id, lead=seed.lead, seed=seed
            )
            try:
                result = await turn.run()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await worker.stop(policy=attrs.evolve(policy, grace=0.0))
                raise
            if result.outcome == "completed":
                with trio.move_on_after(timeouts.exit_grace):
                    await worker.wait()
        if result.session_id is not None and result.outcome != "failed":
            proof = await self.prove_session(result.session_id)
            if proof.available:
                result = attrs.evolve(result, session_boundary=proof.last_message_id)
        return attrs.evolve(result, worker_log=worker.log.text() or None)

    async def _check_session(self, request: TurnRequest) -> str | None:
        wanted = request.session
        if wanted.session_id is None:
            return None
        proof = await self.prove_session(wanted.session_id)
        if not proof.available:
            return f"session_unverified: {proof.reason}"
        if proof.last_message_id != wanted.expected_boundary:
            return (
                f"session_mismatch: the session ends at {proof.last_message_id}, "
                f"not at {wanted.expected_boundary}"
            )
        return None

    async def _seed(self, request: TurnRequest) -> tuple[str | None, Seed]:
        """For a fresh session with portable context: write it as a new native session.

        Returns the new session's id (null when nothing needs a transcript) and the plan.
        """
        context = request.context
        if request.session.session_id is not None or context is None:
            return None, Seed(records=[], lead=[], report=CopyReport())
        session_id = str(uuid.uuid4())
        seed = plan_seed(
            context,
            session_id=session_id,
            cwd=str(request.workspace),
            model=request.model or self.model,
        )
        if not seed.records:
            return None, seed
        path = session_file(self.config_dir, request.workspace, session_id)
        await trio.to_thread.run_sync(write_records, path, seed.records)
        return session_id, seed

    async def prove_session(self, session_id: str) -> SessionProof:
        """Read the CLI's transcript (never modifying it): its last message uuid."""
        if not is_claude_session_id(session_id):
            return SessionProof(session_id, available=False, reason="not a Claude Code session id")
        path = find_session_file(self.config_dir, session_id)
        if path is None:
            return SessionProof(session_id, available=False, reason="no transcript found")
        try:
            end = await trio.to_thread.run_sync(read_claude_session, path)
        except (OSError, ValueError) as exc:
            return SessionProof(session_id, available=False, reason=f"transcript unreadable: {exc}")
        if end.last_message_id is None:
            return SessionProof(session_id, available=False, reason="transcript has no messages")
        return SessionProof(session_id, available=True, last_message_id=end.last_message_id)


def _failed(reason: str, usage: Usage, cost: float | None, session: str | None) -> TurnResult:
    return TurnResult(
        outcome="failed", reason=reason, usage=usage, cost_usd=cost, session_id=session
    )


@attrs.define(eq=False)
class _Turn:
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
        info = self.worker.info
        await self.sink.worker_started(
            WorkerInfo(
                pid=info.pid, create_time=info.create_time, pgid=info.pgid, command=info.command
            )
        )
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
        except _Silent as silent:
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
            raise _Silent(
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
        fork = bool(self.request.options.get("fork_session"))
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
        self.usage, self.cost = result_usage(line)
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
        return _failed(
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
