"""Run state machine.

Theory of operation: a run is created ``queued`` by a submitted turn, ``admitted`` when it
takes its branch's single active slot, ``running`` once its dispatch intent is committed,
``blocked`` while an interaction waits for an answer, ``detached`` while Braid is not
attached to a provider that may still be working, ``cancelling`` between a cancel request
and the provider's answer, and ends in exactly one terminal state. Terminal states accept
nothing: a finished run is immutable.

Everything that changes a run's state lives here: the table below is the only place a
run's next state is decided, and the docs' diagram is drawn from it.
"""

from __future__ import annotations

from typing import Literal

from braid_actors.errors import IllegalTransition, TerminalRunMutation
from braid_actors.model import TERMINAL_RUN_STATES, RunState

RunMove = Literal[
    "admit",
    "dispatch",
    "block",
    "unblock",
    "detach",
    "reattach",
    "request_cancel",
    "succeed",
    "fail",
    "cancel",
    "lose",
]

_ENDINGS: dict[RunMove, RunState] = {
    "fail": "failed",
    "cancel": "cancelled",
    "lose": "unknown",
}

RUN_TRANSITIONS: dict[RunState, dict[RunMove, RunState]] = {
    "queued": {"admit": "admitted", "cancel": "cancelled", "lose": "unknown"},
    "admitted": {"dispatch": "running", "request_cancel": "cancelling", **_ENDINGS},
    "running": {
        "block": "blocked",
        "detach": "detached",
        "request_cancel": "cancelling",
        "succeed": "succeeded",
        **_ENDINGS,
    },
    "blocked": {
        "block": "blocked",
        "unblock": "running",
        "detach": "detached",
        "request_cancel": "cancelling",
        **_ENDINGS,
    },
    "detached": {"reattach": "running", "request_cancel": "cancelling", **_ENDINGS},
    "cancelling": {
        "succeed": "succeeded",
        "block": "cancelling",
        "unblock": "cancelling",
        **_ENDINGS,
    },
    "succeeded": {},
    "failed": {},
    "cancelled": {},
    "unknown": {},
}

FINISH_MOVES: dict[str, RunMove] = {
    "succeeded": "succeed",
    "failed": "fail",
    "cancelled": "cancel",
    "unknown": "lose",
}

# States in which the run's provider may still be producing output (events are accepted).
LIVE_STATES: frozenset[RunState] = frozenset({"running", "blocked", "detached", "cancelling"})


def is_terminal(state: RunState) -> bool:
    """True for states that accept no further event."""
    return state in TERMINAL_RUN_STATES


def next_state(run_id: str, state: RunState, move: RunMove) -> RunState:
    """The state after ``move``, or a stable error naming the run and its state."""
    if is_terminal(state):
        raise TerminalRunMutation(
            f"run {run_id} is {state} and can't change",
            details={"runId": run_id, "state": state, "move": move},
        )
    target = RUN_TRANSITIONS[state].get(move)
    if target is None:
        raise IllegalTransition(
            f"can't apply {move} to run {run_id} in state {state}",
            details={"runId": run_id, "state": state, "move": move},
        )
    return target
