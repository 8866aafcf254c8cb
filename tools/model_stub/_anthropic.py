"""Anthropic Messages API answers for a step: the streaming events and the plain JSON.

Pure functions; the server frames the events as SSE. The event order is the API's:
``message_start``, per content block ``content_block_start`` / ``content_block_delta``… /
``content_block_stop``, then ``message_delta`` (stop reason and usage) and ``message_stop``.
An in-stream error ends the stream with an ``error`` event after ``message_start``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tools.model_stub._sse import pieces

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tools.model_stub._script import ScriptedError, Step, StepUsage, ToolCall

Event = tuple[str, dict[str, Any]]
"""An SSE event: its name and its JSON data."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(error: ScriptedError) -> dict[str, Any]:
    """The JSON body of an error reply (and the data of an in-stream ``error`` event)."""
    kind = error.type or _ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _blocks(step: Step, ids: Iterator[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if step.thinking is not None:
        blocks.append(
            {"type": "thinking", "thinking": step.thinking, "signature": "stub-signature"}
        )
    if step.text is not None:
        blocks.append({"type": "text", "text": step.text})
    blocks.extend(_tool_block(call, ids) for call in step.tool_calls)
    return blocks


def _tool_block(call: ToolCall, ids: Iterator[str]) -> dict[str, Any]:
    arguments: Any = call.arguments
    if isinstance(arguments, str):
        arguments = {"_raw": arguments}
    return {
        "type": "tool_use",
        "id": call.call_id or f"toolu_{next(ids)}",
        "name": call.name,
        "input": dict(arguments),
    }


def _stop_reason(step: Step) -> str:
    if step.stop_reason is not None:
        return step.stop_reason
    return "tool_use" if step.tool_calls else "end_turn"


def _usage(usage: StepUsage, *, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": output_tokens,
    }


def reply(step: Step, *, model: str, ids: Iterator[str]) -> dict[str, Any]:
    """The non-streaming reply: one ``message`` object."""
    return {
        "id": f"msg_{next(ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(step, ids),
        "stop_reason": _stop_reason(step),
        "stop_sequence": None,
        "usage": _usage(step.usage, output_tokens=step.usage.output_tokens),
    }


def stream(step: Step, *, model: str, ids: Iterator[str]) -> list[Event]:
    """The streaming reply as SSE events."""
    msg = reply(step, model=model, ids=ids)
    start = dict(msg, content=[], stop_reason=None)
    start["usage"] = _usage(step.usage, output_tokens=1)
    events: list[Event] = [("message_start", {"type": "message_start", "message": start})]
    events.append(("ping", {"type": "ping"}))
    if step.error is not None:
        events.append(("error", error_body(step.error)))
        return events
    for index, block in enumerate(msg["content"]):
        events.extend(_block_events(index, block))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": msg["usage"],
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: dict[str, Any]) -> list[Event]:
    kind = block["type"]
    deltas: list[dict[str, Any]]
    if kind == "text":
        opening: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        opening = dict(block, input={})
        raw = _json(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(raw, 2)]
    events: list[Event] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    events.extend(
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def count_tokens(body: Any) -> dict[str, Any]:
    """A rough answer to ``/v1/messages/count_tokens``: about four characters a token."""
    size = len(json.dumps(body)) if body is not None else 0
    return {"input_tokens": max(1, size // 4)}
