"""Format detection: which parser reads a file when the caller does not say.

Looks at the first decodable lines only. Claude Code records carry ``sessionId``/``uuid``
and a known ``type``; Codex rollouts are ``{"type", "payload"}`` envelopes (or the legacy bare
meta line); local runner lines are exactly ``{"messageId", "role", "text"}``. A whole-file
JSON object with ``sessionId``, ``projectHash`` and ``messages`` is a Gemini CLI chat.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Final

from ._claude import RECORD_TYPES as CLAUDE_TYPES
from ._codex import ENVELOPE_TYPES, ITEM_TYPES, is_legacy_meta
from ._local import is_local_line

if TYPE_CHECKING:
    from ._parsed import LineSplit

HARNESSES: Final = ("claude_code", "codex", "gemini_cli", "local")
"""Harnesses with a parser."""
UNSUPPORTED: Final[tuple[str, ...]] = ()
"""Harnesses recognized but not parsed."""
_SAMPLE: Final = 20
_NOT_SPACE: Final = re.compile(rb"[^ \t\n\r]")
"""A byte json does not skip after a value."""


def detect(split: LineSplit, data: bytes) -> str | None:
    """The harness of a file, ``gemini_cli`` for a Gemini chat, or null when unknown."""
    if _is_gemini(data):
        return "gemini_cli"
    votes: dict[str, int] = {}
    for line in split.lines[:_SAMPLE]:
        obj = line.obj
        if obj is None:
            continue
        kind = None
        rtype = obj.get("type")
        if is_local_line(obj):
            kind = "local"
        elif rtype in ENVELOPE_TYPES and isinstance(obj.get("payload"), dict):
            kind = "codex"
        elif rtype in CLAUDE_TYPES and ("sessionId" in obj or "uuid" in obj or "messageId" in obj):
            kind = "claude_code"
        elif is_legacy_meta(obj) or "record_type" in obj or rtype in ITEM_TYPES:
            kind = "codex"
        if kind:
            votes[kind] = votes.get(kind, 0) + 1
    if not votes:
        return None
    return max(sorted(votes), key=lambda k: votes[k])


def _is_gemini(data: bytes) -> bool:
    """Whether ``json.loads(data)`` is a Gemini chat object."""
    if not data.lstrip().startswith(b"{"):
        return False
    newline = data.find(b"\n")
    if newline >= 0 and b"\x00" not in data[:4] and _NOT_SPACE.search(data, newline):
        # A JSONL file: when its first line is a whole JSON value, json.loads(data) fails
        # after it ("extra data"); found without decoding the whole file (a parse of the
        # first line can only end where the parse of the file's first value ends). No NUL
        # in the first 4 bytes: json reads both as UTF-8, where a 0x0A byte is a newline.
        try:
            json.loads(data[:newline])
        except ValueError:
            pass  # not a whole value by itself (e.g. a pretty-printed document)
        else:
            return False
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("messages"), list)
        and "sessionId" in obj
        and "projectHash" in obj
    )
