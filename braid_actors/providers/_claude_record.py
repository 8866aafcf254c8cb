"""One turn read back from Claude Code's own session file, for reconciliation.

Design note. The CLI writes its transcript as it goes: the turn's prompt as a ``user``
record, every completed content block of the model's answer as an ``assistant`` record
(``message.id``, ``message.stop_reason``, ``message.usage``), tool results as ``user``
records, and on exit a ``cost-state`` record with the process's running cost and per-model
token counts. After a restart the turn is found as the last main-chain prompt after the
session's boundary before the turn (the runner's own uuid; a record Braid seeded from
portable context carries ``braidMessageId`` and is never the prompt) whose text holds the
turn's input. Its parts come from the same :class:`._claude_stream.StreamMapper` as the
live stream, so the ids are the ones the stream gave (``<api message id>:<block index>``).

The turn *provably finished* only when the last main-chain record is the model's answer
with a final ``stop_reason`` (``end_turn``, ``stop_sequence``, ``max_tokens``), no tool call,
and visible text — an answer of thinking alone makes the CLI ask again, so it is not an
end — or a synthetic API-error answer (the turn failed with that message). Usage is the
sum of each API message's recorded usage (one message spans several records; each counts
once). The cost is the last ``cost-state``'s running total minus the one before the turn
(:func:`._claude_stream.turn_cost`), only when the token counts account for exactly this
turn; otherwise it is unknown (null).
A last line cut off mid-write is ignored (it is the crash's own trace, not a record).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.model import Part, Usage
from braid_actors.providers._claude_stream import CostBase, StreamMapper, turn_cost

if TYPE_CHECKING:
    from pathlib import Path

FINAL_STOPS: Final = frozenset({"end_turn", "stop_sequence", "max_tokens"})


@attrs.frozen
class RecordedTurn:
    """A turn as the runner's own record holds it."""

    started: bool
    """The record holds this turn's start (else nothing below means anything)."""
    finished: bool
    """The record proves the turn ended (see :attr:`ending`)."""
    ending: str
    """How: ``completed``, ``failed: …``, ``aborted: …``, or why it is not provably over."""
    parts: tuple[Part, ...] = ()
    usage: Usage = attrs.Factory(Usage)
    cost_usd: float | None = None


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON object lines of a runner's record; a torn last line is left out."""
    return [line for _, line in read_raw_lines(path)]


def read_raw_lines(path: Path) -> list[tuple[bytes, dict[str, Any]]]:
    """Each JSON object line with its raw bytes; a torn last line is left out."""
    data = path.read_bytes()
    chunks = data.split(b"\n")
    tail = chunks.pop() if chunks else b""  # after the last newline: empty, or torn
    lines: list[tuple[bytes, dict[str, Any]]] = []
    for chunk in chunks:
        if chunk.strip():
            lines.append((chunk.rstrip(b"\r"), _object(json.loads(chunk))))
    if tail.strip():
        with contextlib.suppress(ValueError):  # a line cut off mid-write by the crash
            lines.append((tail.rstrip(b"\r"), _object(json.loads(tail))))
    return lines


def _object(line: object) -> dict[str, Any]:
    if not isinstance(line, dict):
        raise ValueError("a record line is not a JSON object")
    return line


def _main(line: dict[str, Any]) -> bool:
    return line.get("type") in ("user", "assistant") and not line.get("isSidechain")


def _prompt_text(line: dict[str, Any]) -> str | None:
    """The text of a real prompt record (None for tool results, meta notes and seeds)."""
    if line.get("type") != "user" or line.get("isMeta") or "braidMessageId" in line:
        return None
    message = line.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))


