"""One error root for Braid.

Every failure a user or client can see is a :class:`BraidError` with a stable snake_case
``code``. Messages are plain sentences that never carry secrets or raw exception text;
structured facts go in ``details``. The headless loop and the HTTP API translate these into
replies in one place (``app``), so nothing else formats errors for the outside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collections.abc import Mapping


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


__all__ = [
    "BadRequest",
    "BraidError",
    "CrossWorkspaceBinding",
    "CycleDetected",
    "DuplicateIdentifier",
    "IllegalTransition",
    "IntegrityError",
    "InteractionNotPending",
    "InvalidRequest",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalKeyError",
    "LineTooLong",
    "MalformedJson",
    "MissingBoundary",
    "NotFound",
    "OperationConflict",
    "ProviderProtocolError",
    "RunnerUnavailable",
    "RuntimeFault",
    "ShuttingDown",
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
