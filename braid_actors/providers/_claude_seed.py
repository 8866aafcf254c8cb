"""A portable context written as a native Claude Code session (a seed transcript).

Design note. The CLI does not seed a session from typed stream-json assistant input, but
it does resume any transcript it finds under its projects dir. So a fresh session with
portable context is started by writing a new transcript, ``<session>.jsonl``, with one
``user`` / ``assistant`` record per context message (uuid-chained through ``parentUuid``,
with the fields of the CLI's own records: ``type``, ``uuid``, ``parentUuid``,
``sessionId``, ``message``, ``cwd``, ``timestamp``, ``isSidechain``, ``userType``,
``entrypoint``), then running the CLI with ``--resume`` on it and only the new input. It
is a new session with copied context, never reported as resumed.

Translation, per part kind (every record's ``message.content`` is a list of ``text``
blocks; each message's role is kept):

* ``text``: a text block.
* ``reasoning``: omitted (it was the source runner's private reasoning; Claude Code's own
  thinking blocks carry signatures a copy can't have).
* ``tool_request``: ``[tool NAME] {canonical JSON input}`` (bounded). The source's opaque
  call id is never written: the CLI gets no ``tool_use`` block to pair it with.
* ``tool_result``: ``[result STATUS exit=N] summary`` (bounded, ``(truncated)`` noted).
* ``file_input`` / ``artifact_ref``: a one-line note naming the attachment (its content is
  not transferred).
* ``warning`` / ``error``: ``[warning CODE] message`` / ``[error CODE] message``.
* ``unknown``: omitted (never treated as portable text).

``system`` messages are not copied: profile instructions come from the profile snapshot,
not from transcript text. A message left with no content is skipped. The transcript ends
with the last copied assistant message; user messages after it are sent as the leading
content blocks of the new input's message (see :func:`plan_seed`). Each record also
keeps its Braid message id as ``braidMessageId`` (the CLI ignores unknown fields).

While it copies, the seed notes every omitted and transformed part by its stable part id
in a :class:`CopyReport`, which becomes the session's ``ContextTransferReceipt``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.model import (
    ArtifactRefPart,
    ContextOmission,
    ContextTransferReceipt,
    ContextTransformation,
    ErrorPart,
    FileInputPart,
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    WarningPart,
)

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.providers._port import ContextMessage, PortableContext

TOOL_INPUT_LIMIT: Final = 2000
"""Characters of a tool call's JSON input kept in its copied line."""
TOOL_RESULT_LIMIT: Final = 4000
"""Characters of a tool result's summary kept in its copied line."""


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " … (truncated)"


def part_text(part: Part) -> str | None:
    """The normalized text a part is copied as (None: not copied)."""
    if isinstance(part, TextPart):
        return part.text or None
    if isinstance(part, ToolRequestPart):
        data = json.dumps(dict(part.input), sort_keys=True, ensure_ascii=False)
        return f"[tool {part.name}] {_bounded(data, TOOL_INPUT_LIMIT)}"
    if isinstance(part, ToolResultPart):
        head = f"[result {part.status}"
        if part.exit_code is not None:
            head += f" exit={part.exit_code}"
        head += "]"
        summary = _bounded(part.summary, TOOL_RESULT_LIMIT)
        if part.truncated and len(part.summary) <= TOOL_RESULT_LIMIT:
            summary += " … (truncated)"
        return f"{head} {summary}" if summary else head
    if isinstance(part, FileInputPart):
        return f"[attachment {part.name} ({part.media_type}), content not copied]"
    if isinstance(part, ArtifactRefPart):
        return f"[artifact {part.ref} ({part.media_type}), content not copied]"
    if isinstance(part, WarningPart):
        return f"[warning {part.code}] {part.message}"
    if isinstance(part, ErrorPart):
        return f"[error {part.code}] {part.message}"
    return None  # reasoning, unknown


SYSTEM_OMITTED: Final = "system message: instructions come from the profile snapshot"


def _omission_reason(part: Part) -> str:
    if isinstance(part, ReasoningPart):
        return "the source runner's private reasoning is not transferred"
    if isinstance(part, TextPart):
        return "empty text"
    return "not portable: no shared translation for this part"


