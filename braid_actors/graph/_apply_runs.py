"""Event handlers for turns and runs: queueing, dispatch, streaming, interactions, endings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from braid_actors.errors import (
    DuplicateIdentifier,
    IllegalTransition,
    IntegrityError,
    InteractionNotPending,
    UnknownInteraction,
    UnknownMessage,
    UnknownRun,
    UnknownTurn,
)
from braid_actors.graph._checks import (
    check_edge,
    counted,
    get_run,
    live_run,
    new,
    reposition,
)
from braid_actors.graph._queries import get_branch
from braid_actors.graph._replace import replace
from braid_actors.graph._runs import FINISH_MOVES, is_terminal, next_state
from braid_actors.model import (
    Completeness,
    Run,
    RunAdmitted,
    RunCancelRequested,
    RunDispatched,
    RunEvents,
    RunFinished,
    RunInteractionAnswered,
    RunInteractionRequested,
    RunPartUpdated,
    RunRetried,
    RunSessionReported,
    RunUsageReported,
    RunWorkerStarted,
    TurnRunSelected,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from braid_actors.graph._state import GraphState


def _run_admitted(state: GraphState, ev: RunAdmitted, _seq: int | None) -> None:
    run = get_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "admit")
    queue = state.queues.get(run.branch_id, [])
    if run.branch_id in state.active:
        raise IllegalTransition(
            f"branch {run.branch_id} already has an active run {state.active[run.branch_id]}",
            details={"runId": run.run_id, "branchId": run.branch_id},
        )
    if not queue or queue[0] != run.run_id:
        raise IllegalTransition(
            f"run {run.run_id} is not first in its branch queue",
            details={"runId": run.run_id},
        )
    queue.pop(0)
    state.active[run.branch_id] = run.run_id
    state.runs[run.run_id] = replace(run, state=target)
    turn = state.turns[run.turn_id]
    state.turns[turn.turn_id] = replace(turn, queue_position=None)
    reposition(state, run.branch_id)


def _run_dispatched(state: GraphState, ev: RunDispatched, seq: int | None) -> None:
    run = get_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "dispatch")
    msg = ev.assistant_message
    new(state.messages, msg.message_id, "message")
    if msg.role != "assistant" or msg.source_run_id != run.run_id or msg.branch_id != run.branch_id:
        raise IntegrityError("a run's reply is an assistant message of that run and branch")
    branch = get_branch(state, run.branch_id)
    turn = state.turns[run.turn_id]
    local = list(branch.message_ids)
    if turn.user_message_id not in local:
        local.extend((turn.user_message_id, msg.message_id))
    else:
        # A retry: its reply goes right after the turn's earlier replies, not at the tip.
        at = local.index(turn.user_message_id) + 1
        while at < len(local) and state.messages[local[at]].source_run_id in turn.run_ids:
            at += 1
        local.insert(at, msg.message_id)
    if ev.edge is not None:
        check_edge(state, ev.edge, "handed_off")
        if ev.edge.destination_id != run.run_id or ev.session_mode != "handed_off":
            raise IntegrityError("a handed_off edge ends at a run that copies context")
    state.messages[msg.message_id] = msg
    state.branches[branch.branch_id] = replace(branch, message_ids=tuple(local))
    if ev.edge is not None:
        state.add_edge(ev.edge)
    state.runs[run.run_id] = replace(
        run,
        state=target,
        receipt=ev.receipt,
        session_mode=ev.session_mode,
        assistant_message_id=msg.message_id,
        started_at=ev.at,
        events=counted(run, seq),
    )


def _with_cursor(run: Run, cursor: int | None) -> int:
    if cursor is None:
        return run.provider_cursor
    return max(run.provider_cursor, cursor)


def _run_worker_started(state: GraphState, ev: RunWorkerStarted, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    worker = ev.worker
    new(state.workers, worker.worker_id, "worker")
    if worker.run_id != run.run_id or worker.parent_worker_id is not None:
        raise IntegrityError("a run's root worker belongs to the run and has no parent")
    check_edge(state, ev.edge, "spawned", new_nodes=frozenset({worker.worker_id}))
    if (ev.edge.source_id, ev.edge.destination_id) != (run.run_id, worker.worker_id):
        raise IntegrityError("the root worker's spawned edge runs from the run to the worker")
    state.workers[worker.worker_id] = worker
    state.add_edge(ev.edge)
    state.runs[run.run_id] = replace(
        run,
        runtime_id=worker.worker_id,
        worker_ids=(*run.worker_ids, worker.worker_id),
        events=counted(run, seq),
        provider_cursor=_with_cursor(run, ev.cursor),
    )


def _run_session_reported(state: GraphState, ev: RunSessionReported, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    if ev.resumed and run.session_mode != "continued":
        raise IntegrityError(
            f"run {run.run_id} was dispatched as a {run.session_mode} session and can't be "
            "reported as resumed",
            details={"runId": run.run_id},
        )
    state.runs[run.run_id] = replace(
        run,
        provider_session_id=ev.session_id,
        trace_path=ev.trace_path,
        events=counted(run, seq),
        provider_cursor=_with_cursor(run, ev.cursor),
        context_receipt=(
            ev.context_receipt if ev.context_receipt is not None else run.context_receipt
        ),
    )


def _run_part_updated(state: GraphState, ev: RunPartUpdated, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    if ev.message_id != run.assistant_message_id:
        raise UnknownMessage(
            f"message {ev.message_id} is not run {run.run_id}'s reply",
            details={"messageId": ev.message_id},
        )
    msg = state.messages[ev.message_id]
    part_id = ev.part.part_id
    parts = msg.parts
    # The hot path of every stream: a new version of the message's last part.
    if parts and parts[-1].part_id == part_id:
        new_parts = (*parts[:-1], ev.part)
    else:
        listed = list(parts)
        for index, part in enumerate(listed):
            if part.part_id == part_id:
                listed[index] = ev.part
                break
        else:
            listed.append(ev.part)
        new_parts = tuple(listed)
    count = run.events.count + 1
    # ``replace`` (not ``attrs.evolve``): this runs once per provider event, and evolve's
    # generic field walk was a fifth of the journal's cost.
    state.messages[msg.message_id] = replace(
        msg,
        parts=new_parts,
        updated_at=ev.at,
        completeness=Completeness(state="streaming", last_event_seq=count),
    )
    state.runs[run.run_id] = replace(
        run,
        events=RunEvents(count=count, last_seq=seq),
        provider_cursor=_with_cursor(run, ev.cursor),
    )


def _run_interaction_requested(
    state: GraphState, ev: RunInteractionRequested, seq: int | None
) -> None:
    run = live_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "block")
    if any(i.interaction_id == ev.interaction.interaction_id for i in run.interactions):
        raise DuplicateIdentifier(f"interaction {ev.interaction.interaction_id} already exists")
    if ev.interaction.state != "pending":
        raise IntegrityError("a new interaction is pending")
    state.runs[run.run_id] = replace(
        run,
        state=target,
        interactions=(*run.interactions, ev.interaction),
        events=counted(run, seq),
        provider_cursor=_with_cursor(run, ev.cursor),
    )


def _run_interaction_answered(
    state: GraphState, ev: RunInteractionAnswered, seq: int | None
) -> None:
    run = live_run(state, ev.run_id)
    found = [i for i in run.interactions if i.interaction_id == ev.interaction_id]
    if not found:
        raise UnknownInteraction(
            f"run {run.run_id} has no interaction {ev.interaction_id}",
            details={"interactionId": ev.interaction_id},
        )
    if found[0].state != "pending":
        raise InteractionNotPending(
            f"interaction {ev.interaction_id} is {found[0].state}",
            details={"interactionId": ev.interaction_id},
        )
    interactions = tuple(
        replace(i, state="answered", answer=dict(ev.answer), answered_at=ev.at)
        if i.interaction_id == ev.interaction_id
        else i
        for i in run.interactions
    )
    still_pending = any(i.state == "pending" for i in interactions)
    target = run.state if still_pending else next_state(run.run_id, run.state, "unblock")
    state.runs[run.run_id] = replace(
        run, state=target, interactions=interactions, events=counted(run, seq)
    )


def _run_usage_reported(state: GraphState, ev: RunUsageReported, seq: int | None) -> None:
    run = live_run(state, ev.run_id)
    state.runs[run.run_id] = replace(
        run,
        usage=ev.usage,
        cost_usd=ev.cost_usd,
        events=counted(run, seq),
        provider_cursor=_with_cursor(run, ev.cursor),
    )


def _run_finished(state: GraphState, ev: RunFinished, seq: int | None) -> None:
    run = get_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, FINISH_MOVES[ev.state])
    branch = get_branch(state, run.branch_id)
    if ev.binding is not None and ev.binding.state == "bound" and ev.binding.session_id is None:
        raise IntegrityError("a bound provider binding names its session")
    was_queued = run.state == "queued"
    if run.assistant_message_id is not None:
        msg = state.messages[run.assistant_message_id]
        done = ev.state == "succeeded"
        completeness = Completeness(
            state="complete" if done else "incomplete",
            last_event_seq=run.events.count,
            missing=None if done else f"after run event {run.events.count} ({ev.state})",
        )
        state.messages[msg.message_id] = replace(msg, completeness=completeness, updated_at=ev.at)
    interactions = tuple(
        replace(i, state="cancelled") if i.state == "pending" else i for i in run.interactions
    )
    state.runs[run.run_id] = replace(
        run,
        state=target,
        outcome=ev.outcome,
        usage=ev.usage,
        cost_usd=ev.cost_usd,
        ended_at=ev.at,
        interactions=interactions,
        trace_ref=ev.trace_ref or run.trace_ref,
        events=counted(run, seq),
        provider_cursor=_with_cursor(run, ev.cursor),
    )
    if was_queued:
        state.queues[run.branch_id].remove(run.run_id)
        reposition(state, run.branch_id)
        turn = state.turns[run.turn_id]
        state.turns[turn.turn_id] = replace(turn, queue_position=None)
    elif state.active.get(run.branch_id) == run.run_id:
        del state.active[run.branch_id]
    turn = state.turns[run.turn_id]
    if turn.selected_run_id is None and ev.state == "succeeded":
        state.turns[turn.turn_id] = replace(turn, selected_run_id=run.run_id)
    if ev.binding is not None:
        state.branches[branch.branch_id] = replace(
            state.branches[branch.branch_id], binding=ev.binding
        )


def _run_cancel_requested(state: GraphState, ev: RunCancelRequested, seq: int | None) -> None:
    run = get_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "request_cancel")
    state.runs[run.run_id] = replace(
        run, state=target, cancel_reason=ev.reason, events=counted(run, seq)
    )


def _run_retried(state: GraphState, ev: RunRetried, _seq: int | None) -> None:
    turn = state.turns.get(ev.turn_id)
    if turn is None:
        raise UnknownTurn(f"no turn {ev.turn_id}", details={"turnId": ev.turn_id})
    run = ev.run
    new(state.runs, run.run_id, "run")
    previous = [state.runs[r] for r in turn.run_ids]
    active = [r.run_id for r in previous if not is_terminal(r.state)]
    if active:
        raise IllegalTransition(
            f"turn {turn.turn_id} still has an unfinished run {active[0]}",
            details={"turnId": turn.turn_id, "runId": active[0]},
        )
    if (run.turn_id, run.branch_id, run.conversation_id, run.state) != (
        turn.turn_id,
        turn.branch_id,
        turn.conversation_id,
        "queued",
    ):
        raise IntegrityError("a retry is a queued run of the same turn and branch")
    check_edge(state, ev.edge, "retried", new_nodes=frozenset({run.run_id}))
    if (ev.edge.source_id, ev.edge.destination_id) != (turn.run_ids[-1], run.run_id):
        raise IntegrityError("the retried edge runs from the turn's last run to the new one")
    state.runs[run.run_id] = run
    state.add_edge(ev.edge)
    state.turns[turn.turn_id] = replace(turn, run_ids=(*turn.run_ids, run.run_id))
    state.queues.setdefault(turn.branch_id, []).append(run.run_id)
    reposition(state, turn.branch_id)


def _turn_run_selected(state: GraphState, ev: TurnRunSelected, _seq: int | None) -> None:
    turn = state.turns.get(ev.turn_id)
    if turn is None:
        raise UnknownTurn(f"no turn {ev.turn_id}", details={"turnId": ev.turn_id})
    if ev.run_id not in turn.run_ids:
        raise UnknownRun(
            f"run {ev.run_id} is not an attempt of turn {turn.turn_id}",
            details={"runId": ev.run_id},
        )
    if not is_terminal(state.runs[ev.run_id].state):
        raise IllegalTransition(
            f"run {ev.run_id} has not finished; only a finished attempt can be selected",
            details={"runId": ev.run_id},
        )
    state.turns[turn.turn_id] = replace(turn, selected_run_id=ev.run_id)


RUN_HANDLERS: dict[type[Any], Callable[[GraphState, Any, int | None], None]] = {
    RunAdmitted: _run_admitted,
    RunDispatched: _run_dispatched,
    RunWorkerStarted: _run_worker_started,
    RunSessionReported: _run_session_reported,
    RunPartUpdated: _run_part_updated,
    RunInteractionRequested: _run_interaction_requested,
    RunInteractionAnswered: _run_interaction_answered,
    RunUsageReported: _run_usage_reported,
    RunFinished: _run_finished,
    RunCancelRequested: _run_cancel_requested,
    RunRetried: _run_retried,
    TurnRunSelected: _turn_run_selected,
}
