"""Codex rollout JSONL (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Envelope format: every line is ``{"timestamp", "type", "payload"}`` with ``type`` one of
``session_meta``, ``turn_context``, ``response_item``, ``event_msg``, ``compacted`` (and, since
0.17x, ``world_state`` and ``token_usage_record``). The legacy
pre-envelope format starts with a bare ``{"id", "timestamp", ...}`` meta line followed by
bare response items and ``{"record_type": "state"}`` lines; both are read the same way.

- ``session_meta`` and ``turn_context`` are ``configuration`` entries (statuses
  ``session_metadata`` / ``turn_context``). The first ``session_meta`` owns the file: a later
  one (a child replaying its parent's history) is ``replayed_session_metadata`` and changes
  nothing. A valid ``forked_from_id`` becomes the entry's typed ``session_metadata`` (an empty
  object records an observed absence); ``source.subagent.thread_spawn.parent_thread_id``
  becomes the source's ``parent_session_id``.
- Calls (``function_call``, ``custom_tool_call``, ``local_shell_call``) are matched to
  outputs by ``call_id``; a call without output is reported (``unmatched_tool_call``), an
  output without call is ``completion_only``. ``web_search_call`` carries its own result.
- ``event_msg`` ``user_message`` / ``agent_message`` / ``agent_reasoning`` repeat the
  response items' text: they are kept as separate entries (statuses
  ``source_message_event`` / ``source_reasoning_event``; equal text never merges source
  identities) that cite the response item they duplicate, and the summary counts them as
  ``duplicate_messages``. Repeated ``token_count`` snapshots (same cumulative totals) are
  counted once.
- ``world_state`` (``{"full", "state"}``: the model-visible context — model, collaboration
  mode, environments with their cwd, skills, permissions, tool instructions) is a
  ``configuration`` entry (status ``world_state``).
- ``event_msg/thread_settings_applied`` (the thread's settings as applied: model, provider,
  approval policy, permission profile with its file-system entries and network mode, cwd,
  collaboration mode) is a ``configuration`` entry (status ``thread_settings_applied``).
- ``token_usage_record`` (one response's ``usage`` with its ``turn_token_usage`` and
  ``thread_token_usage`` running totals, by ``response_id``) is a session entry: the same
  figures reach usage through the ``token_count`` events, so they are not counted again.
- ``compacted`` is a session entry; its replacement history's tool outputs are
  ``context_replacement`` results (no new execution).
- ``spawn_agent`` outputs naming a new agent are ``spawn`` actions; ``send_input`` calls are
  ``send_input`` actions (session relations ``delegation`` and ``message_request``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs

from ._codex_config import thread_settings, turn_context, world_state
from ._parsed import (
    Action,
    Content,
    Draft,
    DraftLine,
    LineInfo,
    Link,
    Outcome,
    SessionInfo,
    as_dict,
    as_list,
    as_str,
    resolve_pending,
)

if TYPE_CHECKING:
    from ._parsed import LineSplit

PARSER_VERSION: Final = "braid.codex/3"
ENVELOPE: Final = "codex.rollout_jsonl/envelope"
LEGACY: Final = "codex.rollout_jsonl/legacy"
ENVELOPE_TYPES: Final = frozenset(
    {
        "session_meta",
        "turn_context",
        "response_item",
        "event_msg",
        "compacted",
        "world_state",
        "token_usage_record",
    }
)
ITEM_TYPES: Final = frozenset(
    {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "web_search_call",
        "ghost_snapshot",
        "compaction",
        "compaction_summary",
    }
)
CALL_TYPES: Final = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
OUTPUT_TYPES: Final = frozenset({"function_call_output", "custom_tool_call_output"})
QUIET_EVENTS: Final = frozenset(
    {
        "exec_command_begin",
        "exec_command_end",
        "exec_command_output_delta",
        "patch_apply_begin",
        "patch_apply_end",
        "turn_diff",
        "mcp_tool_call_begin",
        "mcp_tool_call_end",
        "web_search_begin",
        "web_search_end",
        "background_event",
        "error",
        "stream_error",
        "item_started",
        "item_completed",
        "agent_message_delta",
        "agent_reasoning_delta",
        "agent_reasoning_section_break",
        "entered_review_mode",
        "exited_review_mode",
        "plan_update",
        "thread_name_updated",
        "session_configured",
        "view_image_tool_call",
        "undo_started",
        "undo_completed",
        "list_custom_prompts_response",
        "mcp_list_tools_response",
        "get_history_entry_response",
        "shutdown_complete",
        "deprecation_notice",
        "warning",
    }
)
_MESSAGE_EVENTS: Final = {"user_message": "user", "agent_message": "assistant"}
_REASONING_EVENTS: Final = frozenset({"agent_reasoning", "agent_reasoning_raw_content"})
_TASK_EVENTS: Final = {
    "task_started": "started",
    "task_complete": "completed",
    "turn_aborted": "aborted",
}
_APPROVAL_EVENTS: Final = frozenset({"exec_approval_request", "apply_patch_approval_request"})
_TOKEN_KEYS: Final = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
    "total_tokens",
)
RELATION_BODY_LIMIT: Final = 64 * 1024
_PENDING: Final = ""


@attrs.define(eq=False)
class _State:
    out: Outcome
    legacy: bool
    owner: str = _PENDING
    calls: dict[str, Draft] = attrs.Factory(dict)
    answered: set[str] = attrs.Factory(set)
    spawns: set[str] = attrs.Factory(set)
    pending: dict[tuple[str, str, str], list[Draft]] = attrs.Factory(dict)
    """Unpaired text by (form, role, text): form is ``item`` or ``event``."""
    last_tokens: dict[str, int] | None = None


def is_legacy_meta(obj: dict[str, Any]) -> bool:
    """A legacy first line: a bare session meta object."""
    return "type" not in obj and "payload" not in obj and isinstance(obj.get("id"), str)


def parse_codex(split: LineSplit, *, fallback_session: str) -> Outcome:
    """Parse a Codex rollout file's lines (either format)."""
    first = next((line.obj for line in split.lines if line.obj is not None), None)
    legacy = first is not None and (
        is_legacy_meta(first) or first.get("type") in ITEM_TYPES or "record_type" in first
    )
    state = _State(Outcome("codex", PARSER_VERSION, LEGACY if legacy else ENVELOPE), legacy)
    out = state.out
    for line in split.lines:
        obj = line.obj
        if obj is None:
            out.lines.append(LineInfo(line.number, state.owner, "failed", "", None))
            out.issue(line.error or "malformed_json", line.number, state.owner)
            continue
        rtype, payload = _envelope(state, obj, line.number == split.lines[0].number)
        timestamp = as_str(obj.get("timestamp"))
        if rtype == "session_meta" and state.owner == _PENDING:
            _own(state, payload)
        session = state.owner
        helper = DraftLine(out, line.number, session, timestamp)
        known = _dispatch(state, helper, rtype, payload)
        status = "ok" if known else "unrecognized"
        out.lines.append(LineInfo(line.number, session, status, _label(rtype, payload), timestamp))
        if not known:
            out.issue("unrecognized_record", line.number, session, "type")
    _finish(state, fallback_session)
    return out


