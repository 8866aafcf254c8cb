"""One turn read back from a Codex rollout, for reconciliation.

Design note. Codex records a turn in its rollout as ``event_msg`` ``task_started``, the
turn's input (a ``user`` ``response_item``), one ``event_msg`` ``item_completed`` per item
(``Reasoning``, ``AgentMessage``, ``CommandExecution``, …), ``token_count`` events (the
thread's running totals) and an end: ``task_complete``, or ``turn_aborted`` (an interrupt;
also what Codex writes when its output breaks because Braid died), with ``error`` events
for failures. The turn is the last ``task_started`` after the thread's boundary before it
(the runner's own last item id, or ``sha256:`` of that line) whose input holds the turn's
text.

``exec --json`` numbers the items of its process ``item_0``, ``item_1``, … in the order it
reports them — the order of the rollout's non-user ``item_completed`` events — so the parts
read here get the ids the live stream gave (``<thread>:item_N``), through the same
:class:`._codex_stream.EventMapper`. The turn's usage is the last total in the turn minus
the last total before it; Codex reports no cost (null).
"""

from __future__ import annotations

import hashlib
import shlex
from typing import TYPE_CHECKING, Any

from braid_actors.model import Part, Usage
from braid_actors.providers._claude_record import RecordedTurn, read_raw_lines
from braid_actors.providers._codex_stream import EventMapper, Totals

if TYPE_CHECKING:
    from pathlib import Path


def _item_id(raw: bytes, line: dict[str, Any]) -> str | None:
    """A ``response_item``'s identity as :func:`._codex_stream.read_rollout` gives it."""
    if line.get("type") != "response_item":
        return None
    payload = line.get("payload")
    ident = payload.get("id") if isinstance(payload, dict) else None
    if isinstance(ident, str) and ident:
        return ident
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _event(line: dict[str, Any]) -> dict[str, Any] | None:
    payload = line.get("payload")
    if line.get("type") == "event_msg" and isinstance(payload, dict):
        return payload
    return None


def _user_text(line: dict[str, Any]) -> str:
    payload = line.get("payload")
    if line.get("type") != "response_item" or not isinstance(payload, dict):
        return ""
    if payload.get("type") != "message" or payload.get("role") != "user":
        return ""
    content = payload.get("content")
    blocks = content if isinstance(content, list) else []
    return "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def exec_item(item: dict[str, Any], ident: str) -> dict[str, Any]:
    """A rollout ``item_completed`` item in the shape ``exec --json`` reports it."""
    kind = item.get("type")
    if kind == "Reasoning":
        summary = item.get("summary_text")
        texts = summary if isinstance(summary, list) else []
        return {"id": ident, "type": "reasoning", "text": "\n".join(map(str, texts))}
    if kind == "AgentMessage":
        content = item.get("content")
        blocks = content if isinstance(content, list) else []
        text = "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
        return {"id": ident, "type": "agent_message", "text": text}
    if kind == "CommandExecution":
        command = item.get("command")
        shown = shlex.join(map(str, command)) if isinstance(command, list) else str(command)
        return {
            "id": ident,
            "type": "command_execution",
            "command": shown,
            "aggregated_output": item.get("aggregated_output", ""),
            "exit_code": item.get("exit_code"),
            "status": str(item.get("status", "")).lower(),
        }
    return {**item, "id": ident, "type": str(kind).lower()}


def read_codex_turn(path: Path, *, thread_id: str, text: str, after: str | None) -> RecordedTurn:
    """The turn whose input is ``text``, after the item ``after`` (see the module note).

    Raises ``OSError`` when the rollout can't be read and ``ValueError`` for a bad line.
    """
    raw = read_raw_lines(path)
    lines = [line for _, line in raw]
    start = 0
    if after is not None:
        found = [i for i, (data, line) in enumerate(raw) if _item_id(data, line) == after]
        if not found:
            return RecordedTurn(False, False, "the rollout no longer holds the turn's start")
        start = found[-1] + 1
    starts = [
        i
        for i in range(start, len(lines))
        if (_event(lines[i]) or {}).get("type") == "task_started"
    ]
    chosen = None
    for index, begin in enumerate(starts):
        stop = starts[index + 1] if index + 1 < len(starts) else len(lines)
        if any(text in _user_text(line) for line in lines[begin:stop]):
            chosen = (begin, stop)
    if chosen is None:
        return RecordedTurn(False, False, "the rollout holds no record of this turn's input")
    begin, stop = chosen
    baseline = Totals()
    for line in lines[:begin]:
        total = _total(line)
        if total is not None:
            baseline = total
    mapper = EventMapper(thread_id=thread_id)
    parts: dict[str, Part] = {}
    latest: Totals | None = None
    ending, finished, error = "the rollout ends mid-turn", False, None
    counter = 0
    for line in lines[begin + 1 : stop]:
        event = _event(line) or {}
        kind = event.get("type")
        total = _total(line)
        if total is not None:
            latest = total
        if kind == "item_completed" and isinstance(event.get("item"), dict):
            item = event["item"]
            if item.get("type") == "UserMessage":
                continue
            shaped = exec_item(item, f"item_{counter}")
            counter += 1
            for part in mapper.item({"type": "item.completed", "item": shaped}):
                parts[part.part_id] = part
        elif kind == "error":
            error = str(event.get("message") or "Codex reported an error")
            parts_error = mapper.error(event)
            parts[parts_error.part_id] = parts_error
        elif kind == "task_complete":
            ending, finished = ("completed", True) if error is None else (f"failed: {error}", True)
        elif kind == "turn_aborted":
            ending, finished = f"aborted: {event.get('reason') or 'interrupted'}", True
    usage = Usage() if latest is None else latest.minus(baseline).usage()
    return RecordedTurn(True, finished, ending, tuple(parts.values()), usage, None)


def _total(line: dict[str, Any]) -> Totals | None:
    event = _event(line)
    if event is None or event.get("type") != "token_count":
        return None
    info = event.get("info")
    return Totals.of(info.get("total_token_usage") if isinstance(info, dict) else None)
