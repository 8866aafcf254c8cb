"""Recorded graph links between entries (``/v1/context/links``), written at ingest.

A link row goes from one entry of a run to a graph node of the same run (another entry, or
a runtime event) and names the evidence it rests on; nothing is inferred from prose, paths
or timing. The kinds:

- ``tool_result``: a tool result and its call, both ways, matched by the parser on the
  shared id (Claude ``tool_use_id``, Codex ``call_id``) within one file;
- ``api_response_group``: two blocks of one Claude API response (the same ``message.id``);
- ``task_agent``: every entry of a Claude subagent's sidechain file → the ``Task`` call whose
  result or ``agent_progress`` names the agent (``agentId``), and the call → the sidechain's
  first entry;
- ``compaction_agent``: a compaction agent's entries → the parent's ``compact_boundary``
  that follows them, and the boundary → the agent's first entry (the same rule as
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
file's entries on every ingest and run links rebuilt, so re-ingesting is idempotent.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import attrs
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


def _task_evidence(action: sqlite3.Row, agent_source: str) -> str:
    """The evidence of a Task call's link to a member of the agent its action names."""
    return _evidence(
        basis="agentId",
        value=action["agent_id"],
        tool_call_id=action["tool_call_id"],
        action_entry_id=action["entry_id"],
        action_object_hash=action["object_hash"],
        parent_source_id=action["source_id"],
        agent_source_id=agent_source,
    )


def _sidechains(conn: sqlite3.Connection, run_id: str) -> dict[str, list[str]]:
    """agent id → the run's sources of that agent, in the order they were stored."""
    sidechains: dict[str, list[str]] = {}
    for source, agent in _tuples(conn).execute(
        "SELECT id, agent_id FROM sources WHERE run_id=? AND agent_id IS NOT NULL ORDER BY pk",
        (run_id,),
    ):
        sidechains.setdefault(agent, []).append(source)
    return sidechains


def _insert(
    conn: sqlite3.Connection, rows: Iterable[tuple[str, str, str, str, str | None, str]]
) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO links(run_id, entry_id, node_id, kind, relation, evidence) "
        "VALUES (?,?,?,?,?,?)",
        rows,
    )


def put_file_links(
    conn: sqlite3.Connection,
    run_id: str,
    links: list[Link],
    rows: list[EntryRow],
    held: list[str],
    clean: Callable[[str], str],
) -> None:
    """Replace the file links of these entries by the parser's links between stored rows.

    ``held`` are the ids of the rows whose source key the run held before this pass: only
    they can have file links already (an entry id is the digest of the run and the source
    key, entries are never deleted, and file links are written between a pass's rows only),
    so only theirs are deleted first.
    """
    by_key = {(row.sequence, row.ordinal): row for row in rows}
    ids = held
    marks = ",".join("?" * len(FILE_KINDS))
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        conn.execute(
            f"DELETE FROM links WHERE run_id=? AND kind IN ({marks}) "
            f"AND entry_id IN ({','.join('?' * len(chunk))})",
            (run_id, *FILE_KINDS, *chunk),
        )
    out: list[tuple[str, str, str, str, str | None, str]] = []
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
    _insert(conn, out)


