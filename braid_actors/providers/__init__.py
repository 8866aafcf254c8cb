"""The provider port and its adapters (``local`` is the embedded default)."""

from braid_actors.providers._local_start import LocalTimeouts
from braid_actors.providers._port import (
    Capabilities,
    ContextMessage,
    ContextTransferReceipt,
    InteractionAnswer,
    InteractionRequest,
    PartNowaitSink,
    PortableContext,
    Provider,
    Reattachable,
    ReconcileRequest,
    Reconciliation,
    RunControl,
    RunSink,
    SessionClosed,
    SessionInfo,
    SessionProof,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
    WorkersSettled,
)
from braid_actors.providers._reconcile import settle_workers
from braid_actors.providers.claude_code import (
    CLAUDE_CODE_CAPABILITIES,
    ClaudeCodeProvider,
    ClaudeTimeouts,
)
from braid_actors.providers.codex import CODEX_CAPABILITIES, CodexProvider, CodexTimeouts
from braid_actors.providers.local import LOCAL_CAPABILITIES, LocalProvider

__all__ = [
    "CLAUDE_CODE_CAPABILITIES",
    "CODEX_CAPABILITIES",
    "LOCAL_CAPABILITIES",
    "Capabilities",
    "ClaudeCodeProvider",
    "ClaudeTimeouts",
    "CodexProvider",
    "CodexTimeouts",
    "ContextMessage",
    "ContextTransferReceipt",
    "InteractionAnswer",
    "InteractionRequest",
    "LocalProvider",
    "LocalTimeouts",
    "PartNowaitSink",
    "PortableContext",
    "Provider",
    "Reattachable",
    "ReconcileRequest",
    "Reconciliation",
    "RunControl",
    "RunSink",
    "SessionClosed",
    "SessionInfo",
    "SessionProof",
    "SessionRequest",
    "TurnRequest",
    "TurnResult",
    "WorkerInfo",
    "WorkersSettled",
    "settle_workers",
]
