"""The ``codex`` provider: each turn runs the real Codex CLI (``codex exec``).

Design note. Before every turn the provider writes its own ``$CODEX_HOME/config.toml``
(``CODEX_HOME`` = ``home/.codex``; see :meth:`CodexProvider.config_text`): approvals
``never``, sandbox ``workspace-write``, update checks, analytics and plugins off, and, with a
``base_url``, a ``braid`` model provider there (``wire_api = "responses"``, key from
``BRAID_CODEX_API_KEY``). A turn starts ``codex exec --json --skip-git-repo-check PROMPT``
(continuing: ``... resume THREAD PROMPT``) in the workspace, in its own process group
through :func:`~braid_actors.workers.open_worker`, with an environment built from scratch;
its stdin is closed at once (as ``/dev/null``: exec reads no more input).

* ``thread.started`` names the session (``resumed`` only for ``resume``), with
  ``trace_path`` = the thread's rollout file when it exists already; a fresh thread's
  rollout is found after the turn and the session reported again with it.
* ``item.*`` events become parts (:mod:`._codex_stream`): agent_message -> text,
  reasoning -> reasoning, command_execution -> tool_request + tool_result (exit code,
  bounded output), error -> error, anything else -> unknown.
* ``turn.completed`` gives the usage (the thread total minus the total before the turn);
  Codex reports no cost, so the cost is null. ``turn.failed`` fails the turn with its
  message; ``error`` events become error parts.
* A cancel request sends SIGINT to the group (Codex aborts its turn, records
  ``turn_aborted`` in the rollout and exits); exiting within ``cancel_grace`` acknowledges
  the cancel, else the stop ladder (SIGTERM, SIGKILL) runs and it is unacknowledged.

Continuing first reads the rollout (:meth:`CodexProvider.prove_session`): its last
``response_item`` id must equal ``expected_boundary``, else the turn is refused before any
process starts. ``exec`` with approvals ``never`` asks nothing, so there are no interactions.

A fresh session with portable context (``exec`` takes one text prompt) is written as a new
rollout by :mod:`._codex_seed` (a new thread id, one typed ``response_item`` message per
copied message) and then run as ``exec resume`` on that thread with only the new input;
``resume`` sends the model the rollout's items before it. It is reported as a new session
with copied context (``resumed`` false), its ``trace_path`` the rollout Braid wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import Usage
from braid_actors.providers._cancel import run_watched
from braid_actors.providers._claude_seed import CopyReport
from braid_actors.providers._codex_seed import (
    new_thread_id,
    plan_rollout,
    rollout_path,
    write_rollout,
)
from braid_actors.providers._codex_stream import (
    EventMapper,
    Totals,
    failure_message,
    find_rollout,
    is_codex_thread_id,
    read_rollout,
)
from braid_actors.providers._port import (
    Capabilities,
    RunControl,
    RunSink,
    SessionInfo,
    SessionProof,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.workers import StopPolicy, WorkerProcess, open_worker

CODEX_CAPABILITIES: Final = Capabilities(
    sessions_continue=True,
    sessions_fork=False,
    portable_context=True,
    interaction_kinds=(),
    usage="reported",
    cost=False,
)

MAX_LINE: Final = 32 * 1024 * 1024
API_KEY_VARIABLE: Final = "BRAID_CODEX_API_KEY"
"""The variable the ``braid`` model provider reads its key from (``env_key``)."""
RETRIES_VARIABLE: Final = "BRAID_CODEX_MAX_RETRIES"
"""In ``env``: the request and stream retries of the ``braid`` model provider (tests: 0)."""


@attrs.frozen
class CodexTimeouts:
    """Deadlines (seconds) for everything the provider waits for from the CLI."""

    startup: float = 60.0
    """From spawn to ``thread.started``."""
    idle: float = 300.0
    """Between two lines of output."""
    cancel_grace: float = 5.0
    """After SIGINT, for the CLI to exit."""
    exit_grace: float = 5.0
    """After the turn's end, for the CLI to exit by itself."""
    term_grace: float = 2.0
    kill_grace: float = 2.0


