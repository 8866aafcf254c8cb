"""The journal sink: how a provider reports one run, each call returning once durable.

Part updates are the exception, because they are most of what a run reports (a stream
sends one per chunk): :meth:`JournalSink.part` queues the update and returns. Up to
:data:`PART_PIPELINE` updates of a run may be queued and not yet committed; every other
report, and :meth:`JournalSink.settle` when the turn ends, first waits until all of them
are answered and raises what refused the first refused one. The journal commits in queue
order, so nothing reported later can land before them. Waiting for each update's commit
instead parked the run's task once more per update, which at 500 streaming runs was a
tenth of the event loop; allowing only one in flight sent every update to the run's own
task (off the pipe hub's fast path) as soon as acknowledgements took longer than the
stream's interval, which made them slower still.

A sink can be *closed*: once a spend limit is crossed (or the run is being stopped), the
event that crossed it was the last one accepted, and every later report from the provider
is dropped without being journaled (an interaction asked then is answered with a denial so
the provider never waits on it).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import attrs
import trio

from braid_actors import graph
from braid_actors._faults import crash_point
from braid_actors.errors import BraidError, JournalTimeout
from braid_actors.model import (
    Interaction,
    Part,
    RunInteractionRequested,
    RunPartUpdated,
    RunSessionReported,
    RunUsageReported,
    RunWorkerStarted,
    Usage,
    Worker,
)
from braid_actors.providers import (
    InteractionAnswer,
    InteractionRequest,
    SessionInfo,
    WorkerInfo,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.journal import Request
    from braid_actors.supervisor._runs import RunsSupervisor

CLOSED_ANSWER = InteractionAnswer(allow=False, message="the run is stopping")
PART_PIPELINE = 4
"""Part updates of one run that may be queued before the sink waits for the oldest one's
commit (4 covers 0.4 s of acknowledgement latency at 10 updates/s; under overload every
run may hold that many in the journal's queue, so more only adds latency)."""


async def recorded_seq(request: Request) -> int:
    """The sequence number a queued run event was committed at, once it is.

    Raises what refused it, and ``trio.TooSlowError`` when the journal did not answer within
    its deadline (the outcome is then unknown).
    """
    try:
        result = await request.result()
    except JournalTimeout as exc:
        raise trio.TooSlowError(exc.message) from exc
    return result.records[-1].seq


@attrs.define(eq=False)
class PendingInteraction:
    """An interaction waiting for ``respond_interaction`` (or for the run to stop)."""

    run_id: str
    answer: InteractionAnswer | None = None
    done: trio.Event = attrs.Factory(trio.Event)

    def resolve(self, answer: InteractionAnswer) -> None:
        if self.answer is None:
            self.answer = answer
            self.done.set()


class JournalSink:
    """A provider's reporting channel for one run."""

    def __init__(
        self,
        sup: RunsSupervisor,
        run_id: str,
        *,
        on_worker: Callable[[Worker], Awaitable[None]],
        on_usage: Callable[[], Awaitable[None]],
    ) -> None:
        self._sup = sup
        self._run_id = run_id
        run = sup.state.runs[run_id]
        self._conv = run.conversation_id
        self._message_id = run.assistant_message_id or ""
        self._on_worker = on_worker
        self._on_usage = on_usage
        self._cursor = run.provider_cursor
        self.closed = False
        self.session_info: SessionInfo | None = None
        self.root_worker: Worker | None = None
        self._unsettled: deque[Request] = deque()
        """Part updates queued whose commit nobody has seen yet, oldest first."""

    def close(self) -> None:
        """Accept nothing more; release any interaction the provider waits on."""
        self.closed = True
        for pending in self._sup.pending.values():
            if pending.run_id == self._run_id:
                pending.resolve(CLOSED_ANSWER)

    async def settle(self) -> None:
        """Wait until every part update queued so far is answered; raise what refused the
        first refused one (each refusal is raised once)."""
        first: BaseException | None = None
        while self._unsettled:
            request = self._unsettled.popleft()
            try:
                await recorded_seq(request)
            except (BraidError, trio.TooSlowError) as exc:
                first = first or exc
                continue
            crash_point("run.part")
        if first is not None:
            raise first

    def _drop_committed(self) -> bool:
        """Forget the committed updates at the front; False when one was refused."""
        unsettled = self._unsettled
        while unsettled:
            head = unsettled[0]
            if not head.answered:
                return True
            if isinstance(head.outcome, BraidError):
                return False
            unsettled.popleft()
            crash_point("run.part")
        return True

    def _next_cursor(self) -> int:
        self._cursor += 1
        return self._cursor

    async def worker_started(self, worker: WorkerInfo) -> None:
        if self.closed:
            return
        await self.settle()
        record = Worker(
            worker_id=self._sup.ids("wrk"),
            run_id=self._run_id,
            status="running",
            pid=worker.pid,
            create_time=worker.create_time,
            pgid=worker.pgid,
            command=worker.command[:32],
        )
        edge = graph.make_edge(
            self._sup.ids,
            "spawned",
            self._run_id,
            record.worker_id,
            self._run_id,
            self._sup.clock(),
            {"pid": worker.pid, "createTime": worker.create_time},
        )
        await self._sup.record(
            RunWorkerStarted(self._conv, self._run_id, record, edge, self._sup.clock())
        )
        self.root_worker = record
        crash_point("worker.started")
        await self._on_worker(record)

    async def session(self, info: SessionInfo) -> None:
        if self.closed:
            return
        await self.settle()
        self.session_info = info
        await self._sup.record(
            RunSessionReported(
                self._conv,
                self._run_id,
                info.session_id,
                info.resumed,
                info.trace_path,
                self._sup.clock(),
                self._next_cursor(),
                info.receipt,
            )
        )

    async def part(self, part: Part) -> None:
        if self.closed:
            return
        if not self._drop_committed() or len(self._unsettled) >= PART_PIPELINE:
            await self.settle()
        self._unsettled.append(await self._sup.submit(self._part_event(part, self._next_cursor())))

    def part_nowait(self, part: Part) -> bool:
        """:meth:`part` if it can be done without waiting; False: call :meth:`part`.

        That is, unless a queued part update was refused, :data:`PART_PIPELINE` of them
        are still uncommitted, or the journal can't queue this one at once. Nothing is
        queued when it returns False.
        """
        if self.closed:
            return True  # dropped, as part() drops it
        if not self._drop_committed() or len(self._unsettled) >= PART_PIPELINE:
            return False
        request = self._sup.submit_nowait(self._part_event(part, self._cursor + 1))
        if request is None:
            return False
        self._cursor += 1
        self._unsettled.append(request)
        return True

    def _part_event(self, part: Part, cursor: int) -> RunPartUpdated:
        return RunPartUpdated(
            self._conv, self._run_id, self._message_id, part, self._sup.clock(), cursor
        )

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        if self.closed:
            return CLOSED_ANSWER
        await self.settle()
        pending = PendingInteraction(self._run_id)
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
                    self._next_cursor(),
                )
            )
            crash_point("run.interaction")
            await pending.done.wait()
            assert pending.answer is not None
            return pending.answer
        finally:
            self._sup.pending.pop(request.interaction_id, None)

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        if self.closed:
            return
        await self.settle()
        await self._sup.record(
            RunUsageReported(
                self._conv, self._run_id, usage, cost_usd, self._sup.clock(), self._next_cursor()
            )
        )
        crash_point("run.usage")
        await self._on_usage()
