"""The provider port and its adapters (``local`` is the embedded default)."""

from braid_actors.providers._port import (
    Capabilities,
    ContextMessage,
    InteractionAnswer,
    InteractionRequest,
    PortableContext,
    Provider,
    Reattachable,
    RunControl,
    RunSink,
    SessionInfo,
    SessionProof,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.providers.local import LOCAL_CAPABILITIES, LocalProvider, LocalTimeouts

__all__ = [
    "LOCAL_CAPABILITIES",
    "Capabilities",
    "ContextMessage",
    "InteractionAnswer",
    "InteractionRequest",
    "LocalProvider",
    "LocalTimeouts",
    "PortableContext",
    "Provider",
    "Reattachable",
    "RunControl",
    "RunSink",
    "SessionInfo",
    "SessionProof",
    "SessionRequest",
    "TurnRequest",
    "TurnResult",
    "WorkerInfo",
]
