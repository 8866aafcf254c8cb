"""The provider port: what Braid asks of any runner (local, Claude Code, Codex).

A provider runs one turn at a time for a run. Everything it observes it reports through a
:class:`RunSink`, and the sink returns only once the observation is durable in the journal,
so a provider never gets ahead of the record. Cancellation is trio cancellation of
``run_turn``: the provider must make sure every process it started is gone before the
cancellation propagates (and say so in :attr:`TurnResult` when it can still return).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs
import trio

from braid_actors.model import ContextTransferReceipt as ContextTransferReceipt
from braid_actors.model import Part, Role, Usage
from braid_actors.workers import PipeHub

if TYPE_CHECKING:
    from braid_actors.workers import ProcessInfo


@attrs.frozen
class Capabilities:
    """What a provider claims; contract tests check claims against behaviour."""

    sessions_continue: bool
    """It can continue a native session and prove where that session's context ends."""
    sessions_fork: bool
    portable_context: bool
    """It accepts a canonical portable context when a fresh session starts."""
    interaction_kinds: tuple[str, ...]
    usage: Literal["reported", "estimated", "none"]
    cost: bool
    """It reports cost (a reported 0 is a real zero)."""
    checkpoint: bool = False
    fork: bool = False


@attrs.frozen
class ContextMessage:
    """One message of portable context: role and typed parts, with its Braid identifier."""

    message_id: str
    role: Role
    parts: tuple[Part, ...]


@attrs.frozen
class PortableContext:
    """Canonical conversation context used to start a fresh native session."""

    source_conversation_id: str
    source_branch_id: str
    through_message_id: str | None
    messages: tuple[ContextMessage, ...]
    complete: bool
    digest: str
    """``sha256:`` of the canonical form of the fields above."""


@attrs.frozen
class SessionRequest:
    """Which native session to use.

    ``session_id`` null: start a fresh session (with ``TurnRequest.context``). Otherwise
    continue that session, which the provider must refuse (``session_mismatch``) unless its
    own record ends exactly at ``expected_boundary`` (and ``expected_digest`` when given).
    """

    def __attrs_post_init__(self) -> None:
        if self.fork and self.session_id is None:
            raise ValueError("a fork names the session it forks")

    session_id: str | None = None
    expected_boundary: str | None = None
    expected_digest: str | None = None
    fork: bool = False
    """Run in a native fork of that session instead: a new session that holds the
    session's history up to the (proven) boundary, the original left unchanged. Only for
    a provider claiming ``sessions_fork``; every other one refuses (``fork_unsupported``)."""


@attrs.frozen
class TurnRequest:
    """Everything a provider needs to run one turn."""

    run_id: str
    turn_id: str
    workspace: Path
    user_message_id: str
    assistant_message_id: str
    text: str
    session: SessionRequest
    context: PortableContext | None = None
    model: str | None = None
    options: Mapping[str, Any] = attrs.Factory(dict)


@attrs.frozen
class SessionInfo:
    """The native session a turn is running in."""

    session_id: str
    resumed: bool
    """True only when an existing native session was continued."""
    trace_path: str | None = None
    """Where the runner keeps its native session/transcript file."""
    receipt: ContextTransferReceipt | None = None
    """For a fresh session given ``TurnRequest.context``: what it was given of it."""


@attrs.frozen
class InteractionRequest:
    interaction_id: str
    kind: str
    subject: Mapping[str, Any]


@attrs.frozen
class InteractionAnswer:
    allow: bool
    message: str | None = None


@attrs.frozen
class WorkerInfo:
    """An OS process the provider started for this run."""

    pid: int
    create_time: float
    pgid: int
    command: tuple[str, ...]

    @classmethod
    def of(cls, process: ProcessInfo) -> WorkerInfo:
        """The port's view of a process the workers layer started or found."""
        return cls(process.pid, process.create_time, process.pgid, process.command)


@attrs.frozen
class TurnResult:
    """How the turn ended, as the provider observed it."""

    outcome: Literal["completed", "failed", "cancelled"]
    reason: str | None
    usage: Usage
    cost_usd: float | None
    session_id: str | None
    session_boundary: str | None = None
    """Last Braid message id the native session now contains (its boundary proof)."""
    session_digest: str | None = None
    worker_log: str | None = None
    """The bounded tail of the worker's stderr (null when the provider keeps none)."""
    cancel_acknowledged: bool | None = None
    """After a cancel request: true when the runner confirmed it stopped, false when it did
    not answer in time (its process was then stopped by force); null without a request."""


@attrs.frozen
class SessionProof:
    """What a provider can prove about a native session's end."""

    session_id: str
    available: bool
    last_message_id: str | None = None
    digest: str | None = None
    reason: str | None = None


