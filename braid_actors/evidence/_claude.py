"""Claude Code session JSONL (``~/.claude/projects/<project>/<session>.jsonl``).

Records: ``user``, ``assistant``, ``system``, ``progress``, ``attachment``,
``queue-operation``, ``file-history-snapshot`` and the older ``summary``; since 2.1.x also
``api-request-shape``, ``api-request``, ``api-request-blob``, ``tools-used``, ``last-prompt``
and ``cost-state`` (see :func:`_request_record`), and ``atis-latch`` (see
:data:`OPAQUE_TYPES`). Anything else is ``unrecognized`` (counted, never fatal).

- Content blocks become entries: ``text`` → message, ``thinking`` / ``redacted_thinking`` →
  message with status ``reasoning``, ``tool_use`` / ``server_tool_use`` → tool call,
  ``tool_result`` (and the assistant's ``*_tool_result`` blocks) → tool result, linked to its
  call by id. A result with no recorded call is ``completion_only``; a call with no result is
  reported as ``unmatched_tool_call``. A rejected tool use adds an ``approval`` (``denied``).
- One API response is written as several lines with the same ``message.id``, each repeating
  the usage: usage is counted once per id (the last line's figures, which are final).
- Subagent files (``isSidechain``, ``agentId``) share the parent's ``sessionId``; the parent
  names the agent in its ``Task`` result (``toolUseResult.agentId``) and its
  ``agent_progress`` records (``data.agentId`` + ``parentToolUseID``). Each such link is a
  ``task_agent`` action on the Task call. The compaction agent's file (``agentId``
  ``acompact-…``) is a sidechain like any other.
- Compaction: ``system/compact_boundary`` is a session entry; the ``isCompactSummary`` user
  record is a message with status ``compact_summary``.
- A file that switches ``sessionId`` (after a resume) yields one session per id; the first
  line of the new id gets a ``session_switch`` session entry citing the previous session's
  last entry.
- Configuration (``cwd``, ``version``, ``gitBranch``, ``permissionMode``, the model) is carried
  on ordinary records; a ``configuration`` snapshot entry is written whenever a value changes.
- The first genuine user prompt of each session is also recorded as a ``task`` (for a
  sidechain: the delegated prompt).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs

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

PARSER_VERSION: Final = "braid.claude_code/3"
FORMAT_VERSION: Final = "claude_code.session_jsonl"
REQUEST_TYPES: Final = frozenset(
    {
        "api-request-shape",
        "api-request",
        "api-request-blob",
        "tools-used",
        "last-prompt",
        "cost-state",
    }
)
"""Records about the CLI's API requests and running totals (see :func:`_request_record`)."""
OPAQUE_TYPES: Final = frozenset({"atis-latch"})
"""Records of a known type whose fields say nothing this parser can interpret (``atis-latch``
carries one string field ``atis``, empty in the files seen): kept as a session entry with the
record's fields as they are (status = the type, ``-`` → ``_``), nothing derived from them."""
RECORD_TYPES: Final = frozenset(
    {
        "user",
        "assistant",
        "system",
        "progress",
        "attachment",
        "queue-operation",
        "file-history-snapshot",
        "summary",
        *REQUEST_TYPES,
        *OPAQUE_TYPES,
    }
)
TASK_TOOLS: Final = frozenset({"Task", "Agent"})
_NOT_PROMPTS: Final = (
    "<command-name>",
    "<command-message>",
    "<local-command-",
    "<bash-",
    "Caveat:",
    "[Request interrupted",
    "<task-notification>",
    "<system-reminder>",
)
_REJECTED: Final = "The user doesn't want to proceed with this tool use"
_USAGE_KEYS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
_CONFIG_KEYS: Final = {
    "workdir": "configuration.workdir",
    "application_version": "configuration.application_version",
    "permission_mode": "configuration.permission_mode",
    "model": "configuration.model",
}
_PENDING: Final = ""
MAX_GROUP: Final = 64
"""At most this many blocks of one API response are linked to each other."""


