"""Recorded graph links between entries (``/v1/context/links``), written at ingest.

A link row goes from one entry of a run to a graph node of the same run (another entry, or
a runtime event) and names the evidence it rests on; nothing is inferred from prose, paths
or timing. The kinds:

- ``tool_result``: a tool result and its call, both ways, matched by the parser on the
  shared id (Claude ``tool_use_id``, Codex ``call_id``) within one file;
- ``api_response_group``: two blocks of one Claude API response (the same ``message.id``);
- ``task_agent``: every entry of a Claude subagent's sidechain file → the ``Task`` call of
  the same session whose result or ``agent_progress`` names the agent (``agentId``), and the
  call → the sidechain's first entry;
- ``compaction_agent``: a compaction agent's entries → the ``compact_boundary`` of its
  session that follows them, and the boundary → the agent's first entry (the same rule as
  ``EvidenceStore.agent_links``);
- ``session_delegation``: the ``delegation`` session relation where it is a graph edge: every
  entry of a session a native spawn result names (Codex ``spawn_agent`` → ``agent_id``),
  ingested into the same run → the spawning ``tool_call``, and the call → the spawned
  session's first entry (evidence basis ``native_spawn_result``). The other session
  relations (``same_session``, ``parent``, ``fork``, ``message_request``) have no entry-to-
  tool-record edge, so the spec's ``EntryLinks`` cannot carry them; they are served by
  ``/v1/context/session-relations`` only;
- ``runtime_process``: a tool call → a runtime event the latest correlation pass attributed
  to it (replaced by each pass, from ``runtime_edges``).

``relation`` is the spec's ``EntryLinks`` relation, named by the destination:
``context_tool_call`` when it is a tool-call entry, ``context_tool_result`` when it is a
tool-result entry, and null otherwise. The spec has no relation for other destinations, so
rows with a null relation are recorded but not served. File links are replaced for the
file's entries on every ingest, and the run's cross-file links (``task_agent``,
``compaction_agent``, ``session_delegation``) rebuilt by ``_run_links``, so re-ingesting is
idempotent.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Iterable

    from ._materialize import EntryRow
    from ._parsed import Link

FILE_KINDS: Final = ("tool_result", "api_response_group")
RUN_KINDS: Final = ("task_agent", "compaction_agent", "session_delegation")
RUNTIME_KIND: Final = "runtime_process"
MAX_LINKS: Final = 200
RELATIONS: Final = {"tool_call": "context_tool_call", "tool_result": "context_tool_result"}
_CHUNK: Final = 500


def relation_of(kind: str | None) -> str | None:
    """The spec relation of a destination entry of ``kind`` (null: not servable)."""
    return RELATIONS.get(kind or "")


_EVIDENCE: Final = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
"""``json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))``, built once."""


def _evidence(**fields: Any) -> str:
    # orjson's sorted compact encoding of strings, nulls and lists of them is these exact
    # bytes (tests/evidence/test_entry_text.py); what it refuses (a lone surrogate) goes
    # to json, which encodes as it always did.
    try:
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except orjson.JSONEncodeError:
        return _EVIDENCE.encode(fields)


def _insert(conn: sqlite3.Connection, rows: Iterable[LinkRow]) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO links(run_id, entry_id, node_id, kind, relation, evidence) "
        "VALUES (?,?,?,?,?,?)",
        rows,
    )


LinkRow = tuple[str, str, str, str, str | None, str]
"""A links row: ``(run_id, entry_id, node_id, kind, relation, evidence)``."""


def file_link_rows(
    run_id: str, links: list[Link], rows: list[EntryRow], clean: Callable[[str], str]
) -> list[LinkRow]:
    """The rows of the parser's links between a pass's entries (pure: computed before the
    file's write turn, see ``Ingest.ready``)."""
    by_key = {(row.sequence, row.ordinal): row for row in rows}
    out: list[LinkRow] = []
    for link in links:
        one, other = by_key.get(link.source), by_key.get(link.target)
        if one is None or other is None or one.id == other.id:
            continue  # an end the policy kept no record of is not a graph node
        evidence = _evidence(
            basis=link.basis,
            value=clean(link.value),
            entries=[one.id, other.id],
            object_hashes=[one.object_hash, other.object_hash],
        )
        out.append((run_id, one.id, other.id, link.kind, relation_of(other.kind), evidence))
        if link.kind == "tool_result":
            out.append((run_id, other.id, one.id, link.kind, relation_of(one.kind), evidence))
    return out


def put_file_links(
    conn: sqlite3.Connection, run_id: str, rows: list[LinkRow], held: list[str]
) -> None:
    """Replace the file links of a pass's entries by ``rows`` (:func:`file_link_rows`).

    ``held`` are the ids of the entries whose source key the run held before this pass:
    only they can have file links already (an entry id is a function of the run and the
    source key, entries are never deleted, and file links are written between a pass's
    rows only), so only theirs are deleted first.
    """
    marks = ",".join("?" * len(FILE_KINDS))
    for start in range(0, len(held), _CHUNK):
        chunk = held[start : start + _CHUNK]
        conn.execute(
            f"DELETE FROM links WHERE run_id=? AND kind IN ({marks}) "
            f"AND entry_id IN ({','.join('?' * len(chunk))})",
            (run_id, *FILE_KINDS, *chunk),
        )
    _insert(conn, rows)


def _tuples(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are plain tuples (cheaper than the connection's ``Row``)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return cursor


def rebuild_runtime_links(conn: sqlite3.Connection, run_id: str) -> None:
    """Mirror the latest correlation pass's edges as ``runtime_process`` links."""
    conn.execute("DELETE FROM links WHERE run_id=? AND kind=?", (run_id, RUNTIME_KIND))
    _insert(
        conn,
        [
            (
                run_id,
                edge["entry_id"],
                edge["event_id"],
                RUNTIME_KIND,
                None,
                _evidence(
                    basis="runtime_correlation",
                    value=edge["tool_call_id"] or "",
                    pass_ref=edge["pass_ref"],
                    inherited=bool(edge["inherited"]),
                ),
            )
            for edge in conn.execute(
                "SELECT * FROM runtime_edges WHERE run_id=? ORDER BY rowid", (run_id,)
            ).fetchall()
        ],
    )


def entry_links(
    conn: sqlite3.Connection, run_id: str, entry_id: str
) -> tuple[list[dict[str, str]], bool]:
    """The served links of one entry (destinations that are latest entries of the run, with
    a spec relation), at most :data:`MAX_LINKS`, and whether more exist."""
    rows = conn.execute(
        "SELECT DISTINCT l.node_id, l.relation FROM links l JOIN entries e "
        "ON e.run_id = l.run_id AND e.id = l.node_id AND e.latest = 1 "
        "WHERE l.run_id=? AND l.entry_id=? AND l.relation IS NOT NULL "
        "ORDER BY l.relation, l.node_id LIMIT ?",
        (run_id, entry_id, MAX_LINKS + 1),
    ).fetchall()
    found = [{"node_id": r["node_id"], "relation": r["relation"]} for r in rows[:MAX_LINKS]]
    return found, len(rows) > MAX_LINKS