def _envelope(state: _State, obj: dict[str, Any], first: bool) -> tuple[str, dict[str, Any]]:
    if not state.legacy:
        rtype = obj.get("type")
        payload = obj.get("payload")
        if isinstance(rtype, str) and isinstance(payload, dict):
            return rtype, payload
        return "?", {}
    if "record_type" in obj:
        return "state", obj
    if first and is_legacy_meta(obj):
        return "session_meta", obj
    if obj.get("type") in ITEM_TYPES:
        return "response_item", obj
    return "?", obj


def _label(rtype: str, payload: dict[str, Any]) -> str:
    sub = payload.get("type") if rtype in ("response_item", "event_msg") else None
    return f"{rtype}/{sub}"[:64] if isinstance(sub, str) else rtype[:64]


def _own(state: _State, payload: dict[str, Any]) -> None:
    sid = as_str(payload.get("id")) or as_str(payload.get("session_id"))
    if sid is None:
        return
    info = SessionInfo(session_id=sid)
    info.application_version = as_str(payload.get("cli_version"))
    info.workdir = as_str(payload.get("cwd"))
    spawn = as_dict(as_dict(as_dict(payload.get("source")).get("subagent")).get("thread_spawn"))
    parent = as_str(spawn.get("parent_thread_id")) or as_str(payload.get("parent_thread_id"))
    if parent:
        info.parent_session_id = parent
        info.evidence.append("session_meta_parent_thread_id")
    state.out.sessions[sid] = info
    state.owner = sid