class _Silent(Exception):
    pass


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


@attrs.define(eq=False)
class CodexProvider:
    """Codex as a Braid runner; its config and rollouts live under ``home/.codex``."""

    bin: str
    home: Path
    base_url: str | None = None
    """The Responses API base (``.../v1``); null: Codex's own default provider."""
    env: dict[str, str] = attrs.Factory(dict)
    """Extra variables (``BRAID_CODEX_API_KEY``, proxies, ``BRAID_CODEX_MAX_RETRIES``)."""
    model: str | None = None
    timeouts: CodexTimeouts = CodexTimeouts()

    @property
    def name(self) -> str:
        return "codex"

    @property
    def capabilities(self) -> Capabilities:
        return CODEX_CAPABILITIES

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def available(self) -> bool:
        path = Path(self.bin)
        return path.is_file() and os.access(path, os.X_OK)

    def config_text(self, model: str | None) -> str:
        """The ``config.toml`` for a turn (see the module note)."""
        lines: list[str] = []
        if model is not None:
            lines.append(f"model = {_toml(model)}")
        if self.base_url is not None:
            lines.append('model_provider = "braid"')
        lines += [
            'approval_policy = "never"',
            'sandbox_mode = "workspace-write"',
            "check_for_update_on_startup = false",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
        ]
        if self.base_url is not None:
            lines += [
                "",
                "[model_providers.braid]",
                'name = "braid"',
                f"base_url = {_toml(self.base_url)}",
                'wire_api = "responses"',
                f"env_key = {_toml(API_KEY_VARIABLE)}",
            ]
            retries = self.env.get(RETRIES_VARIABLE)
            if retries is not None and retries.isdigit():
                lines += [
                    f"request_max_retries = {int(retries)}",
                    f"stream_max_retries = {int(retries)}",
                ]
        return "\n".join(lines) + "\n"

    def write_config(self, model: str | None) -> None:
        self.codex_home.mkdir(parents=True, exist_ok=True)
        (self.codex_home / "config.toml").write_text(self.config_text(model))

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
            CODEX_HOME=str(self.codex_home),
        )
        env.update(self.env)
        return env

    def command(self, request: TurnRequest, seeded: str | None = None) -> list[str]:
        """The CLI's argv; ``seeded``: the new thread Braid wrote from portable context."""
        argv = [self.bin, "exec", "--json", "--skip-git-repo-check"]
        thread = seeded if seeded is not None else request.session.session_id
        if thread is not None:
            argv += ["resume", thread]
        # "--" ends the options: a prompt starting with "-" stays the prompt.
        return [*argv, "--", request.text]

    async def run_turn(
        self, request: TurnRequest, sink: RunSink, control: RunControl | None = None
    ) -> TurnResult:
        """Run one turn in a new CLI process (see the module note)."""
        checked = await self._check_session(request)
        if isinstance(checked, str):
            return _failed(checked, Usage(), request.session.session_id)
        self.write_config(request.model or self.model)
        seeded, report = await self._seed(request)
        timeouts = self.timeouts
        policy = StopPolicy(
            grace=timeouts.exit_grace,
            term_grace=timeouts.term_grace,
            kill_grace=timeouts.kill_grace,
        )
        async with open_worker(
            self.command(request, seeded),
            cwd=request.workspace,
            env=self.environment(),
            policy=policy,
            max_line=MAX_LINE,
        ) as worker:
            stdin = worker.process.stdin
            if stdin is not None:  # nothing more to read: the prompt is in argv
                await stdin.aclose()
            turn = _Turn(
                self,
                worker,
                request,
                sink,
                control,
                baseline=checked,
                seeded=seeded,
                report=report,
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
        if turn.session is not None:
            await turn.report_trace()
        if result.session_id is not None and result.outcome != "failed":
            proof = await self.prove_session(result.session_id)
            if proof.available:
                result = attrs.evolve(result, session_boundary=proof.last_message_id)
        return attrs.evolve(result, worker_log=worker.log.text() or None)

    async def _check_session(self, request: TurnRequest) -> str | Totals:
        """A refusal, or the thread's usage total before this turn."""
        wanted = request.session
        if wanted.session_id is None:
            return Totals()
        if not is_codex_thread_id(wanted.session_id):
            return "session_unverified: not a Codex thread id"
        path = find_rollout(self.codex_home, wanted.session_id)
        if path is None:
            return "session_unverified: no rollout found"
        try:
            end = await trio.to_thread.run_sync(read_rollout, path)
        except (OSError, ValueError) as exc:
            return f"session_unverified: rollout unreadable: {exc}"
        proof = _proof(wanted.session_id, end.thread_id, end.last_item_id)
        if not proof.available:
            return f"session_unverified: {proof.reason}"
        if proof.last_message_id != wanted.expected_boundary:
            return (
                f"session_mismatch: the thread ends at {proof.last_message_id}, "
                f"not at {wanted.expected_boundary}"
            )
        return end.totals

    async def _seed(self, request: TurnRequest) -> tuple[str | None, CopyReport | None]:
        """For a fresh session with portable context: write it as a new thread's rollout.

        Returns the new thread's id (null when there is nothing to copy) and what was
        copied (null without portable context).
        """
        context = request.context
        if request.session.session_id is not None or context is None:
            return None, None
        thread = new_thread_id()
        rollout = plan_rollout(
            context,
            thread_id=thread,
            cwd=str(request.workspace),
            model_provider="braid" if self.base_url is not None else "openai",
        )
        if not rollout.lines:
            return None, rollout.report
        path = rollout_path(self.codex_home, thread)
        await trio.to_thread.run_sync(write_rollout, path, rollout.lines)
        return thread, rollout.report

    async def prove_session(self, session_id: str) -> SessionProof:
        """Read the thread's rollout (never modifying it): its last ``response_item`` id."""
        if not is_codex_thread_id(session_id):
            return SessionProof(session_id, available=False, reason="not a Codex thread id")
        path = find_rollout(self.codex_home, session_id)
        if path is None:
            return SessionProof(session_id, available=False, reason="no rollout found")
        try:
            end = await trio.to_thread.run_sync(read_rollout, path)
        except (OSError, ValueError) as exc:
            return SessionProof(session_id, available=False, reason=f"rollout unreadable: {exc}")
        return _proof(session_id, end.thread_id, end.last_item_id)


def _proof(session_id: str, thread: str | None, last: str | None) -> SessionProof:
    if thread != session_id:
        return SessionProof(session_id, available=False, reason="rollout names another thread")
    if last is None:
        return SessionProof(session_id, available=False, reason="rollout has no items")
    return SessionProof(session_id, available=True, last_message_id=last)


def _failed(reason: str, usage: Usage, session: str | None) -> TurnResult:
    return TurnResult(
        outcome="failed", reason=reason, usage=usage, cost_usd=None, session_id=session
    )


@attrs.define(eq=False)
class _Turn:
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
                    f"cancel_unacknowledged: Codex did not exit within {grace:g} s of SIGINT "
                    "and was stopped"
                ),
                cancel_acknowledged=False,
            )
        return result

    async def _watch_cancel(self, control: RunControl, scope: trio.CancelScope) -> None:
        await control.cancel_requested.wait()
        self.interrupt_sent = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.worker.info.pgid, signal.SIGINT)
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
            raise _Silent(f"worker_unresponsive: Codex printed nothing for {seconds:g} s") from None

    async def _handle(self, line: dict[str, Any]) -> TurnResult | None:
        kind = line.get("type")
        if kind == "thread.started":
            await self._on_thread(line)
        elif kind in ("item.started", "item.updated", "item.completed"):
            for part in self.mapper.item(line):
                await self.sink.part(part)
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
        """After SIGINT: cancelled and acknowledged once the CLI has exited."""
        await self.worker.wait()  # bounded by the cancel watcher's grace
        return TurnResult(
            outcome="cancelled",
            reason=None if self.control is None else self.control.reason,
            usage=self.usage,
            cost_usd=None,
            session_id=self._session_id(),
            cancel_acknowledged=True,
        )

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
        return _failed(reason, self.usage, self._session_id())