@attrs.define(eq=False)
class _State:
    out: Outcome
    current: str = _PENDING
    calls: dict[str, Draft] = attrs.Factory(dict)
    answered: set[str] = attrs.Factory(set)
    usage: dict[tuple[str, str], dict[str, int]] = attrs.Factory(dict)
    config: dict[str, dict[str, Any]] = attrs.Factory(dict)
    config_keys: dict[str, tuple[Any, ...]] = attrs.Factory(dict)
    """The last record's raw settings per session (see ``_configuration``)."""
    tasked: set[str] = attrs.Factory(set)
    agent_links: set[tuple[str, str]] = attrs.Factory(set)
    last_draft: dict[str, tuple[int, int]] = attrs.Factory(dict)
    groups: dict[tuple[str, str], list[Draft]] = attrs.Factory(dict)
    """Drafts of each API response, by (session key, ``message.id``)."""
    switched_from: str | None = None


def parse_claude(split: LineSplit, *, fallback_session: str) -> Outcome:
    """Parse a Claude Code session file's lines."""
    state = _State(Outcome("claude_code", PARSER_VERSION, FORMAT_VERSION))
    out = state.out
    for line in split.lines:
        obj = line.obj
        if obj is None:
            out.lines.append(LineInfo(line.number, state.current, "failed", "", None))
            out.issue(line.error or "malformed_json", line.number, state.current)
            continue
        rtype = obj.get("type")
        timestamp = as_str(obj.get("timestamp"))
        session = _session_of(state, obj)
        if not isinstance(rtype, str) or rtype not in RECORD_TYPES:
            out.lines.append(
                LineInfo(line.number, session, "unrecognized", str(rtype)[:64], timestamp)
            )
            out.issue("unrecognized_record", line.number, session, "type")
            continue
        out.lines.append(LineInfo(line.number, session, "ok", rtype, timestamp))
        helper = DraftLine(out, line.number, session, timestamp, as_str(obj.get("agentId")))
        if state.switched_from is not None:
            switch = helper.add("session", "session_switch", content=Content.json({}))
            cited = state.last_draft.get(state.switched_from)
            if cited is not None:
                switch.refs.append(cited)
            state.switched_from = None
        _configuration(state, helper, obj)
        if rtype == "user":
            _user(state, helper, obj)
        elif rtype == "assistant":
            _assistant(state, helper, obj)
        elif rtype == "progress":
            _progress(state, obj)
        elif rtype in REQUEST_TYPES or rtype in OPAQUE_TYPES:
            _request_record(helper, rtype, obj)
        else:
            _session_record(helper, rtype, obj)
        if helper.count:
            state.last_draft[session] = (line.number, helper.count)
    _finish(state, fallback_session)
    return out


def _session_of(state: _State, obj: dict[str, Any]) -> str:
    sid = as_str(obj.get("sessionId"))
    if sid is None:
        return state.current
    out = state.out
    if sid not in out.sessions:
        out.sessions[sid] = SessionInfo(session_id=sid)
        if state.current not in (_PENDING, sid):
            state.switched_from = state.current
            out.stat(sid, "session_switches")
            out.sessions[sid].evidence.append("file_session_switch")
    info = out.sessions[sid]
    if obj.get("isSidechain") is True:
        info.sidechain = True
        out.stat(sid, "sidechain_records")
    agent = as_str(obj.get("agentId"))
    if agent and info.agent_id is None:
        info.agent_id = agent
    if info.application_version is None:
        info.application_version = as_str(obj.get("version"))
    if info.workdir is None:
        info.workdir = as_str(obj.get("cwd"))
    state.current = sid
    return sid


