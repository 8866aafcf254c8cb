"""The ten entities of the conversation graph, plus edges and the small records they hold.

All are ``@attrs.frozen`` records: the graph replaces a record with ``attrs.evolve`` when an
event changes it, so a record handed to a reader never changes under it. Unknown values are
``None`` (never zero); enumerations are ``Literal`` types written once here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import attrs

from braid_actors.model._parts import Part

Role = Literal["user", "assistant", "system"]
RunState = Literal[
    "queued",
    "admitted",
    "running",
    "blocked",
    "detached",
    "cancelling",
    "succeeded",
    "failed",
    "cancelled",
    "unknown",
]
TERMINAL_RUN_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "unknown"})
OutcomeKind = Literal["completed", "failed", "cancelled", "spend_limit_exceeded", "lost"]
SessionMode = Literal["new", "continued", "handed_off", "forked"]
BindingState = Literal["unbound", "bound", "unavailable", "closed"]
EdgeKind = Literal[
    "continued",
    "branched_at",
    "cloned_from",
    "retried",
    "handed_off",
    "analyzed",
    "compared_left",
    "compared_right",
    "checkpointed",
    "forked_environment",
    "spawned",
    "supervised_by",
]
EDGE_KINDS: tuple[str, ...] = EdgeKind.__args__  # type: ignore[attr-defined]
InteractionState = Literal["pending", "answered", "cancelled", "expired"]
CompletenessState = Literal["complete", "streaming", "incomplete"]
WorkerStatus = Literal["starting", "running", "paused", "stopping", "exited", "killed", "lost"]
TERMINAL_WORKER_STATES: frozenset[str] = frozenset({"exited", "killed", "lost"})
MAX_RUN_CHILDREN = 512
MAX_RUN_SOURCE_EVENTS = 8192


@attrs.frozen
class Completeness:
    """How much of a message is committed."""

    state: CompletenessState
    """``complete``, still ``streaming``, or ``incomplete`` (its run ended early)."""
    last_event_seq: int | None = None
    """Run-local sequence of the last committed event that changed the message."""
    missing: str | None = None
    """Plain description of the missing range when incomplete (e.g. ``after run event 7``)."""


@attrs.frozen
class Boundary:
    """An immutable ancestry link: a branch's context starts with another branch's history."""

    branch_id: str
    """The source branch."""
    through_message_id: str | None
    """Last message included from the source; null for an empty prefix."""
    selected_message_id: str | None
    """The message the user selected (differs from ``through`` when editing a user
    message); null for the clone of an empty branch."""


@attrs.frozen
class Limits:
    """Spend limits; null means no limit set at this level."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    wall_seconds: float | None = None
    cpu_seconds: float | None = None
    rss_bytes: int | None = None


@attrs.frozen
class RunOverrides:
    """Per-branch overrides of the profile's runner settings; null inherits."""

    runner: str | None = None
    model: str | None = None
    effort: str | None = None
    mode: str | None = None
    limits: Limits = Limits()


@attrs.frozen
class ProviderBinding:
    """Which native provider session a branch continues, and what Braid knows of it."""

    runner: str
    """Runner name (``local``, ``claude_code``, ``codex``)."""
    state: BindingState = "unbound"
    """``unbound`` until a run creates a session; ``unavailable`` when it was lost;
    ``closed`` when Braid released it (it is never continued again)."""
    session_id: str | None = None
    """Native session identifier."""
    boundary_message_id: str | None = None
    """The last Braid message the native session is known to contain."""
    session_digest: str | None = None
    """The provider's own digest of its session at that boundary, when it reports one."""
    native_boundary: str | None = None
    """The provider's own identifier of its session's last message (its boundary proof);
    null means the same as ``boundary_message_id`` (runners that record Braid's ids)."""


@attrs.frozen
class Conversation:
    """A conversation: one workspace, many branches."""

    conversation_id: str
    workspace: str
    """Absolute path of the workspace directory."""
    title: str
    created_at: datetime
    active_branch_id: str
    profile_ref: str | None = None
    """Default profile for new branches; null means the built-in default."""
    retention: str = "keep"
    archived: bool = False


