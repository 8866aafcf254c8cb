"""The ``start`` message: validation, and translation of portable context into native lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import (
    ArtifactRefPart,
    ErrorPart,
    FileInputPart,
    Part,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    WarningPart,
    canonical_json,
)
from braid_actors.workers._session import SessionLine, is_session_id
from braid_actors.workers._wire import structure_part


@attrs.frozen
class Start:
    """A validated ``start`` message."""

    run_id: str
    turn_id: str
    user_message_id: str
    assistant_message_id: str
    text: str
    workspace: Path
    session_id: str | None
    expected_boundary: str | None
    expected_digest: str | None
    context: tuple[SessionLine, ...] | None


# ---- reading messages ------------------------------------------------------------------


def _string(obj: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value):
        raise ProviderProtocolError(f"field {key} must be a non-empty string")
    return value


def _object(obj: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise ProviderProtocolError(f"field {key} must be an object")
    return value


def parse_start(msg: dict[str, Any]) -> Start:
    """Validate a ``start`` message; raise :class:`ProviderProtocolError` on a bad one."""
    session = _object(msg, "session")
    session_id = _string(session, "id", optional=True)
    if session_id is not None and not is_session_id(session_id):
        raise ProviderProtocolError("session.id is not a local session id")
    user_id = _string(msg, "userMessageId")
    assistant_id = _string(msg, "assistantMessageId")
    if user_id == assistant_id:
        raise ProviderProtocolError("userMessageId and assistantMessageId must differ")
    text = msg.get("text")
    if not isinstance(text, str):
        raise ProviderProtocolError("field text must be a string")
    raw_context = _object(msg, "context", optional=True)
    context = None if raw_context is None else _context_lines(raw_context)
    if context is not None and session_id is not None:
        raise ProviderProtocolError("context is only accepted when a fresh session starts")
    if context is not None and {user_id, assistant_id} & {line.message_id for line in context}:
        raise ProviderProtocolError("the context already holds this turn's message ids")
    return Start(
        run_id=_string(msg, "runId"),
        turn_id=_string(msg, "turnId"),
        user_message_id=user_id,
        assistant_message_id=assistant_id,
        text=text,
        workspace=Path(_string(msg, "workspace")),
        session_id=session_id,
        expected_boundary=_string(session, "expectedBoundary", optional=True),
        expected_digest=_string(session, "expectedDigest", optional=True),
        context=context,
    )


def _context_lines(context: dict[str, Any]) -> tuple[SessionLine, ...]:
    """Translate portable context messages into native session lines, one per message."""
    messages = context.get("messages")
    if not isinstance(messages, list):
        raise ProviderProtocolError("context.messages must be a list")
    lines: list[SessionLine] = []
    seen: set[str] = set()
    for raw in messages:
        if not isinstance(raw, dict):
            raise ProviderProtocolError("a context message must be an object")
        message_id = _string(raw, "messageId")
        role = raw.get("role")
        parts = raw.get("parts")
        if role not in ("user", "assistant", "system") or not isinstance(parts, list):
            raise ProviderProtocolError("a context message needs a role and a list of parts")
        if message_id in seen:
            raise ProviderProtocolError("a context message id appears twice")
        seen.add(message_id)
        texts = [text for part in parts if (text := native_text(structure_part(part)))]
        lines.append(SessionLine(message_id=message_id, role=role, text="\n".join(texts)))
    return tuple(lines)


def native_text(part: Part) -> str | None:
    """How one portable part reads in the native session (``None``: not carried)."""
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, ToolRequestPart):
        return f"[tool request {part.name}: {canonical_json(dict(part.input)).decode()}]"
    if isinstance(part, ToolResultPart):
        return f"[tool result {part.status}] {part.summary}"
    if isinstance(part, FileInputPart):
        return f"[file {part.name} ({part.media_type})]"
    if isinstance(part, ArtifactRefPart):
        return f"[artifact {part.ref} ({part.media_type})]"
    if isinstance(part, WarningPart | ErrorPart):
        return f"[{part.kind} {part.code}] {part.message}"
    return None  # reasoning and unknown payloads are not portable text
