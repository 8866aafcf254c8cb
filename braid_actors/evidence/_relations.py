"""Session relations (``/v1/context/session-relations``) from source-backed evidence only.

For a subject native session (harness + session id, which must occur in the run) the store
reports, across every run it holds:

- ``same_session``: the subject and the same native session recorded in another run
  (basis ``same_harness_native_session_id``; no temporal direction);
- ``parent``: ``Source.parent_session_id`` → the child (``source_parent_session_id``);
- ``delegation``: spawner → spawned session, from a native spawn result
  (``native_spawn_result``);
- ``fork``: ``session_metadata.forked_from_id`` → the fork (``native_fork_metadata``);
- ``message_request``: requester → addressed session, no delivery claim
  (``native_send_input_call``).

Parent issues: ``self_parent`` (a source names its own session), ``conflicting_parents``
(sources of one session name different parents), ``parent_cycle`` (following parents comes
back to where it started). Prior-context actions never reach the action table, and prose is
never read. Discovery reads at most 1024 same-harness sources and 2048 typed action records;
actions whose body was over 64 KiB were not read at ingest. Each ceiling reached sets
``limited`` and its issue. Claude Code subagents share their parent's native session id, so
they are not separate sessions here (see ``EvidenceStore.agent_links``).

Pages are offsets into the sorted relation list, under a cursor bound to a digest of that
list: when the evidence changes the cursor is refused (``invalid_argument``) and the client
restarts.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from braid_actors.errors import EvidenceContentNotFound
from braid_actors.model import digest

from ._materialize import SCHEMA
from ._paging import check_limit, check_run, invalid

if TYPE_CHECKING:
    import sqlite3

    from ._paging import CursorCodec

SOURCE_LIMIT: Final = 1024
ACTION_LIMIT: Final = 2048
MAX_CHAIN: Final = 256


def session_relations(
    conn: sqlite3.Connection,
    codec: CursorCodec,
    run_id: str,
    harness: str,
    session: str,
    cursor: str | None,
    limit: int,
) -> dict[str, Any]:
    """One ``SessionRelationsPage``."""
    run_id = check_run(conn, run_id)
    limit = check_limit(limit)
    if not isinstance(harness, str) or not 1 <= len(harness) <= 128:
        raise invalid("harness must be a string of 1 to 128 characters", "harness")
    if not isinstance(session, str) or not 1 <= len(session) <= 512:
        raise invalid("session must be a string of 1 to 512 characters", "session")
    if (
        conn.execute(
            "SELECT 1 FROM sources WHERE run_id=? AND harness=? AND session_id=?",
            (run_id, harness, session),
        ).fetchone()
        is None
    ):
        raise EvidenceContentNotFound("the session does not occur in this run")
    finder = _Finder(conn, run_id, harness)
    relations = finder.relations(session)
    relations.sort(key=lambda r: r["id"])
    snapshot = [[r["id"], r.get("issues", [])] for r in relations]
    fingerprint = digest([harness, session, snapshot, sorted(finder.issues)])
    start = 0
    if cursor is not None:
        position = codec.decode(cursor, "session_relations", run_id, fingerprint)
        if len(position) != 1 or not isinstance(position[0], int) or position[0] < 0:
            raise invalid("the cursor is not valid", "cursor", "malformed")
        start = position[0]
    chunk = relations[start : start + limit]
    has_more = start + limit < len(relations)
    page: dict[str, Any] = {
        "schema_version": SCHEMA,
        "subject": finder.ref(session),
        "relations": chunk,
        "has_more": has_more,
        "limit": limit,
        "limited": bool(finder.issues),
        "issues": sorted(finder.issues),
    }
    if has_more:
        page["next_cursor"] = codec.encode(
            "session_relations", run_id, fingerprint, [start + limit]
        )
    return page


class _Finder:
    def __init__(self, conn: sqlite3.Connection, run_id: str, harness: str) -> None:
        self.conn = conn
        self.run_id = run_id
        self.harness = harness
        self.issues: set[str] = set()
        rows = conn.execute(
            "SELECT * FROM sources WHERE harness=? ORDER BY pk DESC LIMIT ?",
            (harness, SOURCE_LIMIT + 1),
        ).fetchall()
        if len(rows) > SOURCE_LIMIT:
            self.issues.add("session_source_discovery_limit")
        self.sources = rows[:SOURCE_LIMIT]
        actions = conn.execute(
            "SELECT * FROM actions WHERE harness=? ORDER BY pk DESC LIMIT ?",
            (harness, ACTION_LIMIT + 1),
        ).fetchall()
        if len(actions) > ACTION_LIMIT:
            self.issues.add("session_action_discovery_limit")
        self.actions = actions[:ACTION_LIMIT]
        if any(a["body_limited"] for a in self.actions):
            self.issues.add("session_relation_body_limit")
        self.runs: dict[str, set[str]] = {}
        self.parents: dict[str, set[str]] = {}
        for row in self.sources:
            self.runs.setdefault(row["session_id"], set()).add(row["run_id"])
            if row["parent_session_id"]:
                self.parents.setdefault(row["session_id"], set()).add(row["parent_session_id"])

    # ---- refs and evidence -----------------------------------------------------------

    def ref(self, session: str) -> dict[str, Any]:
        runs = sorted(self.runs.get(session, set()))
        body: dict[str, Any] = {
            "harness": self.harness,
            "session_id": session,
            "available": bool(runs),
        }
        if self.run_id in runs:
            body["run_id"] = self.run_id
        elif len(runs) == 1:
            body["run_id"] = runs[0]
        if len(runs) > 1:
            body["run_ids"] = runs
        return body

    def _source_evidence(self, source: sqlite3.Row, basis: str) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT id, object_hash, body FROM entries WHERE run_id=? AND source_pk=? "
            "AND latest=1 ORDER BY (kind = 'configuration') DESC, sequence, ordinal LIMIT 1",
            (source["run_id"], source["pk"]),
        ).fetchone()
        if row is not None:
            return _evidence(source["run_id"], source["id"], row, basis)
        # No entry was kept (e.g. only retained history under basic): the coverage report
        # that recorded the source is the evidence.
        report = self.conn.execute(
            "SELECT body FROM coverage WHERE source_id=? ORDER BY pk DESC LIMIT 1", (source["id"],)
        ).fetchone()
        if report is None:
            return None
        return {
            "run_id": source["run_id"],
            "source_id": source["id"],
            "object_hash": json.loads(report["body"])["object_hash"],
            "basis": basis,
        }

    # ---- relations -------------------------------------------------------------------

    def relations(self, session: str) -> list[dict[str, Any]]:
        found: dict[tuple[str, str, str], dict[str, Any]] = {}

        def add(
            kind: str, src: str, dst: str, evidence: dict[str, Any] | None, issues: set[str]
        ) -> None:
            if evidence is None:
                return
            key = (kind, src, dst)
            relation = found.setdefault(
                key, {"kind": kind, "from": self.ref(src), "to": self.ref(dst), "evidence": []}
            )
            if evidence not in relation["evidence"]:
                relation["evidence"].append(evidence)
            if issues:
                relation["issues"] = sorted(set(relation.get("issues", [])) | issues)

        mine = [s for s in self.sources if s["session_id"] == session]
        here = [s for s in mine if s["run_id"] == self.run_id]
        for other in mine:
            if other["run_id"] != self.run_id and here:
                a = self._source_evidence(here[0], "same_harness_native_session_id")
                b = self._source_evidence(other, "same_harness_native_session_id")
                if a is not None and b is not None:
                    key = ("same_session", session, f"{session}@{other['run_id']}")
                    relation = found.setdefault(
                        key,
                        {
                            "kind": "same_session",
                            "from": self.ref(session),
                            "to": {**self.ref(session), "run_id": other["run_id"]},
                            "evidence": [a],
                        },
                    )
                    if b not in relation["evidence"]:
                        relation["evidence"].append(b)
        for source in self.sources:
            parent = source["parent_session_id"]
            child = source["session_id"]
            if not parent or session not in (parent, child):
                continue
            add(
                "parent",
                parent,
                child,
                self._source_evidence(source, "source_parent_session_id"),
                self._parent_issues(child),
            )
        for action in self.actions:
            kind = {"spawn": "delegation", "send_input": "message_request"}.get(action["kind"])
            target = action["target"]
            if kind is None or not target or session not in (action["session_id"], target):
                continue
            basis = "native_spawn_result" if kind == "delegation" else "native_send_input_call"
            add(kind, action["session_id"], target, _action_evidence(action, basis), set())
        for row in self._forks(session):
            add(
                "fork",
                row["fork"],
                row["session_id"],
                _evidence(row["run_id"], row["source_id"], row, "native_fork_metadata"),
                set(),
            )
        result = []
        for (kind, src, dst), relation in found.items():
            ids = sorted(e.get("entry_id", "") + e["object_hash"] for e in relation["evidence"])
            relation["id"] = "rel_" + digest([kind, src, dst, ids])[7:31]
            result.append(relation)
        return result

    def _parent_issues(self, child: str) -> set[str]:
        issues: set[str] = set()
        parents = self.parents.get(child, set())
        if child in parents:
            issues.add("self_parent")
        if len(parents) > 1:
            issues.add("conflicting_parents")
        for start in parents - {child}:
            seen = {child}
            current = start
            for _ in range(MAX_CHAIN):
                if current in seen:
                    issues.add("parent_cycle")
                    break
                seen.add(current)
                nxt = sorted(self.parents.get(current, set()))
                if not nxt:
                    break
                current = nxt[0]
        return issues

    def _forks(self, session: str) -> list[sqlite3.Row]:
        return self.conn.execute(
            "SELECT e.id, e.object_hash, e.body, e.run_id, s.id AS source_id, s.session_id, "
            "json_extract(e.body, '$.session_metadata.forked_from_id') AS fork "
            "FROM entries e JOIN sources s ON s.pk = e.source_pk "
            "WHERE s.harness=? AND e.kind='configuration' AND e.latest=1 "
            "AND json_extract(e.body, '$.session_metadata.forked_from_id') IS NOT NULL "
            "AND (s.session_id=? OR json_extract(e.body, '$.session_metadata.forked_from_id')=?) "
            "LIMIT ?",
            (self.harness, session, session, ACTION_LIMIT),
        ).fetchall()


def _evidence(run_id: str, source_id: str, row: sqlite3.Row, basis: str) -> dict[str, Any]:
    body = json.loads(row["body"])
    evidence: dict[str, Any] = {
        "run_id": run_id,
        "source_id": source_id,
        "object_hash": row["object_hash"],
        "entry_id": row["id"],
        "basis": basis,
    }
    if body.get("recorded_at"):
        evidence["recorded_at"] = body["recorded_at"]
    return evidence


def _action_evidence(action: sqlite3.Row, basis: str) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "run_id": action["run_id"],
        "source_id": action["source_id"],
        "object_hash": action["object_hash"],
        "entry_id": action["entry_id"],
        "basis": basis,
    }
    if action["recorded_at"]:
        evidence["recorded_at"] = action["recorded_at"]
    return evidence
