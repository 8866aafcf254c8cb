"""Reconciling, after a restart, a run of a runner that can't be re-attached (the CLIs).

Theory of operation: the previous supervisor dispatched the run and may have left its
worker running. The provider's ``reconcile`` settles that worker (stops it, or lets it
end by itself within a bound — each adapter says which and why) and then reads the
runner's own session record (the run's trace source): a turn the record proves over ends
with its real outcome, parts and usage exactly as recorded; anything else is ``unknown``
with the reason. While the provider waits, a surviving root is observed again (spend
samples, children, limits: a crossing stops it and fails the run). The request is never
sent again: a CLI turn that began can't be proven not to have reached the model. Without
the provider (no longer installed) the recorded workers are still stopped by identity,
and the run is ``unknown``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from braid_actors.model import TERMINAL_WORKER_STATES, Outcome
from braid_actors.providers import (
    ReconcileRequest,
    Reconciliation,
    WorkerInfo,
    settle_workers,
)
from braid_actors.supervisor._sink import JournalSink
from braid_actors.workers import ProcessInfo, StopPolicy
from braid_actors.workers import kill as kill_process

if TYPE_CHECKING:
    from collections.abc import Iterable

    from braid_actors.graph import GraphState
    from braid_actors.providers import Provider
    from braid_actors.supervisor._run_actor import RunActor

_log = logging.getLogger("braid.supervisor")

RECONCILE_DEADLINE = 300.0
"""Longest a provider's reconcile may take (its own waits are shorter)."""


def reconcile_request(actor: RunActor) -> ReconcileRequest:
    """What the journal knows of the run, for the provider."""
    state = actor.state
    run = state.runs[actor.run_id]
    branch = state.branches[run.branch_id]
    user = state.messages[state.turns[run.turn_id].user_message_id]
    workspace = state.conversations[run.conversation_id].workspace
    if branch.environment_id is not None:
        workspace = state.environments[branch.environment_id].workspace
    binding = branch.binding
    start = None
    if run.session_mode == "continued" and binding is not None:
        start = binding.native_boundary or binding.boundary_message_id
    workers = tuple(
        WorkerInfo(w.pid, w.create_time, w.pgid or w.pid, w.command)
        for w in (state.workers[i] for i in run.worker_ids)
        if w.status not in TERMINAL_WORKER_STATES and w.pid is not None and w.create_time
    )
    return ReconcileRequest(
        run_id=run.run_id,
        turn_id=run.turn_id,
        workspace=Path(workspace),
        text="\n".join(p.text for p in user.parts if p.kind == "text"),
        session_id=run.provider_session_id,
        trace_path=run.trace_path,
        start_boundary=start,
        workers=workers,
        cancel_requested=actor.control.cancel_requested.is_set(),
    )


async def reconcile_native(actor: RunActor, provider: Provider | None) -> None:
    """Settle the run through its provider's ``reconcile`` (see the module note)."""
    request = reconcile_request(actor)
    if provider is None:
        settled = await settle_workers(request.workers, wait=0.0, policy=StopPolicy())
        await actor._record_worker_exits("killed" if settled == "stopped" else "lost")
        await actor.finish(
            "unknown",
            Outcome("lost", f"Braid restarted and runner {actor._run().runner} is not available"),
        )
        return
    sink = JournalSink(
        actor.sup, actor.run_id, on_worker=actor._watch_worker, on_usage=actor._check_usage
    )
    actor.sink = sink
    found: Reconciliation | None = None
    async with trio.open_nursery() as nursery:
        actor._nursery = nursery
        # Re-adopt a survivor while the provider lets it finish: observed like any worker
        # (spend, children), under the run's limits; a crossing ends the wait and stops it.
        await actor._adopt_root()
        with actor._stop, trio.move_on_after(RECONCILE_DEADLINE):
            found = await provider.reconcile(request, sink)
        actor.stop_watching()
        nursery.cancel_scope.cancel()  # a sample being handled
    sink.close()
    if actor.crossing is not None:
        await actor._end(None, None)  # spend_limit_exceeded, its workers killed
        return
    if found is None or found.result is None:
        reason = "reconciliation took too long" if found is None else found.reason
        await actor._record_worker_exits(
            "killed" if found and found.workers == "stopped" else "lost"
        )
        await actor.finish("unknown", Outcome("lost", reason))
        return
    if found.workers == "stopped":
        await actor._record_worker_exits("killed")
    await actor._end(found.result, None)


async def stop_strays(state: GraphState, providers: Iterable[Provider]) -> None:
    """Stop CLI runner processes no run recorded (spawned, then Braid died before
    ``run.worker_started``). Called before any run actor starts, so none of them can be a
    new dispatch; members of a recorded worker's group belong to that run and are left."""
    groups = {w.pgid or w.pid for w in state.workers.values() if w.pid is not None}
    for provider in providers:
        strays = getattr(provider, "strays", None)
        if strays is None:
            continue
        found: list[WorkerInfo] = await trio.to_thread.run_sync(strays)
        for info in found:
            if info.pgid in groups:
                continue
            _log.warning("stopping stray %s process %s", provider.name, info.pid)
            with trio.CancelScope(shield=True):
                await kill_process(ProcessInfo(info.pid, info.create_time, info.pgid, info.command))
