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

from braid_actors.errors import (
    CrossWorkspaceBinding,
    DuplicateIdentifier,
    IllegalTransition,
    IntegrityError,
    UnknownMessage,
    UnknownTurn,
)
from braid_actors.graph._apply_runs import RUN_HANDLERS
from braid_actors.graph._apply_workers import WORKER_HANDLERS
from braid_actors.graph._checks import (
    check_boundary,
    check_edge,
    check_environment,
    check_new_branch,
    new,
    reposition,
)
from braid_actors.graph._queries import get_branch, get_conversation
from braid_actors.graph._replace import replace
from braid_actors.graph._runs import is_terminal
from braid_actors.model import (
    BindingClosed,
    BranchCreated,
    BranchFocused,
    ConversationCloned,
    ConversationCreated,
    DraftSet,
    EnvironmentBound,
    Event,
    Message,
    OverridesSet,
    TurnSubmitted,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from braid_actors.graph._state import GraphState

# ---- handlers --------------------------------------------------------------------------


def _conversation_created(state: GraphState, ev: ConversationCreated, _seq: int | None) -> None:
    conv, branch, env = ev.conversation, ev.branch, ev.environment
    new(state.conversations, conv.conversation_id, "conversation")
    check_new_branch(state, branch)
    if branch.source is not None:
        raise IntegrityError("a conversation's first branch has no source boundary")
    if branch.conversation_id != conv.conversation_id or conv.active_branch_id != branch.branch_id:
        raise IntegrityError("the first branch must belong to and be active in its conversation")
    if env is not None:
        new(state.environments, env.environment_id, "environment")
        if env.workspace != conv.workspace or branch.environment_id != env.environment_id:
            raise CrossWorkspaceBinding("a new environment must be the conversation's workspace")
    else:
        check_environment(state, conv.workspace, branch.environment_id)
    state.conversations[conv.conversation_id] = conv
    state.branches[branch.branch_id] = branch
    if env is not None:
        state.environments[env.environment_id] = env


def _branch_created(state: GraphState, ev: BranchCreated, _seq: int | None) -> None:
    branch = ev.branch
    conv = get_conversation(state, branch.conversation_id)
    check_new_branch(state, branch)
    check_boundary(state, branch)
    assert branch.source is not None
    source = get_branch(state, branch.source.branch_id)
    if source.conversation_id != branch.conversation_id:
        raise IntegrityError("/branch stays inside its conversation; use /clone")
    check_environment(state, conv.workspace, branch.environment_id)
    check_edge(state, ev.edge, "branched_at", new_nodes=frozenset({branch.branch_id}))
    if ev.edge.destination_id != branch.branch_id:
        raise IntegrityError("the branched_at edge must end at the new branch")
    state.branches[branch.branch_id] = branch
    state.add_edge(ev.edge)


def _conversation_cloned(state: GraphState, ev: ConversationCloned, _seq: int | None) -> None:
    conv, branch = ev.conversation, ev.branch
    new(state.conversations, conv.conversation_id, "conversation")
    check_new_branch(state, branch)
    check_boundary(state, branch)
    if branch.conversation_id != conv.conversation_id or conv.active_branch_id != branch.branch_id:
        raise IntegrityError("the clone's branch must belong to and be active in the clone")
    check_environment(state, conv.workspace, branch.environment_id)
    check_edge(state, ev.edge, "cloned_from", new_nodes=frozenset({conv.conversation_id}))
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
    state.branches[branch.branch_id] = replace(branch, draft=ev.draft)


def _overrides_set(state: GraphState, ev: OverridesSet, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    state.branches[branch.branch_id] = replace(branch, overrides=ev.overrides)


def _binding_closed(state: GraphState, ev: BindingClosed, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    binding = branch.binding
    if binding is None or binding.state != "bound" or binding.session_id != ev.session_id:
        raise IllegalTransition("only the branch's bound native session can be closed")
    if any(
        r.branch_id == branch.branch_id and r.state != "queued" and not is_terminal(r.state)
        for r in state.runs.values()
    ):
        raise IllegalTransition("the branch's session is in use by an active run")
    state.branches[branch.branch_id] = replace(branch, binding=replace(binding, state="closed"))


def _environment_bound(state: GraphState, ev: EnvironmentBound, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    conv = get_conversation(state, branch.conversation_id)
    env = ev.environment
    known = state.environments.get(env.environment_id)
    if known is not None and known != env:
        raise DuplicateIdentifier(f"environment {env.environment_id} already exists differently")
    if ev.edge is not None:
        check_edge(state, ev.edge, "forked_environment", new_nodes=frozenset({env.environment_id}))
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
    state.branches[branch.branch_id] = replace(branch, environment_id=env.environment_id)


def _turn_submitted(state: GraphState, ev: TurnSubmitted, _seq: int | None) -> None:
    turn, msg, run = ev.turn, ev.message, ev.run
    branch = get_branch(state, turn.branch_id)
    new(state.turns, turn.turn_id, "turn")
    new(state.messages, msg.message_id, "message")
    new(state.runs, run.run_id, "run")
    same = {turn.conversation_id, msg.conversation_id, run.conversation_id}
    if same != {branch.conversation_id} or {msg.branch_id, run.branch_id} != {branch.branch_id}:
        raise IntegrityError("a turn, its message and its run belong to one branch")
    if msg.role != "user" or turn.user_message_id != msg.message_id or run.turn_id != turn.turn_id:
        raise IntegrityError("a turn starts with its own user message and run")
    if run.state != "queued" or turn.run_ids != (run.run_id,):
        raise IntegrityError("a submitted turn has exactly one queued run")
    check_edge(state, ev.edge, "continued", new_nodes=frozenset({turn.turn_id}))
    if ev.edge.destination_id != turn.turn_id:
        raise IntegrityError("the continued edge must end at the new turn")
    state.messages[msg.message_id] = msg
    state.runs[run.run_id] = run
    state.turns[turn.turn_id] = turn
    state.add_edge(ev.edge)
    state.queues.setdefault(branch.branch_id, []).append(run.run_id)
    state.branches[branch.branch_id] = replace(branch, draft="")
    reposition(state, branch.branch_id)


def _branch_focused(state: GraphState, ev: BranchFocused, _seq: int | None) -> None:
    branch = get_branch(state, ev.branch_id)
    conv = get_conversation(state, ev.conversation_id)
    if branch.conversation_id != conv.conversation_id:
        raise IntegrityError("a conversation can only focus one of its own branches")
    state.conversations[conv.conversation_id] = replace(conv, active_branch_id=branch.branch_id)


_HANDLERS: dict[type[Any], Callable[[GraphState, Any, int | None], None]] = {
    ConversationCreated: _conversation_created,
    BranchCreated: _branch_created,
    ConversationCloned: _conversation_cloned,
    DraftSet: _draft_set,
    OverridesSet: _overrides_set,
    BindingClosed: _binding_closed,
    EnvironmentBound: _environment_bound,
    BranchFocused: _branch_focused,
    TurnSubmitted: _turn_submitted,
    **RUN_HANDLERS,
    **WORKER_HANDLERS,
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
