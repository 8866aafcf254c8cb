"""Gemini CLI chat files (``~/.gemini/tmp/<project hash>/chats/session-<time>-<id>.json``).

One JSON document, not JSONL, rewritten whole on every turn::

    {"sessionId", "projectHash", "startTime", "lastUpdated",
     "messages": [{"id", "timestamp", "type", "content", "thoughts", "tokens", "model",
                   "toolCalls": [{"id", "name", "args", "result", "status", "timestamp", …}]}]}

Units: :func:`split_gemini` turns the document into numbered records in place of physical
lines, so coverage counts records: record 1 is the session header (every top-level key but
``messages``), record ``k + 1`` is ``messages[k]``. Each record keeps its byte range in the
file. A document that does not decode is one ``failed`` record.

- ``user`` and ``gemini`` messages become message entries (``content`` is a string or a list
  of parts with ``text``); each of a reply's ``thoughts`` is a message with status
  ``reasoning``. ``info``, ``error`` and ``warning`` messages are session entries. Any other
  message ``type`` is ``unrecognized`` (counted, never fatal); so is a non-object message.
- Each ``toolCalls`` item is a tool call; each ``functionResponse`` in its ``result`` is a
  tool result, linked to the call whose ``id`` it names (anywhere in the file). A result with
  no recorded call is ``completion_only``; a call with no result is reported as
  ``unmatched_tool_call``. A call whose ``status`` is ``error`` or ``cancelled`` gives its
  results that status.
- ``tokens`` is counted once per message ``id`` (a message repeated under one id counts once).
- The reply's ``model`` is carried on ordinary records; a ``configuration`` snapshot entry is
  written whenever it changes. The first user prompt is also recorded as a ``task``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs

from ._parsed import (
    Content,
    Draft,
    DraftLine,
    Line,
    LineInfo,
    LineSplit,
    Link,
    Outcome,
    SessionInfo,
    as_dict,
    as_list,
    as_str,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

PARSER_VERSION: Final = "braid.gemini_cli/1"
FORMAT_VERSION: Final = "gemini_cli.chat_json"
MESSAGE_TYPES: Final = frozenset({"user", "gemini"})
NOTICE_TYPES: Final = frozenset({"info", "error", "warning"})
_USAGE_KEYS: Final = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cached": "cached_input_tokens",
    "thoughts": "thoughts_tokens",
    "tool": "tool_tokens",
    "total": "total_tokens",
}
_FAILED_STATUSES: Final = {"error": "error", "cancelled": "cancelled"}
_HEADER: Final = 1


# ---- splitting ---------------------------------------------------------------------------


def split_gemini(data: bytes) -> LineSplit:
    """The document's records: the session header, then one record per message."""
    size = len(data)
    try:
        text = data.decode("utf-8")
        document = json.loads(text)
    except ValueError:
        failed = Line(_HEADER, 0, size, data, None, "malformed_json")
        return LineSplit(lines=(failed,), deferred=None, size=size, complete_end=size)
    if not isinstance(document, dict):
        failed = Line(_HEADER, 0, size, data, None, "not_an_object")
        return LineSplit(lines=(failed,), deferred=None, size=size, complete_end=size)
    spans = list(_message_spans(text))
    # A ``messages`` value that is not a list stays in the header, which reports it.
    header = {k: v for k, v in document.items() if k != "messages" or not isinstance(v, list)}
    first = spans[0][0] if spans else len(text)
    offsets = _ByteOffsets(text)
    lines = [Line(_HEADER, 0, offsets.of(first), _dumps(header), header, None)]
    messages = as_list(document.get("messages"))
    for index, (start, end) in enumerate(spans):
        value = messages[index] if index < len(messages) else None
        raw = text[start:end].encode("utf-8")
        begin, finish = offsets.of(start), offsets.of(end)
        number = index + 2
        if isinstance(value, dict):
            lines.append(Line(number, begin, finish, raw, value, None))
        else:
            lines.append(Line(number, begin, finish, raw, None, "not_an_object"))
    return LineSplit(lines=tuple(lines), deferred=None, size=size, complete_end=size)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _ByteOffsets:
    """Character offsets of a decoded text as byte offsets of its UTF-8 encoding."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._char = 0
        self._byte = 0

    def of(self, char: int) -> int:
        if char < self._char:  # offsets are asked in order; restart otherwise
            self._char, self._byte = 0, 0
        self._byte += len(self._text[self._char : char].encode("utf-8"))
        self._char = char
        return self._byte


def _message_spans(text: str) -> Iterator[tuple[int, int]]:
    """Character ranges of the ``messages`` array's items (the document is valid JSON)."""
    decoder = json.JSONDecoder()
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        return
    at = _skip(text, at + 1)
    while at < len(text) and text[at] != "}":
        key, at = decoder.raw_decode(text, at)
        at = _skip(text, _skip(text, at) + 1)  # past ':'
        if key == "messages" and text[at : at + 1] == "[":
            at = _skip(text, at + 1)
            while at < len(text) and text[at] != "]":
                _value, end = decoder.raw_decode(text, at)
                yield at, end
                at = _skip(text, end)
                if text[at : at + 1] == ",":
                    at = _skip(text, at + 1)
            return
        _value, at = decoder.raw_decode(text, at)
        at = _skip(text, at)
        if text[at : at + 1] == ",":
            at = _skip(text, at + 1)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


