"""The Dashboard's search catalog (``/api/search/sources``): readers of saved evidence.

The catalog copies no body: each ``SearchSource`` names a reader (``node`` for
``/api/artifact``, or the ``ContentRef`` of ``/api/context/content``) and the client scans it
in byte pages. Sources come in successive stages, each in its own keyset order:

1. ``context`` — the latest revision of every context entry that is not a tool record
   (messages, tasks, configuration, approvals, session records);
2. ``versions`` — exact saved versions: every superseded revision of an entry (a record that
   changed when its file was read again), one source per revision;
3. ``tools`` — the latest tool-call and tool-result entries;
4. ``runtime_events`` — the run's stored runtime events (process observations), read by
   ``/api/artifact`` as database records (``content: {state: reader}``);
5. ``runtime_reports`` — the run's saved runtime correlation reports (stored objects).

A stage with nothing recorded yields no source: the catalog never stands in for evidence the
store does not hold. A page holds at most :data:`PAGE_SOURCES` sources and fills from the
next stage when one ends. ``next_cursor`` is signed by the store (:class:`CursorCodec`,
scope ``search_sources``) and bound to the run and the native session scope, so a tampered
cursor, another run's or another scope's is ``invalid_argument``.

Session scope needs both ``harness`` and ``session``; the session must occur in the run (a
source of the run records it), else ``content_not_found`` (404). It keeps only records
directly of that native session: entries of its sources, and runtime events whose recorded
session is it (declared by the observation or set by a correlation edge to one of its tool
calls). Correlation reports cover the whole run, so they are not in a session's catalog.
Related sessions and shared paths are never followed.

``node`` is always exact: an entry's stored body object; when none, the entry id if the
entry has a single revision, else the revision's ``object_hash``. ``graph_node`` is a
recorded graph destination: the first served link of an entry (see
:mod:`._links`), or the tool call a runtime event is attributed to (``runtime_edges``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from braid_actors.errors import EvidenceContentNotFound
from braid_actors.model import digest

from ._links import entry_links
from ._paging import BODIES, check_run, entry_body, invalid

if TYPE_CHECKING:
    import sqlite3

    from ._paging import CursorCodec

SCHEMA: Final = "agentprovenance.search_sources/v1"
SCOPE: Final = "search_sources"
PAGE_SOURCES: Final = 50
TOOL_KINDS: Final = ("tool_call", "tool_result")
STAGES: Final = ("context", "versions", "tools", "runtime_events", "runtime_reports")
_ENTRY_STAGES: Final = {
    "context": "e.latest = 1 AND e.kind NOT IN ('tool_call', 'tool_result')",
    "versions": "e.latest = 0",
    "tools": "e.latest = 1 AND e.kind IN ('tool_call', 'tool_result')",
}
CATEGORY: Final = {
    "message": "messages",
    "tool_call": "tools",
    "tool_result": "tools",
    "task": "configuration",
    "configuration": "configuration",
    "approval": "configuration",
    "session": "configuration",
}


def search_page(
    conn: sqlite3.Connection,
    codec: CursorCodec,
    run_id: str,
    harness: str | None,
    session: str | None,
    cursor: str | None,
) -> dict[str, Any]:
    """One ``SearchSourcePage`` (see the module docstring)."""
    run_id = check_run(conn, run_id)
    if (harness is None) != (session is None):
        raise invalid(
            "session scope needs both harness and session",
            "session" if session is None else "harness",
        )
    scope = None if harness is None or session is None else (harness, session)
    if scope is not None and (
        conn.execute(
            "SELECT 1 FROM sources WHERE run_id=? AND harness=? AND session_id=? LIMIT 1",
            (run_id, *scope),
        ).fetchone()
        is None
    ):
        raise EvidenceContentNotFound("the native session does not occur in this run")
    fingerprint = digest([SCOPE, harness, session])
    stage, key = 0, None
    if cursor is not None:
        stage, key = _position(codec.decode(cursor, SCOPE, run_id, fingerprint))
    sources: list[dict[str, Any]] = []
    next_key: list[int] | None = None
    while stage < len(STAGES):
        room = PAGE_SOURCES - len(sources)
        found, more = _read_stage(conn, run_id, STAGES[stage], scope, key, room)
        sources.extend(item for item, _ in found)
        if more:
            next_key = found[-1][1]
            break
        stage, key = stage + 1, None
        if len(sources) == PAGE_SOURCES:
            break
    body: dict[str, Any] = {"schema_version": SCHEMA, "run_id": run_id, "sources": sources}
    if scope is not None:
        body.update(harness=scope[0], session_id=scope[1])
    body["has_more"] = stage < len(STAGES)
    if body["has_more"]:
        position = [stage, *(next_key or [])]
        body["next_cursor"] = codec.encode(SCOPE, run_id, fingerprint, position)
    return body


def _position(position: list[Any]) -> tuple[int, list[int] | None]:
    if not position or not all(isinstance(p, int) and not isinstance(p, bool) for p in position):
        raise invalid("the cursor is not valid", "cursor", "malformed")
    stage, key = position[0], position[1:]
    size = 4 if 0 <= stage < len(_ENTRY_STAGES) else 1
    if not 0 <= stage < len(STAGES) or len(key) not in (0, size):
        raise invalid("the cursor is not valid", "cursor", "malformed")
    return stage, key or None


def _read_stage(
    conn: sqlite3.Connection,
    run_id: str,
    stage: str,
    scope: tuple[str, str] | None,
    key: list[int] | None,
    room: int,
) -> tuple[list[tuple[dict[str, Any], list[int]]], bool]:
    """Up to ``room`` sources of one stage after ``key``, with their keys; and whether the
    stage has more."""
    if stage in _ENTRY_STAGES:
        rows = _entry_rows(conn, run_id, _ENTRY_STAGES[stage], scope, key, room + 1)
        found = [
            (_entry_item(conn, run_id, row, superseded=stage == "versions"), _entry_key(row))
            for row in rows[:room]
        ]
    elif stage == "runtime_events":
        rows = _event_rows(conn, run_id, scope, key, room + 1)
        found = [(event_source(row), [int(row["pk"])]) for row in rows[:room]]
    else:
        rows = [] if scope is not None else _report_rows(conn, run_id, key, room + 1)
        found = [(report_source(row), [int(row["pk"])]) for row in rows[:room]]
    return found, len(rows) > room


def _entry_key(row: sqlite3.Row) -> list[int]:
    return [int(row["source_pk"]), int(row["sequence"]), int(row["ordinal"]), int(row["revision"])]


def _entry_rows(
    conn: sqlite3.Connection,
    run_id: str,
    condition: str,
    scope: tuple[str, str] | None,
    key: list[int] | None,
    limit: int,
) -> list[sqlite3.Row]:
    where = ["e.run_id = ?", condition]
    params: list[Any] = [run_id]
    if scope is not None:
        where.append("s.harness = ? AND s.session_id = ?")
        params.extend(scope)
    if key is not None:
        where.append("(e.source_pk, e.sequence, e.ordinal, e.revision) > (?, ?, ?, ?)")
        params.extend(key)
    return conn.execute(
        f"SELECT e.source_pk, e.sequence, e.ordinal, e.revision, {BODIES} "
        "FROM entries e JOIN sources s ON s.pk = e.source_pk WHERE "
        + " AND ".join(where)
        + " ORDER BY e.source_pk, e.sequence, e.ordinal, e.revision LIMIT ?",
        (*params, limit),
    ).fetchall()


def _event_rows(
    conn: sqlite3.Connection,
    run_id: str,
    scope: tuple[str, str] | None,
    key: list[int] | None,
    limit: int,
) -> list[sqlite3.Row]:
    where = ["ev.run_id = ?"]
    params: list[Any] = [run_id]
    if scope is not None:
        where.append("ev.harness = ? AND ev.session_id = ?")
        params.extend(scope)
    if key is not None:
        where.append("ev.pk > ?")
        params.append(key[0])
    # One edge per event at most (a pass attributes an event to one call); MIN keeps the
    # query exact should that ever change.
    return conn.execute(
        "SELECT ev.*, (SELECT MIN(entry_id) FROM runtime_edges g WHERE g.run_id = ev.run_id "
        "AND g.event_id = ev.event_id) AS edge_entry, (SELECT MIN(tool_call_id) FROM "
        "runtime_edges g WHERE g.run_id = ev.run_id AND g.event_id = ev.event_id) AS edge_call "
        "FROM runtime_events ev WHERE " + " AND ".join(where) + " ORDER BY ev.pk LIMIT ?",
        (*params, limit),
    ).fetchall()


def _report_rows(
    conn: sqlite3.Connection, run_id: str, key: list[int] | None, limit: int
) -> list[sqlite3.Row]:
    return conn.execute(
        "SELECT r.pk, r.ref, r.observed_at, o.bytes, o.media_type, o.redacted "
        "FROM runtime_reports r LEFT JOIN objects o ON o.ref = r.ref "
        "WHERE r.run_id = ? AND r.pk > ? ORDER BY r.pk LIMIT ?",
        (run_id, -1 if key is None else key[0], limit),
    ).fetchall()


# ---- sources ---------------------------------------------------------------------------


def _entry_item(
    conn: sqlite3.Connection, run_id: str, row: sqlite3.Row, *, superseded: bool
) -> dict[str, Any]:
    entry = entry_body(row["body"], row["source_body"])
    if superseded:
        return entry_source(entry, superseded=True)
    links, _ = entry_links(conn, run_id, entry["id"])
    revisions = conn.execute(
        "SELECT COUNT(*) FROM entries WHERE run_id=? AND id=?", (run_id, entry["id"])
    ).fetchone()[0]
    return entry_source(
        entry, graph_node=links[0]["node_id"] if links else None, only_revision=revisions == 1
    )


def entry_source(
    entry: dict[str, Any],
    *,
    graph_node: str | None = None,
    superseded: bool = False,
    only_revision: bool = False,
) -> dict[str, Any]:
    """The ``SearchSource`` of one stored entry (a superseded revision when ``superseded``).

    ``node`` is exact: the stored body's object when there is one; else the entry id when
    the entry has ``only_revision`` (an indexed read), else the revision's ``object_hash``.
    ``/api/artifact`` then states why no body is stored.
    """
    source = entry["source"]
    parts = [entry["kind"], entry.get("tool_name") or entry.get("role")]
    if superseded:
        parts.append("(superseded revision)")
    content = entry["content"]
    item: dict[str, Any] = {
        "id": ("version:" + entry["object_hash"]) if superseded else f"entry:{entry['id']}",
        "category": CATEGORY[entry["kind"]],
        "kind": entry["kind"],
        "label": " ".join(str(part) for part in parts if part),
        "node": content["ref"]
        if content.get("state") == "stored"
        else entry["id"]
        if only_revision
        else entry["object_hash"],
        "source_id": source["id"],
        "harness": source["harness"],
        "session_id": source["session_id"],
        "entry": entry,
        "content": content,
    }
    if graph_node is not None:
        item["graph_node"] = graph_node
    for field in ("agent_id", "tool_call_id", "recorded_at", "execution_scope"):
        if field in entry:
            item[field] = entry[field]
    return item


def event_source(row: sqlite3.Row) -> dict[str, Any]:
    """The ``SearchSource`` of one runtime event; ``/api/artifact`` reads its record."""
    pid = "pid unknown" if row["pid"] is None else f"pid {row['pid']}"
    item: dict[str, Any] = {
        "id": "runtime:" + row["event_id"],
        "category": "runtime",
        "kind": row["type"],
        "label": f"{row['type']} {pid}",
        "node": row["event_id"],
        "content": {"state": "reader", "bytes": None},
    }
    for field, value in (
        ("graph_node", row["edge_entry"]),
        ("harness", row["harness"]),
        ("session_id", row["session_id"]),
        ("tool_call_id", row["edge_call"]),
        ("recorded_at", row["started_at"]),
    ):
        if value is not None:
            item[field] = value
    return item


def report_source(row: sqlite3.Row) -> dict[str, Any]:
    """The ``SearchSource`` of one saved runtime correlation report."""
    content: dict[str, Any]
    if row["bytes"] is None:
        content = {"bytes": None, "redacted": False, "state": "unavailable"}
        content["reason"] = "source_not_recorded"
    else:
        content = {
            "ref": row["ref"],
            "bytes": row["bytes"],
            "sha256": row["ref"][len("sha256:") :],
            "media_type": row["media_type"],
            "redacted": bool(row["redacted"]),
            "state": "stored",
        }
    return {
        "id": "runtime_report:" + row["ref"],
        "category": "runtime",
        "kind": "runtime_correlation",
        "label": f"runtime correlation pass {row['observed_at']}",
        "node": row["ref"],
        "recorded_at": row["observed_at"],
        "content": content,
    }