def read_claude_turn(path: Path, *, text: str, after: str | None) -> RecordedTurn:
    """The turn whose input is ``text``, after the record with uuid ``after`` (see the note).

    Raises ``OSError`` when the file can't be read and ``ValueError`` for a malformed line.
    """
    lines = read_lines(path)
    start = 0
    if after is not None:
        found = [i for i, line in enumerate(lines) if line.get("uuid") == after]
        if not found:
            return RecordedTurn(False, False, "the session no longer holds the turn's start")
        start = found[-1] + 1
    prompts = [
        i
        for i in range(start, len(lines))
        if _main(lines[i]) and text in (_prompt_text(lines[i]) or "\0")
    ]
    if not prompts:
        return RecordedTurn(False, False, "the session holds no record of this turn's input")
    turn = lines[prompts[-1] + 1 :]
    mapper = StreamMapper()
    parts: dict[str, Part] = {}
    usages: dict[str, dict[str, Any]] = {}
    for line in turn:
        if not _main(line):
            continue
        found_parts = mapper.assistant(line) if line["type"] == "assistant" else mapper.user(line)
        for part in found_parts:
            parts[part.part_id] = part
        message = line.get("message")
        if line["type"] == "assistant" and isinstance(message, dict):
            ident, usage = message.get("id"), message.get("usage")
            if isinstance(ident, str) and isinstance(usage, dict):
                usages[ident] = usage
    usage = _sum(usages.values())
    ending, finished = _ending([line for line in turn if _main(line)])
    before = [line for line in lines[: prompts[-1]] if line.get("type") == "cost-state"]
    after_states = [line for line in turn if line.get("type") == "cost-state"]
    cost = None
    if after_states:
        base = CostBase.of(before[-1]) if before else None
        if base is not None or not before:
            state = after_states[-1]
            cost = turn_cost(state.get("totalCostUSD"), state.get("modelUsage"), usage, base)
    return RecordedTurn(True, finished, ending, tuple(parts.values()), usage, cost)


def _ending(main: list[dict[str, Any]]) -> tuple[str, bool]:
    if not main or main[-1].get("type") != "assistant":
        return "the session ends before the model's answer", False
    last = main[-1]
    message = last.get("message")
    body: dict[str, Any] = message if isinstance(message, dict) else {}
    ident = body.get("id")
    blocks = [
        block
        for line in main
        if line.get("type") == "assistant"
        and isinstance(line.get("message"), dict)
        and line["message"].get("id") == ident
        for block in (line["message"].get("content") or [])
        if isinstance(block, dict)
    ]
    if body.get("model") == "<synthetic>" or "error" in last:
        text = "".join(str(b.get("text", "")) for b in blocks)
        return f"failed: {last.get('error') or 'api_error'}: {text or 'the API failed'}", True
    stop = body.get("stop_reason")
    if stop not in FINAL_STOPS:
        return f"the session ends mid-answer (stop_reason {stop})", False
    if any(b.get("type") == "tool_use" for b in blocks):
        return "the session ends at a tool call", False
    if not any(b.get("type") == "text" for b in blocks):
        return "the session ends at an answer with no visible text", False
    return "completed", True


def _count(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if type(value) is int and value >= 0 else None


def _add(total: int | None, value: int | None) -> int | None:
    return value if total is None else total + (value or 0)


def _sum(usages: Any) -> Usage:
    totals: dict[str, int | None] = dict.fromkeys(("input", "output", "cache", "thinking"))
    seen = False
    for raw in usages:
        seen = True
        details = raw.get("output_tokens_details")
        thinking = _count(details, "thinking_tokens") if isinstance(details, dict) else None
        totals["input"] = _add(totals["input"], _count(raw, "input_tokens"))
        totals["output"] = _add(totals["output"], _count(raw, "output_tokens"))
        totals["cache"] = _add(totals["cache"], _count(raw, "cache_read_input_tokens"))
        totals["thinking"] = _add(totals["thinking"], thinking)
    if not seen:
        return Usage()
    return Usage(
        input_tokens=totals["input"],
        output_tokens=totals["output"],
        cache_read_tokens=totals["cache"],
        reasoning_tokens=totals["thinking"],
        source="provider",
    )