# ---- parsing -----------------------------------------------------------------------------


@attrs.define(eq=False)
class _State:
    out: Outcome
    session: str
    calls: dict[str, Draft] = attrs.Factory(dict)
    answered: set[str] = attrs.Factory(set)
    results: list[tuple[Draft, str]] = attrs.Factory(list)
    """Results whose call was not yet seen, with the call id they name."""
    usage: dict[str, dict[str, int]] = attrs.Factory(dict)
    model: str | None = None
    tasked: bool = False


def parse_gemini(split: LineSplit, *, fallback_session: str) -> Outcome:
    """Parse a Gemini CLI chat document split by :func:`split_gemini`."""
    out = Outcome("gemini_cli", PARSER_VERSION, FORMAT_VERSION)
    header = split.lines[0].obj if split.lines else None
    session = as_str(as_dict(header).get("sessionId"))
    info = SessionInfo(session_id=session or fallback_session)
    if session is None:
        info.evidence.append("session_id_from_file_name")
    out.sessions[info.session_id] = info
    state = _State(out, info.session_id)
    for line in split.lines:
        obj = line.obj
        if obj is None:
            out.lines.append(LineInfo(line.number, state.session, "failed", "", None))
            out.issue(line.error or "malformed_json", line.number, state.session)
            continue
        if line.number == _HEADER:
            _header(state, line, obj)
            continue
        mtype = obj.get("type")
        timestamp = as_str(obj.get("timestamp"))
        if not isinstance(mtype, str) or mtype not in MESSAGE_TYPES | NOTICE_TYPES:
            out.lines.append(
                LineInfo(line.number, state.session, "unrecognized", str(mtype)[:64], timestamp)
            )
            out.issue("unrecognized_record", line.number, state.session, "type")
            continue
        out.lines.append(LineInfo(line.number, state.session, "ok", mtype, timestamp))
        helper = DraftLine(out, line.number, state.session, timestamp)
        if mtype in NOTICE_TYPES:
            helper.add("session", mtype, role="system", content=Content.text(_text(obj)))
            continue
        _message(state, helper, obj)
    _finish(state)
    return out


def _header(state: _State, line: Line, obj: dict[str, Any]) -> None:
    out = state.out
    timestamp = as_str(obj.get("startTime"))
    out.lines.append(LineInfo(line.number, state.session, "ok", "session", timestamp))
    helper = DraftLine(out, line.number, state.session, timestamp)
    helper.add("session", "session_start", content=Content.json(obj))
    if "messages" in obj:
        out.issue("unrecognized_record", line.number, state.session, "messages")


