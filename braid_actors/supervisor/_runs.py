"""The runs supervisor: admits queued runs and drives one run actor per admitted run.

Theory of operation: after every journal commit the supervisor is woken; it asks the pure
graph which queue heads may be admitted (one active run per branch, a global admission
limit, oldest first) and commits a ``run.admitted`` event for each. Each admitted run gets
its own task (its own cancel scope) in the supervisor's nursery. A run actor:

1. decides the session: continue the branch's native session only when the provider can
   continue sessions *and* proves its session ends exactly at Braid's recorded boundary;
   otherwise a fresh session receives the branch's portable context;
2. commits ``run.dispatched`` (the intent: receipt digest of the exact request) before the
   provider is called;
3. runs the provider with a wall-time deadline; every observation goes through the
   :class:`JournalSink`, which returns only when that observation is durable;
4. commits ``run.finished`` with the outcome and the branch's new provider binding.

Cancelling a run's scope (shutdown) makes the provider stop its processes; the actor then
records ``cancelled`` only because the provider confirmed its process is gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import trio

from braid_actors import graph
from braid_actors.errors import BraidError, InteractionNotPending, UnknownInteraction
from braid_actors.journal import (
    GraphAdmission,
    JournalHandle,
    event_to_record,
)
from braid_actors.model import (
    Event,
    IdSource,
    Interaction,
    Outcome,
    OutcomeKind,
    Part,
    ProviderBinding,
    RunDispatched,
    RunFinished,
    RunInteractionAnswered,
    RunInteractionRequested,
    RunPartUpdated,
    RunSessionReported,
    RunUsageReported,
    RunWorkerStarted,
    SessionMode,
    TerminalState,
    Usage,
    Worker,
    converter,
    digest,
)
from braid_actors.providers import (
    ContextMessage,
    InteractionAnswer,
    InteractionRequest,
    PortableContext,
    Provider,
    SessionInfo,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)

DEFAULT_WALL_SECONDS = 3600.0
PROOF_DEADLINE = 10.0
RECORD_DEADLINE = 30.0

Clock = Callable[[], datetime]

_ENDINGS: dict[str, tuple[TerminalState, OutcomeKind]] = {
    "completed": ("succeeded", "completed"),
    "failed": ("failed", "failed"),
    "cancelled": ("cancelled", "cancelled"),
}


def utc_now() -> datetime:
    return datetime.now(UTC)


async def commit(journal: JournalHandle, event: Event) -> int:
    """Append one graph event and wait until it is durable; returns its sequence."""
    result = await journal.append([event_to_record(event)])
    return result.records[-1].seq


@attrs.define(eq=False)
class _PendingInteraction:
    run_id: str
    answer: InteractionAnswer | None = None
    done: trio.Event = attrs.Factory(trio.Event)


class JournalSink:
    """A provider's reporting channel for one run: every call returns once durable."""

    def __init__(self, sup: RunsSupervisor, run_id: str) -> None:
        self._sup = sup
        self._run_id = run_id
        run = sup.state.runs[run_id]
        self._conv = run.conversation_id
        self._message_id = run.assistant_message_id or ""
        self.session_info: SessionInfo | None = None

    async def worker_started(self, worker: WorkerInfo) -> None:
        record = Worker(
            worker_id=self._sup.ids("wrk"), run_id=self._run_id, status="running", pid=worker.pid
        )
        await self._sup.record(
            RunWorkerStarted(
                self._conv,
                self._run_id,
                record,
                worker.create_time,
                worker.pgid,
                worker.command,
                self._sup.clock(),
            )
        )

    async def session(self, info: SessionInfo) -> None:
        self.session_info = info
        await self._sup.record(
            RunSessionReported(
                self._conv,
                self._run_id,
                info.session_id,
                info.resumed,
                info.trace_path,
                self._sup.clock(),
            )
        )

    async def part(self, part: Part) -> None:
        await self._sup.record(
            RunPartUpdated(self._conv, self._run_id, self._message_id, part, self._sup.clock())
        )

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        pending = _PendingInteraction(self._run_id)
        self._sup.pending[request.interaction_id] = pending
        try:
            await self._sup.record(
                RunInteractionRequested(
                    self._conv,
                    self._run_id,
                    Interaction(
                        request.interaction_id,
                        request.kind,
                        dict(request.subject),
                        "pending",
                        self._sup.clock(),
                    ),
                    self._sup.clock(),
                )
            )
            await pending.done.wait()
            assert pending.answer is not None
            return pending.answer
        finally:
            self._sup.pending.pop(request.interaction_id, None)

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        await self._sup.record(
            RunUsageReported(self._conv, self._run_id, usage, cost_usd, self._sup.clock())
        )


