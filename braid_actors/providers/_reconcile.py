"""Settling the workers a previous supervisor left behind, shared by the CLI adapters.

Design note. A worker is named by what the journal recorded: ``(pid, create_time, pgid)``.
Every control re-checks that identity through psutil first, so a reused pid is never
signalled. The root may be given ``wait`` seconds to end by itself (a CLI that can still
finish its turn without Braid), then ``interrupt`` (the runner's own cooperative stop,
e.g. SIGINT for Codex, which records the abort in its rollout) and ``policy.grace`` for it
to take effect, then the stop ladder's SIGTERM and SIGKILL. Every other recorded worker
is stopped too, and the group of every exited leader is swept, so nothing of the run is
left running afterwards.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Literal

import psutil  # type: ignore[import-untyped, unused-ignore]
import trio

from braid_actors.errors import WorkerStopTimeout
from braid_actors.providers._port import Reconciliation, TurnResult, WorkerInfo
from braid_actors.workers import ProcessInfo, StopPolicy, recognise, stop

if TYPE_CHECKING:
    import signal
    from collections.abc import Sequence
    from pathlib import Path

    from braid_actors.providers._claude_record import RecordedTurn
    from braid_actors.providers._port import (
        ReconcileRequest,
        RunSink,
        WorkersSettled,
    )

POLL: float = 0.05


def _info(worker: WorkerInfo) -> ProcessInfo:
    return ProcessInfo(
        pid=worker.pid, create_time=worker.create_time, pgid=worker.pgid, command=worker.command
    )


def _alive(worker: WorkerInfo) -> bool:
    return worker.pid > 0 and recognise(worker.pid, worker.create_time, worker.pgid)


async def settle_workers(
    workers: Sequence[WorkerInfo],
    *,
    wait: float,
    policy: StopPolicy,
    interrupt: signal.Signals | None = None,
) -> WorkersSettled:
    """Make sure none of ``workers`` runs any more (see the module note).

    ``none``: none was running; ``exited``: the root ended by itself within ``wait``;
    ``stopped``: something had to be stopped. Only the wait can be cancelled (a limit
    crossed while the survivor is observed ends it early); the stopping is shielded, so a
    cancelled or shut-down restart still leaves no orphan.
    """
    root = workers[0] if workers else None
    alive = root is not None and _alive(root)
    try:
        if root is not None and alive:
            with trio.move_on_after(wait):
                while _alive(root):  # noqa: ASYNC110 - a process Braid did not spawn
                    await trio.sleep(POLL)
    finally:
        with trio.CancelScope(shield=True):
            settled = await _stop_all(workers, alive=alive, policy=policy, interrupt=interrupt)
    return settled


async def _stop_all(
    workers: Sequence[WorkerInfo],
    *,
    alive: bool,
    policy: StopPolicy,
    interrupt: signal.Signals | None,
) -> WorkersSettled:
    settled: WorkersSettled = "none"
    if alive:
        root = workers[0]
        settled = "stopped" if _alive(root) else "exited"
        if settled == "stopped" and interrupt is not None and _alive(root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(root.pgid, interrupt)
    for worker in workers:
        if worker.pid <= 0:
            continue
        if worker is not workers[0] and _alive(worker):
            settled = "stopped"
        try:
            await stop(_info(worker), policy)
        except WorkerStopTimeout:
            settled = "stopped"  # it survived SIGKILL's bounded wait: nothing more to do
    return settled


_SETTLED: dict[str, str] = {
    "none": "no worker of it was left running",
    "exited": "its worker ended by itself",
    "stopped": "its worker was stopped",
}


async def conclude(
    request: ReconcileRequest,
    sink: RunSink,
    settled: WorkersSettled,
    turn: RecordedTurn,
    *,
    boundary: str | None,
) -> Reconciliation:
    """Report what the record holds of the turn and decide its end (never a guess).

    Parts and usage are reported exactly as recorded. Only a provable end gives a result:
    ``completed``; a failure with the runner's message; an abort, which is the cancel's
    acknowledgement when one was requested and otherwise a failed turn (Braid did not ask
    for it: the runner aborted because Braid went away).
    """
    how = _SETTLED[settled]
    if not turn.started:
        return Reconciliation(None, f"after the restart {turn.ending} ({how})", settled)
    for part in turn.parts:
        await sink.part(part)
    if turn.usage.source != "none":
        await sink.usage(turn.usage, turn.cost_usd)
    if not turn.finished:
        return Reconciliation(
            None, f"after the restart {turn.ending}: not provably over ({how})", settled
        )
    outcome: Literal["completed", "failed", "cancelled"] = "completed"
    reason: str | None = None
    acknowledged: bool | None = None
    if turn.ending.startswith("aborted"):
        if request.cancel_requested:
            outcome, acknowledged = "cancelled", True
        else:
            outcome = "failed"
            reason = f"turn_aborted: the runner aborted the turn after Braid restarted ({how})"
    elif turn.ending != "completed":
        outcome, reason = "failed", turn.ending.removeprefix("failed: ")
    result = TurnResult(
        outcome=outcome,
        reason=reason,
        usage=turn.usage,
        cost_usd=turn.cost_usd,
        session_id=request.session_id,
        session_boundary=boundary if outcome == "completed" else None,
        cancel_acknowledged=acknowledged,
    )
    return Reconciliation(result, f"the runner's record shows the turn {turn.ending}", settled)


def find_strays(home: Path) -> list[WorkerInfo]:
    """Processes whose ``HOME`` is ``home``: a CLI runner's processes (each Braid home gives
    its runner a home of its own). After a restart, those of no recorded worker's group
    were started by the previous supervisor but never journaled: nobody owns them."""
    wanted = str(home)
    found: list[WorkerInfo] = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if proc.environ().get("HOME") != wanted or proc.pid == os.getpid():
                continue
            found.append(
                WorkerInfo(
                    pid=proc.pid,
                    create_time=float(proc.info["create_time"]),
                    pgid=os.getpgid(proc.pid),
                    command=tuple(proc.cmdline())[:32],
                )
            )
        except (psutil.Error, ProcessLookupError):
            continue
    return found
