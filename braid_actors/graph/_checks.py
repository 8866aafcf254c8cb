"""Integrity checks shared by the event handlers (each raises a stable error code)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from braid_actors.errors import (
    CrossWorkspaceBinding,
    CycleDetected,
    DuplicateIdentifier,
    IllegalTransition,
    IntegrityError,
    MissingBoundary,
    UnknownEnvironment,
    UnknownRun,
)
from braid_actors.graph._queries import history
from braid_actors.graph._replace import replace
from braid_actors.graph._runs import LIVE_STATES, is_terminal, next_state
from braid_actors.model import (
    Branch,
    Edge,
    Run,
    RunEvents,
)

if TYPE_CHECKING:
    from braid_actors.graph._state import GraphState

# ---- shared checks ---------------------------------------------------------------------


def new(collection: dict[str, Any], key: str, what: str) -> None:
    if key in collection:
        raise DuplicateIdentifier(f"{what} {key} already exists", details={"id": key})


def node_exists(state: GraphState, node_id: str) -> bool:
    return any(
        node_id in coll
        for coll in (
            state.conversations,
            state.branches,
            state.messages,
            state.turns,
            state.runs,
            state.environments,
            state.workers,
        )
    )


def reaches(state: GraphState, start: str, goal: str) -> bool:
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


def check_edge(
    state: GraphState, edge: Edge, kind: str, *, new_nodes: frozenset[str] = frozenset()
) -> None:
    new(state.edges, edge.edge_id, "edge")
    if edge.kind != kind:
        raise IntegrityError(
            f"edge {edge.edge_id} must be {kind}, not {edge.kind}",
            details={"edgeId": edge.edge_id},
        )
    for node in (edge.source_id, edge.destination_id):
        if node not in new_nodes and not node_exists(state, node):
            raise IntegrityError(
                f"edge {edge.edge_id} names unknown node {node}",
                details={"edgeId": edge.edge_id, "node": node},
            )
    if edge.source_id == edge.destination_id or reaches(state, edge.destination_id, edge.source_id):
        raise CycleDetected(
            f"edge {edge.edge_id} would close a cycle", details={"edgeId": edge.edge_id}
        )


def check_boundary(state: GraphState, branch: Branch) -> None:
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


def check_new_branch(state: GraphState, branch: Branch) -> None:
    new(state.branches, branch.branch_id, "branch")
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


def check_environment(state: GraphState, workspace: str, environment_id: str | None) -> None:
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


def get_run(state: GraphState, run_id: str) -> Run:
    run = state.runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id}", details={"runId": run_id})
    return run


def live_run(state: GraphState, run_id: str) -> Run:
    run = get_run(state, run_id)
    if is_terminal(run.state):
        next_state(run_id, run.state, "block")  # raises terminal_run_mutation
    if run.state not in LIVE_STATES:
        raise IllegalTransition(
            f"run {run_id} is {run.state} and produces no events yet",
            details={"runId": run_id, "state": run.state},
        )
    return run


def counted(run: Run, seq: int | None) -> RunEvents:
    return RunEvents(count=run.events.count + 1, last_seq=seq)


def reposition(state: GraphState, branch_id: str) -> None:
    for pos, run_id in enumerate(state.queues.get(branch_id, []), start=1):
        turn = state.turns[state.runs[run_id].turn_id]
        if turn.queue_position != pos:
            state.turns[turn.turn_id] = replace(turn, queue_position=pos)