@attrs.define(eq=False)
class RunControl:
    """Braid's requests to a running turn. Cancellation is two-party: the provider must
    answer a cancel request (``TurnResult.cancel_acknowledged``); stopping the local stream
    alone never proves the runner stopped."""

    cancel_requested: trio.Event = attrs.Factory(trio.Event)
    reason: str | None = None
    pipes: PipeHub | None = None
    """The supervisor's pipe hub, which may read the turn's worker output (none: each
    worker pipe has a reader of its own)."""
    _on_cancel: list[Callable[[], None]] = attrs.field(factory=list, init=False)

    def request_cancel(self, reason: str) -> None:
        if not self.cancel_requested.is_set():
            self.reason = reason
            self.cancel_requested.set()
            for callback in list(self._on_cancel):
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the event loop) when a cancel is requested, or now if one
        was; returns what removes it. Cheaper than a task per run waiting for the event."""
        if self.cancel_requested.is_set():
            callback()
            return lambda: None
        self._on_cancel.append(callback)

        def remove() -> None:
            if callback in self._on_cancel:
                self._on_cancel.remove(callback)

        return remove


@runtime_checkable
class PartNowaitSink(Protocol):
    """A sink that can also take a part update without waiting (a fast path)."""

    def part_nowait(self, part: Part) -> bool:
        """Take the part update now and return True, or change nothing and return False
        (the caller then calls ``part``)."""


class RunSink(Protocol):
    """Where a provider reports; each call returns once the fact is durable."""

    async def worker_started(self, worker: WorkerInfo) -> None: ...

    async def session(self, info: SessionInfo) -> None: ...

    async def part(self, part: Part) -> None:
        """A new part or a newer version of a part (same ``part_id`` replaces)."""

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        """Record a pending interaction and wait for its answer."""

    async def usage(self, usage: Usage, cost_usd: float | None) -> None: ...


@attrs.frozen
class ReconcileRequest:
    """What the journal knows of a turn a previous supervisor left unfinished."""

    run_id: str
    turn_id: str
    workspace: Path
    text: str
    """The turn's user input (how its start is recognised in the runner's own record)."""
    session_id: str | None
    """The native session the run reported (null: none was reported before Braid died)."""
    trace_path: str | None = None
    """The trace source the run reported (null: none yet, e.g. a new Codex rollout)."""
    start_boundary: str | None = None
    """For a continued session: the runner's own id of the session's last message before
    this turn (the turn's record starts after it)."""
    workers: tuple[WorkerInfo, ...] = ()
    """The run's workers the journal still records as live, root first."""
    cancel_requested: bool = False


WorkersSettled = Literal["none", "exited", "stopped"]
"""What became of a previous supervisor's workers: none was left running, the survivor
ended by itself, or it was stopped through the stop ladder."""


@attrs.frozen
class Reconciliation:
    """How a turn a previous supervisor left unfinished really ended, as far as provable."""

    result: TurnResult | None
    """The turn's end as the runner's own record proves it; null when nothing proves it
    (the run is then ``unknown`` with :attr:`reason`)."""
    reason: str
    workers: WorkersSettled


@attrs.frozen
class SessionClosed:
    """What closing a native session released."""

    session_id: str
    released: bool
    """True when the runner itself held something that is now released (a server-side
    session, a process); false when there was nothing to release on the runner's side."""
    detail: str


@runtime_checkable
class Reattachable(Protocol):
    """A provider whose runs can outlive their supervisor and be re-attached after it."""

    def spool_started(self, run_id: str) -> bool:
        """True when the run's turn really began (its spool holds a session or an end)."""

    async def reattach(
        self,
        request: TurnRequest,
        root: WorkerInfo,
        *,
        skip: int,
        answers: Mapping[str, InteractionAnswer | None],
        await_pending: Callable[[str], Awaitable[InteractionAnswer]],
        sink: RunSink,
        control: RunControl | None = None,
    ) -> tuple[TurnResult, bool]:
        """Replay what the journal lacks, follow the worker to its end; ``(result, done)``."""


class Provider(Protocol):
    """A runner Braid can dispatch turns to."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def available(self) -> bool: ...

    async def run_turn(
        self, request: TurnRequest, sink: RunSink, control: RunControl | None = None
    ) -> TurnResult: ...

    async def prove_session(self, session_id: str) -> SessionProof: ...

    async def reconcile(self, request: ReconcileRequest, sink: RunSink) -> Reconciliation:
        """After a restart: settle the previous supervisor's workers (no orphan is left),
        then decide from the runner's own record how the turn ended (see
        :class:`Reconciliation`); what the record holds is reported through ``sink``."""

    async def close_session(self, session_id: str) -> SessionClosed:
        """Release a native session Braid will not continue (see :class:`SessionClosed`)."""


def fork_refusal(request: TurnRequest, runner: str) -> TurnResult | None:
    """For a provider without native forks: the refusal of a fork request (else None)."""
    if not request.session.fork:
        return None
    return TurnResult(
        outcome="failed",
        reason=f"fork_unsupported: {runner} can't fork a native session",
        usage=Usage(),
        cost_usd=None,
        session_id=None,
    )
