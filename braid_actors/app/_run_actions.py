"""Run and worker commands: cancel, retry, select, focus, overrides, workers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from braid_actors import graph
from braid_actors.app._views import branch_view, run_record
from braid_actors.app._wire import to_wire
from braid_actors.errors import BadRequest, IllegalTransition, NotFound, UnknownTurn
from braid_actors.journal import Operation, event_to_record
from braid_actors.model import (
    BranchFocused,
    Limits,
    Outcome,
    OverridesSet,
    RunCancelRequested,
    RunFinished,
    RunOverrides,
    TurnRunSelected,
    WorkerControl,
    WorkerControlled,
    WorkerStatus,
    digest,
)
from braid_actors.workers import ControlResult, ProcessInfo
from braid_actors.workers import kill as kill_process
from braid_actors.workers import pause as pause_process
from braid_actors.workers import resume as resume_process
from braid_actors.workers import stop as stop_process

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.app._service import BraidApp

# ---- params ----------------------------------------------------------------------------


@attrs.frozen
class CancelRunParams:
    run_id: str
    operation_id: str | None = None


@attrs.frozen
class RetryParams:
    turn_id: str
    session: Literal["reuse", "fresh"]
    runner: str | None = None
    model: str | None = None
    effort: str | None = None
    profile_ref: str | None = None
    operation_id: str | None = None


@attrs.frozen
class SelectRunParams:
    turn_id: str
    run_id: str


@attrs.frozen
class RunParams:
    run_id: str


@attrs.frozen
class OverrideParams:
    branch_id: str
    runner: str | None = None
    model: str | None = None
    effort: str | None = None
    mode: str | None = None
    limits: Limits | None = None
    operation_id: str | None = None


def _canonical(params: Any) -> dict[str, Any]:
    data: dict[str, Any] = to_wire(params)
    data.pop("operationId", None)
    return data


# ---- handlers --------------------------------------------------------------------------


async def cancel_run(app: BraidApp, p: CancelRunParams) -> dict[str, Any]:
    """Two-party cancel: journal the request, then ask the provider (see the run actor)."""
    run = app.run(p.run_id)
    if graph.is_terminal(run.state) or run.state == "cancelling":
        return run_record(app.state, run)
    reason = "cancelled by the user"

    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        current = app.run(p.run_id)
        if current.state == "queued":
            # Nothing was dispatched: no provider to ask, the run simply never starts.
            event: Any = RunFinished(
                current.conversation_id,
                current.run_id,
                "cancelled",
                Outcome("cancelled", "cancelled before it was admitted"),
                current.usage,
                current.cost_usd,
                None,
                app.clock(),
            )
        else:
            event = RunCancelRequested(
                current.conversation_id, current.run_id, reason, op_id, app.clock()
            )
        return event, {"runId": current.run_id}

    await app.mutate("cancel_run", _canonical(p), p.operation_id, build)
    app.runs.cancel_requested(p.run_id, reason)
    return run_record(app.state, app.run(p.run_id))


async def retry(app: BraidApp, p: RetryParams) -> dict[str, Any]:
    if p.runner is not None and p.runner not in app.providers:
        raise BadRequest(f"unknown runner {p.runner}", details={"field": "runner"})
    if p.profile_ref is not None or p.effort is not None:
        raise BadRequest(
            "profile and effort changes on retry need the profile catalog, which is not "
            "available yet",
            details={"fields": ["profileRef", "effort"]},
        )

    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = graph.retry(
            app.state,
            turn_id=p.turn_id,
            session=p.session,
            runner=p.runner,
            model=p.model,
            operation_id=op_id,
            at=app.clock(),
            ids=app.ids,
        )
        return ev, {"runId": ev.run.run_id, "edgeId": ev.edge.edge_id}

    return await app.mutate("retry", _canonical(p), p.operation_id, build)


async def select_run(app: BraidApp, p: SelectRunParams) -> dict[str, Any]:
    turn = app.state.turns.get(p.turn_id)
    if turn is None:
        raise UnknownTurn(f"no turn {p.turn_id}", details={"turnId": p.turn_id})
    await app.commit(TurnRunSelected(turn.conversation_id, p.turn_id, p.run_id, app.clock()))
    view: dict[str, Any] = to_wire(app.state.turns[p.turn_id])
    return view


async def focus_run(app: BraidApp, p: RunParams) -> dict[str, Any]:
    """Select the run's conversation and branch; the branch's draft comes back untouched."""
    run = app.run(p.run_id)
    conv = app.state.conversations[run.conversation_id]
    if conv.active_branch_id != run.branch_id:
        await app.commit(BranchFocused(run.conversation_id, run.branch_id, app.clock()))
    branch = app.state.branches[run.branch_id]
    return {
        "conversationId": run.conversation_id,
        "branchId": run.branch_id,
        "draft": branch.draft,
        "selectedRunId": app.state.turns[run.turn_id].selected_run_id,
    }


async def set_run_override(app: BraidApp, p: OverrideParams) -> dict[str, Any]:
    branch = graph.get_branch(app.state, p.branch_id)
    if p.runner is not None and p.runner not in app.providers:
        raise BadRequest(f"unknown runner {p.runner}", details={"field": "runner"})
    limits = p.limits or Limits()
    for name, value in attrs.asdict(limits).items():
        if value is not None and value < 0:
            raise BadRequest("limits must not be negative", details={"field": f"limits.{name}"})
    overrides = RunOverrides(
        runner=p.runner, model=p.model, effort=p.effort, mode=p.mode, limits=limits
    )

    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = OverridesSet(branch.conversation_id, branch.branch_id, overrides, op_id, app.clock())
        return ev, {"branchId": branch.branch_id}

    await app.mutate("set_run_override", _canonical(p), p.operation_id, build)
    return branch_view(app.state, p.branch_id)


def worker_view(app: BraidApp, worker_id: str) -> dict[str, Any]:
    worker = app.state.workers.get(worker_id)
    if worker is None:
        raise NotFound(f"no worker {worker_id}", details={"workerId": worker_id})
    view: dict[str, Any] = to_wire(worker)
    return view


async def list_workers(app: BraidApp, p: RunParams) -> dict[str, Any]:
    run = app.run(p.run_id)
    return {
        "runId": run.run_id,
        "childrenComplete": run.children_complete,
        "workers": [worker_view(app, w) for w in run.worker_ids],
    }


@attrs.frozen
class SteerWorkerParams:
    worker_id: str
    action: Literal["pause", "resume"]
    operation_id: str | None = None


@attrs.frozen
class CancelWorkerParams:
    worker_id: str
    force: bool = False
    operation_id: str | None = None


_STATUS_AFTER: dict[str, WorkerStatus] = {
    "paused": "paused",
    "resumed": "running",
    "gone": "lost",
    "exited": "exited",
    "cooperative": "exited",
    "terminated": "killed",
    "killed": "killed",
}


async def _control(
    app: BraidApp,
    command: str,
    p: Any,
    apply: Callable[[ProcessInfo], Awaitable[ControlResult]],
    action: str,
) -> dict[str, Any]:
    """Journal the control's intent, apply it to the process, journal its result."""
    op_id = p.operation_id or app.ids("op")
    params = _canonical(p)
    params_digest = digest({"command": command, "params": params})
    if await app.journal.recorded(op_id, params_digest) is not None:
        return worker_view(app, p.worker_id)
    worker = app.state.workers.get(p.worker_id)
    if worker is None:
        raise NotFound(f"no worker {p.worker_id}", details={"workerId": p.worker_id})
    if (
        worker.pid is None
        or worker.create_time is None
        or worker.status
        in (
            "exited",
            "killed",
            "lost",
        )
    ):
        raise IllegalTransition(
            f"worker {worker.worker_id} is {worker.status} and can't be controlled",
            details={"workerId": worker.worker_id, "status": worker.status},
        )
    run = app.run(worker.run_id)
    await app.commit(
        WorkerControlled(
            run.conversation_id,
            run.run_id,
            worker.worker_id,
            WorkerControl(action, app.clock(), "requested"),
            worker.status,
            op_id,
            app.clock(),
        )
    )
    info = ProcessInfo(worker.pid, worker.create_time, worker.pgid or worker.pid, worker.command)
    result = await apply(info)
    status = _STATUS_AFTER.get(result.result, worker.status)
    event = WorkerControlled(
        run.conversation_id,
        run.run_id,
        worker.worker_id,
        result.record(),
        status,
        op_id,
        app.clock(),
    )
    await app.journal.append(
        [event_to_record(event)],
        Operation(op_id, command, params_digest, {"workerId": worker.worker_id}),
    )
    return worker_view(app, worker.worker_id)


async def steer_worker(app: BraidApp, p: SteerWorkerParams) -> dict[str, Any]:
    """Pause (SIGSTOP) or resume (SIGCONT) a worker's process group."""
    apply = pause_process if p.action == "pause" else resume_process
    return await _control(app, "steer_worker", p, apply, p.action)


async def cancel_worker(app: BraidApp, p: CancelWorkerParams) -> dict[str, Any]:
    """Stop a worker through the ladder (SIGTERM, bounded wait, SIGKILL), or kill it now."""

    async def apply(info: ProcessInfo) -> ControlResult:
        with trio.CancelScope(shield=True):
            result = await (kill_process(info) if p.force else stop_process(info))
        return result

    return await _control(app, "cancel_worker", p, apply, "kill" if p.force else "stop")
