"""Graph events: the closed set of durable transitions, tagged by ``type``.

Each event is what the journal stores (``type`` + canonical JSON of the rest) and what
``graph.apply`` folds. Every event belongs to one conversation stream. Events are facts, so
they carry their own time and every identifier they introduce: replay never generates ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import attrs

from braid_actors.model._entities import (
    Branch,
    Conversation,
    Edge,
    Environment,
    Interaction,
    Message,
    Outcome,
    ProviderBinding,
    Run,
    RunOverrides,
    SessionMode,
    Turn,
    Usage,
    Worker,
)
from braid_actors.model._parts import Part

TerminalState = Literal["succeeded", "failed", "cancelled", "unknown"]


@attrs.frozen
class ConversationCreated:
    """A new conversation with its first branch and (optionally new) environment."""

    conversation: Conversation
    branch: Branch
    environment: Environment | None
    """Registered together with the conversation when it is new."""
    operation_id: str
    at: datetime
    type: Literal["conversation.created"] = "conversation.created"

    @property
    def stream(self) -> str:
        return self.conversation.conversation_id


@attrs.frozen
class BranchCreated:
    """``/branch``: a new branch whose ancestry is a boundary link into another branch."""

    branch: Branch
    edge: Edge
    """The ``branched_at`` edge from the selected message to the new branch."""
    operation_id: str
    at: datetime
    type: Literal["branch.created"] = "branch.created"

    @property
    def stream(self) -> str:
        return self.branch.conversation_id


@attrs.frozen
class ConversationCloned:
    """``/clone``: a new conversation whose first branch links to the source branch's tip."""

    conversation: Conversation
    branch: Branch
    edge: Edge
    """The ``cloned_from`` edge from the source branch to the new conversation."""
    operation_id: str
    at: datetime
    type: Literal["conversation.cloned"] = "conversation.cloned"

    @property
    def stream(self) -> str:
        return self.conversation.conversation_id


@attrs.frozen
class DraftSet:
    """The branch composer's text changed."""

    conversation_id: str
    branch_id: str
    draft: str
    at: datetime
    type: Literal["branch.draft_set"] = "branch.draft_set"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class OverridesSet:
    """The branch's run overrides changed."""

    conversation_id: str
    branch_id: str
    overrides: RunOverrides
    operation_id: str
    at: datetime
    type: Literal["branch.overrides_set"] = "branch.overrides_set"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class EnvironmentBound:
    """A branch now runs in another environment; cross-workspace needs an explicit edge."""

    conversation_id: str
    branch_id: str
    environment: Environment
    edge: Edge | None
    at: datetime
    type: Literal["branch.environment_bound"] = "branch.environment_bound"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class TurnSubmitted:
    """A user input: its message (stored, not yet in the branch), turn and queued run."""

    turn: Turn
    message: Message
    run: Run
    edge: Edge
    """The ``continued`` edge from the previous turn (or the branch) to this turn."""
    operation_id: str
    at: datetime
    type: Literal["turn.submitted"] = "turn.submitted"

    @property
    def stream(self) -> str:
        return self.turn.conversation_id


@attrs.frozen
class RunAdmitted:
    """The run left its branch queue and holds the branch's single active slot."""

    conversation_id: str
    run_id: str
    at: datetime
    type: Literal["run.admitted"] = "run.admitted"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunDispatched:
    """Intent, committed before the provider is called: receipt, session plan, reply slot."""

    conversation_id: str
    run_id: str
    receipt: str
    """Digest of the canonical dispatch request."""
    session_mode: SessionMode
    assistant_message: Message
    at: datetime
    type: Literal["run.dispatched"] = "run.dispatched"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunWorkerStarted:
    """The provider started an OS process for the run."""

    conversation_id: str
    run_id: str
    worker: Worker
    create_time: float
    pgid: int
    command: tuple[str, ...]
    at: datetime
    type: Literal["run.worker_started"] = "run.worker_started"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunSessionReported:
    """The native session the run is executing in."""

    conversation_id: str
    run_id: str
    session_id: str
    resumed: bool
    trace_path: str | None
    at: datetime
    type: Literal["run.session_reported"] = "run.session_reported"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunPartUpdated:
    """A part of the run's reply message, new or replacing the part with the same id."""

    conversation_id: str
    run_id: str
    message_id: str
    part: Part
    at: datetime
    type: Literal["run.part_updated"] = "run.part_updated"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunInteractionRequested:
    """The runner asked a question; the run is blocked until it is answered."""

    conversation_id: str
    run_id: str
    interaction: Interaction
    at: datetime
    type: Literal["run.interaction_requested"] = "run.interaction_requested"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunInteractionAnswered:
    """A pending interaction got its (non-secret) answer."""

    conversation_id: str
    run_id: str
    interaction_id: str
    answer: Mapping[str, Any]
    operation_id: str
    at: datetime
    type: Literal["run.interaction_answered"] = "run.interaction_answered"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunUsageReported:
    """Usage and cost as the provider reported (or estimated) them so far."""

    conversation_id: str
    run_id: str
    usage: Usage
    cost_usd: float | None
    at: datetime
    type: Literal["run.usage_reported"] = "run.usage_reported"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunFinished:
    """The run reached a terminal state; the branch binding is updated with it."""

    conversation_id: str
    run_id: str
    state: TerminalState
    outcome: Outcome
    usage: Usage
    cost_usd: float | None
    binding: ProviderBinding | None
    """The branch's provider binding after this run (null leaves it unchanged)."""
    at: datetime
    type: Literal["run.finished"] = "run.finished"

    @property
    def stream(self) -> str:
        return self.conversation_id


Event = (
    ConversationCreated
    | BranchCreated
    | ConversationCloned
    | DraftSet
    | OverridesSet
    | EnvironmentBound
    | TurnSubmitted
    | RunAdmitted
    | RunDispatched
    | RunWorkerStarted
    | RunSessionReported
    | RunPartUpdated
    | RunInteractionRequested
    | RunInteractionAnswered
    | RunUsageReported
    | RunFinished
)


def _tag(cls: type[Event]) -> str:
    return str(attrs.fields_dict(cls)["type"].default)


EVENT_TYPES: dict[str, type[Event]] = {
    _tag(cls): cls
    for cls in (
        ConversationCreated,
        BranchCreated,
        ConversationCloned,
        DraftSet,
        OverridesSet,
        EnvironmentBound,
        TurnSubmitted,
        RunAdmitted,
        RunDispatched,
        RunWorkerStarted,
        RunSessionReported,
        RunPartUpdated,
        RunInteractionRequested,
        RunInteractionAnswered,
        RunUsageReported,
        RunFinished,
    )
}

RUN_EVENT_TYPES: frozenset[str] = frozenset(t for t in EVENT_TYPES if t.startswith("run."))