def _dispatch(state: _State, helper: DraftLine, rtype: str, payload: dict[str, Any]) -> bool:
    if rtype == "session_meta":
        _session_meta(state, helper, payload)
    elif rtype == "turn_context":
        turn_context(helper, payload)
    elif rtype == "response_item":
        return _item(state, helper, payload)
    elif rtype == "event_msg":
        return _event(state, helper, payload)
    elif rtype == "compacted":
        _compacted(state, helper, payload)
    elif rtype == "world_state":
        world_state(helper, payload)
    elif rtype == "token_usage_record":
        # Metadata only: ``thread_token_usage`` is the cumulative total the following
        # ``event_msg/token_count`` reports as ``total_token_usage`` (and ``usage`` its
        # ``last_token_usage``); usage is counted from token_count, so never twice.
        helper.add("session", "token_usage_record", content=Content.json(payload))
        state.out.stat(helper.session, "token_usage_records")
    elif rtype != "state":
        return False
    return True


def _session_meta(state: _State, helper: DraftLine, payload: dict[str, Any]) -> None:
    out = state.out
    sid = as_str(payload.get("id")) or as_str(payload.get("session_id"))
    if helper.session != sid or any(
        d.status == "session_metadata" and d.session == helper.session for d in out.drafts
    ):
        helper.add("configuration", "replayed_session_metadata", content=Content.json(payload))
        out.stat(helper.session, "replayed_session_meta")
        return
    fields = {"configuration"}
    for key, name in (
        ("model_provider", "configuration.provider"),
        ("cli_version", "configuration.application_version"),
        ("cwd", "configuration.workdir"),
    ):
        if key in payload:
            fields.add(name)
    metadata: dict[str, Any] | None = {}
    if "forked_from_id" in payload:
        fork = payload.get("forked_from_id")
        if _valid_fork(fork):
            metadata = {"forked_from_id": fork}
        else:
            metadata = None
            out.issue("invalid_session_metadata", helper.line, helper.session, "forked_from_id")
    helper.add(
        "configuration",
        "session_metadata",
        content=Content.json(payload),
        session_metadata=metadata,
        fields=frozenset(fields),
    )
    out.stat(helper.session, "configurations")


def _valid_fork(value: object) -> bool:
    return (
        isinstance(value, str) and 1 <= len(value.encode("utf-8")) <= 512 and value == value.strip()
    )


def _item(state: _State, helper: DraftLine, item: dict[str, Any]) -> bool:
    out = state.out
    itype = item.get("type")
    if itype == "message":
        role = as_str(item.get("role")) or "unknown"
        text = _text(item.get("content"))
        draft = helper.add("message", "recorded", role=role, content=Content.text(text))
        out.stat(helper.session, "messages")
        _pair(state, "item", role, text, draft)
    elif itype == "reasoning":
        summary = "\n".join(str(as_dict(s).get("text", "")) for s in as_list(item.get("summary")))
        body = _text(item.get("content")) if item.get("content") else summary
        content = Content.text(body) if body else Content.unavailable("encrypted")
        draft = helper.add("message", "reasoning", role="assistant", content=content)
        out.stat(helper.session, "reasoning")
        _pair(state, "item", "reasoning", summary, draft)
    elif itype in CALL_TYPES:
        _call(state, helper, item)
    elif itype in OUTPUT_TYPES:
        _output(state, helper, item, replacement=False)
    elif itype == "web_search_call":
        helper.add(
            "tool_call",
            as_str(item.get("status")) or "requested",
            role="assistant",
            tool_name="web_search",
            content=Content.json(item.get("action")),
        )
        out.stat(helper.session, "tool_calls")
        out.stat(helper.session, "web_searches")
    elif itype in ITEM_TYPES:
        helper.add("session", str(itype), content=Content.json(item))
    else:
        return False
    return True


