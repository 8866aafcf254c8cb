"""The run's cross-file links: subagents, compaction agents and delegations (see ``_links``).

A subagent is its ``(session id, agent id)`` (:data:`Agent`): Claude Code writes a
subagent's sidechain with the session id of the session whose ``Task`` call started it,
and agent ids are short, so a ``Task`` call (``task_agent``) and a compaction boundary
(``compaction_agent``) are linked only to their own session's sidechains. A pass rebuilds
these links after its rows are written (:func:`rebuild_run_links`), recomputing only what it
can have changed and writing only the rows that differ.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from ._links import _CHUNK, RUN_KINDS, _evidence, _insert, _tuples, relation_of

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Iterable


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


Agent = tuple[str, str]
"""A subagent of a run: ``(session id, agent id)`` (see the module docstring). Agent ids
are 7 hex digits (a compaction agent's 6): a large import's sessions share some by chance."""


def _in_sessions(
    query: str, run_id: str, sessions: frozenset[str] | None
) -> tuple[str, tuple[str, ...]]:
    """``query`` (``... WHERE run_id=?``) narrowed to rows of ``sessions`` when given."""
    if sessions is None:
        return query, (run_id,)
    return f"{query} AND session_id IN ({','.join('?' * len(sessions))})", (run_id, *sessions)


def sidechains(
    conn: sqlite3.Connection, run_id: str, sessions: frozenset[str] | None = None
) -> dict[Agent, list[str]]:
    """Each subagent of the run (of ``sessions`` when given) → its sources, in the order
    they were stored."""
    query, params = _in_sessions(
        "SELECT id, session_id, agent_id FROM sources WHERE run_id=? AND agent_id IS NOT NULL",
        run_id,
        sessions,
    )
    out: dict[Agent, list[str]] = {}
    for source, session, agent in _tuples(conn).execute(query + " ORDER BY pk", params):
        out.setdefault((session, agent), []).append(source)
    return out


def task_actions(
    conn: sqlite3.Connection, run_id: str, sessions: frozenset[str] | None = None
) -> list[sqlite3.Row]:
    """The run's ``task_agent`` actions (of calls in ``sessions`` when given), in order."""
    query, params = _in_sessions(
        "SELECT * FROM actions WHERE run_id=? AND kind='task_agent'", run_id, sessions
    )
    return conn.execute(query + " ORDER BY pk", params).fetchall()


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
    members: list[tuple[str, str, str, str, str]]
    """``(entry id, kind, source id, session id, agent id)`` of the entries written for
    sources with an ``agent_id``."""
    calls: frozenset[str]
    """Call entries of the ``task_agent`` actions this pass inserted."""
    agents: frozenset[Agent] = frozenset()
    """Subagents the pass can have touched: of its sources (now and before the pass) and
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
    session_of: dict[str, str] = {}
    if touched is not None:
        # A compaction row's evidence names the agent's source, whose id names its session.
        session_of = _sources_of(conn, run_id, frozenset(session for session, _ in touched))
        query += (
            " AND (kind != 'compaction_agent' OR json_extract(evidence, '$.agent_source_id') "
            f"IN ({','.join('?' * len(session_of))}))"
        )
        params += tuple(session_of)
    stored = _tuples(conn).execute(query, params).fetchall()
    if touched is not None:
        stored = [
            row
            for row in stored
            if row[2] != "compaction_agent" or _owner(row, session_of) in touched
        ]
    _write_difference(conn, run_id, wanted, stored)
    if additive and changes is not None:
        _add_task_links(conn, run_id, changes)


def _sources_of(conn: sqlite3.Connection, run_id: str, sessions: frozenset[str]) -> dict[str, str]:
    """Source id → session id of the run's sources in ``sessions``."""
    marks = ",".join("?" * len(sessions))
    return dict(
        _tuples(conn).execute(
            f"SELECT id, session_id FROM sources WHERE run_id=? AND session_id IN ({marks})",
            (run_id, *sessions),
        )
    )


def _owner(row: tuple[Any, ...], session_of: dict[str, str]) -> Agent:
    """The subagent a stored ``compaction_agent`` row belongs to: its evidence names the
    agent (``value``) and the agent's source (in ``session_of``)."""
    evidence = json.loads(row[4])
    return (session_of[evidence["agent_source_id"]], evidence["value"])


def _touched(conn: sqlite3.Connection, run_id: str, changes: PassChanges) -> frozenset[Agent]:
    """The subagents whose compaction links the pass can have changed: ``changes.agents``,
    and every subagent of one of the pass's sessions (where the parent's
    ``compact_boundary`` entries are)."""
    return changes.agents | frozenset(sidechains(conn, run_id, changes.sessions))


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
    that is new or names a subagent of ``changes.agents`` (the first member of any other
    subagent is as it was).
    """
    # Only the subagents of the pass's sessions and of the ones it touched can change: a
    # call is linked to its own session's sidechains.
    sessions = changes.sessions | {session for session, _ in changes.agents}
    chains = sidechains(conn, run_id, sessions)
    added: dict[Agent, list[tuple[str, str, str]]] = {}
    for entry, kind, source, session, agent in changes.members:
        added.setdefault((session, agent), []).append((entry, kind, source))
    new: dict[Key, tuple[str | None, str]] = {}
    firsts: dict[Key, tuple[str | None, str]] = {}
    members_of: dict[Agent, list[tuple[str, str, str]]] = {}
    actions = task_actions(conn, run_id, sessions)
    touched = {
        action["entry_id"]
        for action in actions
        if (action["session_id"], action["agent_id"]) in changes.agents
        or action["entry_id"] in changes.calls
    }
    calls: list[str] = []
    for action in actions:
        subagent, call = (action["session_id"], action["agent_id"]), action["entry_id"]
        if call not in touched:
            continue
        calls.append(call)
        if not chains.get(subagent):
            continue
        members = members_of.get(subagent)
        if members is None:
            members = members_of[subagent] = _source_entries(conn, chains[subagent])
        if not members:
            continue
        first, first_kind, first_source = members[0]
        firsts.setdefault(
            (call, first, "task_agent"),
            (relation_of(first_kind), _task_evidence(action, first_source)),
        )
        fresh = members if call in changes.calls else added.get(subagent, [])
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
    compaction_agents: frozenset[Agent] | None = None,
) -> dict[Key, tuple[str | None, str]]:
    """The run's cross-file links a full rebuild leaves: ``(relation, evidence)`` by key,
    from the first row of each key in the rebuild's order (the ``compaction_agent`` rows
    only of ``compaction_agents`` when given; a compaction agent's rows share no key with
    any other row).

    The evidence of a row names the action and the member's source, not the member entry, so
    it is encoded once per source; an agent's entries are read once per rebuild however many
    actions name it.
    """
    # Without task links, only the named subagents of the given compaction agents' sessions
    # matter (a subagent is its session's).
    sessions = (
        None
        if task_agents or compaction_agents is None
        else frozenset(session for session, _ in compaction_agents)
    )
    chains = sidechains(conn, run_id, sessions)
    members_of: dict[Agent, list[tuple[str, str, str]]] = {}

    def members(agent: Agent) -> list[tuple[str, str, str]]:
        found = members_of.get(agent)
        if found is None:
            found = members_of[agent] = _source_entries(conn, chains[agent])
        return found

    out: dict[Key, tuple[str | None, str]] = {}
    add = out.setdefault  # the first row of a key wins, as with INSERT OR IGNORE
    named: set[Agent] = set()
    for action in task_actions(conn, run_id, sessions):
        agent, call = (action["session_id"], action["agent_id"]), action["entry_id"]
        named.add(agent)
        if not task_agents or not chains.get(agent):
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
    for agent, ids in chains.items():
        if agent in named or not agent[1].startswith("acompact"):
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
                    value=agent[1],
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
