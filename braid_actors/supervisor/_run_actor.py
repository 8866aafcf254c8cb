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
from typing import TYPE_CHECKING, cast

import attrs
import trio

from braid_actors import graph
from braid_actors._faults import crash_point
from braid_actors.errors import BraidError
from braid_actors.model import (
    Limits,
    Outcome,
    OutcomeKind,
    ProviderBinding,
    Run,
    SessionMode,
    TerminalState,
    Usage,
    Worker,
    WorkerExited,
    WorkerObserved,
    WorkerSpend,
    WorkerStatus,
)
from braid_actors.providers import (
    InteractionAnswer,
    Provider,
    Reattachable,
    RunControl,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.supervisor._children import ChildWorkers
from braid_actors.supervisor._planning import prepare_request
from braid_actors.supervisor._reconcile_cli import reconcile_native
from braid_actors.supervisor._sink import JournalSink, PendingInteraction
from braid_actors.supervisor._spend_log import SpendLog
from braid_actors.workers import (
    Crossing,
    Measured,
    ProcessInfo,
    ProcessKey,
    effective_limits,
    find_local_workers,
    first_crossing,
    recognise,
)
from braid_actors.workers import kill as kill_process

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.model import Event
    from braid_actors.supervisor._runs import RunsSupervisor
    from braid_actors.workers import TreeSample, Watch

DEFAULT_WALL_SECONDS = 3600.0
RESUME_GRACE = 5.0
PROOF_DEADLINE = 10.0

_ENDINGS: dict[str, tuple[TerminalState, OutcomeKind]] = {
    "completed": ("succeeded", "completed"),
    "failed": ("failed", "failed"),
    "cancelled": ("cancelled", "cancelled"),
}


class RunActor:
    """Owns one admitted run until it is terminal."""

    def __init__(self, sup: RunsSupervisor, run_id: str, *, resume: bool = False) -> None:
        self.sup = sup
        self.run_id = run_id
        self.resume = resume
        """Started by reconciliation: the previous supervisor already dispatched this run."""
        self.gone = False
        """Set when a re-attached worker turned out gone without reporting its end."""
        self.control = RunControl(pipes=sup.pipes)
        self.scope = trio.CancelScope()
        """Cancelled by shutdown: the provider stops its processes, the run ends."""
        self._stop = trio.CancelScope()
        """Cancelled when a limit is crossed: the provider is stopped through its ladder."""
        self.crossing: Crossing | None = None
        self.sink: JournalSink | None = None
        self._nursery: trio.Nursery | None = None
        self.children = ChildWorkers(sup, run_id)
        self._spend: WorkerSpend | None = None
        """The last sample's figures (not the sample: that holds every process's details)."""
        self._spend_log = SpendLog()
        self._watches: list[Watch] = []
        self.limits: Limits = Limits()

    @property
    def state(self) -> graph.GraphState:
        return self.sup.state

    # ---- entry ---------------------------------------------------------------------------

    async def run(self) -> None:
        with self.scope:
            await (self._resume() if self.resume else self._drive())
        if self.scope.cancelled_caught and not graph.is_terminal(self._run().state):
            # Shutdown cancelled the provider, which stopped its process group before the
            # cancellation propagated: the worker is gone, so the run is cancelled.
            await self._record_worker_exits("killed")
            await self.finish("cancelled", Outcome("cancelled", "Braid shut down and stopped it"))

    def _run(self) -> Run:
        return self.state.runs[self.run_id]

    async def _prepare(self, provider: Provider) -> tuple[TurnRequest, SessionMode, str]:
        return await prepare_request(self.state, self.run_id, self.limits, provider)

    def _context_source(self, request: TurnRequest) -> str | None:
        """The run whose reply ends the copied context (else the branch), for the edge."""
        context = request.context
        if context is None or context.through_message_id is None:
            return None
        through = self.state.messages[context.through_message_id]
        return through.source_run_id or self._run().branch_id

    def _provider(self) -> Provider | None:
        provider = self.sup.providers.get(self._run().runner)
        return provider if provider is not None and provider.available() else None

    async def _drive(self) -> None:
        run = self._run()
        self.limits = effective_limits(
            self.sup.default_limits, self.state.branches[run.branch_id].overrides.limits
        )
        if self.control.cancel_requested.is_set():
            await self.finish("cancelled", Outcome("cancelled", "cancelled before dispatch"))
            return
        provider = self._provider()
        if provider is None:
            await self.finish("failed", Outcome("failed", f"runner {run.runner} is not available"))
            return
        request, mode, receipt = await self._prepare(provider)
        dispatched = graph.dispatch(
            self.state,
            run_id=self.run_id,
            receipt=receipt,
            session_mode=mode,
            at=self.sup.clock(),
            ids=self.sup.ids,
            handed_from=self._context_source(request),
        )
        await self.sup.record(dispatched)
        crash_point("run.dispatched")
        request = attrs.evolve(
            request, assistant_message_id=dispatched.assistant_message.message_id
        )
        await self._execute(lambda sink: provider.run_turn(request, sink, self.control))

    def _root(self) -> Worker | None:
        ids = self._run().worker_ids
        return self.state.workers[ids[0]] if ids else None

    async def _resume(self) -> None:
        """Reconcile a run the previous supervisor dispatched (see the reconcile module)."""
        run = self._run()
        self.limits = effective_limits(
            self.sup.default_limits, self.state.branches[run.branch_id].overrides.limits
        )
        found = self._provider()
        if run.state == "cancelling":
            # The cancel was journaled before the crash; the provider may never have heard.
            self.control.request_cancel(run.cancel_reason or "cancelled by the user")
        if found is None or not _reattachable(found):
            # Its worker can't be followed again: the provider settles it and its own
            # session record decides (see the _reconcile_cli module).
            await reconcile_native(self, found)
            return
        provider = cast("Reattachable", found)
        root = self._root()
        if not provider.spool_started(self.run_id):
            await self._redispatch(found, root)
            return
        root_info = await self._find_root(found, root)
        binding = self.state.branches[run.branch_id].binding
        requested = (
            binding.session_id if run.session_mode == "continued" and binding is not None else None
        )
        request = TurnRequest(
            run_id=self.run_id,
            turn_id=run.turn_id,
            workspace=Path("/"),
            user_message_id=self.state.turns[run.turn_id].user_message_id,
            assistant_message_id=run.assistant_message_id or "",
            text="",
            session=SessionRequest(session_id=requested),
        )
        answers = {
            i.interaction_id: (
                None
                if i.state == "pending"
                else InteractionAnswer(bool((i.answer or {}).get("allow")), None)
            )
            for i in run.interactions
            if i.state in ("pending", "answered")
        }

        async def call(sink: JournalSink) -> TurnResult:
            result, done = await provider.reattach(
                request,
                root_info,
                skip=run.provider_cursor,
                answers=answers,
                await_pending=lambda iid: self._await_pending(iid, root_info),
                sink=sink,
                control=self.control,
            )
            self.gone = not done
            return result

        await self._execute(call, resumed=True)

    async def _redispatch(self, provider: Provider, root: Worker | None) -> None:
        """The intent was committed but the turn never began: send the same request once."""
        for info in find_local_workers_for(provider, self.run_id):
            await kill_process(info)
        if root is not None and root.status not in ("exited", "killed", "lost"):
            await self.sup.record_quietly(
                WorkerExited(
                    self._run().conversation_id,
                    self.run_id,
                    root.worker_id,
                    "killed",
                    None,
                    None,
                    f"proc:{root.pid}:{root.create_time or 0:.2f}:end",
                    self.sup.clock(),
                )
            )
        if self.control.cancel_requested.is_set():
            await self.finish("cancelled", Outcome("cancelled", "cancelled before it began"))
            return
        request, mode, receipt = await self._prepare(provider)
        run = self._run()
        if receipt != run.receipt or mode != run.session_mode:
            await self.finish(
                "unknown",
                Outcome(
                    "lost",
                    "after the restart the dispatch could not be repeated exactly (its request "
                    "changed), so nothing was sent again",
                ),
            )
            return
        request = attrs.evolve(request, assistant_message_id=run.assistant_message_id or "")
        await self._execute(lambda sink: provider.run_turn(request, sink, self.control))

    async def _find_root(self, provider: Provider, root: Worker | None) -> WorkerInfo:
        if root is not None and root.pid is not None and root.create_time is not None:
            return WorkerInfo(root.pid, root.create_time, root.pgid or root.pid, root.command)
        # Started but never recorded: recognise it by its command line, or accept it is gone.
        found = find_local_workers_for(provider, self.run_id)
        if found:
            return WorkerInfo.of(found[0])
        return WorkerInfo(0, 0.0, 0, ())

    async def _await_pending(self, interaction_id: str, root: WorkerInfo) -> InteractionAnswer:
        """A pending interaction becomes answerable only once its worker is proven alive."""
        if not recognise(root.pid, root.create_time, root.pgid):
            return InteractionAnswer(False, "the worker is gone")
        pending = PendingInteraction(self.run_id)
        self.sup.pending[interaction_id] = pending
        try:
            await pending.done.wait()
        finally:
            self.sup.pending.pop(interaction_id, None)
        assert pending.answer is not None
        return pending.answer

    async def _adopt_root(self) -> None:
        """Re-adopt a recorded root worker that is still running: observe it again."""
        assert self.sink is not None
        root = self._root()
        if root is None or root.pid is None or root.create_time is None:
            return
        if not recognise(root.pid, root.create_time, root.pgid or root.pid):
            return
        self.sink.root_worker = root
        await self._watch_worker(root)

    async def _execute(
        self, call: Callable[[JournalSink], Awaitable[TurnResult]], *, resumed: bool = False
    ) -> None:
        """Run the provider call under the limits and the observer, then record the end."""
        self.sink = JournalSink(
            self.sup, self.run_id, on_worker=self._watch_worker, on_usage=self._check_usage
        )
        result: TurnResult | None = None
        failure: str | None = None
        wall = self.limits.wall_seconds
        budget = wall or DEFAULT_WALL_SECONDS
        started = self._run().started_at
        if started is not None:
            budget = max(0.0, budget - (self.sup.clock() - started).total_seconds())
        if resumed:
            # What a worker spooled while Braid was down is read whatever the clock says.
            budget = max(budget, RESUME_GRACE)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if resumed:
                await self._adopt_root()
            with self._stop, trio.move_on_after(budget) as deadline:
                try:
                    result = await call(self.sink)
                    await self.sink.settle()  # its last part updates are committed
                except BraidError as exc:
                    result, failure = None, exc.message
            if deadline.cancelled_caught and self.crossing is None:
                if wall is not None:
                    self.crossing = Crossing("wall_seconds", wall, wall)
                else:
                    failure = f"the run exceeded Braid's {DEFAULT_WALL_SECONDS:g} s wall limit"
            self.stop_watching()
            nursery.cancel_scope.cancel()  # a sample being handled
        self.sink.close()
        await self._end(result, failure)

    async def _end(self, result: TurnResult | None, failure: str | None) -> None:
        if self.gone and self.crossing is None:
            await self._record_worker_exits("lost")
            await self.finish(
                "unknown",
                Outcome("lost", "the worker is gone and did not report how the turn ended"),
            )
            return
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
                await self._record_worker_exits("exited", result.worker_log)
                await self.finish(
                    "cancelled",
                    Outcome("cancelled", self.control.reason),
                    result.usage,
                    result.cost_usd,
                )
            else:
                await self._record_worker_exits("killed", result.worker_log)
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
        await self._record_worker_exits("exited", result.worker_log)
        branch = self.state.branches[self._run().branch_id]
        binding = branch.binding
        if result.session_id is not None and result.outcome == "completed":
            binding = ProviderBinding(
                runner=self._run().runner,
                state="bound",
                session_id=result.session_id,
                # Braid's boundary is this run's reply; the runner's proof is its own id.
                boundary_message_id=self._run().assistant_message_id,
                native_boundary=result.session_boundary,
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
        trace_ref = await self.sup.ingest_evidence(self.run_id)
        await self.sup.finish(self.run_id, end, outcome, usage, cost_usd, binding, trace_ref)

    # ---- workers and limits ----------------------------------------------------------------

    def stop_watching(self) -> None:
        """No more samples of this run's workers (one being handled ends with the nursery)."""
        for watch in self._watches:
            watch.close()
        self._watches.clear()

    async def _watch_worker(self, worker: Worker) -> None:
        assert self._nursery is not None
        assert worker.pid is not None
        assert worker.create_time is not None
        key = ProcessKey(worker.pid, worker.create_time)
        # The supervisor's one observer samples it; the samples are handled in this run's
        # nursery, so they end with the run. Children a previous supervisor recorded are
        # members from the start, also those that left the tree while nobody looked.
        self._watches.append(
            self.sup.hub.watch(
                key,
                self._sampled,
                self._nursery,
                on_repeat=self._repeated,
                adopt=self.children.live_keys(),
            )
        )

    async def _sampled(self, sample: TreeSample) -> None:
        sink = self.sink
        if sink is None or sink.closed or sink.root_worker is None:
            return
        self._spend = spend = _spend_of(sample)
        await self.children.sampled(sample, sink.root_worker, self.sup.clock())
        if self._spend_log.due(spend):
            await self._journal_spend(self.sup.record)
        self._check(self._measured())

    def _repeated(self, sample: TreeSample) -> bool:
        """:meth:`_sampled` of a sample that repeats the previous one, done at once unless
        its figures are due in the journal (False: the sample goes to :meth:`_sampled`)."""
        sink = self.sink
        if sink is None or sink.closed or sink.root_worker is None:
            return True
        spend = _spend_of(sample)
        if self._spend_log.due(spend):
            return False
        self._spend = spend
        self._check(self._measured())
        return True

    async def _journal_spend(self, record: Callable[[Event], Awaitable[object]]) -> None:
        """Journal the last sample's figures as the root worker's ``worker.observed``."""
        sink, spend = self.sink, self._spend
        if sink is None or sink.root_worker is None or spend is None:
            return
        run = self._run()
        await record(
            WorkerObserved(
                run.conversation_id,
                self.run_id,
                sink.root_worker.worker_id,
                spend,
                self.sup.clock(),
            )
        )
        self._spend_log.journaled(spend)

    def _measured(self) -> Measured:
        run = self._run()
        spend = self._spend
        return Measured(
            input_tokens=run.usage.input_tokens,
            output_tokens=run.usage.output_tokens,
            cost_usd=run.cost_usd,
            wall_seconds=None if spend is None else spend.wall_seconds,
            cpu_seconds=None if spend is None else spend.cpu_seconds,
            rss_bytes=None if spend is None else spend.rss_bytes,
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

    async def _record_worker_exits(self, how: WorkerStatus, log: str | None = None) -> None:
        """Every worker of the run still recorded as live is gone now: say so (the root
        worker's bounded, redacted stderr is kept as its log artifact)."""
        if self._spend_log.behind(self._spend):
            await self._journal_spend(self.sup.record_quietly)  # the figures they ended with
        run = self._run()
        at = self.sup.clock()
        log_ref = await self.sup.keep_log(log) if log else None
        for worker_id in run.worker_ids:
            worker = self.state.workers[worker_id]
            if worker.status in ("exited", "killed", "lost"):
                continue
            status = how
            last = worker.control_history[-1] if worker.control_history else None
            if last is not None and last.action == "kill" and last.result == "requested":
                # A kill is in flight (its result not journaled yet): this end is its
                # effect, whichever of the two records commits first.
                status = "killed"
            await self.sup.record_quietly(
                WorkerExited(
                    run.conversation_id,
                    self.run_id,
                    worker_id,
                    status,
                    None,
                    log_ref if worker.parent_worker_id is None else None,
                    f"proc:{worker.pid}:{worker.create_time or 0:.2f}:end",
                    at,
                )
            )


_REATTACHABLE: dict[type, bool] = {}


def _reattachable(provider: Provider) -> bool:
    """Whether ``provider`` is :class:`Reattachable`, asked once per class: a runtime
    protocol check reads every member, and a restart asks for every run."""
    cls = type(provider)
    known = _REATTACHABLE.get(cls)
    if known is None:
        known = _REATTACHABLE[cls] = isinstance(provider, Reattachable)
    return known


def find_local_workers_for(provider: Provider, run_id: str) -> list[ProcessInfo]:
    """Live local workers of ``run_id`` (found by command line), for a spooling provider."""
    spools = getattr(provider, "spools", None)
    if spools is None:
        return []
    return find_local_workers(spools).get(run_id, [])


def _spend_of(sample: TreeSample) -> WorkerSpend:
    """A run's worker figures from its tree's sample."""
    return WorkerSpend(
        cpu_seconds=sample.cpu_seconds,
        rss_bytes=sample.peak_rss_bytes,
        wall_seconds=sample.wall_seconds,
    )
