"""OpenAI Responses API answers for a step: the streaming events and the plain JSON.

Pure functions; the server frames the events as SSE (``event: <type>``). The order is the
API's: ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``, its part and delta events, ``response.output_item.done``,
and last ``response.completed`` with the usage. Items come as reasoning (from
``thinking``), message (from ``text``), then one ``function_call`` per tool call. An
in-stream error ends the stream with ``response.failed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.model_stub._sse import pieces

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tools.model_stub._script import ScriptedError, Step

CREATED_AT = 1_700_000_000
"""A fixed ``created_at`` so answers are deterministic."""


def error_body(error: ScriptedError) -> dict[str, Any]:
    """The JSON body of an HTTP error reply."""
    kind = error.type or ("rate_limit_exceeded" if error.status == 429 else "server_error")
    if 400 <= error.status < 500 and error.status != 429 and error.type is None:
        kind = "invalid_request_error"
    return {"error": {"message": error.message, "type": kind, "param": None, "code": kind}}


def _items(step: Step, ids: Iterator[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if step.thinking is not None:
        items.append(
            {
                "id": f"rs_{next(ids)}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": step.thinking}],
            }
        )
    if step.text is not None:
        items.append(
            {
                "id": f"msg_{next(ids)}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        )
    for call in step.tool_calls:
        items.append(
            {
                "id": f"fc_{next(ids)}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.call_id or f"call_{next(ids)}",
                "name": call.name,
                "arguments": call.arguments_json(),
            }
        )
    return items


def _usage(step: Step) -> dict[str, Any]:
    u = step.usage
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_input_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens,
    }


def reply(step: Step, *, model: str, ids: Iterator[str]) -> dict[str, Any]:
    """The non-streaming reply: one completed ``response`` object."""
    return {
        "id": f"resp_{next(ids)}",
        "object": "response",
        "created_at": CREATED_AT,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": _items(step, ids),
        "parallel_tool_calls": True,
        "usage": _usage(step),
    }


def stream(step: Step, *, model: str, ids: Iterator[str]) -> list[tuple[str, dict[str, Any]]]:
    """The streaming reply as SSE events named by their ``type``, each data object with its
    ``sequence_number``."""
    done = reply(step, model=model, ids=ids)
    opening = dict(done, status="in_progress", output=[], usage=None)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    if step.error is not None:
        error = {"code": step.error.type or "server_error", "message": step.error.message}
        failed = dict(opening, status="failed", error=error)
        events.append({"type": "response.failed", "response": failed})
    else:
        for index, item in enumerate(done["output"]):
            events.extend(_item_events(index, item))
        events.append({"type": "response.completed", "response": done})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return [(event["type"], event) for event in events]


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item["type"]
    where = {"item_id": item["id"], "output_index": index}
    events: list[dict[str, Any]] = []
    if kind == "reasoning":
        events.append(_added(index, dict(item, summary=[])))
        text = item["summary"][0]["text"]
        part = {"summary_index": 0}
        events.append(
            {
                "type": "response.reasoning_summary_part.added",
                **where,
                **part,
                "part": {"type": "summary_text", "text": ""},
            }
        )
        events.extend(
            {"type": "response.reasoning_summary_text.delta", **where, **part, "delta": p}
            for p in pieces(text)
        )
        events.append(
            {"type": "response.reasoning_summary_text.done", **where, **part, "text": text}
        )
        events.append(
            {
                "type": "response.reasoning_summary_part.done",
                **where,
                **part,
                "part": {"type": "summary_text", "text": text},
            }
        )
    elif kind == "message":
        events.append(_added(index, dict(item, status="in_progress", content=[])))
        content = item["content"][0]
        text = content["text"]
        part = {"content_index": 0}
        events.append(
            {
                "type": "response.content_part.added",
                **where,
                **part,
                "part": dict(content, text=""),
            }
        )
        events.extend(
            {"type": "response.output_text.delta", **where, **part, "delta": p, "logprobs": []}
            for p in pieces(text)
        )
        events.append(
            {"type": "response.output_text.done", **where, **part, "text": text, "logprobs": []}
        )
        events.append({"type": "response.content_part.done", **where, **part, "part": content})
    else:
        events.append(_added(index, dict(item, status="in_progress", arguments="")))
        arguments = item["arguments"]
        events.extend(
            {"type": "response.function_call_arguments.delta", **where, "delta": p}
            for p in pieces(arguments, 2)
        )
        events.append(
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments}
        )
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def _added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}
