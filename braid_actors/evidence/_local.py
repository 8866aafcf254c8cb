"""Braid's own ``local`` runner session files (see ``docs/local-runner.md``).

``DIR/<sessionId>.jsonl``: one canonical-JSON object per line, exactly
``{"messageId", "role", "text"}`` with role ``user``, ``assistant`` or ``system``. Each line is
a message entry; the first user line is also the session's ``task``. A line of another shape
is ``unrecognized``. The source records the session's documented digest and boundary (the
last message id) as binding evidence, so a reader can check them against a boundary proof.
The file carries no configuration, approvals or tool calls; coverage lists them as missing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from braid_actors.model import digest

from ._parsed import Content, DraftLine, LineInfo, Outcome, SessionInfo

if TYPE_CHECKING:
    from ._parsed import LineSplit

PARSER_VERSION: Final = "braid.local/1"
FORMAT_VERSION: Final = "braid.local_session/1"
LINE_KEYS: Final = frozenset({"messageId", "role", "text"})
ROLES: Final = frozenset({"user", "assistant", "system"})
SESSION_ID_RE: Final = re.compile(r"sess_[0-9a-f]{8,64}")


def is_local_line(obj: dict[str, Any]) -> bool:
    """The documented line shape."""
    return (
        set(obj) == LINE_KEYS
        and all(isinstance(obj[key], str) for key in LINE_KEYS)
        and obj["role"] in ROLES
    )


def parse_local(split: LineSplit, *, fallback_session: str) -> Outcome:
    """Parse a local runner session file's lines."""
    out = Outcome("local", PARSER_VERSION, FORMAT_VERSION)
    session = fallback_session
    info = SessionInfo(session_id=session)
    if SESSION_ID_RE.fullmatch(session) is None:
        info.evidence.append("session_id_not_a_local_id")
    out.sessions[session] = info
    good: list[dict[str, str]] = []
    tasked = False
    for line in split.lines:
        obj = line.obj
        if obj is None:
            out.lines.append(LineInfo(line.number, session, "failed", "", None))
            out.issue(line.error or "malformed_json", line.number, session)
            continue
        if not is_local_line(obj):
            out.lines.append(LineInfo(line.number, session, "unrecognized", "?", None))
            out.issue("unrecognized_record", line.number, session, "messageId")
            continue
        out.lines.append(LineInfo(line.number, session, "ok", "message", None))
        good.append({key: obj[key] for key in LINE_KEYS})
        helper = DraftLine(out, line.number, session, None)
        helper.add("message", "recorded", role=obj["role"], content=Content.text(obj["text"]))
        out.stat(session, "messages")
        if obj["role"] == "user" and not tasked:
            tasked = True
            helper.add(
                "task",
                "initial_prompt",
                role="user",
                content=Content.text(obj["text"]),
                fields=frozenset({"task"}),
            )
            out.stat(session, "tasks")
    if good and len(good) == len(split.lines):
        info.evidence.append(f"session_digest={digest(good)}")
        info.evidence.append(f"boundary={good[-1]['messageId']}")
    return out