def _tuples(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are plain tuples (cheaper than the connection's ``Row``)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return cursor


def _source_entries(conn: sqlite3.Connection, source_ids: list[str]) -> list[tuple[str, str, str]]:
    """``(id, kind, source id)`` of the sources' latest entries, in page order."""
    marks = ",".join("?" * len(source_ids))
    return (
        _tuples(conn)
        .execute(
            "SELECT e.id, e.kind, s.id AS source_id FROM entries e JOIN sources s "
            f"ON s.pk = e.source_pk AND e.run_id = s.run_id WHERE s.id IN ({marks}) "
            "AND e.latest=1 "
            "ORDER BY e.source_pk, e.sequence, e.ordinal",
            source_ids,
        )
        .fetchall()
    )


def _kind_of(conn: sqlite3.Connection, run_id: str, entry_id: str) -> str | None:
    row = conn.execute(
        "SELECT kind FROM entries WHERE run_id=? AND id=? AND latest=1", (run_id, entry_id)
    ).fetchone()
    return None if row is None else str(row["kind"])


Key = tuple[str, str, str]
"""A link's ``(entry_id, node_id, kind)`` (its primary key within a run)."""


@attrs.frozen
class PassChanges:
    """What an ingest pass wrote that the run's ``task_agent`` links rest on."""

    additive: bool
    """No entry was superseded by a new revision and no existing source changed its
    ``agent_id``: the pass only added sources, entries and actions."""
    members: list[tuple[str, str, str, str]]
    """``(entry id, kind, source id, agent id)`` of the entries written for sources with
    an ``agent_id``."""
    calls: frozenset[str]
    """Call entries of the ``task_agent`` actions this pass inserted."""
    agents: frozenset[str] = frozenset()
    """Agent ids the pass can have touched: of its sources (now and before the pass) and
    named by its ``task_agent`` actions."""
    sessions: frozenset[str] = frozenset()
    """Session ids of the pass's sources."""


def rebuild_run_links(
    conn: sqlite3.Connection, run_id: str, changes: PassChanges | None = None
) -> None:
    """Rebuild the run's cross-file links (subagents, compaction agents, delegations).

    The result is what deleting them all and inserting the rebuild's rows in order with
    ``INSERT OR IGNORE`` gives (:func:`run_links`), but only the rows that differ are
    written: most passes change a few links of a run that holds thousands, and rewriting
    them all cost as much in commits as computing them. With ``changes`` of an additive
    pass, the ``task_agent`` links are not recomputed but extended (:func:`_add_task_links`).

    With ``changes``, only the compaction agents the pass can have touched are recomputed
    (:func:`_touched`); the stored rows of the others are kept as they are, which is what
    recomputing them gives: they rest on the agent's sources and entries, on whether an
    action names the agent, and on the entries of the agent's session, none of which the
    pass changed. (Each recompute reads the agent's entries and its session's, so a run of
    many subagent files cost quadratic time.)
    """
    additive = changes is not None and changes.additive and not _nested_task_calls(conn, run_id)
    kinds = tuple(k for k in RUN_KINDS if not (additive and k == "task_agent"))
    touched = None if changes is None else _touched(conn, run_id, changes)
    wanted = run_links(conn, run_id, task_agents=not additive, compaction_agents=touched)
    query = (
        "SELECT entry_id, node_id, kind, relation, evidence FROM links "
        f"WHERE run_id=? AND kind IN ({','.join('?' * len(kinds))})"
    )
    params: tuple[str, ...] = (run_id, *kinds)
    if touched is not None:  # (the evidence's value is the agent id)
        query += (
            " AND (kind != 'compaction_agent' OR json_extract(evidence, '$.value') "
            f"IN ({','.join('?' * len(touched))}))"
        )
        params += tuple(touched)
    _write_difference(conn, run_id, wanted, _tuples(conn).execute(query, params))
    if additive and changes is not None:
        _add_task_links(conn, run_id, changes)


def _touched(conn: sqlite3.Connection, run_id: str, changes: PassChanges) -> frozenset[str]:
    """The agents whose compaction links the pass can have changed: ``changes.agents``, and
    every agent with a source in one of the pass's sessions (where the parent's
    ``compact_boundary`` entries are)."""
    touched = set(changes.agents)
    sessions = list(changes.sessions)
    if sessions:
        marks = ",".join("?" * len(sessions))
        touched.update(
            agent
            for (agent,) in _tuples(conn).execute(
                f"SELECT agent_id FROM sources WHERE run_id=? AND session_id IN ({marks}) "
                "AND agent_id IS NOT NULL",
                (run_id, *sessions),
            )
        )
    return frozenset(touched)


def _write_difference(
    conn: sqlite3.Connection,
    run_id: str,
    wanted: dict[Key, tuple[str | None, str]],
    stored: Iterable[tuple[Any, ...]],
) -> None:
    """Make the ``stored`` rows (entry, node, kind, relation, evidence) the ``wanted`` ones."""
    stale: list[tuple[str, str, str, str]] = []
    for row in stored:
        key = row[:3]
        if wanted.get(key) == row[3:]:
            del wanted[key]  # already stored as it should be
        else:
            stale.append((run_id, *key))
    conn.executemany(
        "DELETE FROM links WHERE run_id=? AND entry_id=? AND node_id=? AND kind=?", stale
    )
    _insert(conn, [(run_id, *key, *value) for key, value in wanted.items()])


def _nested_task_calls(conn: sqlite3.Connection, run_id: str) -> bool:
    """Whether a ``task_agent`` call is itself in a subagent's sidechain (then a call can
    also be a member of another agent, and the rows of two actions can share a key)."""
    found = conn.execute(
        "SELECT 1 FROM actions a JOIN sources s ON s.id = a.source_id WHERE a.run_id=? "
        "AND a.kind='task_agent' AND s.agent_id IS NOT NULL LIMIT 1",
        (run_id,),
    ).fetchone()
    return found is not None


def _add_task_links(conn: sqlite3.Connection, run_id: str, changes: PassChanges) -> None:
    """The ``task_agent`` rows of an additive pass, without recomputing the others.

    A member row ``(member, call)`` depends on the action, the member's source and the
    call's kind; an additive pass changes none of those for the rows it did not write
    entries or actions for (no revision: no kind changes; no agent change: no member
    leaves). Its new rows are every action × the agent's new entries, and every new
    action × all of the agent's entries; each key holds a new entry or a new action's
    call, so none is stored yet. The call → first-member rows (one per action, and the
    first member can change) are recomputed and compared for the calls of every action
    that is new or names an agent of ``changes.agents`` (the first member of any other
    agent is as it was).
    """
    sidechains = _sidechains(conn, run_id)
    added: dict[str, list[tuple[str, str, str]]] = {}
    for entry, kind, source, agent in changes.members:
        added.setdefault(agent, []).append((entry, kind, source))
    new: dict[Key, tuple[str | None, str]] = {}
    firsts: dict[Key, tuple[str | None, str]] = {}
    members_of: dict[str, list[tuple[str, str, str]]] = {}
    actions = conn.execute(
        "SELECT * FROM actions WHERE run_id=? AND kind='task_agent' ORDER BY pk", (run_id,)
    ).fetchall()
    touched = {
        action["entry_id"]
        for action in actions
        if action["agent_id"] in changes.agents or action["entry_id"] in changes.calls
    }
    calls: list[str] = []
    for action in actions:
        agent, call = action["agent_id"], action["entry_id"]
        if call not in touched:
            continue
        calls.append(call)
        if not sidechains.get(agent):
            continue
        members = members_of.get(agent)
        if members is None:
            members = members_of[agent] = _source_entries(conn, sidechains[agent])
        if not members:
            continue
        first, first_kind, first_source = members[0]
        firsts.setdefault(
            (call, first, "task_agent"),
            (relation_of(first_kind), _task_evidence(action, first_source)),
        )
        fresh = members if call in changes.calls else added.get(agent, [])
        if fresh:
            call_relation = relation_of(_kind_of(conn, run_id, call))
            evidence_of: dict[str, str] = {}
            for member, _kind, source in fresh:
                text = evidence_of.get(source)
                if text is None:
                    text = evidence_of[source] = _task_evidence(action, source)
                new.setdefault((member, call, "task_agent"), (call_relation, text))
    _insert(conn, [(run_id, *key, *value) for key, value in new.items()])
    stored: list[tuple[Any, ...]] = []
    cursor = _tuples(conn)
    for start in range(0, len(calls), _CHUNK):
        chunk = calls[start : start + _CHUNK]
        stored += cursor.execute(
            "SELECT entry_id, node_id, kind, relation, evidence FROM links WHERE run_id=? "
            f"AND kind='task_agent' AND entry_id IN ({','.join('?' * len(chunk))})",
            (run_id, *chunk),
        ).fetchall()
    _write_difference(conn, run_id, firsts, stored)


def run_links(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    task_agents: bool = True,
    compaction_agents: frozenset[str] | None = None,
) -> dict[Key, tuple[str | None, str]]:
    """The run's cross-file links a full rebuild leaves: ``(relation, evidence)`` by key,
    from the first row of each key in the rebuild's order (the ``compaction_agent`` rows
    only of ``compaction_agents`` when given; a compaction agent's rows share no key with
    any other row).

    The evidence of a row names the action and the member's source, not the member entry, so
    it is encoded once per source; an agent's entries are read once per rebuild however many
    actions name it.
    """
    sidechains = _sidechains(conn, run_id)
    members_of: dict[str, list[tuple[str, str, str]]] = {}

    def members(agent: str) -> list[tuple[str, str, str]]:
        found = members_of.get(agent)
        if found is None:
            found = members_of[agent] = _source_entries(conn, sidechains[agent])
        return found

    out: dict[Key, tuple[str | None, str]] = {}
    add = out.setdefault  # the first row of a key wins, as with INSERT OR IGNORE
    named: set[str] = set()
    for action in conn.execute(
        "SELECT * FROM actions WHERE run_id=? AND kind='task_agent' ORDER BY pk", (run_id,)
    ).fetchall():
        agent, call = action["agent_id"], action["entry_id"]
        named.add(agent)
        if not task_agents or not sidechains.get(agent):
            continue  # (without task_agents: only which agents are named)
        call_relation = relation_of(_kind_of(conn, run_id, call))
        evidence_of: dict[str, str] = {}
        found = members(agent)
        for index, (member, kind, source) in enumerate(found):
            evidence = evidence_of.get(source)
            if evidence is None:
                evidence = evidence_of[source] = _task_evidence(action, source)
            add((member, call, "task_agent"), (call_relation, evidence))
            if index == 0:
                add((call, member, "task_agent"), (relation_of(kind), evidence))
    for agent, ids in sidechains.items():
        if agent in named or not agent.startswith("acompact"):
            continue
        if compaction_agents is not None and agent not in compaction_agents:
            continue
        boundary = compaction_boundary(conn, run_id, ids)
        if boundary is None:
            continue
        evidence_of = {}
        found = members(agent)
        for index, (member, _kind, source) in enumerate(found):
            evidence = evidence_of.get(source)
            if evidence is None:
                evidence = evidence_of[source] = _evidence(
                    basis="compact_boundary_after_agent",
                    value=agent,
                    boundary_entry_id=boundary["id"],
                    parent_source_id=boundary["source_id"],
                    agent_source_id=source,
                )
            add((member, boundary["id"], "compaction_agent"), (None, evidence))
            if index == 0:
                add((boundary["id"], member, "compaction_agent"), (None, evidence))
    _delegation_links(conn, run_id, add)
    return out


def _delegation_links(
    conn: sqlite3.Connection,
    run_id: str,
    add: Callable[[Key, tuple[str | None, str]], object],
) -> None:
    """``session_delegation`` rows: spawned sessions' entries ↔ the spawning tool call."""
    members_of: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for action in conn.execute(
        "SELECT * FROM actions WHERE run_id=? AND kind='spawn' AND target IS NOT NULL "
        "AND tool_call_id IS NOT NULL AND target != session_id ORDER BY pk",
        (run_id,),
    ).fetchall():
        call = conn.execute(
            "SELECT e.id FROM entries e JOIN sources s ON s.pk = e.source_pk WHERE e.run_id=? "
            "AND s.id=? AND e.latest=1 AND e.kind='tool_call' AND e.tool_call_id=? "
            "ORDER BY e.sequence, e.ordinal LIMIT 1",
            (run_id, action["source_id"], action["tool_call_id"]),
        ).fetchone()
        if call is None:
            continue  # the call itself was not kept (e.g. history under basic)
        target = (action["harness"], action["target"])
        members = members_of.get(target)
        if members is None:
            children = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM sources WHERE run_id=? AND harness=? AND session_id=? "
                    "ORDER BY pk",
                    (run_id, *target),
                )
            ]
            members = members_of[target] = _source_entries(conn, children) if children else []
        evidence_of: dict[str, str] = {}
        for index, (member, kind, source) in enumerate(members):
            evidence = evidence_of.get(source)
            if evidence is None:
                evidence = evidence_of[source] = _evidence(
                    basis="native_spawn_result",
                    value=action["target"],
                    tool_call_id=action["tool_call_id"],
                    action_entry_id=action["entry_id"],
                    action_object_hash=action["object_hash"],
                    parent_source_id=action["source_id"],
                    child_source_id=source,
                )
            add((member, call["id"], "session_delegation"), ("context_tool_call", evidence))
            if index == 0:
                add((call["id"], member, "session_delegation"), (relation_of(kind), evidence))


