"""Read-only questions about a graph state: ancestry, context, tips, queue positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors.errors import MissingBoundary, UnknownBranch, UnknownConversation

if TYPE_CHECKING:
    from braid_actors.graph._state import GraphState
    from braid_actors.model import Branch, Conversation, Message


def get_branch(state: GraphState, branch_id: str) -> Branch:
    """The branch, or ``unknown_branch``."""
    branch = state.branches.get(branch_id)
    if branch is None:
        raise UnknownBranch(f"no branch {branch_id}", details={"branchId": branch_id})
    return branch


def get_conversation(state: GraphState, conversation_id: str) -> Conversation:
    """The conversation, or ``unknown_conversation``."""
    conv = state.conversations.get(conversation_id)
    if conv is None:
        raise UnknownConversation(
            f"no conversation {conversation_id}", details={"conversationId": conversation_id}
        )
    return conv


def history(state: GraphState, branch_id: str, *, all_attempts: bool = False) -> list[str]:
    """Message ids visible on a branch, oldest first: ancestry through its boundary + local.

    Ancestry is followed iteratively (boundary links can chain across branches and
    conversations); each step keeps the source's history only through the boundary message.
    Of a turn's several attempts only the chosen reply is shown (see :func:`_shown`);
    a boundary message always stays visible, so a branch's ancestry never breaks.
    ``all_attempts`` returns every reply, selected or not (the raw sequence).
    """
    chain: list[Branch] = []
    seen: set[str] = set()
    current: Branch | None = get_branch(state, branch_id)
    while current is not None:
        if current.branch_id in seen:
            raise MissingBoundary(
                f"branch {branch_id} has cyclic ancestry", details={"branchId": branch_id}
            )
        seen.add(current.branch_id)
        chain.append(current)
        current = (
            get_branch(state, current.source.branch_id) if current.source is not None else None
        )
    ids: list[str] = []
    # Walk from the root down: each child keeps its parent's history through its boundary.
    for index in range(len(chain) - 1, -1, -1):
        branch = chain[index]
        if index < len(chain) - 1:
            boundary = branch.source
            assert boundary is not None
            if boundary.through_message_id is None:
                ids = []
            else:
                try:
                    cut = ids.index(boundary.through_message_id)
                except ValueError:
                    raise MissingBoundary(
                        f"branch {branch.branch_id} starts after message "
                        f"{boundary.through_message_id}, which its source does not contain",
                        details={"branchId": branch.branch_id},
                    ) from None
                ids = ids[: cut + 1]
        ids.extend(branch.message_ids)
    if all_attempts:
        return ids
    keep = {b.source.through_message_id for b in chain if b.source is not None}
    return [mid for mid in ids if mid in keep or _shown(state, mid)]


def _shown(state: GraphState, message_id: str) -> bool:
    """A reply is shown unless its turn has several attempts and another one is chosen.

    The chosen attempt is the selected run, else the latest; alternates stay in the graph.
    """
    msg = state.messages[message_id]
    if msg.source_run_id is None:
        return True
    run = state.runs.get(msg.source_run_id)
    if run is None:
        return True
    turn = state.turns[run.turn_id]
    if len(turn.run_ids) < 2:
        return True
    chosen = turn.selected_run_id or turn.run_ids[-1]
    return run.run_id == chosen


def history_messages(state: GraphState, branch_id: str) -> list[Message]:
    """The messages of :func:`history`."""
    return [state.messages[mid] for mid in history(state, branch_id)]


def tip(state: GraphState, branch_id: str) -> str | None:
    """The last visible message id of a branch, or null when it has none."""
    ids = history(state, branch_id)
    return ids[-1] if ids else None


def queue_position(state: GraphState, branch_id: str, run_id: str) -> int | None:
    """1-based position of a queued run on its branch, null when not queued."""
    queue = state.queues.get(branch_id, [])
    return queue.index(run_id) + 1 if run_id in queue else None


def branches_of(state: GraphState, conversation_id: str) -> list[Branch]:
    """Branches of a conversation in creation order."""
    return sorted(
        (b for b in state.branches.values() if b.conversation_id == conversation_id),
        key=lambda b: (b.created_at, b.branch_id),
    )
