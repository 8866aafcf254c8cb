"""A portable context written as a native Codex rollout (a seed thread).

Design note. ``codex exec`` takes one text prompt, but ``exec resume THREAD`` sends the model
every ``response_item`` of that thread's rollout before the new input. So a fresh session
with portable context is started by writing a rollout for a new thread id (a UUID v7, as
Codex makes them) at ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl``:
a ``session_meta`` line (``id``, ``timestamp``, ``cwd``, ``originator``, ``cli_version``,
``source``, ``model_provider``; Codex refuses a meta without ``cli_version``), then one
``response_item`` ``message`` per copied message, then running ``exec resume`` on it with
only the new input. It is a new session with copied context, never reported as resumed.

Translation, per part kind (as :func:`._claude_seed.part_text`; each part one content
block, ``input_text`` in user messages, ``output_text`` in assistant ones):

* ``text``: its text.
* ``reasoning``: omitted (the source runner's private reasoning).
* ``tool_request``: ``[tool NAME] {canonical JSON input}`` (bounded). The source's call id
  is never written (no ``function_call`` item is made for it).
* ``tool_result``: ``[result STATUS exit=N] summary`` (bounded, ``(truncated)`` noted).
* ``file_input`` / ``artifact_ref``: a one-line note naming the attachment.
* ``warning`` / ``error``: ``[warning CODE] message`` / ``[error CODE] message``.
* ``unknown``: omitted.

``system`` messages are not copied (profile instructions come from the profile snapshot),
and a message left with no content is skipped. Items get no ``id`` (Codex's own first
rollouts had none); the thread's boundary after the turn is Codex's own last item.
Trailing user messages stay in the rollout: ``exec resume`` never answers history by
itself, it sends it followed by the new input.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.providers._claude_seed import CopyReport, message_texts

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.providers._port import ContextMessage, PortableContext

SEED_CLI_VERSION: Final = "0.0.0-braid.seed"
"""``session_meta.cli_version`` of a seed rollout (Codex requires one; any string works)."""


def new_thread_id(now_ms: int | None = None) -> str:
    """A new thread id: a UUID v7 (48-bit ms timestamp, version 7, RFC 4122 variant)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    raw = bytearray(ms.to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(raw)))


def message_item(
    message: ContextMessage, report: CopyReport | None = None
) -> dict[str, Any] | None:
    """A context message as a ``response_item`` payload (None: nothing to copy)."""
    kind = "input_text" if message.role == "user" else "output_text"
    content = [{"type": kind, "text": text} for text in message_texts(message, report)]
    if not content:
        return None
    return {"type": "message", "role": message.role, "content": content}


@attrs.frozen
class Rollout:
    """How a portable context enters a new Codex thread."""

    lines: list[dict[str, Any]]
    """The rollout lines to write (empty: nothing to copy, no seed needed)."""
    report: CopyReport
    """What of the context was copied, omitted or transformed (by part id)."""


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def plan_rollout(
    context: PortableContext,
    *,
    thread_id: str,
    cwd: str,
    model_provider: str,
    now: datetime | None = None,
) -> Rollout:
    """The rollout lines for ``context`` and what they copied of it."""
    stamp = _stamp(now or datetime.now(UTC))
    report = CopyReport()
    items = [
        item for message in context.messages for item in [message_item(message, report)] if item
    ]
    if not items:
        return Rollout(lines=[], report=report)
    meta = {
        "id": thread_id,
        "timestamp": stamp,
        "cwd": cwd,
        "originator": "codex_exec",
        "cli_version": SEED_CLI_VERSION,
        "source": "exec",
        "model_provider": model_provider,
    }
    lines: list[dict[str, Any]] = [{"timestamp": stamp, "type": "session_meta", "payload": meta}]
    lines += [{"timestamp": stamp, "type": "response_item", "payload": item} for item in items]
    return Rollout(lines=lines, report=report)


def rollout_path(codex_home: Path, thread_id: str, now: datetime | None = None) -> Path:
    """Where Codex keeps a thread's rollout: ``sessions/YYYY/MM/DD/rollout-<time>-<id>``."""
    when = now or datetime.now(UTC)
    day = codex_home / "sessions" / when.strftime("%Y") / when.strftime("%m") / when.strftime("%d")
    return day / f"rollout-{when.strftime('%Y-%m-%dT%H-%M-%S')}-{thread_id}.jsonl"


def write_rollout(path: Path, lines: list[dict[str, Any]]) -> None:
    """Write a seed rollout at ``path`` (which must not exist yet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as stream:
        for line in lines:
            stream.write(json.dumps(line, ensure_ascii=False) + "\n")
