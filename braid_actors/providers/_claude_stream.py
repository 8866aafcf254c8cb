"""Claude Code's stream-json output mapped to Braid parts, and its session files.

Design note. With ``--include-partial-messages`` the CLI prints the model's stream as
``stream_event`` lines (``message_start`` names the API message id, ``content_block_*``
carry the block ``index``) and, as each block completes, an ``assistant`` line holding that
one block. A part's id is ``<api message id>:<block index>``, so every delta and the final
block replace the same part. Without stream events the blocks of one message are counted in
the order the ``assistant`` lines bring them, which gives the same index. Tool results come
in ``user`` lines; their part id is ``<tool_use id>:result``. This module does no I/O except
reading a session file (:func:`read_claude_session`).
"""

from __future__ import annotations

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
    Usage,
)

if TYPE_CHECKING:
    from pathlib import Path

SUMMARY_LIMIT: Final = 4000
"""Characters of a tool result kept as its summary."""

_SESSION_ID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_MESSAGE_TYPES: Final = frozenset({"user", "assistant"})


def is_claude_session_id(value: str) -> bool:
    """True for the CLI's session ids (lower-case UUIDs): safe as a file name."""
    return bool(_SESSION_ID.match(value))


def project_dir_name(workspace: Path) -> str:
    """The CLI's directory name for a workspace: its path with every other character as -."""
    return re.sub(r"[^A-Za-z0-9]", "-", str(workspace))


def session_file(config_dir: Path, workspace: Path, session_id: str) -> Path:
    """Where the CLI keeps the transcript of ``session_id`` started in ``workspace``."""
    return config_dir / "projects" / project_dir_name(workspace) / f"{session_id}.jsonl"


def find_session_file(config_dir: Path, session_id: str) -> Path | None:
    """The transcript of ``session_id`` in any project directory (None when there is none)."""
    if not is_claude_session_id(session_id):
        return None
    found = sorted((config_dir / "projects").glob(f"*/{session_id}.jsonl"))
    return found[0] if found else None


@attrs.frozen
class SessionEnd:
    """Where a transcript ends: its last main-chain message uuid, and how many it has."""

    last_message_id: str | None
    messages: int


def read_claude_session(path: Path) -> SessionEnd:
    """Read a transcript (never modifying it): its last ``user``/``assistant`` line's uuid.

    Side-chain lines (sub-agents) do not count. Raises ``OSError`` when it can't be read
    and ``ValueError`` when a line is not a JSON object.
    """
    last: str | None = None
    count = 0
    with path.open("rb") as stream:
        for raw in stream:
            if not raw.strip():
                continue
            line = json.loads(raw)
            if not isinstance(line, dict):
                raise ValueError("a session line is not a JSON object")
            uuid = line.get("uuid")
            if (
                line.get("type") in _MESSAGE_TYPES
                and isinstance(uuid, str)
                and not line.get("isSidechain")
            ):
                last = uuid
                count += 1
    return SessionEnd(last_message_id=last, messages=count)


@attrs.frozen
class CostBase:
    """A session's running cost where a turn starts: the CLI's last ``cost-state`` record
    (``totalCostUSD`` and its per-model token counts). On ``--resume`` (and on a fork) the
    CLI carries this total on, so its ``total_cost_usd`` and ``modelUsage`` include it."""

    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0

    @classmethod
    def of(cls, record: dict[str, Any]) -> CostBase | None:
        cost = record.get("totalCostUSD")
        models = record.get("modelUsage")
        if isinstance(cost, bool) or not isinstance(cost, int | float):
            return None
        if not isinstance(models, dict):
            return None
        inputs, outputs = _model_tokens(models)
        return None if inputs is None or outputs is None else cls(float(cost), inputs, outputs)


def _model_tokens(models: dict[str, Any]) -> tuple[int | None, int | None]:
    inputs = outputs = 0
    for entry in models.values():
        if not isinstance(entry, dict):
            return None, None
        i, o = _count(entry.get("inputTokens")), _count(entry.get("outputTokens"))
        if i is None or o is None:
            return None, None
        inputs, outputs = inputs + i, outputs + o
    return inputs, outputs


def last_cost_base(path: Path) -> CostBase | None:
    """The last ``cost-state`` of a transcript (None when it has none or can't be read)."""
    base: CostBase | None = None
    try:
        with path.open("rb") as stream:
            for raw in stream:
                if b'"cost-state"' not in raw:
                    continue
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("type") == "cost-state":
                    base = CostBase.of(line)
    except (OSError, ValueError):
        return None
    return base


def turn_cost(total: object, models: object, usage: Usage, base: CostBase | None) -> float | None:
    """This turn's cost from the CLI's running total, when provable (else None).

    The total counts every turn of the session since its cost record began, so the turn's
    share is the total minus ``base`` — only when the running token counts are exactly
    ``base``'s plus this turn's (then nothing else is in the difference). Without a base
    (a new session) the total is the turn's own when its token counts are the turn's.
    """
    if isinstance(total, bool) or not isinstance(total, int | float) or total < 0:
        return None
    start = base or CostBase()
    if not isinstance(models, dict):
        return float(total) if base is None else None
    inputs, outputs = _model_tokens(models)
    if usage.input_tokens is None or usage.output_tokens is None:
        return None
    if (inputs, outputs) != (
        start.input_tokens + usage.input_tokens,
        start.output_tokens + usage.output_tokens,
    ):
        return None
    if base is None:
        return float(total)  # exactly as reported
    # The difference of two reported totals, without the binary float's noise.
    share = round(float(total) - base.cost_usd, 12)
    return share if share >= 0 else None


