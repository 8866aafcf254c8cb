"""What a run's process samples say about its workers: new children, exits, new commands.

A :class:`ChildWorkers` belongs to one :class:`~braid_actors.supervisor._run_actor.RunActor`
and turns each :class:`~braid_actors.workers.TreeSample` of the run's root worker into
journal events: a child first seen becomes a Worker (``worker.spawned``, with a ``spawned``
edge from its parent worker), a child seen exiting ends (``worker.exited``), and a worker
seen running a new command line records it (``worker.executed``). Each carries a source
identity built from the process's pid and creation time, so the graph refuses a repeat (a
restarted supervisor's observer finds the same processes again). A process is matched to
its worker among the run's journaled workers, whoever recorded them: a parent, an exit (of
a child still live) and a new command line of a child a previous supervisor recorded are
recorded against that worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors import graph
from braid_actors.model import (
    TERMINAL_WORKER_STATES,
    Worker,
    WorkerExecuted,
    WorkerExited,
    WorkerSpawned,
    digest,
)
from braid_actors.workers import ProcessKey, presence, same_start

if TYPE_CHECKING:
    from datetime import datetime

    from braid_actors.supervisor._runs import RunsSupervisor
    from braid_actors.workers import ProcessSnapshot, TreeSample


class ChildWorkers:
    """The workers one run's samples found (see the module docstring)."""

    def __init__(self, sup: RunsSupervisor, run_id: str) -> None:
        self.sup = sup
        self.run_id = run_id

    async def sampled(self, sample: TreeSample, root: Worker, at: datetime) -> None:
        """Journal what ``sample`` found that is new (root is the run's root worker)."""
        conv = self.sup.state.runs[self.run_id].conversation_id
        for snap in sample.new:
            if snap.key.pid != root.pid:
                await self._spawned(snap, sample, root, conv, at)
        for key in sample.exited:
            child = self._journaled(key)
            if child is not None and _live_child(child):
                await self._exited(child, key, conv, at)
        if sample.number == 1:
            for child, key in self._gone_unseen(sample):
                await self._exited(child, key, conv, at)
        for snap in sample.execs:
            worker = self._journaled(snap.key)
            if worker is None:
                continue  # a child the run never recorded (past the limits)
            command = tuple(snap.argv or ())[:32]
            source = (
                f"proc:{snap.key.pid}:{snap.key.create_time:.2f}:exec:{digest(list(command))[7:23]}"
            )
            await self.sup.record_quietly(
                WorkerExecuted(conv, self.run_id, worker.worker_id, command, source, at)
            )

    async def _spawned(
        self, snap: ProcessSnapshot, sample: TreeSample, root: Worker, conv: str, at: datetime
    ) -> None:
        run = self.sup.state.runs[self.run_id]
        if not run.children_complete:
            return
        # Its parent is the worker of the process this sample read for its parent's pid (a
        # child's, whichever supervisor recorded it; else the root's).
        member = next((p for p in sample.processes if p.pid == snap.ppid), None)
        parent = None if member is None else self._journaled(member.key)
        if parent is None or parent.parent_worker_id is None:
            parent = root
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
        await self.sup.record_quietly(WorkerSpawned(conv, self.run_id, child, edge, source, at))

    async def _exited(self, child: Worker, key: ProcessKey, conv: str, at: datetime) -> None:
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

    def live_keys(self) -> list[ProcessKey]:
        """The processes of the run's journaled children that have not ended, in the order
        they were recorded (a parent before its children)."""
        return [key for _, key in self._live_children()]

    def _live_children(self) -> list[tuple[Worker, ProcessKey]]:
        state = self.sup.state
        live: list[tuple[Worker, ProcessKey]] = []
        for worker_id in state.runs[self.run_id].worker_ids:
            worker = state.workers[worker_id]
            if _live_child(worker) and worker.pid is not None and worker.create_time is not None:
                live.append((worker, ProcessKey(worker.pid, worker.create_time)))
        return live

    def _gone_unseen(self, sample: TreeSample) -> list[tuple[Worker, ProcessKey]]:
        """The run's live journaled children that this supervisor's first sample of the run
        does not find and whose process has exited: they ended while no sample looked (a
        previous supervisor recorded them and went down). A child that still runs is in
        the sample even when it left the tree: the observer adopts it (:meth:`live_keys`)."""
        seen = [p.key for p in sample.processes] + list(sample.exited)
        return [
            (worker, key)
            for worker, key in self._live_children()
            if not any(_same(k, key) for k in seen)  # in the tree: its samples tell
            and presence(key) != "running"  # gone, or a zombie: it has exited
        ]

    def _journaled(self, key: ProcessKey) -> Worker | None:
        """The run's journaled worker for the process ``key`` (the root included), if any."""
        state = self.sup.state
        for worker_id in state.runs[self.run_id].worker_ids:
            worker = state.workers[worker_id]
            if (
                worker.pid == key.pid
                and worker.create_time is not None
                and same_start(worker.create_time, key.create_time)
            ):
                return worker
        return None


def _live_child(worker: Worker) -> bool:
    """A child worker (not the run's root) the journal holds as not ended."""
    return worker.parent_worker_id is not None and worker.status not in TERMINAL_WORKER_STATES


def _same(a: ProcessKey, b: ProcessKey) -> bool:
    """Whether two keys name one process (creation times within the tolerance)."""
    return a.pid == b.pid and same_start(a.create_time, b.create_time)