def _configuration(state: _State, helper: DraftLine, obj: dict[str, Any]) -> None:
    model = as_str(as_dict(obj.get("message")).get("model"))
    if obj.get("type") != "assistant" or not model or model == "<synthetic>":
        model = None
    raw = (obj.get("cwd"), obj.get("version"), obj.get("gitBranch"), obj.get("permissionMode"))
    # Most records repeat the previous one's settings: the same values change nothing.
    key = (*raw, model)
    if state.config_keys.get(helper.session) == key:
        return
    state.config_keys[helper.session] = key
    seen = {
        "workdir": as_str(raw[0]),
        "application_version": as_str(raw[1]),
        "git_branch": as_str(raw[2]),
        "permission_mode": as_str(raw[3]),
    }
    if model is not None:
        seen["model"] = model
    current = state.config.setdefault(helper.session, {})
    changed = {k: v for k, v in seen.items() if v is not None and current.get(k) != v}
    if not changed:
        return
    current.update(changed)
    fields = {"configuration"} | {_CONFIG_KEYS[k] for k in current if k in _CONFIG_KEYS}
    missing = tuple(sorted(set(_CONFIG_KEYS.values()) - fields))
    helper.add(
        "configuration",
        "snapshot",
        content=Content.json(dict(sorted(current.items()))),
        fields=frozenset(fields),
        missing_fields=missing,
    )
    state.out.stat(helper.session, "configurations")


def _user(state: _State, helper: DraftLine, obj: dict[str, Any]) -> None:
    out = state.out
    message = as_dict(obj.get("message"))
    content = message.get("content")
    if obj.get("isCompactSummary") is True:
        text = content if isinstance(content, str) else _joined_text(content)
        helper.add("message", "compact_summary", role="user", content=Content.text(text))
        out.stat(helper.session, "messages")
        out.stat(helper.session, "compact_summaries")
        return
    meta = obj.get("isMeta") is True
    if isinstance(content, str):
        _prompt(state, helper, content, meta)
        return
    for block in as_list(content):
        block = as_dict(block)
        btype = block.get("type")
        if btype == "text":
            _prompt(state, helper, str(block.get("text", "")), meta)
        elif btype == "tool_result":
            _tool_result(state, helper, block, obj.get("toolUseResult"))
        elif btype in ("image", "document"):
            media = str(
                as_dict(block.get("source")).get("media_type") or "application/octet-stream"
            )
            helper.add(
                "message",
                "attachment",
                role="user",
                content=Content.unavailable("binary_content", media),
            )
            out.stat(helper.session, "messages")
        else:
            out.issue("unrecognized_block", helper.line, helper.session, "message.content.type")


def _prompt(state: _State, helper: DraftLine, text: str, meta: bool) -> None:
    out = state.out
    status = "meta" if meta else "recorded"
    helper.add(
        "message",
        status,
        role="user",
        content=Content.text(text),
        intent={"role": "user", "prompt": text},
    )
    out.stat(helper.session, "messages")
    genuine = not meta and text.strip() and not text.lstrip().startswith(_NOT_PROMPTS)
    if genuine and helper.session not in state.tasked:
        state.tasked.add(helper.session)
        info = out.sessions.get(helper.session)
        sidechain = info is not None and info.sidechain
        helper.add(
            "task",
            "delegated_prompt" if sidechain else "initial_prompt",
            role="user",
            content=Content.text(text),
            fields=frozenset({"task"}),
        )
        out.stat(helper.session, "tasks")


def _tool_result(state: _State, helper: DraftLine, block: dict[str, Any], result: Any) -> None:
    out = state.out
    call_id = as_str(block.get("tool_use_id"))
    call = state.calls.get(call_id) if call_id else None
    body = block.get("content")
    text = body if isinstance(body, str) else _joined_text(body)
    rejected = result == "User rejected tool use" or text.startswith(_REJECTED)
    if call is None:
        status = "completion_only"
        out.issue("orphan_tool_result", helper.line, helper.session)
        out.stat(helper.session, "orphan_results")
    else:
        status = "error" if block.get("is_error") is True else "returned"
        if call_id is not None:
            state.answered.add(call_id)
    draft = helper.add(
        "tool_result",
        status,
        role="user",
        tool_call_id=call_id,
        tool_name=call.tool_name if call else None,
        content=Content.text(text),
    )
    out.stat(helper.session, "tool_results")
    if call is not None:
        draft.refs.append(call.key)
        out.links.append(Link("tool_result", draft.key, call.key, "tool_use_id", call_id or ""))
    if rejected:
        approval = helper.add(
            "approval",
            "denied",
            role="user",
            tool_call_id=call_id,
            tool_name=call.tool_name if call else None,
            content=Content.json({"decision": "denied", "source": "user_rejected_tool_use"}),
            fields=frozenset({"approval", "approval_decision"}),
        )
        approval.refs.append(draft.key)
        out.stat(helper.session, "approvals")
    agent = as_str(as_dict(result).get("agentId"))
    if call is not None and agent and call_id:
        _link_agent(state, call, agent, call_id)


