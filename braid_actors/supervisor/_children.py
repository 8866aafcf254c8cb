"""What a run's process samples say about its workers: new children, exits, new commands.

A :class:`ChildWorkers` belongs to one :class:`~braid_actors.supervisor._run_actor.RunActor`
and turns each :class:`~braid_actors.workers.TreeSample` of the run's root worker into
journal events: a child first seen becomes a Worker (``worker.spawned``, with a ``spawned``
edge from its parent worker), a child seen exiting ends (``worker.exited``), and a worker
seen running a new command line records it (``worker.executed``). Each carries a source
identity built from the process's pid and creation time, so the graph refuses a repeat (a
restarted supervisor's observer finds the same processes again). A new command line is
matched to its worker among the ones this actor recorded, the root, or the run's journaled
workers (a child a previous supervisor recorded), and so is an exit (of a child only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors import graph
from braid_actors.model import Worker, WorkerExecuted, WorkerExited, WorkerSpawned, digest

if TYPE_CHECKING:
    from datetime import datetime

    from braid_actors.supervisor._runs import RunsSupervisor
    from braid_actors.workers import ProcessKey, ProcessSnapshot, TreeSample


def _key_of(pid: int, create_time: float) -> tuple[int, str]:
    # Creation times compare as the source identities print them (two decimals).
    return pid, f"{create_time:.2f}"


class ChildWorkers:
    """The workers one run's samples found (see the module docstring)."""

    def __init__(self, sup: RunsSupervisor, run_id: str) -> None:
        self.sup = sup
        self.run_id = run_id
        self._known: dict[tuple[int, str], Worker] = {}
        """Child workers by process identity, once their spawn is journaled or recognised."""

    async def sampled(self, sample: TreeSample, root: Worker, at: datetime) -> None:
        """Journal what ``sample`` found that is new (root is the run's root worker)."""
        conv = self.sup.state.runs[self.run_id].conversation_id
        for snap in sample.new:
            if snap.key.pid != root.pid:
                await self._spawned(snap, sample, root, conv, at)
        for key in sample.exited:
            child = self._known.pop(_key_of(key.pid, key.create_time), None)
            if child is None:
                # A child a previous supervisor recorded (this one's spawn was refused as
                # a duplicate): its exit is recorded now, not when the run ends.
                child = self._journaled(key)
                if child is not None and (
                    child.parent_worker_id is None or child.status != "running"
                ):
                    child = None
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
        for snap in sample.execs:
            await self._executed(snap, root, conv, at)

    async def _spawned(
        self, snap: ProcessSnapshot, sample: TreeSample, root: Worker, conv: str, at: datetime
    ) -> None:
        run = self.sup.state.runs[self.run_id]
        if not run.children_complete:
            return
        parent = next((w for w in self._known.values() if w.pid == snap.ppid), None)
        if parent is None:
            # A parent a previous supervisor recorded: found by the identity this sample
            # read for its pid (a child spawned after a restart is not the root's).
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
        key = _key_of(snap.key.pid, snap.key.create_time)
        if await self.sup.record_quietly(WorkerSpawned(conv, self.run_id, child, edge, source, at)):
            self._known[key] = child

    async def _executed(self, snap: ProcessSnapshot, root: Worker, conv: str, at: datetime) -> None:
        key = _key_of(snap.key.pid, snap.key.create_time)
        worker = self._known.get(key)
        if worker is None:
            worker = root if key == _key_of(root.pid or 0, root.create_time or 0.0) else None
        if worker is None:
            worker = self._journaled(snap.key)
        if worker is None:
            return  # a child the run never recorded (past the limits)
        command = tuple(snap.argv or ())[:32]
        source = f"proc:{key[0]}:{key[1]}:exec:{digest(list(command))[7:23]}"
        await self.sup.record_quietly(
            WorkerExecuted(conv, self.run_id, worker.worker_id, command, source, at)
        )

    def _journaled(self, key: ProcessKey) -> Worker | None:
        """The run's journaled worker for the process ``key``, if any."""
        state = self.sup.state
        wanted = _key_of(key.pid, key.create_time)
        for worker_id in state.runs[self.run_id].worker_ids:
            worker = state.workers[worker_id]
            if (
                worker.pid is not None
                and worker.create_time is not None
                and _key_of(worker.pid, worker.create_time) == wanted
            ):
                return worker
        return None
