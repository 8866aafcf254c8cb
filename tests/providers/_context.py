"""Shared by the Claude Code and Codex adapter tests: a portable context and JSONL reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from braid_actors.model import ReasoningPart, TextPart, ToolRequestPart, ToolResultPart
from braid_actors.providers import ContextMessage, PortableContext


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def portable_context(through: str = "m4") -> PortableContext:
    """user / assistant (reasoning, text, a tool call and its result) / user / system,
    its boundary at ``through``."""
    return PortableContext(
        source_conversation_id="conv",
        source_branch_id="branch",
        through_message_id=through,
        messages=(
            ContextMessage("m1", "user", (TextPart("p1", "What is in the folder?"),)),
            ContextMessage(
                "m2",
                "assistant",
                (
                    ReasoningPart("p2", "private source reasoning"),
                    TextPart("p3", "Let me look."),
                    ToolRequestPart("p4", "shell", {"cmd": "ls"}, call_id="call_source_1"),
                    ToolResultPart("p5", "p4", "ok", "notes.txt", exit_code=0),
                    TextPart("p6", "It holds notes.txt."),
                ),
            ),
            ContextMessage(
                "m3",
                "user",
                (
                    TextPart("p7", "And the size?"),
                    ToolRequestPart("p8", "shell", {"cmd": "wc -c notes.txt"}, call_id="call_2"),
                    ToolResultPart("p9", "p8", "error", "x" * 5000, truncated=True),
                ),
            ),
            ContextMessage("m4", "system", (TextPart("p10", "profile instructions"),)),
        ),
        complete=True,
        digest="sha256:" + "0" * 64,
    )
