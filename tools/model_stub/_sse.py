"""Server-sent event framing and delta splitting, shared by both APIs."""

from __future__ import annotations

import json
from typing import Any


def frame(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event: ``event: <name>`` and its JSON ``data`` line."""
    payload = json.dumps(data, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()


def pieces(text: str, count: int = 3) -> list[str]:
    """Split ``text`` into at most ``count`` non-empty deltas (at spaces when it can)."""
    if len(text) <= 1 or count <= 1:
        return [text] if text else []
    size = max(1, -(-len(text) // count))
    out: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        space = text.rfind(" ", start + 1, end)
        if end < len(text) and space > start:
            end = space
        out.append(text[start:end])
        start = end
    return out