class RunsSupervisor:
    """Owns the run actors; see the module docstring."""

    def __init__(
        self,
        journal: JournalHandle,
        admission: GraphAdmission,
        providers: Mapping[str, Provider],
        *,
        admission_limit: int | None = None,
        ids: IdSource,
        clock: Clock = utc_now,
    ) -> None:
        self.journal = journal
        self.admission = admission
        self.providers = dict(providers)
        self.admission_limit = admission_limit
        self.ids = ids
        self.clock = clock
        self.pending: dict[str, _PendingInteraction] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[str, trio.CancelScope] = {}
        self._accepting = True
        self._idle = trio.Event()
        admission.listeners.append(lambda _records: self._wake.set())

    @property
    def state(self) -> graph.GraphState:
        return self.admission.read

    async def record(self, event: Event) -> int:
        """Commit a run event; a shutdown in progress does not interrupt the record."""
        with trio.CancelScope(shield=True):
            with trio.fail_after(RECORD_DEADLINE):
                seq = await commit(self.journal, event)
        return seq

    # ---- lifecycle -----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[RunsSupervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            while True:
                self._wake = trio.Event()
                if self._accepting:
                    await self._admit_ready()
                await self._wake.wait()

    def active_runs(self) -> list[str]:
        return list(self._scopes)

    async def stop(self, *, drain: bool, grace: float) -> None:
        """Stop admitting; let active runs finish within ``grace`` (drain), then cancel."""
        self._accepting = False
        if drain:
            with trio.move_on_after(grace):
                await self._wait_idle()
        for scope in list(self._scopes.values()):
            scope.cancel()
        with trio.move_on_after(grace + RECORD_DEADLINE):
            await self._wait_idle()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _wait_idle(self) -> None:
        while self._scopes:
            self._idle = trio.Event()
            await self._idle.wait()

    async def _admit_ready(self) -> None:
        limit = None
        if self.admission_limit is not None:
            limit = self.admission_limit - len(self.state.active)
        for admitted in graph.next_admissions(self.state, at=self.clock(), limit=limit):
            run = self.state.runs[admitted.run_id]
            if run.state != "queued":
                continue
            await commit(self.journal, admitted)
            assert self._nursery is not None
            scope = trio.CancelScope()
            self._scopes[run.run_id] = scope
            self._nursery.start_soon(self._run_actor, run.run_id, scope)

    # ---- interactions --------------------------------------------------------------------

    async def answer(
        self, run_id: str, interaction_id: str, answer: InteractionAnswer, operation_id: str
    ) -> None:
        """Commit the answer, then hand it to the waiting provider."""
        pending = self.pending.get(interaction_id)
        run = self.state.runs[run_id]
        known = [i for i in run.interactions if i.interaction_id == interaction_id]
        if not known:
            raise UnknownInteraction(
                f"run {run_id} has no interaction {interaction_id}",
                details={"interactionId": interaction_id},
            )
        if known[0].state != "pending" or pending is None or pending.run_id != run_id:
            raise InteractionNotPending(
                f"interaction {interaction_id} is not waiting for an answer",
                details={"interactionId": interaction_id, "state": known[0].state},
            )
        await commit(
            self.journal,
            RunInteractionAnswered(
                run.conversation_id,
                run_id,
                interaction_id,
                {"allow": answer.allow, **({"message": answer.message} if answer.message else {})},
                operation_id,
                self.clock(),
            ),
        )
        pending.answer = answer
        pending.done.set()

    # ---- one run -------------------------------------------------------------------------

    async def _run_actor(self, run_id: str, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self._drive(run_id)
            if scope.cancelled_caught and not graph.is_terminal(self.state.runs[run_id].state):
                await self._finish(run_id, "cancelled", Outcome("cancelled", "shutdown"), None)
        finally:
            self._scopes.pop(run_id, None)
            self._idle.set()
            self._wake.set()

    def _context(self, branch_id: str, through: str | None) -> PortableContext:
        state = self.state
        ids = graph.history(state, branch_id)
        ids = ids[: ids.index(through) + 1] if through is not None else []
        messages = tuple(
            ContextMessage(mid, state.messages[mid].role, state.messages[mid].parts) for mid in ids
        )
        complete = all(state.messages[mid].completeness.state == "complete" for mid in ids)
        source_conversation = state.branches[branch_id].conversation_id
        body = {
            "sourceConversationId": source_conversation,
            "sourceBranchId": branch_id,
            "throughMessageId": through,
            "messages": [converter().unstructure(m) for m in messages],
            "complete": complete,
        }
        return PortableContext(
            source_conversation, branch_id, through, messages, complete, digest(body)
        )

    async def _plan_session(
        self, provider: Provider, binding: ProviderBinding | None, boundary: str | None
    ) -> tuple[SessionMode, SessionRequest]:
        if (
            binding is not None
            and binding.state == "bound"
            and binding.session_id is not None
            and binding.runner == provider.name
            and provider.capabilities.sessions_continue
            and binding.boundary_message_id == boundary
        ):
            with trio.move_on_after(PROOF_DEADLINE):
                proof = await provider.prove_session(binding.session_id)
                if (
                    proof.available
                    and proof.last_message_id == binding.boundary_message_id
                    and (binding.session_digest is None or proof.digest == binding.session_digest)
                ):
                    return "continued", SessionRequest(
                        binding.session_id, binding.boundary_message_id, binding.session_digest
                    )
        # No proof, a mismatch, or nothing to continue: a fresh session with copied context.
        return ("new" if boundary is None else "handed_off"), SessionRequest()

    async def _drive(self, run_id: str) -> None:
        state = self.state
        run = state.runs[run_id]
        branch = state.branches[run.branch_id]
        conv = state.conversations[run.conversation_id]
        turn = state.turns[run.turn_id]
        provider = self.providers.get(run.runner)
        if provider is None or not provider.available():
            await self._finish(
                run_id, "failed", Outcome("failed", f"runner {run.runner} is not available"), None
            )
            return
        history = graph.history(state, branch.branch_id)
        boundary = history[-1] if history else None
        mode, session = await self._plan_session(provider, branch.binding, boundary)
        context = None if mode == "continued" else self._context(branch.branch_id, boundary)
        user = state.messages[turn.user_message_id]
        text = "\n".join(p.text for p in user.parts if p.kind == "text")
        workspace = conv.workspace
        if branch.environment_id is not None:
            workspace = state.environments[branch.environment_id].workspace
        request_body: dict[str, Any] = {
            "runId": run_id,
            "turnId": run.turn_id,
            "runner": run.runner,
            "model": run.model,
            "workspace": workspace,
            "session": converter().unstructure(session),
            "contextDigest": context.digest if context else None,
            "inputDigest": digest(converter().unstructure(user.parts, tuple[Part, ...])),
        }
        receipt = digest(request_body)
        dispatched: RunDispatched = graph.dispatch(
            state, run_id=run_id, receipt=receipt, session_mode=mode, at=self.clock(), ids=self.ids
        )
        await self.record(dispatched)
        request = TurnRequest(
            run_id=run_id,
            turn_id=run.turn_id,
            workspace=Path(workspace),
            user_message_id=user.message_id,
            assistant_message_id=dispatched.assistant_message.message_id,
            text=text,
            session=session,
            context=context,
            model=run.model,
        )
        sink = JournalSink(self, run_id)
        wall = branch.overrides.limits.wall_seconds or DEFAULT_WALL_SECONDS
        result: TurnResult | None = None
        reason = None
        with trio.move_on_after(wall) as deadline:
            try:
                result = await provider.run_turn(request, sink)
            except BraidError as exc:
                reason = exc.message
        if result is None:
            if deadline.cancelled_caught:
                await self._finish(
                    run_id,
                    "failed",
                    Outcome(
                        "spend_limit_exceeded",
                        "wall time limit reached",
                        "wall_seconds",
                        wall,
                        wall,
                    ),
                    None,
                )
            else:
                await self._finish(run_id, "failed", Outcome("failed", reason), None)
            return
        binding = branch.binding
        if result.session_id is not None and result.outcome == "completed":
            binding = ProviderBinding(
                runner=provider.name,
                state="bound",
                session_id=result.session_id,
                boundary_message_id=result.session_boundary,
                session_digest=result.session_digest,
            )
        end, kind = _ENDINGS[result.outcome]
        await self._finish(
            run_id, end, Outcome(kind, result.reason), binding, result.usage, result.cost_usd
        )

    async def _finish(
        self,
        run_id: str,
        end: TerminalState,
        outcome: Outcome,
        binding: ProviderBinding | None,
        usage: Usage | None = None,
        cost_usd: float | None = None,
    ) -> None:
        run = self.state.runs[run_id]
        if graph.is_terminal(run.state):
            return
        if usage is None:
            usage = run.usage
            cost_usd = run.cost_usd
        if math.isnan(cost_usd or 0.0):
            cost_usd = None
        await self.record(
            RunFinished(
                run.conversation_id, run_id, end, outcome, usage, cost_usd, binding, self.clock()
            )
        )