def _assistant(state: _State, helper: DraftLine, obj: dict[str, Any]) -> None:
    out = state.out
    message = as_dict(obj.get("message"))
    msg_id = as_str(message.get("id"))
    model = as_str(message.get("model"))
    usage = as_dict(message.get("usage"))
    if msg_id and usage:
        state.usage[(helper.session, msg_id)] = {
            k: v for k in _USAGE_KEYS if isinstance(v := usage.get(k), int)
        }
        out.stat(helper.session, "usage_lines")
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else as_list(content)
    for block in blocks:
        block = as_dict(block)
        btype = block.get("type")
        before = len(out.drafts)
        intent = {"role": "assistant", "message_id": msg_id, "model": model}
        if btype == "text":
            text = str(block.get("text", ""))
            helper.add(
                "message",
                "recorded",
                role="assistant",
                content=Content.text(text),
                intent={**intent, "answer": text},
            )
            out.stat(helper.session, "messages")
        elif btype in ("thinking", "redacted_thinking"):
            thinking = block.get("thinking")
            body = (
                Content.text(thinking)
                if isinstance(thinking, str)
                else Content.unavailable("encrypted")
            )
            helper.add(
                "message",
                "reasoning",
                role="assistant",
                content=body,
                intent={**intent, "thinking": thinking if isinstance(thinking, str) else None},
            )
            out.stat(helper.session, "reasoning")
        elif btype in ("tool_use", "server_tool_use"):
            call_id = as_str(block.get("id"))
            name = as_str(block.get("name"))
            draft = helper.add(
                "tool_call",
                "requested",
                role="assistant",
                tool_call_id=call_id,
                tool_name=name,
                content=Content.json(block.get("input")),
                intent={
                    **intent,
                    "tool": {"id": call_id, "name": name, "input": block.get("input")},
                },
            )
            out.stat(helper.session, "tool_calls")
            if call_id:
                state.calls[call_id] = draft
        elif isinstance(btype, str) and btype.endswith("_tool_result"):
            _tool_result(state, helper, block, None)
        else:
            out.issue("unrecognized_block", helper.line, helper.session, "message.content.type")
            continue
        if msg_id:
            added = [d for d in out.drafts[before:] if d.kind != "approval"]
            state.groups.setdefault((helper.session, msg_id), []).extend(added)


def _progress(state: _State, obj: dict[str, Any]) -> None:
    data = as_dict(obj.get("data"))
    if data.get("type") != "agent_progress":
        return
    agent = as_str(data.get("agentId"))
    call_id = as_str(obj.get("parentToolUseID"))
    call = state.calls.get(call_id) if call_id else None
    if agent and call is not None and call_id:
        _link_agent(state, call, agent, call_id)


def _link_agent(state: _State, call: Draft, agent: str, call_id: str) -> None:
    if (call_id, agent) in state.agent_links:
        return
    state.agent_links.add((call_id, agent))
    state.out.actions.append(
        Action("task_agent", call.key, call.session, None, agent_id=agent, tool_call_id=call_id)
    )


def _session_record(helper: DraftLine, rtype: str, obj: dict[str, Any]) -> None:
    out = helper.outcome
    if rtype == "system":
        subtype = as_str(obj.get("subtype")) or "system"
        body: Any = obj.get("content")
        if not isinstance(body, str):
            body = {k: obj[k] for k in ("compactMetadata", "durationMs", "level") if k in obj}
        content = Content.text(body) if isinstance(body, str) else Content.json(body)
        helper.add("session", subtype, role="system", content=content)
        if subtype == "compact_boundary":
            out.stat(helper.session, "compactions")
    elif rtype == "attachment":
        helper.add("session", "attachment", content=Content.json(obj.get("attachment")))
    elif rtype == "queue-operation":
        operation = as_str(obj.get("operation")) or "unknown"
        text = obj.get("content")
        body_value = text if isinstance(text, str) else {"operation": operation}
        content = (
            Content.text(body_value) if isinstance(body_value, str) else Content.json(body_value)
        )
        helper.add("session", f"queue_{operation}", content=content)
    elif rtype == "file-history-snapshot":
        helper.add("session", "file_history_snapshot", content=Content.json(obj.get("snapshot")))
    else:  # summary
        helper.add("session", "summary", content=Content.text(str(obj.get("summary", ""))))


