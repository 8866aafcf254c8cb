"""The local adapter's deadlines, what it sends its worker to start a turn, the receipt of
the portable context it copied (exactly what the worker's own translation keeps), and the
places among the workers starting at once."""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Any

import attrs
import trio

from braid_actors.model import (
    ContextOmission,
    ContextTransferReceipt,
    ContextTransformation,
    TextPart,
)
from braid_actors.workers import LOCAL_WORKER_MODULE, native_text, unstructure_part

if TYPE_CHECKING:
    from braid_actors.providers._port import PortableContext, TurnRequest


@attrs.frozen
class LocalTimeouts:
    """Deadlines (seconds) for everything the provider waits for from its worker."""

    startup: float = 15.0
    """From spawn to ``hello``."""
    idle: float = 120.0
    """Between two worker messages (``?sleep`` streams at least every 0.25 s)."""
    shell: float = 30.0
    """Passed to the worker: how long one ``!`` shell command may run."""
    cancel_grace: float = 3.0
    """After ``cancel``, for the worker's ``done`` and exit."""
    exit_grace: float = 5.0
    """After ``done``, for the worker to exit by itself."""
    term_grace: float = 2.0
    """After SIGTERM to the worker's group."""
    kill_grace: float = 2.0
    """After SIGKILL to the worker's group."""

    def __attrs_post_init__(self) -> None:
        if self.idle <= self.shell:
            raise ValueError("the idle deadline must be longer than the shell time limit")


def start_message(request: TurnRequest) -> dict[str, Any]:
    """The protocol's ``start`` for a turn request."""
    return {
        "type": "start",
        "runId": request.run_id,
        "turnId": request.turn_id,
        "userMessageId": request.user_message_id,
        "assistantMessageId": request.assistant_message_id,
        "text": request.text,
        "workspace": str(request.workspace),
        "session": {
            "id": request.session.session_id,
            "expectedBoundary": request.session.expected_boundary,
            "expectedDigest": request.session.expected_digest,
        },
        "context": None if request.context is None else _context(request.context),
    }


def _context(context: PortableContext) -> dict[str, Any]:
    return {
        "sourceConversationId": context.source_conversation_id,
        "sourceBranchId": context.source_branch_id,
        "throughMessageId": context.through_message_id,
        "complete": context.complete,
        "digest": context.digest,
        "messages": [
            {
                "messageId": message.message_id,
                "role": message.role,
                "parts": [unstructure_part(part) for part in message.parts],
            }
            for message in context.messages
        ],
    }


def context_receipt(context: PortableContext, session_id: str) -> ContextTransferReceipt:
    """What the worker's fresh session gets of ``context``: every message (as one native
    line), text parts unchanged, other parts as the worker's text, reasoning and unknown
    parts omitted (the worker's own translation, :func:`native_text`)."""
    omitted: list[ContextOmission] = []
    transformed: list[ContextTransformation] = []
    for message in context.messages:
        for part in message.parts:
            text = native_text(part)
            if not text:
                reason = "empty text" if isinstance(part, TextPart) else "not portable text"
                omitted.append(ContextOmission(message.message_id, part.part_id, part.kind, reason))
            elif not isinstance(part, TextPart):
                transformed.append(
                    ContextTransformation(
                        message.message_id, part.part_id, part.kind, "as a bracketed text line"
                    )
                )
    return ContextTransferReceipt(
        source_digest=context.digest,
        included_message_ids=tuple(message.message_id for message in context.messages),
        omitted_parts=tuple(omitted),
        transformed_parts=tuple(transformed),
        estimated_input_tokens=None,
        destination_runner="local",
        destination_session_id=session_id,
    )


@functools.cache
def worker_module_found() -> bool:
    """Whether the worker program's module can be imported (asked once per process).

    Asked for every run (a restart asks for each run it reconciles), and a module lookup
    walks the import path: the answer cannot change while this package is loaded.
    """
    return importlib.util.find_spec(LOCAL_WORKER_MODULE) is not None


@attrs.define(eq=False)
class StartPlace:
    """One place among the workers starting at once, given back exactly once."""

    places: trio.Semaphore
    held: bool = False

    async def take(self) -> None:
        await self.places.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.places.release()


def nothing() -> None:
    """The default of a callback nobody needs."""
    return None