@attrs.frozen
class Branch:
    """One ordered path through message boundaries."""

    branch_id: str
    conversation_id: str
    created_at: datetime
    source: Boundary | None
    """Ancestry link; null for a conversation's first branch."""
    message_ids: tuple[str, ...] = ()
    """Branch-local continuation after the boundary, in order."""
    profile_ref: str | None = None
    connection: str | None = None
    """Connection selection (for local runners, null)."""
    overrides: RunOverrides = RunOverrides()
    binding: ProviderBinding | None = None
    environment_id: str | None = None
    draft: str = ""


# Message and Run keep their fields in a ``__dict__`` (no ``__slots__``): a stream replaces
# both on every part update, and ``graph.replace`` copies a dict in one C call where a
# slotted copy sets every field through ``__init__`` (Run: 2.8 -> 0.6 us).
@attrs.frozen(slots=False)
class Message:
    """A user-, assistant- or system-visible message, stored once."""

    message_id: str
    conversation_id: str
    branch_id: str
    """The branch the message was first written on."""
    role: Role
    parts: tuple[Part, ...]
    created_at: datetime
    updated_at: datetime
    completeness: Completeness
    source_run_id: str | None = None
    """The run that produced an assistant message; null for user input."""
    redacted: bool = False
    """True when redaction removed something from the parts."""


@attrs.frozen
class Turn:
    """One user input plus the runs it admitted."""

    turn_id: str
    conversation_id: str
    branch_id: str
    user_message_id: str
    created_at: datetime
    run_ids: tuple[str, ...] = ()
    queue_position: int | None = None
    """1-based position among the branch's queued runs; null once admitted."""
    selected_run_id: str | None = None


@attrs.frozen
class Usage:
    """Token usage; each count is null when not reported."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    reasoning_tokens: int | None = None
    source: Literal["provider", "estimate", "none"] = "none"
    """Where the counts came from: the provider, Braid's/the runner's estimate, or nowhere."""


@attrs.frozen
class Outcome:
    """How a run ended."""

    kind: OutcomeKind
    reason: str | None = None
    dimension: str | None = None
    limit: float | None = None
    measured: float | None = None


@attrs.frozen
class Interaction:
    """A question the runner asked (permission, input), answered through Braid."""

    interaction_id: str
    kind: str
    """``permission`` or another kind the runner declares."""
    subject: Mapping[str, Any]
    """Structured subject (for a permission: tool and command)."""
    state: InteractionState
    requested_at: datetime
    answer: Mapping[str, Any] | None = None
    """Non-secret answer; secret answers are never stored."""
    answered_at: datetime | None = None


@attrs.frozen
class RunEvents:
    """How many run events are committed and the last one's journal sequence."""

    count: int = 0
    last_seq: int | None = None


@attrs.frozen
class ContextOmission:
    """A part of portable context the destination runner was not given."""

    message_id: str
    part_id: str
    kind: str
    """The part's kind (``reasoning``, ``unknown``; ``*`` for a whole system message)."""
    reason: str


@attrs.frozen
class ContextTransformation:
    """A part of portable context the destination runner was given in a changed form."""

    message_id: str
    part_id: str
    kind: str
    how: str


@attrs.frozen
class ContextTransferReceipt:
    """What a fresh native session was given of a portable context (by stable part id)."""

    source_digest: str
    """The :class:`PortableContext` digest the transfer was made from."""
    included_message_ids: tuple[str, ...]
    """Messages that entered the session (with at least one part, possibly transformed)."""
    omitted_parts: tuple[ContextOmission, ...]
    transformed_parts: tuple[ContextTransformation, ...]
    estimated_input_tokens: int | None
    """Null: the estimate is unavailable."""
    destination_runner: str
    destination_session_id: str


