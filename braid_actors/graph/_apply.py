"""``apply(state, event)``: validate an event against the graph, then fold it in.

Design note: every handler first checks everything it needs and only then mutates, so an
event that raises leaves the state exactly as it was. The checks are the graph's integrity
rules, each with its own stable error code:

- identifiers an event introduces must be new (``duplicate_identifier``);
- edges join existing nodes and never close a cycle (``graph_cycle``);
- a branch's boundary names a message its source branch really shows (``missing_boundary``);
- an environment bound to a branch belongs to the conversation's workspace, unless a
  ``forked_environment`` edge explicitly brings it in (``cross_workspace_binding``);
- a terminal run accepts nothing (``terminal_run_mutation``); other illegal run moves are
  ``illegal_transition`` (see ``_runs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from braid_actors.errors import (
    CrossWorkspaceBinding,
    CycleDetected,
    DuplicateIdentifier,
    IllegalTransition,
    IntegrityError,
    InteractionNotPending,
    MissingBoundary,
    UnknownEnvironment,
    UnknownInteraction,
    UnknownMessage,
    UnknownRun,
    UnknownTurn,
)
from braid_actors.graph._queries import get_branch, get_conversation, history
from braid_actors.graph._runs import FINISH_MOVES, LIVE_STATES, is_terminal, next_state
from braid_actors.model import (
    Branch,
    BranchCreated,
    Completeness,
    ConversationCloned,
    ConversationCreated,
    DraftSet,
    Edge,
    EnvironmentBound,
    Event,
    Message,
    OverridesSet,
    Run,
    RunAdmitted,
    RunDispatched,
    RunEvents,
    RunFinished,
    RunInteractionAnswered,
    RunInteractionRequested,
    RunPartUpdated,
    RunSessionReported,
    RunUsageReported,
    RunWorkerStarted,
    TurnSubmitted,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from braid_actors.graph._state import GraphState

# ---- shared checks ---------------------------------------------------------------------


def _new(collection: dict[str, Any], key: str, what: str) -> None:
    if key in collection:
        raise DuplicateIdentifier(f"{what} {key} already exists", details={"id": key})


def _node_exists(state: GraphState, node_id: str) -> bool:
    return any(
        node_id in coll
        for coll in (
            state.conversations,
            state.branches,
            state.messages,
            state.turns,
            state.runs,
            state.environments,
        )
    )


def _reaches(state: GraphState, start: str, goal: str) -> bool:
    """True when following edges from ``start`` arrives at ``goal``."""
    out = state.out_edges
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack.extend(out.get(node, ()))
    return False


def _check_edge(
    state: GraphState, edge: Edge, kind: str, *, new_nodes: frozenset[str] = frozenset()
) -> None:
    _new(state.edges, edge.edge_id, "edge")
    if edge.kind != kind:
        raise IntegrityError(
            f"edge {edge.edge_id} must be {kind}, not {edge.kind}",
            details={"edgeId": edge.edge_id},
        )
    for node in (edge.source_id, edge.destination_id):
        if node not in new_nodes and not _node_exists(state, node):
            raise IntegrityError(
                f"edge {edge.edge_id} names unknown node {node}",
                details={"edgeId": edge.edge_id, "node": node},
            )
    if edge.source_id == edge.destination_id or _reaches(
        state, edge.destination_id, edge.source_id
    ):
        raise CycleDetected(
            f"edge {edge.edge_id} would close a cycle", details={"edgeId": edge.edge_id}
        )


def _check_boundary(state: GraphState, branch: Branch) -> None:
    boundary = branch.source
    if boundary is None:
        raise MissingBoundary(
            f"branch {branch.branch_id} needs a source boundary",
            details={"branchId": branch.branch_id},
        )
    if boundary.branch_id == branch.branch_id:
        raise CycleDetected(
            f"branch {branch.branch_id} can't descend from itself",
            details={"branchId": branch.branch_id},
        )
    visible = history(state, boundary.branch_id)
    for mid in (boundary.through_message_id, boundary.selected_message_id):
        if mid is not None and mid not in visible:
            raise MissingBoundary(
                f"message {mid} is not on branch {boundary.branch_id}",
                details={"branchId": boundary.branch_id, "messageId": mid},
            )
    if boundary.selected_message_id is not None and boundary.through_message_id is not None:
        sel = visible.index(boundary.selected_message_id)
        thr = visible.index(boundary.through_message_id)
        if thr > sel:
            raise MissingBoundary(
                "a boundary can't extend past the selected message",
                details={"branchId": boundary.branch_id},
            )
    if boundary.through_message_id is not None:
        through = state.messages[boundary.through_message_id]
        if through.completeness.state == "streaming":
            raise MissingBoundary(
                f"message {through.message_id} is still streaming; wait for its run",
                details={"messageId": through.message_id},
            )


def _check_new_branch(state: GraphState, branch: Branch) -> None:
    _new(state.branches, branch.branch_id, "branch")
    if branch.message_ids:
        raise IntegrityError(
            "a new branch starts with no local messages",
            details={"branchId": branch.branch_id},
        )
    if branch.binding is not None and branch.binding.state != "unbound":
        raise IntegrityError(
            "a new branch starts with a fresh provider binding",
            details={"branchId": branch.branch_id},
        )


def _check_environment(state: GraphState, workspace: str, environment_id: str | None) -> None:
    if environment_id is None:
        return
    env = state.environments.get(environment_id)
    if env is None:
        raise UnknownEnvironment(
            f"no environment {environment_id}", details={"environmentId": environment_id}
        )
    if env.workspace != workspace and not any(
        e.kind == "forked_environment" and e.destination_id == environment_id
        for e in state.edges.values()
    ):
        raise CrossWorkspaceBinding(
            f"environment {environment_id} belongs to another workspace",
            details={"environmentId": environment_id},
        )


def _run(state: GraphState, run_id: str) -> Run:
    run = state.runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id}", details={"runId": run_id})
    return run


def _live_run(state: GraphState, run_id: str) -> Run:
    run = _run(state, run_id)
    if is_terminal(run.state):
        next_state(run_id, run.state, "block")  # raises terminal_run_mutation
    if run.state not in LIVE_STATES:
        raise IllegalTransition(
            f"run {run_id} is {run.state} and produces no events yet",
            details={"runId": run_id, "state": run.state},
        )
    return run


def _counted(run: Run, seq: int | None) -> RunEvents:
    return RunEvents(count=run.events.count + 1, last_seq=seq)


def _reposition(state: GraphState, branch_id: str) -> None:
    for pos, run_id in enumerate(state.queues.get(branch_id, []), start=1):
        turn = state.turns[state.runs[run_id].turn_id]
        if turn.queue_position != pos:
            state.turns[turn.turn_id] = attrs.evolve(turn, queue_position=pos)


# ---- handlers --------------------------------------------------------------------------


def _conversation_created(state: GraphState, ev: ConversationCreated, _seq: int | None) -> None:
    conv, branch, env = ev.conversation, ev.branch, ev.environment
    _new(state.conversations, conv.conversation_id, "conversation")
    _check_new_branch(state, branch)
    if branch.source is not None:
        raise IntegrityError("a conversation's first branch has no source boundary")
    if branch.conversation_id != conv.conversation_id or conv.active_branch_id != branch.branch_id:
        raise IntegrityError("the first branch must belong to and be active in its conversation")
    if env is not None:
        _new(state.environments, env.environment_id, "environment")
        if env.workspace != conv.workspace or branch.environment_id != env.environment_id:
            raise CrossWorkspaceBinding("a new environment must be the conversation's workspace")
    else:
        _check_environment(state, conv.workspace, branch.environment_id)
    state.conversations[conv.conversation_id] = conv
    state.branches[branch.branch_id] = branch
    if env is not None:
        state.environments[env.environment_id] = env


def _branch_created(state: GraphState, ev: BranchCreated, _seq: int | None) -> None:
    branch = ev.branch
    conv = get_conversation(state, branch.conversation_id)
    _check_new_branch(state, branch)
    _check_boundary(state, branch)
    assert branch.source is not None
    source = get_branch(state, branch.source.branch_id)
    if source.conversation_id != branch.conversation_id:
        raise IntegrityError("/branch stays inside its conversation; use /clone")
    _check_environment(state, conv.workspace, branch.environment_id)
    _check_edge(state, ev.edge, "branched_at", new_nodes=frozenset({branch.branch_id}))
    if ev.edge.destination_id != branch.branch_id:
        raise IntegrityError("the branched_at edge must end at the new branch")
    state.branches[branch.branch_id] = branch
    state.add_edge(ev.edge)


def _conversation_cloned(state: GraphState, ev: ConversationCloned, _seq: int | None) -> None:
    conv, branch = ev.conversation, ev.branch
    _new(state.conversations, conv.conversation_id, "conversation")
    _check_new_branch(state, branch)
    _check_boundary(state, branch)
    if branch.conversation_id != conv.conversation_id or conv.active_branch_id != branch.branch_id:
        raise IntegrityError("the clone's branch must belong to and be active in the clone")
    _check_environment(state, conv.workspace, branch.environment_id)
    _check_edge(state, ev.edge, "cloned_from", new_nodes=frozenset({conv.conversation_id}))
    assert branch.source is not None
    if ev.edge.destination_id != conv.conversation_id or (
        ev.edge.source_id != branch.source.branch_id
    ):
        raise IntegrityError("the cloned_from edge joins the source branch and the clone")
    state.conversations[conv.conversation_id] = conv
    state.branches[branch.branch_id] = branch
    state.add_edge(ev.edge)


def _draft_set(state: GraphState, ev: DraftSet, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    state.branches[branch.branch_id] = attrs.evolve(branch, draft=ev.draft)


def _overrides_set(state: GraphState, ev: OverridesSet, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    state.branches[branch.branch_id] = attrs.evolve(branch, overrides=ev.overrides)


def _environment_bound(state: GraphState, ev: EnvironmentBound, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    conv = get_conversation(state, branch.conversation_id)
    env = ev.environment
    known = state.environments.get(env.environment_id)
    if known is not None and known != env:
        raise DuplicateIdentifier(f"environment {env.environment_id} already exists differently")
    if ev.edge is not None:
        _check_edge(state, ev.edge, "forked_environment", new_nodes=frozenset({env.environment_id}))
        if ev.edge.destination_id != env.environment_id:
            raise IntegrityError("the forked_environment edge must end at the environment")
    if (
        env.workspace != conv.workspace
        and ev.edge is None
        and not any(
            e.kind == "forked_environment" and e.destination_id == env.environment_id
            for e in state.edges.values()
        )
    ):
        raise CrossWorkspaceBinding(
            f"environment {env.environment_id} belongs to another workspace",
            details={"environmentId": env.environment_id},
        )
    state.environments[env.environment_id] = env
    if ev.edge is not None:
        state.add_edge(ev.edge)
    state.branches[branch.branch_id] = attrs.evolve(branch, environment_id=env.environment_id)


def _turn_submitted(state: GraphState, ev: TurnSubmitted, _seq: int | None) -> None:
    turn, msg, run = ev.turn, ev.message, ev.run
    branch = get_branch(state, turn.branch_id)
    _new(state.turns, turn.turn_id, "turn")
    _new(state.messages, msg.message_id, "message")
    _new(state.runs, run.run_id, "run")
    same = {turn.conversation_id, msg.conversation_id, run.conversation_id}
    if same != {branch.conversation_id} or {msg.branch_id, run.branch_id} != {branch.branch_id}:
        raise IntegrityError("a turn, its message and its run belong to one branch")
    if msg.role != "user" or turn.user_message_id != msg.message_id or run.turn_id != turn.turn_id:
        raise IntegrityError("a turn starts with its own user message and run")
    if run.state != "queued" or turn.run_ids != (run.run_id,):
        raise IntegrityError("a submitted turn has exactly one queued run")
    _check_edge(state, ev.edge, "continued", new_nodes=frozenset({turn.turn_id}))
    if ev.edge.destination_id != turn.turn_id:
        raise IntegrityError("the continued edge must end at the new turn")
    state.messages[msg.message_id] = msg
    state.runs[run.run_id] = run
    state.turns[turn.turn_id] = turn
    state.add_edge(ev.edge)
    state.queues.setdefault(branch.branch_id, []).append(run.run_id)
    state.branches[branch.branch_id] = attrs.evolve(branch, draft="")
    _reposition(state, branch.branch_id)


def _run_admitted(state: GraphState, ev: RunAdmitted, _seq: int | None) -> None:
    run = _run(state, ev.run_id)
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
    state.runs[run.run_id] = attrs.evolve(run, state=target)
    turn = state.turns[run.turn_id]
    state.turns[turn.turn_id] = attrs.evolve(turn, queue_position=None)
    _reposition(state, run.branch_id)


def _run_dispatched(state: GraphState, ev: RunDispatched, seq: int | None) -> None:
    run = _run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "dispatch")
    msg = ev.assistant_message
    _new(state.messages, msg.message_id, "message")
    if msg.role != "assistant" or msg.source_run_id != run.run_id or msg.branch_id != run.branch_id:
        raise IntegrityError("a run's reply is an assistant message of that run and branch")
    branch = get_branch(state, run.branch_id)
    turn = state.turns[run.turn_id]
    local = list(branch.message_ids)
    if turn.user_message_id not in local:
        local.append(turn.user_message_id)
    local.append(msg.message_id)
    state.messages[msg.message_id] = msg
    state.branches[branch.branch_id] = attrs.evolve(branch, message_ids=tuple(local))
    state.runs[run.run_id] = attrs.evolve(
        run,
        state=target,
        receipt=ev.receipt,
        session_mode=ev.session_mode,
        assistant_message_id=msg.message_id,
        started_at=ev.at,
        events=_counted(run, seq),
    )


def _run_worker_started(state: GraphState, ev: RunWorkerStarted, seq: int | None) -> None:
    run = _live_run(state, ev.run_id)
    state.runs[run.run_id] = attrs.evolve(
        run, runtime_id=ev.worker.worker_id, events=_counted(run, seq)
    )


def _run_session_reported(state: GraphState, ev: RunSessionReported, seq: int | None) -> None:
    run = _live_run(state, ev.run_id)
    if ev.resumed and run.session_mode != "continued":
        raise IntegrityError(
            f"run {run.run_id} was dispatched as a {run.session_mode} session and can't be "
            "reported as resumed",
            details={"runId": run.run_id},
        )
    state.runs[run.run_id] = attrs.evolve(
        run, provider_session_id=ev.session_id, trace_ref=ev.trace_path, events=_counted(run, seq)
    )


def _run_part_updated(state: GraphState, ev: RunPartUpdated, seq: int | None) -> None:
    run = _live_run(state, ev.run_id)
    if ev.message_id != run.assistant_message_id:
        raise UnknownMessage(
            f"message {ev.message_id} is not run {run.run_id}'s reply",
            details={"messageId": ev.message_id},
        )
    msg = state.messages[ev.message_id]
    parts = list(msg.parts)
    for index, part in enumerate(parts):
        if part.part_id == ev.part.part_id:
            parts[index] = ev.part
            break
    else:
        parts.append(ev.part)
    count = run.events.count + 1
    state.messages[msg.message_id] = attrs.evolve(
        msg,
        parts=tuple(parts),
        updated_at=ev.at,
        completeness=Completeness(state="streaming", last_event_seq=count),
    )
    state.runs[run.run_id] = attrs.evolve(run, events=RunEvents(count=count, last_seq=seq))


def _run_interaction_requested(
    state: GraphState, ev: RunInteractionRequested, seq: int | None
) -> None:
    run = _live_run(state, ev.run_id)
    target = next_state(run.run_id, run.state, "block")
    if any(i.interaction_id == ev.interaction.interaction_id for i in run.interactions):
        raise DuplicateIdentifier(f"interaction {ev.interaction.interaction_id} already exists")
    if ev.interaction.state != "pending":
        raise IntegrityError("a new interaction is pending")
    state.runs[run.run_id] = attrs.evolve(
        run,
        state=target,
        interactions=(*run.interactions, ev.interaction),
        events=_counted(run, seq),
    )


def _run_interaction_answered(
    state: GraphState, ev: RunInteractionAnswered, seq: int | None
) -> None:
    run = _live_run(state, ev.run_id)
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
        attrs.evolve(i, state="answered", answer=dict(ev.answer), answered_at=ev.at)
        if i.interaction_id == ev.interaction_id
        else i
        for i in run.interactions
    )
    still_pending = any(i.state == "pending" for i in interactions)
    target = run.state if still_pending else next_state(run.run_id, run.state, "unblock")
    state.runs[run.run_id] = attrs.evolve(
        run, state=target, interactions=interactions, events=_counted(run, seq)
    )


def _run_usage_reported(state: GraphState, ev: RunUsageReported, seq: int | None) -> None:
    run = _live_run(state, ev.run_id)
    state.runs[run.run_id] = attrs.evolve(
        run, usage=ev.usage, cost_usd=ev.cost_usd, events=_counted(run, seq)
    )


def _run_finished(state: GraphState, ev: RunFinished, seq: int | None) -> None:
    run = _run(state, ev.run_id)
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
        state.messages[msg.message_id] = attrs.evolve(
            msg, completeness=completeness, updated_at=ev.at
        )
    interactions = tuple(
        attrs.evolve(i, state="cancelled") if i.state == "pending" else i for i in run.interactions
    )
    state.runs[run.run_id] = attrs.evolve(
        run,
        state=target,
        outcome=ev.outcome,
        usage=ev.usage,
        cost_usd=ev.cost_usd,
        ended_at=ev.at,
        interactions=interactions,
        events=_counted(run, seq),
    )
    if was_queued:
        state.queues[run.branch_id].remove(run.run_id)
        _reposition(state, run.branch_id)
        turn = state.turns[run.turn_id]
        state.turns[turn.turn_id] = attrs.evolve(turn, queue_position=None)
    elif state.active.get(run.branch_id) == run.run_id:
        del state.active[run.branch_id]
    turn = state.turns[run.turn_id]
    if turn.selected_run_id is None and ev.state == "succeeded":
        state.turns[turn.turn_id] = attrs.evolve(turn, selected_run_id=run.run_id)
    if ev.binding is not None:
        state.branches[branch.branch_id] = attrs.evolve(
            state.branches[branch.branch_id], binding=ev.binding
        )


_HANDLERS: dict[type[Any], Callable[[GraphState, Any, int | None], None]] = {
    ConversationCreated: _conversation_created,
    BranchCreated: _branch_created,
    ConversationCloned: _conversation_cloned,
    DraftSet: _draft_set,
    OverridesSet: _overrides_set,
    EnvironmentBound: _environment_bound,
    TurnSubmitted: _turn_submitted,
    RunAdmitted: _run_admitted,
    RunDispatched: _run_dispatched,
    RunWorkerStarted: _run_worker_started,
    RunSessionReported: _run_session_reported,
    RunPartUpdated: _run_part_updated,
    RunInteractionRequested: _run_interaction_requested,
    RunInteractionAnswered: _run_interaction_answered,
    RunUsageReported: _run_usage_reported,
    RunFinished: _run_finished,
}


def apply(state: GraphState, event: Event, seq: int | None = None) -> GraphState:
    """Fold ``event`` into ``state`` (in place) and return it.

    ``seq`` is the event's journal sequence when known (recorded as a run's last event
    sequence). Raises an :class:`IntegrityError` (or a not-found error) and leaves ``state``
    unchanged when the event breaks a rule.
    """
    handler = _HANDLERS[type(event)]
    handler(state, event, seq)
    state.events += 1
    return state


def check_turn_branch(state: GraphState, turn_id: str) -> str:
    """The branch of a turn, or ``unknown_turn``."""
    turn = state.turns.get(turn_id)
    if turn is None:
        raise UnknownTurn(f"no turn {turn_id}", details={"turnId": turn_id})
    return turn.branch_id


def message(state: GraphState, message_id: str) -> Message:
    """A message, or ``unknown_message``."""
    msg = state.messages.get(message_id)
    if msg is None:
        raise UnknownMessage(f"no message {message_id}", details={"messageId": message_id})
    return msg
