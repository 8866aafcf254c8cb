"""The journal sink: how a provider reports one run, each call returning once durable.

A sink can be *closed*: once a spend limit is crossed (or the run is being stopped), the
event that crossed it was the last one accepted, and every later report from the provider
is dropped without being journaled (an interaction asked then is answered with a denial so
the provider never waits on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from braid_actors import graph
from braid_actors._faults import crash_point
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

    from braid_actors.supervisor._runs import RunsSupervisor

CLOSED_ANSWER = InteractionAnswer(allow=False, message="the run is stopping")


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

    def close(self) -> None:
        """Accept nothing more; release any interaction the provider waits on."""
        self.closed = True
        for pending in self._sup.pending.values():
            if pending.run_id == self._run_id:
                pending.resolve(CLOSED_ANSWER)

    def _next_cursor(self) -> int:
        self._cursor += 1
        return self._cursor

    async def worker_started(self, worker: WorkerInfo) -> None:
        if self.closed:
            return
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
        await self._sup.record(
            RunPartUpdated(
                self._conv,
                self._run_id,
                self._message_id,
                part,
                self._sup.clock(),
                self._next_cursor(),
            )
        )
        crash_point("run.part")

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        if self.closed:
            return CLOSED_ANSWER
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
        await self._sup.record(
            RunUsageReported(
                self._conv, self._run_id, usage, cost_usd, self._sup.clock(), self._next_cursor()
            )
        )
        crash_point("run.usage")
        await self._on_usage()
