"""What a parser produces: lines, draft entries, sessions, actions, issues and statistics.

Parsers are pure: they read a :class:`LineSplit` (bytes already split into numbered lines,
each decoded to a JSON object or marked failed) and return an :class:`Outcome`. Nothing here
touches the disk, redacts or hashes; :mod:`._materialize` turns drafts into stored entries.

Counting units (also see :mod:`._coverage`): ``Outcome.lines`` has one :class:`LineInfo`
per complete non-blank physical line, with its status (``ok``, ``failed`` or
``unrecognized``); a recognized line yields zero or more :class:`Draft` entries, numbered by
``ordinal`` (1-based) within the line.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Final

import attrs
import orjson

MAX_LINE_BYTES: Final = 64 * 1024 * 1024
"""A physical line longer than this is ``failed`` (``line_too_long``) and not decoded."""

CHECKED_FIELDS: Final = (
    "task",
    "configuration",
    "approval",
    "approval_decision",
    "configuration.model",
    "configuration.provider",
    "configuration.application_version",
    "configuration.workdir",
    "configuration.permission_mode",
    "configuration.approval_policy",
    "configuration.sandbox_policy",
    "configuration.directory_restrictions",
    "configuration.network_restrictions",
    "configuration.mcp_servers",
    "configuration.tools",
    "configuration.skills",
    "configuration.plugins",
)
"""The source fields the parsers check (the spec's ``MissingSnapshotFields`` list)."""
CHANGE_HISTORY: Final = "configuration.change_history_completeness"
"""Always reported: snapshots never establish exhaustive change history."""


@attrs.frozen
class Line:
    """One complete physical line."""

    number: int
    """1-based physical line number."""
    start: int
    """Byte offset of the line's first byte."""
    end: int
    """Byte offset just after the line's newline."""
    raw: bytes
    """The line without its newline."""
    obj: dict[str, Any] | None
    """The decoded object, or null when the line failed."""
    error: str | None
    """Issue code of a failed line: ``malformed_json``, ``not_an_object``, ``line_too_long``."""


@attrs.frozen
class LineSplit:
    """A file's bytes split into lines."""

    lines: tuple[Line, ...]
    """Complete non-blank lines, in order."""
    deferred: Line | None
    """An incomplete last line (no newline yet): deferred to a later ingest."""
    size: int
    """Size of the bytes that were split."""
    complete_end: int
    """Offset just after the last complete line (the resume cursor)."""


def split_lines(data: bytes) -> LineSplit:
    """Split ``data`` into numbered lines and decode each one as a JSON object."""
    lines: list[Line] = []
    deferred: Line | None = None
    position = 0
    number = 0
    size = len(data)
    runs = long_digit_runs(data)
    run = 0  # index of the first run not before ``position``
    while position < size:
        newline = data.find(b"\n", position)
        number += 1
        if newline < 0:
            raw = data[position:]
            if raw.strip():
                deferred = Line(number, position, size, raw, None, "incomplete_line")
            break
        raw = data[position:newline]
        if (raw and raw[0] not in _SPACE) or raw.strip():  # not blank (without copying)
            while run < len(runs) and runs[run] < position:
                run += 1
            plain = run < len(runs) and runs[run] < newline
            lines.append(_decode(number, position, newline + 1, raw, plain))
        position = newline + 1
    end = deferred.start if deferred is not None else position
    return LineSplit(lines=tuple(lines), deferred=deferred, size=size, complete_end=end)


_SPACE: Final = frozenset(b" \t\n\r\x0b\x0c")
"""The bytes ``bytes.strip`` removes."""
_DIGITS: Final = bytes.maketrans(b"123456789", b"000000000")
_RUN: Final = b"0" * 19
"""19 digits in a row: an integer literal orjson could read outside 64 bits (as a float)."""


def long_digit_runs(data: bytes) -> list[int]:
    """Offsets where 19 digits in a row start (overlapping runs included)."""
    marked = data.translate(_DIGITS)  # every digit becomes "0", nothing else does
    out: list[int] = []
    found = marked.find(_RUN)
    while found >= 0:
        out.append(found)
        found = marked.find(_RUN, found + 1)
    return out


def loads(raw: bytes, plain: bool = False) -> Any:
    """``json.loads(raw)``, by ``orjson.loads`` where that gives the same value.

    orjson refuses everything json refuses here (and more: lone surrogates, NaN, a BOM,
    out-of-range floats), so whatever it refuses goes to json, which decides. What it
    accepts it reads as json does, except integers beyond 64 bits (floats in orjson); every
    such literal has 19 digits in a row, so ``plain`` (the caller found 19 digits in a row
    somewhere in ``raw``, also inside a string) sends ``raw`` to json directly.
    """
    if not plain:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def loads_stored(data: bytes) -> Any:
    """``json.loads`` of a text the store wrote (an entry or source body, as UTF-8 bytes),
    by :func:`loads`: orjson unless 19 digits in a row occur somewhere in it."""
    return loads(data, data.translate(_DIGITS).find(_RUN) >= 0)


def _decode(number: int, start: int, end: int, raw: bytes, plain: bool) -> Line:
    if len(raw) > MAX_LINE_BYTES:
        return Line(number, start, end, raw, None, "line_too_long")
    try:
        obj = loads(raw, plain)
    except ValueError:
        return Line(number, start, end, raw, None, "malformed_json")
    if not isinstance(obj, dict):
        return Line(number, start, end, raw, None, "not_an_object")
    return Line(number, start, end, raw, obj, None)


@attrs.frozen
class Content:
    """A body a draft carries: text, a JSON value, or an explicit unavailability."""

    value: Any
    """A ``str`` (stored as text) or a JSON value (stored as JSON); null when unavailable."""
    media_type: str = "text/plain; charset=utf-8"
    reason: str | None = None
    """Why there is no body (``binary_content``, ``encrypted``, ``source_not_recorded``)."""

    @classmethod
    def text(cls, value: str) -> Content:
        return cls(value)

    @classmethod
    def json(cls, value: Any) -> Content:
        return cls(value, "application/json")

    @classmethod
    def unavailable(cls, reason: str, media_type: str = "application/octet-stream") -> Content:
        return cls(None, media_type, reason)


@attrs.define(eq=False)
class Draft:
    """A normalized record before storage."""

    line: int
    ordinal: int
    session: str
    """The session key (``Outcome.sessions``) this record belongs to."""
    kind: str
    """``message``, ``tool_call``, ``tool_result``, ``task``, ``configuration``, ``approval``,
    ``session``."""
    status: str
    role: str | None = None
    recorded_at: str | None = None
    agent_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    content: Content | None = None
    intent: Any = None
    """A derived model-message projection (Claude), kept when raw records are omitted."""
    session_metadata: dict[str, Any] | None = None
    fields: frozenset[str] = frozenset()
    """Checked source fields this record shows present (see :data:`CHECKED_FIELDS`)."""
    missing_fields: tuple[str, ...] = ()
    refs: list[tuple[int, int]] = attrs.Factory(list)
    """Other drafts this one cites, as ``(line, ordinal)``."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.line, self.ordinal)


@attrs.define(eq=False)
class SessionInfo:
    """One native session found in a file (a file may switch sessions after a resume)."""

    session_id: str
    agent_id: str | None = None
    parent_session_id: str | None = None
    application_version: str | None = None
    workdir: str | None = None
    sidechain: bool = False
    evidence: list[str] = attrs.Factory(list)
    """``Source.binding_evidence`` notes (no bodies)."""


@attrs.frozen
class LineInfo:
    """What one physical line was."""

    number: int
    session: str
    status: str
    """``ok``, ``failed`` or ``unrecognized``."""
    record_type: str
    timestamp: str | None


@attrs.frozen
class ParseIssue:
    code: str
    line: int | None
    session: str | None
    field: str | None = None


@attrs.frozen
class Action:
    """A typed action a session relation can rest on (spawn, send input, delegated task)."""

    kind: str
    """``spawn`` (native spawn result), ``send_input`` or ``task_agent`` (Claude)."""
    draft: tuple[int, int]
    """The draft that records it."""
    session: str
    target: str | None
    """The spawned or addressed native session, when the source names one."""
    agent_id: str | None = None
    tool_call_id: str | None = None
    body_limited: bool = False
    """The body was over the relation body limit and was not read."""


@attrs.frozen
class Link:
    """A graph link between two drafts of one file, and the source field that records it."""

    kind: str
    """``tool_result`` (a result and its call) or ``api_response_group`` (two blocks of one
    API response)."""
    source: tuple[int, int]
    target: tuple[int, int]
    basis: str
    """The source field both records share: ``tool_use_id``, ``call_id`` or ``message.id``."""
    value: str
    """That field's value (redacted before storage)."""


@attrs.define(eq=False)
class Outcome:
    """Everything a parser found in one file."""

    harness: str
    parser_version: str
    format_version: str
    sessions: dict[str, SessionInfo] = attrs.Factory(dict)
    drafts: list[Draft] = attrs.Factory(list)
    lines: list[LineInfo] = attrs.Factory(list)
    issues: list[ParseIssue] = attrs.Factory(list)
    actions: list[Action] = attrs.Factory(list)
    links: list[Link] = attrs.Factory(list)
    stats: dict[str, Counter[str]] = attrs.Factory(dict)
    """Per session key: the derived summary counts (see ``SourceSummary``)."""
    usage: dict[str, Counter[str]] = attrs.Factory(dict)
    """Per session key: token usage with repeated reports counted once."""

    def stat(self, session: str, name: str, amount: int = 1) -> None:
        counts = self.stats.get(session)  # (setdefault would build a Counter per call)
        if counts is None:
            counts = self.stats[session] = Counter()
        counts[name] += amount

    def issue(
        self, code: str, line: int | None, session: str | None, field: str | None = None
    ) -> None:
        self.issues.append(ParseIssue(code, line, session, field))


@attrs.define(eq=False)
class DraftLine:
    """Helper that numbers the drafts of one line."""

    outcome: Outcome
    line: int
    session: str
    recorded_at: str | None
    agent_id: str | None = None
    count: int = 0

    def add(self, kind: str, status: str, **fields: Any) -> Draft:
        self.count += 1
        fields.setdefault("recorded_at", self.recorded_at)
        fields.setdefault("agent_id", self.agent_id)
        draft = Draft(self.line, self.count, self.session, kind, status, **fields)
        self.outcome.drafts.append(draft)
        return draft


def as_str(value: object) -> str | None:
    """``value`` when it is a non-empty string."""
    return value if isinstance(value, str) and value else None


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def resolve_pending(out: Outcome, pending: str, owner: str) -> None:
    """Give everything recorded before a session was known (key ``pending``) to ``owner``."""
    out.lines[:] = [
        attrs.evolve(line, session=owner) if line.session == pending else line for line in out.lines
    ]
    for draft in out.drafts:
        if draft.session == pending:
            draft.session = owner
    out.issues[:] = [
        attrs.evolve(issue, session=owner) if issue.session in (None, pending) else issue
        for issue in out.issues
    ]
    out.actions[:] = [
        attrs.evolve(action, session=owner) if action.session == pending else action
        for action in out.actions
    ]
    for table in (out.stats, out.usage):
        if pending in table:
            table.setdefault(owner, Counter()).update(table.pop(pending))
