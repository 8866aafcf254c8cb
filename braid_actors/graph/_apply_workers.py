"""Event handlers for a run's workers: root and child processes, spend, controls, exits.

Child observations are kept on the owning run, deduplicated by their source event identity
(also across restarts, because the identities are part of the projection). A run holds at
most ``MAX_RUN_CHILDREN`` children and ``MAX_RUN_SOURCE_EVENTS`` identities: the first
observation past either limit freezes the child history and marks it incomplete; later
child observations change nothing, and each worker keeps its last observed status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from braid_actors.errors import (
    DuplicateIdentifier,
    IntegrityError,
)
from braid_actors.graph._checks import check_edge, counted, live_run, new
from braid_actors.graph._replace import replace
from braid_actors.model import (
    MAX_RUN_CHILDREN,
    MAX_RUN_SOURCE_EVENTS,
    Run,
    Worker,
    WorkerControlled,
    WorkerExec,
    WorkerExecuted,
    WorkerExited,
    WorkerObserved,
    WorkerSpawned,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from braid_actors.graph._state import GraphState


def _run_worker(state: GraphState, run_id: str, worker_id: str) -> tuple[Run, Worker]:
    run = live_run(state, run_id)
    worker = state.workers.get(worker_id)
    if worker is None or worker.run_id != run.run_id:
        raise IntegrityError(
            f"run {run_id} has no worker {worker_id}", details={"workerId": worker_id}
        )
    return run, worker


def _seen(run: Run, source_event_id: str) -> None:
    if source_event_id in run.source_event_ids:
        raise DuplicateIdentifier(
            f"observation {source_event_id} is already recorded on run {run.run_id}",
            details={"sourceEventId": source_event_id},
        )


def _worker_spawned(state: GraphState, ev: WorkerSpawned, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    child = ev.worker
    if not run.children_complete:
        state.runs[run.run_id] = replace(run, events=counted(run, seq))
        return
    _seen(run, ev.source_event_id)
    new(state.workers, child.worker_id, "worker")
    parent = state.workers.get(child.parent_worker_id or "")
    if parent is None or parent.run_id != run.run_id or child.run_id != run.run_id:
        raise IntegrityError("a child worker's parent is a worker of the same run")
    children = sum(1 for w in run.worker_ids if state.workers[w].parent_worker_id is not None)
    if children >= MAX_RUN_CHILDREN or len(run.source_event_ids) >= MAX_RUN_SOURCE_EVENTS:
        state.runs[run.run_id] = replace(run, children_complete=False, events=counted(run, seq))
        return
    check_edge(state, ev.edge, "spawned", new_nodes=frozenset({child.worker_id}))
    if (ev.edge.source_id, ev.edge.destination_id) != (parent.worker_id, child.worker_id):
        raise IntegrityError("a child's spawned edge runs from its parent worker")
    state.workers[child.worker_id] = child
    state.add_edge(ev.edge)
    state.runs[run.run_id] = replace(
        run,
        worker_ids=(*run.worker_ids, child.worker_id),
        source_event_ids=(*run.source_event_ids, ev.source_event_id),
        events=counted(run, seq),
    )


def _worker_observed(state: GraphState, ev: WorkerObserved, seq: int | None) -> None:
    run, worker = _run_worker(state, ev.run_id, ev.worker_id)
    state.workers[worker.worker_id] = replace(worker, spend=ev.spend)
    state.runs[run.run_id] = replace(run, events=counted(run, seq))


def _worker_controlled(state: GraphState, ev: WorkerControlled, seq: int | None) -> None:
    run, worker = _run_worker(state, ev.run_id, ev.worker_id)
    state.workers[worker.worker_id] = replace(
        worker, status=ev.status, control_history=(*worker.control_history, ev.control)
    )
    state.runs[run.run_id] = replace(run, events=counted(run, seq))


def _worker_executed(state: GraphState, ev: WorkerExecuted, seq: int | None) -> None:
    """A worker's new command line, kept in its ``execs``: deduplicated, and past the
    limits handled as ``worker.exited`` is (a child's freezes the child history; the root's
    is kept, its identity only while there is room)."""
    run, worker = _run_worker(state, ev.run_id, ev.worker_id)
    _seen(run, ev.source_event_id)
    ids = run.source_event_ids
    if worker.parent_worker_id is not None and (
        not run.children_complete or len(ids) >= MAX_RUN_SOURCE_EVENTS
    ):
        state.runs[run.run_id] = replace(run, children_complete=False, events=counted(run, seq))
        return
    state.workers[worker.worker_id] = replace(
        worker, execs=(*worker.execs, WorkerExec(ev.command, ev.at))
    )
    if len(ids) < MAX_RUN_SOURCE_EVENTS:
        ids = (*ids, ev.source_event_id)
    state.runs[run.run_id] = replace(run, source_event_ids=ids, events=counted(run, seq))


def _worker_exited(state: GraphState, ev: WorkerExited, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    worker = state.workers.get(ev.worker_id)
    if worker is None or worker.run_id != run.run_id:
        if not run.children_complete:  # a child past the limit was never recorded
            state.runs[run.run_id] = replace(run, events=counted(run, seq))
            return
        raise IntegrityError(
            f"run {ev.run_id} has no worker {ev.worker_id}", details={"workerId": ev.worker_id}
        )
    _seen(run, ev.source_event_id)
    is_child = worker.parent_worker_id is not None
    frozen = is_child and (
        not run.children_complete or len(run.source_event_ids) >= MAX_RUN_SOURCE_EVENTS
    )
    if frozen:
        # Past the limit: keep the last observed status, mark the history incomplete.
        state.runs[run.run_id] = replace(run, children_complete=False, events=counted(run, seq))
        return
    state.workers[worker.worker_id] = replace(
        worker, status=ev.status, exit_code=ev.exit_code, log_ref=ev.log_ref or worker.log_ref
    )
    ids = run.source_event_ids
    if len(ids) < MAX_RUN_SOURCE_EVENTS:
        ids = (*ids, ev.source_event_id)
    state.runs[run.run_id] = replace(run, source_event_ids=ids, events=counted(run, seq))


WORKER_HANDLERS: dict[type[Any], Callable[[GraphState, Any, int | None], None]] = {
    WorkerSpawned: _worker_spawned,
    WorkerObserved: _worker_observed,
    WorkerControlled: _worker_controlled,
    WorkerExecuted: _worker_executed,
    WorkerExited: _worker_exited,
}
