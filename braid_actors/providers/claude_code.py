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

import functools
import os
import uuid
from pathlib import Path
from typing import Final

import attrs
import trio

from braid_actors.errors import InvalidRequest
from braid_actors.model import Usage
from braid_actors.providers._claude_record import read_claude_turn
from braid_actors.providers._claude_seed import CopyReport, Seed, plan_seed, write_records
from braid_actors.providers._claude_stream import (
    find_session_file,
    is_claude_session_id,
    last_cost_base,
    read_claude_session,
    session_file,
)
from braid_actors.providers._claude_turn import ClaudeTurn, failed
from braid_actors.providers._port import (
    Capabilities,
    ReconcileRequest,
    Reconciliation,
    RunControl,
    RunSink,
    SessionClosed,
    SessionProof,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.providers._reconcile import conclude, find_strays, settle_workers
from braid_actors.workers import StopPolicy, open_worker

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
    reconcile_wait: float = 60.0
    """After a restart, for an orphaned CLI to finish its turn by itself before it is
    stopped (with its stdin closed it still completes the turn, then exits)."""


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
            if request.session.fork:
                argv.append("--fork-session")
        return argv

    async def run_turn(
        self, request: TurnRequest, sink: RunSink, control: RunControl | None = None
    ) -> TurnResult:
        """Run one turn in a new CLI process (see the module note)."""
        refusal = await self._check_session(request)
        if refusal is not None:
            return failed(refusal, Usage(), None, request.session.session_id)
        seed_id, seed = await self._seed(request)
        resumed = request.session.session_id
        source = None if resumed is None else find_session_file(self.config_dir, resumed)
        base = None if source is None else await trio.to_thread.run_sync(last_cost_base, source)
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
            turn = ClaudeTurn(
                self,
                worker,
                request,
                sink,
                control,
                seeded=seed_id,
                lead=seed.lead,
                seed=seed,
                cost_base=base,
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

    def strays(self) -> list[WorkerInfo]:
        """Live processes of this runner (its ``HOME``), journaled or not; see
        :func:`._reconcile.find_strays`."""
        return find_strays(self.home)

    async def reconcile(self, request: ReconcileRequest, sink: RunSink) -> Reconciliation:
        """After a restart: let an orphaned CLI finish (bounded), stop it, read its record.

        Claude Code outlives Braid: with its stdin closed and its output pipe broken it
        still completes the turn, writes it to its session file and exits, so it is given
        ``timeouts.reconcile_wait`` (a permission request can never be answered any more,
        which the bound covers; a cancelled run gets no wait), then stopped through the
        ladder. The session file then decides (:mod:`._claude_record`).
        """
        timeouts = self.timeouts
        settled = await settle_workers(
            request.workers,
            # A cancel journaled before the crash: no reason to let the turn go on.
            wait=0.0 if request.cancel_requested else timeouts.reconcile_wait,
            policy=StopPolicy(
                grace=0.0, term_grace=timeouts.term_grace, kill_grace=timeouts.kill_grace
            ),
        )
        session = request.session_id
        path = None if session is None else find_session_file(self.config_dir, session)
        if session is None or path is None:
            missing = "no session was reported" if session is None else "no transcript found"
            return Reconciliation(None, f"after the restart {missing} ({settled})", settled)
        try:
            turn = await trio.to_thread.run_sync(
                functools.partial(
                    read_claude_turn, path, text=request.text, after=request.start_boundary
                )
            )
        except (OSError, ValueError) as exc:
            return Reconciliation(None, f"the transcript is unreadable: {exc}", settled)
        proof = await self.prove_session(session)
        return await conclude(request, sink, settled, turn, boundary=proof.last_message_id)

    async def close_session(self, session_id: str) -> SessionClosed:
        """Claude Code keeps no session on a server: nothing is released there, and its
        session file is left alone (it is the user's); Braid only stops continuing it."""
        if not is_claude_session_id(session_id):
            raise InvalidRequest("not a Claude Code session id", details={"sessionId": session_id})
        return SessionClosed(
            session_id,
            released=False,
            detail="no server-side session; the session file is left in place",
        )

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
