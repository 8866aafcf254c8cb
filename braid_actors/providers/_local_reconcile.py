"""The local runner's reconcile, through its re-attachable spool.

The supervisor re-attaches local runs itself (:class:`~braid_actors.providers.Reattachable`,
which replays from the journal's cursor); this is the port's general form of the same:
replay the whole spool (parts replace by id), follow a surviving worker to its end (a
permission it asks is refused: nobody is proven to be waiting for it), and report an end
only when the worker spooled one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors.providers._port import (
    InteractionAnswer,
    Reconciliation,
    SessionRequest,
    TurnRequest,
    WorkerInfo,
)
from braid_actors.workers import recognise

if TYPE_CHECKING:
    from braid_actors.providers._port import ReconcileRequest, RunSink, WorkersSettled
    from braid_actors.providers.local import LocalProvider


async def reconcile_local(
    provider: LocalProvider, request: ReconcileRequest, sink: RunSink
) -> Reconciliation:
    """See the module note."""
    root = request.workers[0] if request.workers else WorkerInfo(0, 0.0, 0, ())
    alive = root.pid > 0 and recognise(root.pid, root.create_time, root.pgid)
    turn = TurnRequest(
        run_id=request.run_id,
        turn_id=request.turn_id,
        workspace=request.workspace,
        user_message_id="",
        assistant_message_id="",
        text=request.text,
        # A continued session is named (the worker must be in it); a new one is not.
        session=SessionRequest(
            session_id=request.session_id if request.start_boundary is not None else None
        ),
    )

    async def refuse(_: str) -> InteractionAnswer:
        return InteractionAnswer(False, "Braid restarted; nobody is waiting for this answer")

    result, done = await provider.reattach(
        turn, root, skip=0, answers={}, await_pending=refuse, sink=sink
    )
    settled: WorkersSettled = "exited" if alive else "none"
    if not done:
        return Reconciliation(None, "the worker is gone and did not report its end", settled)
    return Reconciliation(result, "the worker spooled its end", settled)
