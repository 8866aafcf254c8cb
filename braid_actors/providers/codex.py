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
  ``turn_aborted`` in the rollout and exits) once ``turn.started`` was printed: an interrupt
  that lands after Codex installed its handler but before its turn began is ignored, and
  so is every later one (seen on 0.171.0), so an early cancel waits for the turn to start.
  The cancel is acknowledged when the CLI exited within ``cancel_grace`` and its rollout
  proves the end (no turn recorded, or the turn's ``turn_aborted``); else the stop ladder
  (SIGTERM, SIGKILL) runs and it is unacknowledged.

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

import functools
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import trio

from braid_actors.errors import InvalidRequest
from braid_actors.model import Usage
from braid_actors.providers._codex_record import read_codex_turn
from braid_actors.providers._codex_seed import (
    new_thread_id,
    plan_rollout,
    rollout_path,
    write_rollout,
)
from braid_actors.providers._codex_stream import (
    Totals,
    find_rollout,
    is_codex_thread_id,
    read_rollout,
)
from braid_actors.providers._codex_turn import CodexTurn, failed
from braid_actors.providers._port import (
    Capabilities,
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
from braid_actors.providers._reconcile import conclude, find_strays, settle_workers
from braid_actors.workers import StopPolicy, open_worker

if TYPE_CHECKING:
    from braid_actors.providers._claude_seed import CopyReport

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
        refused = fork_refusal(request, self.name)  # exec has no native fork
        if refused is not None:
            return refused
        checked = await self._check_session(request)
        if isinstance(checked, str):
            return failed(checked, Usage(), request.session.session_id)
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
            turn = CodexTurn(
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

    def strays(self) -> list[WorkerInfo]:
        """Live processes of this runner (its ``HOME``), journaled or not; see
        :func:`._reconcile.find_strays`."""
        return find_strays(self.home)

    async def reconcile(self, request: ReconcileRequest, sink: RunSink) -> Reconciliation:
        """After a restart: stop an orphaned ``exec`` at once, then read its rollout.

        Waiting would gain nothing: ``exec`` keeps running after Braid dies (its stdin is
        ``/dev/null``), but its output pipe is broken, and at its next event it aborts the
        turn (``turn_aborted`` in the rollout) and exits. So it gets SIGINT (Codex's own
        interrupt, recorded in the rollout) and ``cancel_grace``, then the ladder's SIGTERM
        and SIGKILL. A turn that ended before that is in the rollout all the same
        (:mod:`._codex_record`).
        """
        timeouts = self.timeouts
        settled = await settle_workers(
            request.workers,
            wait=0.0,
            policy=StopPolicy(
                grace=timeouts.cancel_grace,
                term_grace=timeouts.term_grace,
                kill_grace=timeouts.kill_grace,
            ),
            interrupt=signal.SIGINT,
        )
        thread = request.session_id
        path = None if thread is None else find_rollout(self.codex_home, thread)
        if thread is None or path is None:
            missing = "no thread was reported" if thread is None else "no rollout found"
            return Reconciliation(None, f"after the restart {missing} ({settled})", settled)
        if request.trace_path is None:  # a new thread's rollout is found after its turn
            resumed = request.start_boundary is not None
            await sink.session(SessionInfo(thread, resumed=resumed, trace_path=str(path)))
        try:
            turn = await trio.to_thread.run_sync(
                functools.partial(
                    read_codex_turn,
                    path,
                    thread_id=thread,
                    text=request.text,
                    after=request.start_boundary,
                )
            )
        except (OSError, ValueError) as exc:
            return Reconciliation(None, f"the rollout is unreadable: {exc}", settled)
        proof = await self.prove_session(thread)
        return await conclude(request, sink, settled, turn, boundary=proof.last_message_id)

    async def close_session(self, session_id: str) -> SessionClosed:
        """``codex exec`` keeps no session on a server: nothing is released there, and the
        rollout is left alone (it is the user's); Braid only stops continuing the thread."""
        if not is_codex_thread_id(session_id):
            raise InvalidRequest("not a Codex thread id", details={"sessionId": session_id})
        return SessionClosed(
            session_id,
            released=False,
            detail="no server-side session; the rollout is left in place",
        )

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