def _transformation(part: Part) -> str | None:
    """How a copied part's text differs from the part (None: copied unchanged)."""
    if isinstance(part, ToolRequestPart):
        how = "tool call as a text line; the source's call id is not reused"
        if len(json.dumps(dict(part.input), sort_keys=True, ensure_ascii=False)) > (
            TOOL_INPUT_LIMIT
        ):
            how += "; input truncated"
        return how
    if isinstance(part, ToolResultPart):
        how = "tool result as a bounded text summary"
        if part.truncated or len(part.summary) > TOOL_RESULT_LIMIT:
            how += "; truncated"
        return how
    if isinstance(part, FileInputPart | ArtifactRefPart):
        return "a note naming the attachment; its content is not copied"
    if isinstance(part, WarningPart | ErrorPart):
        return f"{part.kind} as a text line"
    return None


@attrs.define
class CopyReport:
    """What a seed copied of a portable context, by stable part id (filled as it copies)."""

    included: list[str] = attrs.Factory(list)
    omitted: list[ContextOmission] = attrs.Factory(list)
    transformed: list[ContextTransformation] = attrs.Factory(list)

    def receipt(
        self, context: PortableContext, *, runner: str, session_id: str
    ) -> ContextTransferReceipt:
        """The transfer receipt for a session started from ``context`` with this copy."""
        return ContextTransferReceipt(
            source_digest=context.digest,
            included_message_ids=tuple(self.included),
            omitted_parts=tuple(self.omitted),
            transformed_parts=tuple(self.transformed),
            estimated_input_tokens=None,
            destination_runner=runner,
            destination_session_id=session_id,
        )


def message_texts(message: ContextMessage, report: CopyReport | None = None) -> list[str]:
    """The texts a context message is copied as (one per copied part), noted in ``report``.

    A ``system`` message is never copied; a message left with no text is not included.
    """
    texts: list[str] = []
    for part in message.parts:
        text = None if message.role == "system" else part_text(part)
        if report is None:
            pass
        elif text is None:
            reason = SYSTEM_OMITTED if message.role == "system" else _omission_reason(part)
            report.omitted.append(
                ContextOmission(message.message_id, part.part_id, part.kind, reason)
            )
        elif (how := _transformation(part)) is not None:
            report.transformed.append(
                ContextTransformation(message.message_id, part.part_id, part.kind, how)
            )
        if text is not None:
            texts.append(text)
    if texts and report is not None:
        report.included.append(message.message_id)
    return texts


def message_content(
    message: ContextMessage, report: CopyReport | None = None
) -> list[dict[str, Any]]:
    """A context message's parts as the CLI's content blocks (all ``text``)."""
    return [{"type": "text", "text": text} for text in message_texts(message, report)]


@attrs.frozen
class Seed:
    """How a portable context enters a new Claude Code session."""

    records: list[dict[str, Any]]
    """The transcript records to write (empty: no transcript, a plain fresh session)."""
    lead: list[dict[str, Any]]
    """Content blocks of the context's trailing user messages, sent before the new input."""
    report: CopyReport = attrs.Factory(CopyReport)
    """What of the context was copied, omitted or transformed (by part id)."""


def plan_seed(
    context: PortableContext,
    *,
    session_id: str,
    cwd: str,
    model: str | None,
    now: datetime | None = None,
) -> Seed:
    """The transcript records (one per copied message, uuid-chained) for ``context``.

    The transcript ends with the last copied assistant message: the CLI, resuming a
    transcript that ends with a user message, would answer it with a made-up assistant
    message, so the user messages after it lead the new input's own message instead.
    """
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    report = CopyReport()
    copied = [
        (index, message, content)
        for index, message in enumerate(context.messages)
        for content in [message_content(message, report)]
        if content
    ]
    last_assistant = max(
        (n for n, (_, message, _) in enumerate(copied) if message.role == "assistant"),
        default=-1,
    )
    records: list[dict[str, Any]] = []
    parent: str | None = None
    for index, message, content in copied[: last_assistant + 1]:
        record_id = str(uuid.uuid4())
        body: dict[str, Any]
        if message.role == "user":
            body = {"role": "user", "content": content}
        else:
            body = {
                "id": f"msg_braid_{session_id.replace('-', '')[:12]}_{index:04d}",
                "type": "message",
                "role": "assistant",
                "model": model or "unknown",
                "content": content,
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
        records.append(
            {
                "parentUuid": parent,
                "isSidechain": False,
                "userType": "external",
                "entrypoint": "sdk-cli",
                "cwd": cwd,
                "sessionId": session_id,
                "type": message.role,
                "message": body,
                "uuid": record_id,
                "timestamp": stamp,
                "braidMessageId": message.message_id,
            }
        )
        parent = record_id
    lead = [block for _, _, content in copied[last_assistant + 1 :] for block in content]
    return Seed(records=records, lead=lead, report=report)


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Write a seed transcript at ``path`` (which must not exist yet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps(record, ensure_ascii=False) + "\n")
