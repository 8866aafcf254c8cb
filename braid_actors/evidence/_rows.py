"""Rows every ingest path writes: runs, sources, coverage reports; and the report records.

:class:`Rows` holds the connection, redactor and clock of one pass; the parsed path
(:mod:`._ingest`) and the unparsed one (:mod:`._unparsed`) both write through it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import attrs

from braid_actors.errors import EvidenceInvalidArgument

from ._policy import CapturePolicy, make_policy
from ._redact import Redactor
from ._schema import ENTRY_IDS


@attrs.frozen
class SourceReport:
    """One source of an ingested file: its coverage and derived summary counts."""

    coverage: dict[str, Any]
    """The spec's ``Coverage`` object for this pass."""
    summary: dict[str, int]
    """Derived counts (messages, tool calls, unmatched calls, sidechain records, compactions,
    de-duplicated usage ``usage_*`` …); not part of the spec's schemas."""


@attrs.frozen
class IngestReport:
    """What one ``ingest`` call did."""

    run_id: str
    path: str
    harness: str
    sources: tuple[SourceReport, ...]

    @property
    def coverage(self) -> tuple[dict[str, Any], ...]:
        return tuple(source.coverage for source in self.sources)


@attrs.define(eq=False)
class Rows:
    """The database side of one ingest pass."""

    conn: sqlite3.Connection
    redactor: Redactor
    now: str

    def put_source(self, run_id: str, path_key: str, source: dict[str, Any]) -> int:
        body = json.dumps(source, ensure_ascii=False, sort_keys=True)
        self.conn.execute(
            "INSERT INTO sources(id, run_id, harness, session_id, agent_id, parent_session_id, "
            "path_key, body, updated_at) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE "
            "SET body=excluded.body, agent_id=excluded.agent_id, "
            "parent_session_id=excluded.parent_session_id, updated_at=excluded.updated_at",
            (
                source["id"],
                run_id,
                source["harness"],
                source["session_id"],
                source.get("agent_id"),
                source.get("parent_session_id"),
                path_key,
                body,
                self.now,
            ),
        )
        row = self.conn.execute("SELECT pk FROM sources WHERE id=?", (source["id"],)).fetchone()
        return int(row["pk"])

    def last_success(self, run_id: str, source_key: str) -> str | None:
        row = self.conn.execute(
            "SELECT body FROM coverage WHERE run_id=? AND source_id=? ORDER BY pk DESC LIMIT 1",
            (run_id, source_key),
        ).fetchone()
        if row is None:
            return None
        value = json.loads(row["body"]).get("last_success_at")
        return value if isinstance(value, str) else None

    def put_coverage(self, run_id: str, report: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO coverage(id, run_id, source_id, status, observed_at, body) "
            "VALUES (?,?,?,?,?,?)",
            (
                report["id"],
                run_id,
                report["source"]["id"],
                report["status"],
                report["observed_at"],
                json.dumps(report, ensure_ascii=False, sort_keys=True),
            ),
        )


def run_policy(
    conn: sqlite3.Connection, run_id: str, wanted: CapturePolicy | None
) -> CapturePolicy:
    """The capture policy an ingest into ``run_id`` uses: the one the run recorded, else
    ``wanted``, else ``basic``; ``wanted`` differing from the recorded one is refused."""
    row = conn.execute("SELECT policy FROM runs WHERE run_id=?", (run_id,)).fetchone()
    if row is None or row["policy"] is None:
        return wanted or make_policy("basic")
    recorded = CapturePolicy.from_wire(json.loads(row["policy"]))
    if wanted is not None and wanted != recorded:
        raise EvidenceInvalidArgument(
            "the run's capture policy is fixed by its first ingest",
            details={"field": "policy", "recorded": recorded.preset},
        )
    return recorded


def ensure_run(conn: sqlite3.Connection, run_id: str, policy: CapturePolicy, now: str) -> None:
    body = json.dumps(policy.to_wire(), sort_keys=True)
    conn.execute(
        "INSERT OR IGNORE INTO runs(run_id, created_at, policy, entry_ids) VALUES (?,?,?,?)",
        (run_id, now, body, ENTRY_IDS),
    )
    conn.execute("UPDATE runs SET policy=? WHERE run_id=? AND policy IS NULL", (body, run_id))


class transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on any exception)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("ROLLBACK")
