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
    ContextTransferReceipt,
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
    WorkerControl,
    WorkerSpend,
    WorkerStatus,
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
class BindingClosed:
    """The branch's native session was closed: the next turn starts a fresh one."""

    conversation_id: str
    branch_id: str
    session_id: str
    operation_id: str
    at: datetime
    type: Literal["branch.binding_closed"] = "branch.binding_closed"

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
    edge: Edge | None = None
    """A ``handed_off`` edge when the run starts a fresh session with copied context."""
    type: Literal["run.dispatched"] = "run.dispatched"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunWorkerStarted:
    """The provider started the run's root OS process (pid, create time, process group)."""

    conversation_id: str
    run_id: str
    worker: Worker
    edge: Edge
    """The ``spawned`` edge from the run to its root worker."""
    at: datetime
    cursor: int | None = None
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
    cursor: int | None = None
    """Provider message position this event came from (for replay after restart)."""
    context_receipt: ContextTransferReceipt | None = None
    """What a fresh session was given of the portable context (null: none, or unknown)."""
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
    cursor: int | None = None
    """Provider message position this event came from (for replay after restart)."""
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
    cursor: int | None = None
    """Provider message position this event came from (for replay after restart)."""
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
    cursor: int | None = None
    """Provider message position this event came from (for replay after restart)."""
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
    cursor: int | None = None
    """Provider message position this event came from (for replay after restart)."""
    trace_ref: str | None = None
    """The evidence run its transcript was ingested into, when it was."""
    type: Literal["run.finished"] = "run.finished"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunCancelRequested:
    """Cancellation was asked for; the run shows ``cancelling`` until the provider answers."""

    conversation_id: str
    run_id: str
    reason: str
    operation_id: str
    at: datetime
    type: Literal["run.cancel_requested"] = "run.cancel_requested"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class RunRetried:
    """A new queued run for the same turn, after an earlier run of it ended."""

    conversation_id: str
    turn_id: str
    run: Run
    edge: Edge
    """The ``retried`` edge from the previous run to the new one."""
    operation_id: str
    at: datetime
    type: Literal["run.retried"] = "run.retried"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class TurnRunSelected:
    """The run whose result the branch shows for this turn."""

    conversation_id: str
    turn_id: str
    run_id: str
    at: datetime
    type: Literal["turn.run_selected"] = "turn.run_selected"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class BranchFocused:
    """The conversation's active branch changed (focus on a run or branch)."""

    conversation_id: str
    branch_id: str
    at: datetime
    type: Literal["branch.focused"] = "branch.focused"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class WorkerSpawned:
    """Observation found a new child process of one of the run's workers."""

    conversation_id: str
    run_id: str
    worker: Worker
    edge: Edge
    """The ``spawned`` edge from the parent worker."""
    source_event_id: str
    """Identity of the observation (``proc:<pid>:<create time>``), deduplicated per run."""
    at: datetime
    type: Literal["worker.spawned"] = "worker.spawned"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class WorkerObserved:
    """A spend sample of one worker (its process tree for the root)."""

    conversation_id: str
    run_id: str
    worker_id: str
    spend: WorkerSpend
    at: datetime
    type: Literal["worker.observed"] = "worker.observed"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class WorkerControlled:
    """A control (pause, resume, stop, kill) applied to a worker, and its result."""

    conversation_id: str
    run_id: str
    worker_id: str
    control: WorkerControl
    status: WorkerStatus
    """The worker's status after the control."""
    operation_id: str | None
    at: datetime
    type: Literal["worker.controlled"] = "worker.controlled"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class WorkerExecuted:
    """Observation found a worker running a new command line (an exec since its last sample)."""

    conversation_id: str
    run_id: str
    worker_id: str
    command: tuple[str, ...]
    source_event_id: str
    """Identity of the observation (``proc:<pid>:<create time>:exec:<digest of the command>``),
    deduplicated per run."""
    at: datetime
    type: Literal["worker.executed"] = "worker.executed"

    @property
    def stream(self) -> str:
        return self.conversation_id


@attrs.frozen
class WorkerExited:
    """A worker process is gone: exited, killed, or lost from sight."""

    conversation_id: str
    run_id: str
    worker_id: str
    status: WorkerStatus
    exit_code: int | None
    log_ref: str | None
    source_event_id: str
    at: datetime
    type: Literal["worker.exited"] = "worker.exited"

    @property
    def stream(self) -> str:
        return self.conversation_id


Event = (
    ConversationCreated
    | BranchCreated
    | ConversationCloned
    | DraftSet
    | OverridesSet
    | BindingClosed
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
    | RunCancelRequested
    | RunRetried
    | TurnRunSelected
    | BranchFocused
    | WorkerSpawned
    | WorkerObserved
    | WorkerControlled
    | WorkerExecuted
    | WorkerExited
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
        BindingClosed,
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
        RunCancelRequested,
        RunRetried,
        TurnRunSelected,
        BranchFocused,
        WorkerSpawned,
        WorkerObserved,
        WorkerControlled,
        WorkerExecuted,
        WorkerExited,
    )
}

RUN_EVENT_TYPES: frozenset[str] = frozenset(
    t for t in EVENT_TYPES if t.startswith(("run.", "worker."))
)
