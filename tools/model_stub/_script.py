"""The script: what the scripted model answers, one step per request, per API.

A script is JSON. Either a list of steps (used by both APIs, each with its own cursor) or an
object ``{"anthropic": [...], "openai": [...], "fallback": "text" | step}``. A step is an
object:

- ``text``: the answer's text;
- ``thinking``: a thinking block (Anthropic) or a reasoning item with a summary (OpenAI);
- ``tool_use`` / ``function_call``: one call or a list, ``{"name", "input" | "arguments",
  "id"?}``; ``arguments`` may also be a raw string (sent as is);
- ``error``: ``{"status", "message", "type"?}``; a status of 400 or more is an HTTP error
  reply, ``"in_stream": true`` (status 200) fails the stream after it started;
- ``delay``: seconds to wait before answering (at most :data:`MAX_DELAY`);
- ``usage``: token counts (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``, ``reasoning_tokens``);
- ``stop_reason``: overrides the computed one (Anthropic only);
- ``match``: only a request whose JSON body contains this text takes the step (see below).

Each model request takes the next step of its API. Harnesses also send side requests of
their own (titles, summaries); a step with ``match`` is taken only by a request whose body
holds that substring, and a request that does not match the next step is answered with the
fallback without consuming it. Once the steps are used up every request gets the fallback:
a text, or a whole step (say an error, so that every retry of a client fails too).

Parsing is strict: unknown keys and wrong types raise :class:`ScriptError` naming the step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

MAX_DELAY = 60.0
"""Longest ``delay`` a step may ask for, in seconds."""
MAX_STEPS = 10_000
DEFAULT_FALLBACK = "Done."

_STEP_KEYS = frozenset(
    {
        "text",
        "thinking",
        "tool_use",
        "function_call",
        "error",
        "delay",
        "usage",
        "stop_reason",
        "match",
    }
)
_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)


class ScriptError(ValueError):
    """The script is not valid; the message names the step and the field."""


@attrs.frozen
class ToolCall:
    """A tool call the model makes."""

    name: str
    arguments: Mapping[str, Any] | str
    """A JSON object, or a raw string sent as the call's arguments unchanged."""
    call_id: str | None = None
    """The call's id; a fresh one is made when null."""

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"))


@attrs.frozen
class ScriptedError:
    """An error the model's API answers with."""

    status: int
    """HTTP status; 200 means the stream starts and then fails."""
    message: str
    type: str | None = None
    """The API's error type; derived from the status when null."""


@attrs.frozen
class StepUsage:
    """Token counts the answer reports."""

    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0


@attrs.frozen
class Step:
    """One scripted answer."""

    text: str | None = None
    thinking: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    error: ScriptedError | None = None
    delay: float = 0.0
    usage: StepUsage = StepUsage()
    stop_reason: str | None = None
    match: str | None = None
    """Only a request whose body contains this substring takes the step."""


@attrs.frozen
class Script:
    """Steps per API and the answer once they are used up."""

    anthropic: tuple[Step, ...] = ()
    openai: tuple[Step, ...] = ()
    fallback: Step = Step(text=DEFAULT_FALLBACK)
    """What answers once the steps are used up (and requests a ``match`` step skips)."""