def _message(state: _State, helper: DraftLine, obj: dict[str, Any]) -> None:
    out = state.out
    user = obj.get("type") == "user"
    role = "user" if user else "assistant"
    msg_id = as_str(obj.get("id"))
    text = _text(obj)
    if user:
        helper.add(
            "message",
            "recorded",
            role="user",
            content=Content.text(text),
            intent={"role": "user", "prompt": text},
        )
        out.stat(helper.session, "messages")
        if text.strip() and not state.tasked:
            state.tasked = True
            helper.add(
                "task",
                "initial_prompt",
                role="user",
                content=Content.text(text),
                fields=frozenset({"task"}),
            )
            out.stat(helper.session, "tasks")
        return
    model = as_str(obj.get("model"))
    if model and model != state.model:
        state.model = model
        helper.add(
            "configuration",
            "snapshot",
            content=Content.json({"model": model}),
            fields=frozenset({"configuration", "configuration.model"}),
        )
        out.stat(helper.session, "configurations")
    tokens = as_dict(obj.get("tokens"))
    if tokens:
        out.stat(helper.session, "usage_lines")
        key = msg_id or f"record:{helper.line}"
        state.usage[key] = {
            name: value
            for source, name in _USAGE_KEYS.items()
            if isinstance(value := tokens.get(source), int) and not isinstance(value, bool)
        }
    intent = {"role": role, "message_id": msg_id, "model": model}
    for thought in as_list(obj.get("thoughts")):
        thought = as_dict(thought)
        subject = str(thought.get("subject") or "")
        description = str(thought.get("description") or "")
        body = f"{subject}\n\n{description}" if subject and description else subject or description
        helper.add(
            "message",
            "reasoning",
            role=role,
            recorded_at=as_str(thought.get("timestamp")) or helper.recorded_at,
            content=Content.text(body),
            intent={**intent, "thinking": body},
        )
        out.stat(helper.session, "reasoning")
    content = obj.get("content")
    if content is not None and (text or not as_list(obj.get("toolCalls"))):
        helper.add(
            "message",
            "recorded",
            role=role,
            content=Content.text(text),
            intent={**intent, "answer": text},
        )
        out.stat(helper.session, "messages")
    for call in as_list(obj.get("toolCalls")):
        _tool_call(state, helper, as_dict(call), intent)


def _tool_call(
    state: _State, helper: DraftLine, call: dict[str, Any], intent: dict[str, Any]
) -> None:
    out = state.out
    call_id = as_str(call.get("id"))
    name = as_str(call.get("name"))
    status = as_str(call.get("status"))
    draft = helper.add(
        "tool_call",
        "requested",
        role="assistant",
        recorded_at=as_str(call.get("timestamp")) or helper.recorded_at,
        tool_call_id=call_id,
        tool_name=name,
        content=Content.json(call.get("args")),
        intent={**intent, "tool": {"id": call_id, "name": name, "input": call.get("args")}},
    )
    out.stat(helper.session, "tool_calls")
    if call_id:
        state.calls[call_id] = draft
    for part in as_list(call.get("result")):
        response = as_dict(as_dict(part).get("functionResponse"))
        if not response:
            continue
        result_id = as_str(response.get("id")) or call_id
        result = helper.add(
            "tool_result",
            _FAILED_STATUSES.get(status or "", "returned"),
            role="user",
            recorded_at=as_str(call.get("timestamp")) or helper.recorded_at,
            tool_call_id=result_id,
            tool_name=as_str(response.get("name")) or name,
            content=_response_content(response.get("response")),
        )
        out.stat(helper.session, "tool_results")
        state.results.append((result, result_id or ""))


def _response_content(value: Any) -> Content:
    body = as_dict(value)
    if set(body) == {"output"} and isinstance(body["output"], str):
        return Content.text(body["output"])
    return Content.json(value)


def _text(obj: dict[str, Any]) -> str:
    content = obj.get("content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in as_list(content) if isinstance(content, list) else [content]:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(text := as_dict(part).get("text"), str):
            parts.append(text)
    return "\n".join(parts)


def _finish(state: _State) -> None:
    out = state.out
    for result, call_id in state.results:
        call = state.calls.get(call_id) if call_id else None
        if call is None:
            result.status = "completion_only"
            out.issue("orphan_tool_result", result.line, result.session)
            out.stat(result.session, "orphan_results")
            continue
        state.answered.add(call_id)
        result.refs.append(call.key)
        out.links.append(Link("tool_result", result.key, call.key, "functionResponse.id", call_id))
    for call_id, call in state.calls.items():
        if call_id not in state.answered:
            out.issue("unmatched_tool_call", call.line, call.session)
            out.stat(call.session, "unmatched_calls")
    totals: Counter[str] = Counter()
    for usage in state.usage.values():
        totals["responses"] += 1
        for key, value in usage.items():
            totals[key] += value
    if totals:
        out.usage[state.session] = totals
