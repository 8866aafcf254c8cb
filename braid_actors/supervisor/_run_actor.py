"""One run actor: plan the session, commit the intent, drive the provider, enforce limits.

Theory of operation:

1. *Session.* Continue the branch's native session only when the provider can continue
   sessions, the run may reuse it, and the provider proves its session ends exactly at
   Braid's recorded boundary; otherwise a fresh session receives the portable context of
   the history before this turn (``handed_off``; ``new`` when there is no history).
2. *Intent.* ``run.dispatched`` carries the receipt digest of the exact request and is
   committed before the provider is called (a cancel that arrived before dispatch ends the
   run without calling anyone).
3. *Drive.* The provider runs under the run's wall-time limit and its own cancel scope;
   its reports go through the :class:`JournalSink`; its root process is observed on an
   interval (CPU, RSS of the tree, children become ``spawned`` workers).
4. *Limits.* After each usage report and each observation the effective limits (branch
   overrides over defaults) are checked; the first crossing closes the sink (that event was
   the last one accepted), stops the provider (its stop ladder), and the run ends with
   ``spend_limit_exceeded`` naming the dimension, the limit and the measured value.
5. *Cancel.* Two-party: the provider must acknowledge; an acknowledgement records
   ``cancelled``, a missing one ``unknown`` with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from braid_actors import graph
from braid_actors.errors import BraidError
from braid_actors.model import (
    Limits,
    Outcome,
    OutcomeKind,
    Part,
    ProviderBinding,
    SessionMode,
    TerminalState,
    Usage,
    Worker,
    WorkerExited,
    WorkerObserved,
    WorkerSpawned,
    WorkerSpend,
    WorkerStatus,
    converter,
    digest,
)
from braid_actors.providers import (
    ContextMessage,
    PortableContext,
    Provider,
    RunControl,
    SessionRequest,
    TurnRequest,
    TurnResult,
)
from braid_actors.supervisor._sink import JournalSink
from braid_actors.workers import Crossing, Measured, ProcessKey, effective_limits, first_crossing

if TYPE_CHECKING:
    from braid_actors.supervisor._runs import RunsSupervisor
    from braid_actors.workers import TreeSample

DEFAULT_WALL_SECONDS = 3600.0
PROOF_DEADLINE = 10.0

_ENDINGS: dict[str, tuple[TerminalState, OutcomeKind]] = {
    "completed": ("succeeded", "completed"),
    "failed": ("failed", "failed"),
    "cancelled": ("cancelled", "cancelled"),
}


class RunActor:
    """Owns one admitted run until it is terminal."""

    def __init__(self, sup: RunsSupervisor, run_id: str) -> None:
        self.sup = sup
        self.run_id = run_id
        self.control = RunControl()
        self.scope = trio.CancelScope()
        """Cancelled by shutdown: the provider stops its processes, the run ends."""
        self._stop = trio.CancelScope()
        """Cancelled when a limit is crossed: the provider is stopped through its ladder."""
        self.crossing: Crossing | None = None
        self.sink: JournalSink | None = None
        self._nursery: trio.Nursery | None = None
        self._children: dict[tuple[int, float], Worker] = {}
        self._sample: TreeSample | None = None
        self.limits: Limits = Limits()

    @property
    def state(self) -> graph.GraphState:
        return self.sup.state

    # ---- entry ---------------------------------------------------------------------------

    async def run(self) -> None:
        with self.scope:
            await self._drive()
        if self.scope.cancelled_caught and not graph.is_terminal(self._run().state):
            # Shutdown cancelled the provider, which stopped its process group before the
            # cancellation propagated: the worker is gone, so the run is cancelled.
            await self._record_worker_exits("killed")
            await self.finish("cancelled", Outcome("cancelled", "Braid shut down and stopped it"))

    def _run(self) -> Any:
        return self.state.runs[self.run_id]

    # ---- session and context -------------------------------------------------------------

    def _context(self, branch_id: str, before: list[str]) -> PortableContext:
        state = self.state
        messages = tuple(
            ContextMessage(mid, state.messages[mid].role, state.messages[mid].parts)
            for mid in before
        )
        complete = all(state.messages[mid].completeness.state == "complete" for mid in before)
        through = before[-1] if before else None
        source_conversation = state.branches[branch_id].conversation_id
        body: dict[str, Any] = {
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
        run = self._run()
        if (
            run.session_preference == "reuse"
            and binding is not None
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

    # ---- the run -------------------------------------------------------------------------

    async def _drive(self) -> None:
        state = self.state
        run = self._run()
        branch = state.branches[run.branch_id]
        conv = state.conversations[run.conversation_id]
        turn = state.turns[run.turn_id]
        self.limits = effective_limits(self.sup.default_limits, branch.overrides.limits)
        if self.control.cancel_requested.is_set():
            await self.finish("cancelled", Outcome("cancelled", "cancelled before dispatch"))
            return
        provider = self.sup.providers.get(run.runner)
        if provider is None or not provider.available():
            await self.finish("failed", Outcome("failed", f"runner {run.runner} is not available"))
            return
        history = graph.history(state, branch.branch_id)
        before = (
            history[: history.index(turn.user_message_id)]
            if turn.user_message_id in history
            else history
        )
        boundary = before[-1] if before else None
        mode, session = await self._plan_session(provider, branch.binding, boundary)
        context = None if mode == "continued" else self._context(branch.branch_id, before)
        user = state.messages[turn.user_message_id]
        text = "\n".join(p.text for p in user.parts if p.kind == "text")
        workspace = conv.workspace
        if branch.environment_id is not None:
            workspace = state.environments[branch.environment_id].workspace
        request_body: dict[str, Any] = {
            "runId": self.run_id,
            "turnId": run.turn_id,
            "runner": run.runner,
            "model": run.model,
            "workspace": workspace,
            "session": converter().unstructure(session),
            "contextDigest": context.digest if context else None,
            "inputDigest": digest(converter().unstructure(user.parts, tuple[Part, ...])),
            "limits": converter().unstructure(self.limits),
        }
        dispatched = graph.dispatch(
            state,
            run_id=self.run_id,
            receipt=digest(request_body),
            session_mode=mode,
            at=self.sup.clock(),
            ids=self.sup.ids,
        )
        await self.sup.record(dispatched)
        request = TurnRequest(
            run_id=self.run_id,
            turn_id=run.turn_id,
            workspace=Path(workspace),
            user_message_id=user.message_id,
            assistant_message_id=dispatched.assistant_message.message_id,
            text=text,
            session=session,
            context=context,
            model=run.model,
        )
        self.sink = JournalSink(
            self.sup, self.run_id, on_worker=self._watch_worker, on_usage=self._check_usage
        )
        result: TurnResult | None = None
        failure: str | None = None
        wall = self.limits.wall_seconds
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with self._stop, trio.move_on_after(wall or DEFAULT_WALL_SECONDS) as deadline:
                try:
                    result = await provider.run_turn(request, self.sink, self.control)
                except BraidError as exc:
                    failure = exc.message
            if deadline.cancelled_caught and self.crossing is None:
                if wall is not None:
                    self.crossing = Crossing("wall_seconds", wall, wall)
                else:
                    failure = f"the run exceeded Braid's {DEFAULT_WALL_SECONDS:g} s wall limit"
            nursery.cancel_scope.cancel()  # the observer
        self.sink.close()
        await self._end(result, failure)

    async def _end(self, result: TurnResult | None, failure: str | None) -> None:
        if self.crossing is not None:
            c = self.crossing
            await self._record_worker_exits("killed")
            await self.finish(
                "failed",
                Outcome(
                    "spend_limit_exceeded",
                    f"{c.dimension} limit {c.limit:g} crossed at {c.measured:g}",
                    c.dimension,
                    float(c.limit),
                    float(c.measured),
                ),
            )
            return
        if result is None:
            await self._record_worker_exits("exited")
            await self.finish("failed", Outcome("failed", failure or "the runner failed"))
            return
        if self.control.cancel_requested.is_set() and result.outcome != "completed":
            if result.cancel_acknowledged:
                await self._record_worker_exits("exited")
                await self.finish(
                    "cancelled",
                    Outcome("cancelled", self.control.reason),
                    result.usage,
                    result.cost_usd,
                )
            else:
                await self._record_worker_exits("killed")
                await self.finish(
                    "unknown",
                    Outcome(
                        "lost",
                        "the runner did not acknowledge the cancel"
                        + (f" ({result.reason})" if result.reason else ""),
                    ),
                    result.usage,
                    result.cost_usd,
                )
            return
        await self._record_worker_exits("exited")
        branch = self.state.branches[self._run().branch_id]
        binding = branch.binding
        if result.session_id is not None and result.outcome == "completed":
            binding = ProviderBinding(
                runner=self._run().runner,
                state="bound",
                session_id=result.session_id,
                boundary_message_id=result.session_boundary,
                session_digest=result.session_digest,
            )
        end, kind = _ENDINGS[result.outcome]
        await self.finish(end, Outcome(kind, result.reason), result.usage, result.cost_usd, binding)

    async def finish(
        self,
        end: TerminalState,
        outcome: Outcome,
        usage: Usage | None = None,
        cost_usd: float | None = None,
        binding: ProviderBinding | None = None,
    ) -> None:
        await self.sup.finish(self.run_id, end, outcome, usage, cost_usd, binding)

    # ---- workers and limits ----------------------------------------------------------------

    async def _watch_worker(self, worker: Worker) -> None:
        assert self._nursery is not None
        assert worker.pid is not None
        assert worker.create_time is not None
        from braid_actors.workers import observe_tree

        key = ProcessKey(worker.pid, worker.create_time)
        self._nursery.start_soon(
            lambda: observe_tree(key, interval=self.sup.observe_interval, on_sample=self._sampled)
        )

    async def _sampled(self, sample: TreeSample) -> None:
        sink = self.sink
        if sink is None or sink.closed or sink.root_worker is None:
            return
        self._sample = sample
        run = self._run()
        conv = run.conversation_id
        root = sink.root_worker
        at = self.sup.clock()
        for snap in sample.new:
            if snap.key.pid == root.pid:
                continue
            await self._child_spawned(snap, root, conv, at)
        for key in sample.exited:
            child = self._children.pop((key.pid, key.create_time), None)
            if child is not None:
                await self.sup.record_quietly(
                    WorkerExited(
                        conv,
                        self.run_id,
                        child.worker_id,
                        "exited",
                        None,
                        None,
                        f"proc:{key.pid}:{key.create_time:.2f}:exit",
                        at,
                    )
                )
        spend = WorkerSpend(
            cpu_seconds=sample.cpu_seconds,
            rss_bytes=sample.peak_rss_bytes,
            wall_seconds=sample.wall_seconds,
        )
        await self.sup.record(WorkerObserved(conv, self.run_id, root.worker_id, spend, at))
        self._check(self._measured())

    async def _child_spawned(self, snap: Any, root: Worker, conv: str, at: Any) -> None:
        run = self._run()
        if not run.children_complete:
            return
        parent = next((w for w in self._children.values() if w.pid == snap.ppid), root)
        child = Worker(
            worker_id=self.sup.ids("wrk"),
            run_id=self.run_id,
            status="running",
            parent_worker_id=parent.worker_id,
            pid=snap.key.pid,
            create_time=snap.key.create_time,
            pgid=snap.pgid,
            command=tuple(snap.argv or ())[:32],
        )
        edge = graph.make_edge(
            self.sup.ids,
            "spawned",
            parent.worker_id,
            child.worker_id,
            self.run_id,
            at,
            {"pid": snap.key.pid},
        )
        source = f"proc:{snap.key.pid}:{snap.key.create_time:.2f}:start"
        if await self.sup.record_quietly(WorkerSpawned(conv, self.run_id, child, edge, source, at)):
            self._children[(snap.key.pid, snap.key.create_time)] = child

    def _measured(self) -> Measured:
        run = self._run()
        sample = self._sample
        return Measured(
            input_tokens=run.usage.input_tokens,
            output_tokens=run.usage.output_tokens,
            cost_usd=run.cost_usd,
            wall_seconds=None if sample is None else sample.wall_seconds,
            cpu_seconds=None if sample is None else sample.cpu_seconds,
            rss_bytes=None if sample is None else sample.peak_rss_bytes,
        )

    async def _check_usage(self) -> None:
        self._check(self._measured())

    def _check(self, measured: Measured) -> None:
        if self.crossing is not None:
            return
        crossing = first_crossing(self.limits, measured)
        if crossing is not None:
            self.crossing = crossing
            assert self.sink is not None
            self.sink.close()
            self._stop.cancel()

    async def _record_worker_exits(self, how: WorkerStatus) -> None:
        """Every worker of the run still recorded as live is gone now: say so."""
        run = self._run()
        at = self.sup.clock()
        for worker_id in run.worker_ids:
            worker = self.state.workers[worker_id]
            if worker.status in ("exited", "killed", "lost"):
                continue
            status = how
            await self.sup.record_quietly(
                WorkerExited(
                    run.conversation_id,
                    self.run_id,
                    worker_id,
                    status,
                    None,
                    None,
                    f"proc:{worker.pid}:{worker.create_time or 0:.2f}:end",
                    at,
                )
            )
