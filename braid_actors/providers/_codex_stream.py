"""Codex's ``exec --json`` events mapped to Braid parts, and its rollout (session) files.

Design note. ``codex exec --json`` prints one JSON event a line: ``thread.started``
(``thread_id``), ``turn.started``, ``item.started`` / ``item.updated`` / ``item.completed``
(an ``item`` with an ``id`` such as ``item_3`` and a ``type``), ``turn.completed`` (``usage``),
``turn.failed`` (``error.message``) and ``error`` (``message``). Item ids count from
``item_0`` in every ``exec`` process, so they are unique within one turn (one assistant
message) only: a part's id is ``<thread id>:<item id>``, and a command's result part
``<thread id>:<item id>:result``. Every newer version of an item replaces the same part.

The rollout ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl`` holds the
thread's history: ``response_item`` lines are what the model is sent back on ``resume``.
Its end (:func:`read_rollout`) is the last ``response_item``'s ``payload.id`` (Codex gives
every message, reasoning, call and call output one), or ``sha256:<hex>`` of that raw line
when it has none. The ``usage`` of ``turn.completed`` is the thread's running total (it
survives ``resume``), so a turn's own usage is that total minus the rollout's last
``token_count`` total before the turn. This module does no I/O except reading a rollout.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.model import (
    ErrorPart,
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    UnknownPart,
    Usage,
)

if TYPE_CHECKING:
    from pathlib import Path

SUMMARY_LIMIT: Final = 4000
"""Characters of a command's output kept as its result summary."""

_THREAD_ID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def is_codex_thread_id(value: str) -> bool:
    """True for Codex's thread ids (lower-case UUIDs): safe inside a file name pattern."""
    return bool(_THREAD_ID.match(value))


def find_rollout(codex_home: Path, thread_id: str) -> Path | None:
    """The rollout file of ``thread_id`` (None when there is none yet)."""
    if not is_codex_thread_id(thread_id):
        return None
    found = sorted((codex_home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
    return found[-1] if found else None


@attrs.frozen
class Totals:
    """Token counts as Codex totals them (``total_token_usage`` / ``turn.completed``)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0

    @classmethod
    def of(cls, raw: object) -> Totals | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            input_tokens=_count(raw.get("input_tokens")),
            cached_input_tokens=_count(raw.get("cached_input_tokens")),
            output_tokens=_count(raw.get("output_tokens")),
            reasoning_output_tokens=_count(raw.get("reasoning_output_tokens")),
        )

    def minus(self, earlier: Totals) -> Totals:
        return Totals(
            input_tokens=max(self.input_tokens - earlier.input_tokens, 0),
            cached_input_tokens=max(self.cached_input_tokens - earlier.cached_input_tokens, 0),
            output_tokens=max(self.output_tokens - earlier.output_tokens, 0),
            reasoning_output_tokens=max(
                self.reasoning_output_tokens - earlier.reasoning_output_tokens, 0
            ),
        )

    def usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cached_input_tokens,
            reasoning_tokens=self.reasoning_output_tokens,
            source="provider",
        )


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


@attrs.frozen
class RolloutEnd:
    """Where a rollout ends: its last ``response_item``'s identity, and its usage total."""

    thread_id: str | None
    last_item_id: str | None
    items: int
    totals: Totals


def read_rollout(path: Path) -> RolloutEnd:
    """Read a rollout (never modifying it); see the module note.

    Raises ``OSError`` when it can't be read and ``ValueError`` when a line is not a JSON
    object.
    """
    thread: str | None = None
    last: str | None = None
    count = 0
    totals = Totals()
    with path.open("rb") as stream:
        for raw in stream:
            if not raw.strip():
                continue
            line = json.loads(raw)
            if not isinstance(line, dict):
                raise ValueError("a rollout line is not a JSON object")
            payload = line.get("payload")
            body: dict[str, Any] = payload if isinstance(payload, dict) else {}
            kind = line.get("type")
            if kind == "session_meta" and thread is None and isinstance(body.get("id"), str):
                thread = body["id"]
            elif kind == "response_item":
                ident = body.get("id")
                if isinstance(ident, str) and ident:
                    last = ident
                else:
                    last = "sha256:" + hashlib.sha256(raw.rstrip(b"\r\n")).hexdigest()
                count += 1
            elif kind == "event_msg" and body.get("type") == "token_count":
                info = body.get("info")
                total = Totals.of(info.get("total_token_usage") if isinstance(info, dict) else None)
                if total is not None:
                    totals = total
    return RolloutEnd(thread_id=thread, last_item_id=last, items=count, totals=totals)


@attrs.define(eq=False)
class EventMapper:
    """Turns ``exec --json`` items into parts (stateful: one per turn)."""

    thread_id: str = ""
    errors: int = 0

    def item(self, event: dict[str, Any]) -> list[Part]:
        """An ``item.started`` / ``item.updated`` / ``item.completed`` event's parts."""
        item = event.get("item")
        if not isinstance(item, dict):
            return []
        ident = item.get("id")
        if not isinstance(ident, str) or not ident:
            return []
        part_id = f"{self.thread_id}:{ident}"
        kind = item.get("type")
        if kind == "agent_message":
            return [TextPart(part_id=part_id, text=str(item.get("text", "")))]
        if kind == "reasoning":
            return [ReasoningPart(part_id=part_id, text=str(item.get("text", "")))]
        if kind == "error":
            return [ErrorPart(part_id=part_id, code="codex_error", message=_message(item))]
        if kind == "command_execution":
            return self._command(part_id, ident, item, done=event.get("type") == "item.completed")
        return [UnknownPart(part_id=part_id, payload_type=f"codex.{kind}", payload=item)]

    def _command(self, part_id: str, ident: str, item: dict[str, Any], *, done: bool) -> list[Part]:
        command = str(item.get("command", ""))
        request = ToolRequestPart(
            part_id=part_id,
            name="command_execution",
            input={"command": command},
            call_id=ident,
        )
        status = item.get("status")
        if not done and status == "in_progress":
            return [request]
        exit_code = item.get("exit_code")
        code = exit_code if type(exit_code) is int else None
        output = str(item.get("aggregated_output", ""))
        result_status: Any
        if status == "declined":
            result_status = "denied"
        elif status == "completed" and code in (0, None):
            result_status = "ok"
        else:
            result_status = "error"
        result = ToolResultPart(
            part_id=f"{part_id}:result",
            request_part_id=part_id,
            status=result_status,
            summary=output[:SUMMARY_LIMIT],
            truncated=len(output) > SUMMARY_LIMIT,
            exit_code=code,
        )
        return [request, result]

    def error(self, event: dict[str, Any]) -> ErrorPart:
        """A top-level ``error`` event as an error part (numbered within the turn)."""
        self.errors += 1
        return ErrorPart(
            part_id=f"{self.thread_id}:error:{self.errors}",
            code="codex_error",
            message=_message(event),
        )


def _message(body: dict[str, Any]) -> str:
    message = body.get("message")
    if isinstance(message, str) and message:
        return message
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return "Codex reported an error"


def failure_message(event: dict[str, Any]) -> str:
    """The message of a ``turn.failed`` / ``error`` event."""
    return _message(event)