@attrs.frozen(slots=False)  # see Message
class Run:
    """One admitted execution attempt for a turn."""

    run_id: str
    turn_id: str
    conversation_id: str
    branch_id: str
    runner: str
    state: RunState
    created_at: datetime
    model: str | None = None
    runtime_id: str | None = None
    """Runtime (worker) identifier while running."""
    provider_session_id: str | None = None
    session_mode: SessionMode | None = None
    """``new``, ``continued`` or ``handed_off``; null before the run starts."""
    receipt: str | None = None
    """Digest of the immutable dispatch receipt."""
    assistant_message_id: str | None = None
    events: RunEvents = RunEvents()
    interactions: tuple[Interaction, ...] = ()
    outcome: Outcome | None = None
    usage: Usage = Usage()
    cost_usd: float | None = None
    trace_ref: str | None = None
    """The evidence run that holds this run's ingested transcript (null until ingested)."""
    trace_path: str | None = None
    """Where the runner keeps its native transcript (session file, rollout, spool)."""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    session_preference: Literal["reuse", "fresh"] = "reuse"
    """For a retry: reuse the branch's native session when provably safe, or start fresh."""
    cancel_reason: str | None = None
    worker_ids: tuple[str, ...] = ()
    """Workers of this run in observation order (root first); children beyond the limit
    are not recorded and ``children_complete`` turns false."""
    source_event_ids: tuple[str, ...] = ()
    """Identities of the native observations folded into this run (deduplicated)."""
    children_complete: bool = True
    provider_cursor: int = 0
    """How many provider messages (local runner spool lines) are committed for this run."""
    context_receipt: ContextTransferReceipt | None = None
    """What the fresh native session was given of the portable context (null: none given)."""


@attrs.frozen
class Analysis:
    """A child node that reads frozen run evidence; never conversation context by itself."""

    analysis_id: str
    source_ref: str
    """Frozen source digest."""
    analyst_profile: str
    recipe: str
    status: Literal["pending", "running", "completed", "failed", "cancelled"]
    created_at: datetime
    findings: tuple[Mapping[str, Any], ...] = ()
    citations: tuple[Mapping[str, Any], ...] = ()
    usage: Usage = Usage()
    cost_usd: float | None = None


@attrs.frozen
class Environment:
    """Where a branch's runs act: a workspace and what is claimed about it."""

    environment_id: str
    provider: str
    """``local_directory`` for the built-in adapter."""
    workspace: str
    placement: Mapping[str, Any] = attrs.Factory(dict)
    confidentiality: Mapping[str, Any] = attrs.Factory(dict)
    """Evidence of isolation; empty means no claim."""
    lifecycle: Literal["active", "unavailable", "deleted"] = "active"


@attrs.frozen
class Checkpoint:
    """A provider checkpoint of an environment at a run boundary."""

    checkpoint_id: str
    provider_id: str
    source_environment_id: str
    boundary: Boundary
    created_at: datetime
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    state_digest: str | None = None


@attrs.frozen
class Supervisor:
    """The runtime supervisor tree that represents a run."""

    runtime_id: str
    run_id: str


@attrs.frozen
class WorkerSpend:
    cpu_seconds: float | None = None
    rss_bytes: int | None = None
    wall_seconds: float | None = None


@attrs.frozen
class WorkerControl:
    """One control applied to a worker (pause, resume, stop, kill) and how it went."""

    action: str
    at: datetime
    result: str


@attrs.frozen
class WorkerExec:
    """A command line a worker was seen running after it was found (an exec)."""

    command: tuple[str, ...]
    """Bounded argv, as the sample that saw it read it."""
    observed_at: datetime
    """When that sample's result was recorded: the exec happened since the sample before."""


@attrs.frozen
class Worker:
    """An OS process a run started (or one its children started)."""

    worker_id: str
    run_id: str
    status: WorkerStatus
    parent_worker_id: str | None = None
    pid: int | None = None
    create_time: float | None = None
    """psutil create time; with the pid it identifies the process (pids get reused)."""
    pgid: int | None = None
    command: tuple[str, ...] = ()
    """Bounded argv as observed when the worker was found (a child caught between ``fork``
    and ``exec`` shows its parent's: see ``execs``)."""
    execs: tuple[WorkerExec, ...] = ()
    """Command lines it was seen running later, oldest first (its current one is the last,
    or ``command`` when there is none)."""
    spend: WorkerSpend = WorkerSpend()
    log_ref: str | None = None
    """Where the bounded stderr log was kept (a path under the Braid home)."""
    exit_code: int | None = None
    control_history: tuple[WorkerControl, ...] = ()


@attrs.frozen
class Edge:
    """A typed, provenance-carrying link between two graph nodes."""

    edge_id: str
    kind: EdgeKind
    source_id: str
    destination_id: str
    operation_id: str
    created_at: datetime
    receipt: str
    """``sha256:`` digest of the canonical facts that justify the edge."""
