"""Normalized message parts: ordered, typed, each with a stable part identifier.

A part identifier is stable for the life of a message: a streaming update that carries the
same ``part_id`` replaces the earlier version of that part in place (this is what drives
streaming replacement in every client). Parts are a closed tagged union on ``kind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

ToolStatus = Literal["ok", "error", "denied", "cancelled"]
Availability = Literal["available", "unavailable", "redacted"]


@attrs.frozen
class TextPart:
    """Plain text shown to the user."""

    part_id: str
    """Stable identifier within the message."""
    text: str
    """The text as committed so far."""
    kind: Literal["text"] = "text"


@attrs.frozen
class ReasoningPart:
    """Reasoning the runner exposed, kept only when the capture policy permits."""

    part_id: str
    """Stable identifier within the message."""
    text: str
    """Reasoning text."""
    kind: Literal["reasoning"] = "reasoning"


@attrs.frozen
class ToolRequestPart:
    """A tool call the runner asked for."""

    part_id: str
    """Stable identifier within the message."""
    name: str
    """Tool name as the runner reported it."""
    input: Mapping[str, Any]
    """Canonical JSON input of the call."""
    call_id: str | None = None
    """The runner's own call identifier; opaque, never reused across runners."""
    kind: Literal["tool_request"] = "tool_request"


@attrs.frozen
class ToolResultPart:
    """The bounded result of a tool call."""

    part_id: str
    """Stable identifier within the message."""
    request_part_id: str
    """The ``tool_request`` part this answers."""
    status: ToolStatus
    """How the call ended."""
    summary: str
    """Bounded result text (see ``truncated``)."""
    truncated: bool = False
    """True when ``summary`` is shorter than the full result."""
    exit_code: int | None = None
    """Process exit code for shell tools; null when not a process or not known."""
    artifact_ref: str | None = None
    """``sha256:`` reference of the full result when kept as an artifact."""
    kind: Literal["tool_result"] = "tool_result"


@attrs.frozen
class ArtifactRefPart:
    """A reference to content kept outside the message (too large or sensitive)."""

    part_id: str
    """Stable identifier within the message."""
    ref: str
    """``sha256:`` content reference."""
    media_type: str
    """MIME type of the referenced content."""
    size: int | None
    """Size in bytes; null when not known."""
    availability: Availability = "available"
    """Whether the content can be read back."""
    kind: Literal["artifact_ref"] = "artifact_ref"


@attrs.frozen
class FileInputPart:
    """An image or file the user attached."""

    part_id: str
    """Stable identifier within the message."""
    name: str
    """File name as given."""
    media_type: str
    """MIME type."""
    ref: str | None = None
    """``sha256:`` content reference when stored."""
    size: int | None = None
    """Size in bytes; null when not known."""
    kind: Literal["file_input"] = "file_input"


@attrs.frozen
class WarningPart:
    """A warning the user must see (for example incomplete context)."""

    part_id: str
    """Stable identifier within the message."""
    code: str
    """Stable warning code."""
    message: str
    """Plain sentence."""
    kind: Literal["warning"] = "warning"


@attrs.frozen
class ErrorPart:
    """An error reported inside a message."""

    part_id: str
    """Stable identifier within the message."""
    code: str
    """Stable error code."""
    message: str
    """Plain sentence without secrets."""
    kind: Literal["error"] = "error"


@attrs.frozen
class UnknownPart:
    """A canonical payload no adapter translates; kept, never treated as portable text."""

    part_id: str
    """Stable identifier within the message."""
    payload_type: str
    """The source's own type name."""
    payload: Mapping[str, Any]
    """Canonical JSON payload (already redacted)."""
    kind: Literal["unknown"] = "unknown"


Part = (
    TextPart
    | ReasoningPart
    | ToolRequestPart
    | ToolResultPart
    | ArtifactRefPart
    | FileInputPart
    | WarningPart
    | ErrorPart
    | UnknownPart
)

PART_TYPES: dict[str, type[Part]] = {
    "text": TextPart,
    "reasoning": ReasoningPart,
    "tool_request": ToolRequestPart,
    "tool_result": ToolResultPart,
    "artifact_ref": ArtifactRefPart,
    "file_input": FileInputPart,
    "warning": WarningPart,
    "error": ErrorPart,
    "unknown": UnknownPart,
}
