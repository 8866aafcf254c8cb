"""One error root for Braid.

Every failure a user or client can see is a :class:`BraidError` with a stable snake_case
``code``. Messages are plain sentences that never carry secrets or raw exception text;
structured facts go in ``details``. The headless loop and the HTTP API translate these into
replies in one place (``app``), so nothing else formats errors for the outside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class BraidError(Exception):
    """Root of every error Braid reports; ``code`` is stable and machine-readable."""

    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


# ---- bad input -------------------------------------------------------------------------


class BadRequest(BraidError):
    """The request is not well formed: wrong or missing parameters."""

    code = "invalid_params"


class MalformedJson(BadRequest):
    code = "malformed_json"


class LineTooLong(BadRequest):
    code = "line_too_long"


class UnknownCommand(BadRequest):
    code = "unknown_command"


class InvalidRequest(BadRequest):
    """The envelope itself is wrong (not an object, missing ``command``)."""

    code = "invalid_request"


class OperationConflict(BraidError):
    """An operation id was reused with different canonical parameters."""

    code = "operation_conflict"


# ---- unknown identifiers ---------------------------------------------------------------


class NotFound(BraidError):
    code = "not_found"


class UnknownConversation(NotFound):
    code = "unknown_conversation"


class UnknownBranch(NotFound):
    code = "unknown_branch"


class UnknownMessage(NotFound):
    code = "unknown_message"


class UnknownTurn(NotFound):
    code = "unknown_turn"


class UnknownRun(NotFound):
    code = "unknown_run"


class UnknownInteraction(NotFound):
    code = "unknown_interaction"


class UnknownEnvironment(NotFound):
    code = "unknown_environment"


# ---- graph integrity -------------------------------------------------------------------


class IntegrityError(BraidError):
    """An event would break a graph invariant; nothing was applied."""

    code = "integrity_violation"


class CycleDetected(IntegrityError):
    code = "graph_cycle"


class MissingBoundary(IntegrityError):
    code = "missing_boundary"


class CrossWorkspaceBinding(IntegrityError):
    code = "cross_workspace_binding"


class TerminalRunMutation(IntegrityError):
    code = "terminal_run_mutation"


class DuplicateIdentifier(IntegrityError):
    code = "duplicate_identifier"


class IllegalTransition(IntegrityError):
    """A run (or other state machine) cannot take this event in its current state."""

    code = "illegal_transition"


class InteractionNotPending(IntegrityError):
    code = "interaction_not_pending"


# ---- journal ---------------------------------------------------------------------------


class JournalError(BraidError):
    code = "journal_error"


class JournalKeyError(JournalError):
    """The journal key is missing, malformed, unsafe, or does not open this journal."""

    code = "journal_key_invalid"


class UnsafeKeyFile(JournalKeyError):
    code = "journal_key_unsafe"


class WrongKey(JournalKeyError):
    code = "journal_wrong_key"


class JournalCorrupt(JournalError):
    code = "journal_corrupt"


class JournalClosed(JournalError):
    code = "journal_closed"


class JournalTimeout(JournalError):
    """The journal did not answer a request in time; its outcome is unknown."""

    code = "journal_timeout"


# ---- runtime ---------------------------------------------------------------------------


class RuntimeFault(BraidError):
    code = "runtime_error"


class RunnerUnavailable(RuntimeFault):
    code = "runner_unavailable"


class ProviderProtocolError(RuntimeFault):
    code = "provider_protocol_error"


class WorkerStartFailed(RuntimeFault):
    """A worker process could not be started (missing program, refused spawn)."""

    code = "worker_start_failed"


class WorkerStopTimeout(RuntimeFault):
    """A worker outlived a stage of the stop ladder.

    Recorded (not raised) when a cooperative stop or SIGTERM was not enough and Braid
    escalated; raised when the process group survived even SIGKILL's bounded wait. Its own
    type so a generic timeout handler cannot hide a worker that refuses to stop.
    """

    code = "worker_stop_timeout"


class WorkerLineTooLong(ProviderProtocolError):
    """A worker wrote a protocol line longer than the reader's bound."""

    code = "worker_line_too_long"


class WaitTimeout(BraidError):
    code = "timeout"


class ShuttingDown(BraidError):
    code = "shutting_down"


class DaemonRunning(BraidError):
    """Another daemon serves this Braid home."""

    code = "daemon_running"


# ---- supervision (the actor kit: mailboxes, calls, supervised children) ----------------


class SupervisionError(RuntimeFault):
    """Root of the actor kit's errors."""

    code = "supervision_error"


class ActorStopped(SupervisionError):
    """The actor stopped before it answered a call, or before it took the request."""

    code = "actor_stopped"

    def __init__(self, actor: str) -> None:
        super().__init__(f"actor {actor} stopped before answering", details={"actor": actor})
        self.actor = actor


class CallTimeout(WaitTimeout):
    """A call got no answer within its deadline; the actor may still handle the request."""

    code = "call_timeout"

    def __init__(self, actor: str, timeout: float) -> None:
        super().__init__(
            f"actor {actor} did not answer within {timeout} seconds",
            details={"actor": actor, "timeout": timeout},
        )
        self.actor = actor
        self.timeout = timeout