def _request_record(helper: DraftLine, rtype: str, obj: dict[str, Any]) -> None:
    """The API-request bookkeeping records: stored as they are, never as conversation.

    - ``api-request-shape``: the request's static part (``shape.system`` prompt blocks and
      ``shape.tools`` definitions) under a ``shapeHash`` → configuration ``api_request_shape``.
    - ``api-request``: one API call's parameters (``params``: model, betas, max_tokens,
      thinking…), its ``shapeHash`` and the message-blob hashes it sent (``tail``, ``base``)
      → configuration ``api_request``. The assistant records cite its ``id`` (``requestRef``).
    - ``api-request-blob``: a request message body by ``hash``; it repeats text already on
      ``user`` / ``attachment`` records, so it is a session entry, not a message.
    - ``tools-used``: the names of tools used so far → session entry ``tools_used`` (not tool
      calls: those are the assistant's ``tool_use`` blocks).
    - ``last-prompt``: the last prompt's text and the leaf record's uuid → session entry
      ``last_prompt`` (the prompt itself is already a message / task).
    - ``atis-latch`` (:data:`OPAQUE_TYPES`): session entry ``atis_latch`` with its fields.
    - ``cost-state``: the CLI's running totals (cost, durations, per-model token counts) →
      session entry ``cost_state``. Its ``modelUsage`` tokens are the sum of the usage already
      on the assistant messages (counted once per ``message.id`` in ``Outcome.usage``), so they
      are metadata here and never added to usage again.
    """
    body = {k: v for k, v in obj.items() if k not in ("type", "sessionId", "timestamp")}
    if rtype in ("api-request-shape", "api-request"):
        fields = {"configuration"}
        if as_str(obj.get("version")):
            fields.add("configuration.application_version")
        tools = as_dict(obj.get("shape")).get("tools")
        if rtype == "api-request-shape" and isinstance(tools, list):
            fields.add("configuration.tools")
        if rtype == "api-request" and as_str(as_dict(obj.get("params")).get("model")):
            fields.add("configuration.model")
        helper.add(
            "configuration",
            rtype.replace("-", "_"),
            content=Content.json(body),
            fields=frozenset(fields),
        )
        helper.outcome.stat(helper.session, "configurations")
        return
    helper.add("session", rtype.replace("-", "_"), content=Content.json(body))


def _joined_text(value: Any) -> str:
    parts: list[str] = []
    for block in as_list(value):
        block = as_dict(block)
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type"):
            parts.append(f"[{block.get('type')}]")
    return "\n".join(parts)


def _finish(state: _State, fallback_session: str) -> None:
    out = state.out
    first = next(iter(out.sessions), None)
    if first is None:
        first = fallback_session
        out.sessions[first] = SessionInfo(session_id=first, evidence=["session_id_from_file_name"])
    resolve_pending(out, _PENDING, first)
    for call_id, call in state.calls.items():
        if call_id not in state.answered:
            out.issue("unmatched_tool_call", call.line, call.session)
            out.stat(call.session, "unmatched_calls")
    for (_session, msg_id), members in state.groups.items():
        members = members[:MAX_GROUP]
        for one in members:
            for other in members:
                if one is not other and one.session == other.session:
                    out.links.append(
                        Link("api_response_group", one.key, other.key, "message.id", msg_id)
                    )
    for (session, _msg), usage in state.usage.items():
        totals = out.usage.setdefault(session, Counter())
        totals["responses"] += 1
        for key, value in usage.items():
            totals[key] += value