def result_usage(
    result: dict[str, Any], base: CostBase | None = None
) -> tuple[Usage, float | None]:
    """The raw counts and this turn's share of ``total_cost_usd`` (null when unknown)."""
    usage = result.get("usage")
    raw: dict[str, Any] = usage if isinstance(usage, dict) else {}
    details = raw.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    counts = Usage(
        input_tokens=_count(raw.get("input_tokens")),
        output_tokens=_count(raw.get("output_tokens")),
        cache_read_tokens=_count(raw.get("cache_read_input_tokens")),
        reasoning_tokens=_count(thinking),
        source="provider" if raw else "none",
    )
    return counts, turn_cost(result.get("total_cost_usd"), result.get("modelUsage"), counts, base)


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return ""


@attrs.define(eq=False)
class _Block:
    kind: str
    text: str = ""


@attrs.define(eq=False)
class StreamMapper:
    """Turns stream-json lines into parts (stateful: one per turn)."""

    message_id: str | None = None
    """The API message the stream events currently belong to."""
    blocks: dict[int, _Block] = attrs.Factory(dict)
    current_index: int | None = None
    counted: dict[str, int] = attrs.Factory(dict)
    """Blocks seen per message id in ``assistant`` lines (the index without stream events)."""
    tool_parts: dict[str, str] = attrs.Factory(dict)
    """tool_use id -> the part id of its request."""
    denied: set[str] = attrs.Factory(set)
    """tool_use ids Braid denied."""
    last_uuid: str | None = None
    """The uuid of the last user/assistant line (the CLI's message id)."""

    def stream_event(self, event: object) -> Part | None:
        """A ``stream_event``'s inner event: a part to report for text/thinking deltas."""
        if not isinstance(event, dict):
            return None
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            ident = message.get("id") if isinstance(message, dict) else None
            self.message_id = ident if isinstance(ident, str) else None
            self.blocks = {}
            self.current_index = None
            return None
        index = event.get("index")
        if type(index) is not int or self.message_id is None:
            return None
        if kind == "content_block_start":
            block = event.get("content_block")
            block_kind = block.get("type") if isinstance(block, dict) else None
            self.blocks[index] = _Block(kind=str(block_kind))
            self.current_index = index
            return None
        if kind != "content_block_delta":
            return None
        delta = event.get("delta")
        state = self.blocks.get(index)
        if not isinstance(delta, dict) or state is None:
            return None
        part_id = f"{self.message_id}:{index}"
        if delta.get("type") == "text_delta":
            state.text += str(delta.get("text", ""))
            return TextPart(part_id=part_id, text=state.text)
        if delta.get("type") == "thinking_delta":
            state.text += str(delta.get("thinking", ""))
            return ReasoningPart(part_id=part_id, text=state.text)
        return None

    def assistant(self, line: dict[str, Any]) -> list[Part]:
        """An ``assistant`` line: its (complete) blocks as parts."""
        self._note_uuid(line)
        message = line.get("message")
        if not isinstance(message, dict):
            return []
        ident = message.get("id")
        content = message.get("content")
        if not isinstance(ident, str) or not isinstance(content, list):
            return []
        synthetic = message.get("model") == "<synthetic>" or "error" in line
        parts: list[Part] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            index = self._index_for(ident)
            part_id = f"{ident}:{index}"
            kind = block.get("type")
            if kind == "text" and synthetic:
                code = str(line.get("error") or "api_error")
                parts.append(ErrorPart(part_id=part_id, code=code, message=str(block["text"])))
            elif kind == "text":
                parts.append(TextPart(part_id=part_id, text=str(block.get("text", ""))))
            elif kind == "thinking":
                parts.append(ReasoningPart(part_id=part_id, text=str(block.get("thinking", ""))))
            elif kind == "tool_use":
                call_id = block.get("id")
                tool_input = block.get("input")
                if isinstance(call_id, str):
                    self.tool_parts[call_id] = part_id
                parts.append(
                    ToolRequestPart(
                        part_id=part_id,
                        name=str(block.get("name", "")),
                        input=tool_input if isinstance(tool_input, dict) else {},
                        call_id=call_id if isinstance(call_id, str) else None,
                    )
                )
        return parts

    def _index_for(self, message_id: str) -> int:
        seen = self.counted.get(message_id, 0)
        self.counted[message_id] = seen + 1
        if message_id == self.message_id and self.current_index is not None:
            return self.current_index
        return seen

    def user(self, line: dict[str, Any]) -> list[Part]:
        """A ``user`` line: its tool results as parts."""
        self._note_uuid(line)
        message = line.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return []
        parts: list[Part] = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = str(block.get("tool_use_id", ""))
            text = _text_of(block.get("content"))
            if call_id in self.denied:
                status: Any = "denied"
            else:
                status = "error" if block.get("is_error") else "ok"
            parts.append(
                ToolResultPart(
                    part_id=f"{call_id}:result",
                    request_part_id=self.tool_parts.get(call_id, call_id),
                    status=status,
                    summary=text[:SUMMARY_LIMIT],
                    truncated=len(text) > SUMMARY_LIMIT,
                )
            )
        return parts

    def _note_uuid(self, line: dict[str, Any]) -> None:
        uuid = line.get("uuid")
        if isinstance(uuid, str) and not line.get("isSidechain"):
            self.last_uuid = uuid
