"""The runs supervisor: admits queued runs and owns one run actor per admitted run.

Theory of operation: after every journal commit the supervisor is woken; it asks the pure
graph which queue heads may be admitted (one active run per branch, a global admission
limit, oldest first) and commits ``run.admitted`` for each, then starts a
:class:`RunActor` for it in its own nursery, each with its own cancel scope. A failed run
is never restarted: it ends in a truthful terminal state and may be retried explicitly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from braid_actors import graph
from braid_actors._faults import crash_point
from braid_actors.errors import (
    BraidError,
    InteractionNotPending,
    UnknownInteraction,
)
from braid_actors.evidence import EvidenceStore, ProcessObservation, Redactor
from braid_actors.journal import Operation, event_to_record
from braid_actors.model import (
    TERMINAL_WORKER_STATES,
    Event,
    IdSource,
    Limits,
    Outcome,
    ProviderBinding,
    RunFinished,
    RunInteractionAnswered,
    TerminalState,
    Usage,
    digest_bytes,
)
from braid_actors.providers import InteractionAnswer, Provider
from braid_actors.supervisor._reconcile_cli import stop_strays
from braid_actors.supervisor._run_actor import RunActor
from braid_actors.supervisor._sink import recorded_seq
from braid_actors.workers import (
    ObservationHub,
    PipeHub,
    adopt,
    find_local_workers,
    pipe_hub_supported,
)
from braid_actors.workers import kill as kill_process

if TYPE_CHECKING:
    from collections.abc import Sequence

    from braid_actors.journal import CommittedRecord, GraphAdmission, JournalHandle, Request
    from braid_actors.supervisor._sink import PendingInteraction

_log = logging.getLogger("braid.supervisor")

_ADMISSION_TRIGGERS = frozenset({"turn.submitted", "run.retried", "run.finished"})

RECORD_DEADLINE = 30.0
EVIDENCE_DEADLINE = 30.0
DEFAULT_OBSERVE_INTERVAL = 0.5

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


async def commit(journal: JournalHandle, event: Event) -> int:
    """Append one graph event and wait until it is durable; returns its sequence."""
    result = await journal.append([event_to_record(event)])
    return result.records[-1].seq


class RunsSupervisor:
    """Owns the run actors; see the module docstring."""

    def __init__(
        self,
        journal: JournalHandle,
        admission: GraphAdmission,
        providers: Mapping[str, Provider],
        *,
        admission_limit: int | None = None,
        default_limits: Limits | None = None,
        observe_interval: float = DEFAULT_OBSERVE_INTERVAL,
        artifacts_dir: Path | None = None,
        evidence: EvidenceStore | None = None,
        ids: IdSource,
        clock: Clock = utc_now,
    ) -> None:
        if journal.answer_within is None:
            raise ValueError("a runs supervisor needs a journal with an answer deadline")
        self.journal = journal
        self.admission = admission
        self.providers = dict(providers)
        self.admission_limit = admission_limit
        self.default_limits = default_limits or Limits()
        self.observe_interval = observe_interval
        # One observer samples every run's worker tree each interval, in thread calls of a
        # chunk of trees, with one read of the process table per tick (workers/_hub.py).
        self.hub = ObservationHub(observe_interval)
        self.pipes = PipeHub() if pipe_hub_supported() else None
        self.artifacts_dir = artifacts_dir
        self.evidence = evidence
        self._redactor = Redactor.create()
        self.ids = ids
        self.clock = clock
        self.pending: dict[str, PendingInteraction] = {}
        self.actors: dict[str, RunActor] = {}
        self._wake = trio.Event()
        self._idle = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._accepting = True
        self._admitting = trio.Lock()
        """Held by an admission pass: the loop's and a drain's never overlap."""
        admission.listeners.append(self._committed)

    @property
    def state(self) -> graph.GraphState:
        return self.admission.read

    def _committed(self, records: Sequence[CommittedRecord]) -> None:
        # Only a new queued run or a freed slot can make a run admissible: the admission
        # pass (which looks at every branch queue) runs for those, not for every part update.
        if any(r.type in _ADMISSION_TRIGGERS for r in records):
            self._wake.set()

    async def record(self, event: Event) -> int:
        """Commit a run event; a shutdown in progress does not interrupt the record.

        Raises ``trio.TooSlowError`` when the journal did not answer within its deadline
        (the app's journal has ``answer_within=RECORD_DEADLINE``).
        """
        return await recorded_seq(await self.submit(event))

    async def submit(self, event: Event) -> Request:
        """Queue a run event for the journal and return without waiting for its commit;
        :func:`recorded_seq` of the request waits (events are committed in queue order)."""
        # A shielded append, not a shielded cancel scope with a deadline: this is once per
        # event, and the scope (its deadline's registration) cost more than the append.
        return await self.journal.submit([event_to_record(event)], shielded=True)

    def submit_nowait(self, event: Event) -> Request | None:
        """:meth:`submit` if the journal can queue the event at once, else ``None``."""
        return self.journal.submit_nowait([event_to_record(event)], shielded=True)

    async def keep_log(self, text: str) -> str | None:
        """Keep a worker's bounded stderr as a content-addressed artifact; its ``sha256:``.

        Redacted first (credentials and tokens never reach a log artifact), then written
        as ``<artifacts>/logs/<hex>.log`` with mode 0600. Null when there is nowhere to
        keep it.
        """
        if self.artifacts_dir is None:
            return None
        clean = self._redactor.clean(text).encode("utf-8")
        ref = digest_bytes(clean)
        path = self.artifacts_dir / "logs" / f"{ref.removeprefix('sha256:')}.log"

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(clean)

        await trio.to_thread.run_sync(write)
        return ref

    async def ingest_evidence(self, run_id: str) -> str | None:
        """Ingest a finished run's transcript and its worker processes as evidence.

        The evidence run is named by the Braid run id; returned as the run's ``traceRef``.
        Null (and logged) when there is no store, no transcript, or the ingest failed:
        a missing trace is never papered over.
        """
        store = self.evidence
        run = self.state.runs[run_id]
        if store is None or run.trace_path is None:
            return None
        observations = []
        for worker in (self.state.workers[w] for w in run.worker_ids):
            ppid = (
                self.state.workers[worker.parent_worker_id].pid
                if worker.parent_worker_id is not None
                else os.getpid()
            )
            started = (
                datetime.fromtimestamp(worker.create_time, UTC)
                if worker.create_time is not None
                else None
            )
            observations.append(
                ProcessObservation(worker.pid, ppid, worker.command, started, run_id)
            )
            # Each later command line: the process exec'd it between the sample before
            # and the one that saw it, which is the time it carries.
            observations.extend(
                ProcessObservation(worker.pid, ppid, ex.command, ex.observed_at, run_id)
                for ex in worker.execs
            )
        trace = Path(run.trace_path)

        def ingest() -> None:
            store.begin_runtime_capture(run_id)
            store.record_runtime(run_id, observations)
            store.end_runtime_capture(run_id)
            store.ingest(trace, run_id=run_id, harness=run.runner)

        try:
            with trio.fail_after(EVIDENCE_DEADLINE):
                await trio.to_thread.run_sync(ingest)
        except (BraidError, OSError, trio.TooSlowError):
            _log.warning("evidence ingest of run %s failed", run_id, exc_info=True)
            return None
        return run_id

    async def record_quietly(self, event: Event) -> bool:
        """Commit an observation the graph may refuse (a duplicate, a frozen history)."""
        try:
            await self.record(event)
        except BraidError as exc:
            if exc.code in ("duplicate_identifier", "terminal_run_mutation"):
                return False
            raise
        return True

    # ---- lifecycle -----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[RunsSupervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.hub.run)
            if self.pipes is not None:
                await nursery.start(self.pipes.run)
            await self._reconcile()
            task_status.started(self)
            while True:
                self._wake = trio.Event()
                async with self._admitting:
                    if self._accepting:
                        await self._admit_ready()
                await self._wake.wait()

    async def _reconcile(self) -> None:
        """Before any new dispatch: settle every run the previous supervisor left active.

        An admitted run never reached its provider, so its actor simply dispatches it. A
        dispatched run is resumed: its actor re-attaches to a worker that is still running
        (replaying the spool from the journal's cursor), collects the end a finished worker
        spooled, re-sends a dispatch that provably never began (same receipt), or records
        ``unknown`` with the reason, never a guessed success. Workers of finished runs that
        are somehow still alive, and local workers nobody recorded, are stopped.
        """
        assert self._nursery is not None
        active = sorted(
            (
                r
                for r in self.state.runs.values()
                if r.state not in ("queued",) and not graph.is_terminal(r.state)
            ),
            key=lambda r: (r.created_at, r.run_id),
        )
        resumed = {r.run_id for r in active}
        await stop_strays(self.state, self.providers.values())
        for run in active:
            actor = RunActor(self, run.run_id, resume=run.state != "admitted")
            self.actors[run.run_id] = actor
            self._nursery.start_soon(self._run_actor, actor)
        for worker in list(self.state.workers.values()):
            run = self.state.runs[worker.run_id]
            if worker.status in TERMINAL_WORKER_STATES or not graph.is_terminal(run.state):
                continue
            if worker.pid is not None and worker.create_time is not None:
                info = adopt(worker.pid, worker.create_time, worker.pgid or worker.pid)
                if info is not None:
                    with trio.CancelScope(shield=True):
                        await kill_process(info)
        for provider in self.providers.values():
            spools = getattr(provider, "spools", None)
            if spools is None:
                continue
            for run_id, infos in find_local_workers(spools).items():
                if run_id in resumed:
                    continue
                for info in infos:  # nobody owns it any more: no orphans
                    with trio.CancelScope(shield=True):
                        await kill_process(info)

    def active_runs(self) -> list[str]:
        return list(self.actors)

    async def stop(self, *, drain: bool, grace: float) -> None:
        """Stop admitting; let active runs finish within ``grace`` (drain), then cancel.

        A drain first admits what is admissible right now: a turn accepted just before the
        request would otherwise stay queued only because the admission pass its commit
        triggered had not run yet (a race of a few milliseconds, the commit floor's).
        """
        async with self._admitting:
            if drain and self._accepting:
                await self._admit_ready()
            self._accepting = False
        if drain:
            with trio.move_on_after(grace):
                await self._wait_idle()
        for actor in list(self.actors.values()):
            actor.scope.cancel()
        with trio.move_on_after(grace + RECORD_DEADLINE):
            await self._wait_idle()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _wait_idle(self) -> None:
        while self.actors:
            self._idle = trio.Event()
            await self._idle.wait()

    async def _admit_ready(self) -> None:
        limit = None
        if self.admission_limit is not None:
            limit = self.admission_limit - len(self.state.active)
        for admitted in graph.next_admissions(self.state, at=self.clock(), limit=limit):
            if self.state.runs[admitted.run_id].state != "queued":
                continue
            await commit(self.journal, admitted)
            crash_point("run.admitted")
            assert self._nursery is not None
            actor = RunActor(self, admitted.run_id)
            self.actors[admitted.run_id] = actor
            self._nursery.start_soon(self._run_actor, actor)

    async def _run_actor(self, actor: RunActor) -> None:
        try:
            await actor.run()
        except Exception as exc:
            # One run's failure never takes the supervisor (or other runs) down, and it is
            # never hidden: the run ends ``unknown`` with the error's stable code, because
            # what its provider did after the failure is not known.
            code = exc.code if isinstance(exc, BraidError) else "internal_error"
            _log.exception("run actor %s failed", actor.run_id)
            with trio.CancelScope(shield=True):
                await self.finish(
                    actor.run_id,
                    "unknown",
                    Outcome("lost", f"Braid's run actor failed ({code}); the outcome is unknown"),
                )
        finally:
            self.actors.pop(actor.run_id, None)
            self._idle.set()
            self._wake.set()

    async def finish(
        self,
        run_id: str,
        end: TerminalState,
        outcome: Outcome,
        usage: Usage | None = None,
        cost_usd: float | None = None,
        binding: ProviderBinding | None = None,
        trace_ref: str | None = None,
    ) -> None:
        """Record the run's terminal state (no-op when it is already terminal)."""
        run = self.state.runs[run_id]
        if graph.is_terminal(run.state):
            return
        if usage is None:
            usage, cost_usd = run.usage, run.cost_usd
        crash_point("run.finishing")
        await self.record(
            RunFinished(
                run.conversation_id,
                run_id,
                end,
                outcome,
                usage,
                cost_usd,
                binding,
                self.clock(),
                trace_ref=trace_ref,
            )
        )
        crash_point("run.finished")

    # ---- requests from the application ---------------------------------------------------

    def cancel_requested(self, run_id: str, reason: str) -> None:
        """After ``run.cancel_requested`` is durable: ask the run's provider to stop."""
        actor = self.actors.get(run_id)
        if actor is None:
            return
        actor.control.request_cancel(reason)
        if actor.sink is not None:
            # An interaction the provider waits on would hold up its answer to the cancel.
            for pending in self.pending.values():
                if pending.run_id == run_id:
                    pending.resolve(InteractionAnswer(False, "the run is being cancelled"))

    async def answer(
        self,
        run_id: str,
        interaction_id: str,
        answer: InteractionAnswer,
        operation_id: str,
        operation: Operation | None = None,
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
        body: dict[str, object] = {"allow": answer.allow}
        if answer.message:
            body["message"] = answer.message
        event = RunInteractionAnswered(
            run.conversation_id, run_id, interaction_id, body, operation_id, self.clock()
        )
        await self.journal.append([event_to_record(event)], operation)
        crash_point("interaction.answered")
        pending.resolve(answer)
