"""The conversation graph as a pure state machine: ``apply(state, event) -> state``.

No I/O here: no trio, no sqlite. The application builds events with the builders in
``_ops`` and the journal folds them with :func:`apply`.
"""

from braid_actors.graph._apply import apply, check_turn_branch, message
from braid_actors.graph._ops import (
    DEFAULT_RUNNER,
    branch,
    clone,
    clone_title,
    create_conversation,
    dispatch,
    effective_runner,
    make_edge,
    next_admissions,
    retry,
    submit_turn,
)
from braid_actors.graph._queries import (
    branches_of,
    get_branch,
    get_conversation,
    history,
    history_messages,
    queue_position,
    tip,
)
from braid_actors.graph._runs import (
    LIVE_STATES,
    RUN_TRANSITIONS,
    RunMove,
    is_terminal,
    next_state,
)
from braid_actors.graph._state import (
    PROJECTION_VERSION,
    GraphState,
    PieceCache,
    checksum,
    copy_state,
    dump_state,
    entity_count,
    iter_state_json,
    load_state,
)

__all__ = [
    "DEFAULT_RUNNER",
    "LIVE_STATES",
    "PROJECTION_VERSION",
    "RUN_TRANSITIONS",
    "GraphState",
    "PieceCache",
    "RunMove",
    "apply",
    "branch",
    "branches_of",
    "check_turn_branch",
    "checksum",
    "clone",
    "clone_title",
    "copy_state",
    "create_conversation",
    "dispatch",
    "dump_state",
    "effective_runner",
    "entity_count",
    "get_branch",
    "get_conversation",
    "history",
    "history_messages",
    "is_terminal",
    "iter_state_json",
    "load_state",
    "make_edge",
    "message",
    "next_admissions",
    "next_state",
    "queue_position",
    "retry",
    "submit_turn",
    "tip",
]
