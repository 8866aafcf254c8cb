"""Client views of graph records (run record, conversation, graph) in wire form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from braid_actors import graph
from braid_actors.app._wire import to_wire
from braid_actors.model import Run, digest

if TYPE_CHECKING:
    from braid_actors.graph import GraphState

SESSION_LABELS = {
    "new": "new session",
    "handed_off": "new session with copied context",
    "continued": "resumed session",
    "forked": "new session forked from the source session",
}


def run_record(state: GraphState, run: Run) -> dict[str, Any]:
    """The headless run record: the run's fields plus queue position and session label."""
    view: dict[str, Any] = to_wire(run)
    view["queuePosition"] = graph.queue_position(state, run.branch_id, run.run_id)
    # The label is derived from the recorded session mode, never from the provider's claim.
    view["sessionLabel"] = SESSION_LABELS.get(run.session_mode or "")
    return view


def branch_view(state: GraphState, branch_id: str) -> dict[str, Any]:
    branch = state.branches[branch_id]
    view: dict[str, Any] = to_wire(branch)
    view["history"] = graph.history(state, branch_id)
    view["activeRunId"] = state.active.get(branch_id)
    view["queue"] = list(state.queues.get(branch_id, []))
    view["effectiveRunner"] = graph.effective_runner(state, branch)
    return view


def conversation_view(state: GraphState, conversation_id: str) -> dict[str, Any]:
    conv = graph.get_conversation(state, conversation_id)
    branches = graph.branches_of(state, conversation_id)
    branch_ids = {b.branch_id for b in branches}
    visible: set[str] = set()
    for b in branches:
        visible.update(graph.history(state, b.branch_id))
    messages = sorted(
        (
            m
            for m in state.messages.values()
            if m.message_id in visible or m.branch_id in branch_ids
        ),
        key=lambda m: (m.created_at, m.message_id),
    )
    turns = sorted(
        (t for t in state.turns.values() if t.conversation_id == conversation_id),
        key=lambda t: (t.created_at, t.turn_id),
    )
    runs = sorted(
        (r for r in state.runs.values() if r.conversation_id == conversation_id),
        key=lambda r: (r.created_at, r.run_id),
    )
    return {
        "conversation": to_wire(conv),
        "branches": [branch_view(state, b.branch_id) for b in branches],
        "messages": [to_wire(m) for m in messages],
        "turns": [to_wire(t) for t in turns],
        "runs": [run_record(state, r) for r in runs],
    }


def conversation_summary(state: GraphState, conversation_id: str) -> dict[str, Any]:
    view: dict[str, Any] = to_wire(state.conversations[conversation_id])
    view["branchCount"] = len(graph.branches_of(state, conversation_id))
    return view


def graph_view(state: GraphState, conversation_id: str) -> dict[str, Any]:
    """Nodes and edges of one conversation, with a checksum over both."""
    conv = graph.get_conversation(state, conversation_id)
    nodes: list[dict[str, Any]] = [
        {"id": conv.conversation_id, "kind": "conversation", "label": conv.title}
    ]
    branches = graph.branches_of(state, conversation_id)
    for b in branches:
        nodes.append(
            {
                "id": b.branch_id,
                "kind": "branch",
                "source": to_wire(b.source),
                "environmentId": b.environment_id,
            }
        )
    for m in sorted(state.messages.values(), key=lambda m: (m.created_at, m.message_id)):
        if m.conversation_id == conversation_id:
            nodes.append(
                {
                    "id": m.message_id,
                    "kind": "message",
                    "role": m.role,
                    "branchId": m.branch_id,
                    "complete": m.completeness.state,
                }
            )
    for t in sorted(state.turns.values(), key=lambda t: (t.created_at, t.turn_id)):
        if t.conversation_id == conversation_id:
            nodes.append(
                {
                    "id": t.turn_id,
                    "kind": "turn",
                    "branchId": t.branch_id,
                    "userMessageId": t.user_message_id,
                    "runIds": list(t.run_ids),
                }
            )
    for r in sorted(state.runs.values(), key=lambda r: (r.created_at, r.run_id)):
        if r.conversation_id == conversation_id:
            nodes.append(
                {
                    "id": r.run_id,
                    "kind": "run",
                    "turnId": r.turn_id,
                    "state": r.state,
                    "runner": r.runner,
                    "receipt": r.receipt,
                }
            )
    env_ids = sorted({b.environment_id for b in branches if b.environment_id is not None})
    for env_id in env_ids:
        env = state.environments[env_id]
        nodes.append(
            {
                "id": env_id,
                "kind": "environment",
                "provider": env.provider,
                "workspace": env.workspace,
            }
        )
    ids = {n["id"] for n in nodes}
    edges = [
        to_wire(e)
        for e in sorted(state.edges.values(), key=lambda e: (e.created_at, e.edge_id))
        if e.source_id in ids or e.destination_id in ids
    ]
    for e in edges:
        for end in ("sourceId", "destinationId"):
            if e[end] not in ids:
                nodes.append({"id": e[end], "kind": "external"})
                ids.add(e[end])
    return {"nodes": nodes, "edges": edges, "checksum": digest({"nodes": nodes, "edges": edges})}