def compaction_boundary(
    conn: sqlite3.Connection, run_id: str, source_ids: list[str]
) -> sqlite3.Row | None:
    """The parent's ``compact_boundary`` a compaction agent's transcript ends before."""
    marks = ",".join("?" * len(source_ids))
    last = conn.execute(
        "SELECT MAX(json_extract(e.body, '$.recorded_at')) AS at, MIN(s.session_id) AS sid "
        "FROM entries e JOIN sources s ON s.pk = e.source_pk AND e.run_id = s.run_id "
        f"WHERE s.id IN ({marks})",
        source_ids,
    ).fetchone()
    if last is None or last["sid"] is None:
        return None
    row: sqlite3.Row | None = conn.execute(
        "SELECT e.id, s.id AS source_id, s.session_id FROM entries e "
        "JOIN sources s ON s.pk = e.source_pk WHERE e.run_id=? AND s.session_id=? "
        "AND s.agent_id IS NULL AND e.kind='session' "
        "AND json_extract(e.body, '$.status')='compact_boundary' "
        "AND json_extract(e.body, '$.recorded_at') >= COALESCE(?, '') "
        "ORDER BY json_extract(e.body, '$.recorded_at') LIMIT 1",
        (run_id, last["sid"], last["at"]),
    ).fetchone()
    return row


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