def _call(state: _State, helper: DraftLine, item: dict[str, Any]) -> None:
    out = state.out
    call_id = as_str(item.get("call_id")) or as_str(item.get("id"))
    if item.get("type") == "local_shell_call":
        name: str | None = "local_shell"
        args: Any = item.get("action")
    else:
        name = as_str(item.get("name"))
        raw = item.get("arguments", item.get("input"))
        args = _maybe_json(raw)
    content = Content.json(args) if not isinstance(args, str) else Content.text(args)
    draft = helper.add(
        "tool_call",
        "requested",
        role="assistant",
        tool_call_id=call_id,
        tool_name=name,
        content=content,
    )
    out.stat(helper.session, "tool_calls")
    if call_id:
        state.calls[call_id] = draft
    params = as_dict(args)
    escalated = params.get("with_escalated_permissions") is True or params.get(
        "sandbox_permissions"
    ) in ("require_escalated", "escalated")
    if escalated:
        approval = helper.add(
            "approval",
            "requested",
            role="assistant",
            tool_call_id=call_id,
            tool_name=name,
            content=Content.json({k: params[k] for k in sorted(params) if k != "command"}),
            fields=frozenset({"approval"}),
        )
        approval.refs.append(draft.key)
        out.stat(helper.session, "approvals")
    if name == "spawn_agent" and call_id:
        state.spawns.add(call_id)
    if name == "send_input":
        target = _agent_ref(params)
        out.actions.append(
            Action("send_input", draft.key, helper.session, target, tool_call_id=call_id)
        )


def _output(state: _State, helper: DraftLine, item: dict[str, Any], *, replacement: bool) -> None:
    out = state.out
    call_id = as_str(item.get("call_id"))
    call = state.calls.get(call_id) if call_id else None
    body = item.get("output")
    if isinstance(body, dict):
        text = (
            _text(body.get("content"))
            if "content" in body
            else json.dumps(body, ensure_ascii=False)
        )
    else:
        text = str(body) if body is not None else ""
    if replacement:
        status = "context_replacement"
    elif call is None:
        status = "completion_only"
        out.issue("orphan_tool_result", helper.line, helper.session)
        out.stat(helper.session, "orphan_results")
    else:
        status = "returned"
        if call_id:
            state.answered.add(call_id)
    draft = helper.add(
        "tool_result",
        status,
        role="tool",
        tool_call_id=call_id,
        tool_name=call.tool_name if call else None,
        content=Content.text(text),
    )
    if call is not None:
        draft.refs.append(call.key)
        out.links.append(Link("tool_result", draft.key, call.key, "call_id", call_id or ""))
    if replacement:
        out.stat(helper.session, "context_replacements")
        return
    out.stat(helper.session, "tool_results")
    if call_id in state.spawns:
        limited = len(text.encode("utf-8")) > RELATION_BODY_LIMIT
        target = None if limited else _agent_ref(as_dict(_maybe_json(text)))
        out.actions.append(
            Action(
                "spawn",
                draft.key,
                helper.session,
                target,
                tool_call_id=call_id,
                body_limited=limited,
            )
        )