def load_script(path: str | Path) -> Script:
    """Read and parse a script file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ScriptError(f"script {path} is not JSON: {exc}") from None
    return parse_script(raw)


def parse_script(raw: Any) -> Script:
    """Build a :class:`Script` from its JSON form (a list of steps or an object)."""
    if isinstance(raw, list):
        steps = _steps(raw, "steps")
        return Script(anthropic=steps, openai=steps)
    if not isinstance(raw, dict):
        raise ScriptError("a script is a list of steps or an object")
    unknown = sorted(set(raw) - {"anthropic", "openai", "fallback"})
    if unknown:
        raise ScriptError(f"unknown script keys {unknown}")
    fallback = raw.get("fallback", DEFAULT_FALLBACK)
    if isinstance(fallback, str):
        fallback = {"text": fallback}
    if isinstance(fallback, dict) and "match" in fallback:
        raise ScriptError("the script fallback cannot have a match")
    return Script(
        anthropic=_steps(raw.get("anthropic", []), "anthropic"),
        openai=_steps(raw.get("openai", []), "openai"),
        fallback=parse_step(fallback, "fallback"),
    )


def _steps(raw: Any, where: str) -> tuple[Step, ...]:
    if not isinstance(raw, list):
        raise ScriptError(f"{where} must be a list of steps")
    if len(raw) > MAX_STEPS:
        raise ScriptError(f"{where} has {len(raw)} steps, more than {MAX_STEPS}")
    return tuple(parse_step(item, f"{where}[{i}]") for i, item in enumerate(raw))


def parse_step(raw: Any, where: str = "step") -> Step:
    """Build one :class:`Step`; ``where`` names it in error messages."""
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be an object")
    unknown = sorted(set(raw) - _STEP_KEYS)
    if unknown:
        raise ScriptError(f"{where} has unknown keys {unknown}")
    calls: list[ToolCall] = []
    for key in ("tool_use", "function_call"):
        if key in raw:
            items = raw[key] if isinstance(raw[key], list) else [raw[key]]
            calls.extend(_tool_call(item, f"{where}.{key}") for item in items)
    delay = raw.get("delay", 0.0)
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        raise ScriptError(f"{where}.delay must be a number of seconds >= 0")
    if delay > MAX_DELAY:
        raise ScriptError(f"{where}.delay {delay} is longer than {MAX_DELAY} s")
    return Step(
        text=_opt_str(raw, "text", where),
        thinking=_opt_str(raw, "thinking", where),
        tool_calls=tuple(calls),
        error=_error(raw["error"], f"{where}.error") if "error" in raw else None,
        delay=float(delay),
        usage=_usage(raw.get("usage", {}), f"{where}.usage"),
        stop_reason=_opt_str(raw, "stop_reason", where),
        match=_opt_str(raw, "match", where),
    )


def _opt_str(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ScriptError(f"{where}.{key} must be a string")
    return value


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be an object")
    unknown = sorted(set(raw) - {"name", "input", "arguments", "id"})
    if unknown:
        raise ScriptError(f"{where} has unknown keys {unknown}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{where}.name must be a non-empty string")
    if "input" in raw and "arguments" in raw:
        raise ScriptError(f"{where} has both input and arguments")
    arguments = raw.get("input", raw.get("arguments", {}))
    if not isinstance(arguments, dict | str):
        raise ScriptError(f"{where}.input must be an object (or arguments a string)")
    return ToolCall(name=name, arguments=arguments, call_id=_opt_str(raw, "id", where))


def _error(raw: Any, where: str) -> ScriptedError:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be an object")
    unknown = sorted(set(raw) - {"status", "message", "type", "in_stream"})
    if unknown:
        raise ScriptError(f"{where} has unknown keys {unknown}")
    in_stream = raw.get("in_stream", False)
    status = raw.get("status", 200 if in_stream else 500)
    if isinstance(status, bool) or not isinstance(status, int):
        raise ScriptError(f"{where}.status must be an integer")
    if in_stream and status != 200:
        raise ScriptError(f"{where}: an in-stream error has status 200, not {status}")
    if not in_stream and not 400 <= status <= 599:
        raise ScriptError(f"{where}.status {status} is not an HTTP error (400-599)")
    message = raw.get("message", "scripted error")
    if not isinstance(message, str):
        raise ScriptError(f"{where}.message must be a string")
    return ScriptedError(status=status, message=message, type=_opt_str(raw, "type", where))


def _usage(raw: Any, where: str) -> StepUsage:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be an object")
    unknown = sorted(set(raw) - set(_USAGE_KEYS))
    if unknown:
        raise ScriptError(f"{where} has unknown keys {unknown}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ScriptError(f"{where}.{key} must be an integer >= 0")
    return StepUsage(**raw)