class ChildStartFailed(SupervisionError):
    """A supervisor could not start one of its children; the cause is the child's error."""

    code = "child_start_failed"

    def __init__(self, supervisor: str, child: str) -> None:
        super().__init__(
            f"supervisor {supervisor} could not start its child {child}",
            details={"supervisor": supervisor, "child": child},
        )
        self.supervisor = supervisor
        self.child = child


class ChildExited(SupervisionError):
    """A permanent child returned: for a permanent child that is an exit to restart."""

    code = "child_exited"

    def __init__(self, supervisor: str, child: str) -> None:
        super().__init__(
            f"permanent child {child} of supervisor {supervisor} returned",
            details={"supervisor": supervisor, "child": child},
        )
        self.supervisor = supervisor
        self.child = child


class ChildNotRunning(SupervisionError):
    """A supervisor was asked for a child that is not running now."""

    code = "child_not_running"

    def __init__(self, supervisor: str, child: str) -> None:
        super().__init__(
            f"child {child} of supervisor {supervisor} is not running",
            details={"supervisor": supervisor, "child": child},
        )
        self.supervisor = supervisor
        self.child = child


class ChildStopTimeout(SupervisionError):
    """A child outlived its shutdown grace after its scope was cancelled, and was abandoned.

    Recorded by its supervisor (never raised into a caller), which goes on without it. Its own
    type so a generic timeout handler cannot hide a child that refuses to stop.
    """

    code = "child_stop_timeout"

    def __init__(self, supervisor: str, child: str, grace: float) -> None:
        super().__init__(
            f"child {child} of supervisor {supervisor} did not stop within {grace} seconds",
            details={"supervisor": supervisor, "child": child, "grace": grace},
        )
        self.supervisor = supervisor
        self.child = child
        self.grace = grace


class SupervisorEscalation(SupervisionError):
    """A supervisor exceeded its restart intensity, stopped its children and gave up.

    ``failures`` (also the ``__cause__``) is an :class:`ExceptionGroup` of what went wrong,
    each failure with a note naming its child; a parent supervisor sees this error as the
    failure of its child.
    """

    code = "supervisor_escalation"

    def __init__(
        self,
        supervisor: str,
        *,
        max_restarts: int,
        period: float,
        failures: Sequence[tuple[str, Exception]],
    ) -> None:
        children = list(dict.fromkeys(child for child, _ in failures))
        super().__init__(
            f"supervisor {supervisor} gave up: more than {max_restarts} restarts "
            f"within {period} seconds",
            details={
                "supervisor": supervisor,
                "maxRestarts": max_restarts,
                "period": period,
                "children": children,
            },
        )
        self.supervisor = supervisor
        self.children = tuple(children)
        self.failures: ExceptionGroup[Exception] | None = None
        if failures:
            self.failures = ExceptionGroup(
                f"failures of the children of supervisor {supervisor}",
                [error for _, error in failures],
            )
        self.__cause__ = self.failures


# ---- evidence --------------------------------------------------------------------------


class EvidenceError(BraidError):
    """Root of the evidence store's errors; its codes are the evidence API's error codes."""

    code = "evidence_error"


class EvidenceInvalidArgument(EvidenceError):
    """A run, cursor, filter, page limit or UTF-8 byte offset the evidence API refuses."""

    code = "invalid_argument"


class EvidenceRunNotFound(EvidenceError):
    code = "run_not_found"


class EvidenceContentNotFound(EvidenceError):
    """A content reference (or native session) that does not occur in the run."""

    code = "content_not_found"


class EvidenceStoreUnavailable(EvidenceError):
    """The evidence database cannot be opened or read; never reported as missing evidence."""

    code = "store_unavailable"


class EvidenceReadFailed(EvidenceError):
    """A stored object could not be read or its hash did not verify; it is never served."""

    code = "evidence_read_failed"


__all__ = [
    "ActorStopped",
    "BadRequest",
    "BraidError",
    "CallTimeout",
    "ChildExited",
    "ChildNotRunning",
    "ChildStartFailed",
    "ChildStopTimeout",
    "CrossWorkspaceBinding",
    "CycleDetected",
    "DaemonRunning",
    "DuplicateIdentifier",
    "EvidenceContentNotFound",
    "EvidenceError",
    "EvidenceInvalidArgument",
    "EvidenceReadFailed",
    "EvidenceRunNotFound",
    "EvidenceStoreUnavailable",
    "IllegalTransition",
    "IntegrityError",
    "InteractionNotPending",
    "InvalidRequest",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalKeyError",
    "JournalTimeout",
    "LineTooLong",
    "MalformedJson",
    "MissingBoundary",
    "NotFound",
    "OperationConflict",
    "ProviderProtocolError",
    "RunnerUnavailable",
    "RuntimeFault",
    "ShuttingDown",
    "SupervisionError",
    "SupervisorEscalation",
    "TerminalRunMutation",
    "UnknownBranch",
    "UnknownCommand",
    "UnknownConversation",
    "UnknownEnvironment",
    "UnknownInteraction",
    "UnknownMessage",
    "UnknownRun",
    "UnknownTurn",
    "UnsafeKeyFile",
    "WaitTimeout",
    "WorkerLineTooLong",
    "WorkerStartFailed",
    "WorkerStopTimeout",
    "WrongKey",
]