def _event(state: _State, helper: DraftLine, event: dict[str, Any]) -> bool:
    out = state.out
    etype = event.get("type")
    if etype in _MESSAGE_EVENTS:
        role = _MESSAGE_EVENTS[str(etype)]
        text = str(event.get("message", ""))
        draft = helper.add("message", "source_message_event", role=role, content=Content.text(text))
        out.stat(helper.session, "message_events")
        _pair(state, "event", role, text, draft)
    elif etype in _REASONING_EVENTS:
        text = str(event.get("text", ""))
        draft = helper.add(
            "message", "source_reasoning_event", role="assistant", content=Content.text(text)
        )
        out.stat(helper.session, "message_events")
        _pair(state, "event", "reasoning", text, draft)
    elif etype == "token_count":
        _tokens(state, helper.session, as_dict(event.get("info")))
    elif etype in _TASK_EVENTS:
        helper.add(
            "task",
            _TASK_EVENTS[str(etype)],
            content=Content.json(event),
            fields=frozenset({"task"}),
        )
        out.stat(helper.session, "tasks")
    elif etype in _APPROVAL_EVENTS:
        helper.add(
            "approval",
            "requested",
            tool_call_id=as_str(event.get("call_id")),
            content=Content.json(event),
            fields=frozenset({"approval"}),
        )
        out.stat(helper.session, "approvals")
    elif etype == "context_compacted":
        helper.add("session", "context_compacted", content=Content.json(event))
    elif etype == "thread_settings_applied":
        thread_settings(helper, event)
    elif etype not in QUIET_EVENTS:
        return False
    return True


def _tokens(state: _State, session: str, info: dict[str, Any]) -> None:
    out = state.out
    out.stat(session, "token_count_events")
    total = as_dict(info.get("total_token_usage"))
    if not total:
        return
    figures = {k: v for k in _TOKEN_KEYS if isinstance(v := total.get(k), int)}
    if figures == state.last_tokens:
        out.stat(session, "token_count_duplicates")
        return
    state.last_tokens = figures
    usage = out.usage.setdefault(session, Counter())
    usage["responses"] += 1
    for key, value in figures.items():
        usage[key] = value  # cumulative: the latest snapshot is the total


def _compacted(state: _State, helper: DraftLine, payload: dict[str, Any]) -> None:
    helper.add("session", "compacted", content=Content.json(payload))
    state.out.stat(helper.session, "compactions")
    for item in as_list(payload.get("replacement_history")):
        item = as_dict(item)
        if item.get("type") in OUTPUT_TYPES:
            _output(state, helper, item, replacement=True)


def _pair(state: _State, form: str, role: str, text: str, draft: Draft) -> None:
    """Cite the other representation of the same text (response item ↔ event)."""
    other = "event" if form == "item" else "item"
    waiting = state.pending.get((other, role, text))
    if waiting:
        counterpart = waiting.pop(0)
        event, item = (draft, counterpart) if form == "event" else (counterpart, draft)
        event.refs.append(item.key)
        state.out.stat(draft.session, "duplicate_messages")
        return
    state.pending.setdefault((form, role, text), []).append(draft)


def _agent_ref(params: dict[str, Any]) -> str | None:
    for key in ("agent_id", "id", "thread_id", "conversation_id", "target"):
        value = as_str(params.get(key))
        if value:
            return value
    return None


def _maybe_json(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in as_list(content):
        block = as_dict(block)
        text = block.get("text")
        if isinstance(text, str):
            parts.append(text)
        elif block.get("type"):
            parts.append(f"[{block.get('type')}]")
    return "\n".join(parts)


def _finish(state: _State, fallback_session: str) -> None:
    out = state.out
    owner = state.owner
    if owner == _PENDING:
        owner = fallback_session
        out.sessions[owner] = SessionInfo(session_id=owner, evidence=["session_id_from_file_name"])
    resolve_pending(out, _PENDING, owner)
    for call_id, call in state.calls.items():
        if call_id not in state.answered:
            out.issue("unmatched_tool_call", call.line, call.session)
            out.stat(call.session, "unmatched_calls")
