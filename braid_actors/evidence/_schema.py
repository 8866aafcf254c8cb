"""The evidence database: ``$BRAID_HOME/evidence.sqlite3`` (WAL, mode 0600).

Tables (bodies are redacted JSON; no column ever holds an unredacted source string)::

    meta(name PRIMARY KEY, value)            schema_version, cursor_key (hex, 32 random bytes)
    runs(run_id PRIMARY KEY, created_at, policy, runtime_capture, runtime_started_at,
         runtime_ended_at, entry_ids)        policy = CapturePolicy wire JSON, set by the
                                             first ingest and immutable; runtime_capture =
                                             null (never recorded), enabled or disabled;
                                             entry_ids = ENTRY_IDS, or null for a run
                                             recorded before schema 3 (its own ids)
    sources(pk, id UNIQUE, run_id, harness, session_id, agent_id, parent_session_id,
            path_key, body, updated_at)      body = Source wire JSON
    files(run_id, path_key, boundary, boundary_hash, cursor, cursor_hash, updated_at)
                                             the resume cursor of each file per run
    coverage(pk, id UNIQUE, run_id, source_id, status, observed_at, body)
                                             every report; the latest per source is current
    entries(pk, id, run_id, source_pk, source_key, sequence, ordinal, revision, latest,
            kind, tool_call_id, scope, content_ref, raw_ref, intent_ref, object_hash, body)
                                             body = Entry wire JSON without ``source``;
                                             indexes: see ``_ENTRY_INDEXES`` (schema 2)
    objects(ref PRIMARY KEY, bytes, media_type, redacted)
    object_data(ref UNIQUE, data)            the bodies (see ``_objects``; older stores
                                             kept them as files under ``objects/``)
    actions(pk, run_id, source_id, entry_id, object_hash, kind, harness, session_id,
            target, agent_id, tool_call_id, recorded_at, body_limited)
                                             typed spawn / send_input / task_agent facts
    runtime_events(pk, event_id UNIQUE, run_id, source, type, pid, ppid, argv, started_at,
                   observed_run, session_id, harness, tool_call_id, created_at)
                                             argv = redacted JSON list; observed_run = the
                                             run the process said it belonged to
    runtime_edges(run_id, event_id, entry_id, tool_call_id, inherited, pass_ref)
    runtime_reports(pk, run_id, observed_at, ref, body)
    links(run_id, entry_id, node_id, kind, relation, evidence)
                                             recorded graph links (see ``_links``): from an
                                             entry to an entry or runtime event; relation =
                                             the spec's EntryLinks relation, or null when
                                             the destination is neither a tool call nor a
                                             tool result; evidence = JSON naming the source
                                             fields and records the link rests on

Every ingest writes its rows and the objects they cite in one transaction.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from typing import TYPE_CHECKING, Final

from braid_actors.errors import EvidenceStoreUnavailable

if TYPE_CHECKING:
    from pathlib import Path

DB_FILE: Final = "evidence.sqlite3"
SCHEMA_VERSION: Final = "3"
"""Schema 3 (``runs.entry_ids``); schema 2 (entries indexes, see ``_ENTRY_INDEXES``) and 1
stores are migrated when opened, any other version is refused (``store_unavailable``)."""
ENTRY_IDS: Final = "source"
"""``runs.entry_ids`` of a run created since schema 3: its entry ids begin with their
source's prefix (``_materialize.source_entry_id``). A run recorded before keeps the digest
ids it has (``_materialize.entry_id``), so a new revision keeps its entry's id."""
CACHE_KIB: Final = 65_536
"""Page cache of each connection, in KiB (SQLite's default is 2,000). An ingest touches
index leaves all over the entries, objects and links indexes; with the default cache most
of them were evicted and read back (121,000 reads for 75 MB of Claude Code files, 36,000
with this cache) and dirty pages spilled into the WAL before the commit wrote them again.
The cache fills only with pages actually read."""
PAGE_SIZE: Final = 16_384
"""Bytes per database page of a new store (SQLite's default is 4,096; an existing store
keeps the page size it was created with). The rows are large (an entry's stored text is
~1.2 KB, a link's ~450 bytes): with 16 KiB pages an ingest dirties and writes fewer pages
and splits fewer. ``tools/bench evidence``, 102.8 MB, two runs each way: all files 30.1-30.7
MB/s against 28.1; in one process, the Claude Code subset's writes took 0.73-0.82 s of CPU
against 0.87-0.90; entry pages p99 1.23-1.30 ms against 1.32-1.55."""

_ENTRIES_TABLE: Final = """CREATE TABLE entries(
    pk INTEGER PRIMARY KEY, id TEXT NOT NULL, run_id TEXT NOT NULL,
    source_pk INTEGER NOT NULL, source_key TEXT NOT NULL, sequence INTEGER NOT NULL,
    ordinal INTEGER NOT NULL, revision INTEGER NOT NULL, latest INTEGER NOT NULL,
    kind TEXT NOT NULL, tool_call_id TEXT, scope TEXT, content_ref TEXT, raw_ref TEXT,
    intent_ref TEXT, object_hash TEXT NOT NULL, body TEXT NOT NULL);
"""
_ENTRY_COLUMNS: Final = (
    "pk",
    "id",
    "run_id",
    "source_pk",
    "source_key",
    "sequence",
    "ordinal",
    "revision",
    "latest",
    "kind",
    "tool_call_id",
    "scope",
    "content_ref",
    "raw_ref",
    "intent_ref",
    "object_hash",
    "body",
)

_DDL: Final = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs(
    run_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, policy TEXT,
    runtime_capture TEXT, runtime_started_at TEXT, runtime_ended_at TEXT, entry_ids TEXT);
CREATE TABLE IF NOT EXISTS sources(
    pk INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL,
    harness TEXT NOT NULL, session_id TEXT NOT NULL, agent_id TEXT, parent_session_id TEXT,
    path_key TEXT NOT NULL, body TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sources_run ON sources(run_id, pk);
CREATE INDEX IF NOT EXISTS sources_session ON sources(harness, session_id);
CREATE INDEX IF NOT EXISTS sources_session_any ON sources(session_id, agent_id);
CREATE TABLE IF NOT EXISTS files(
    run_id TEXT NOT NULL, path_key TEXT NOT NULL, boundary INTEGER NOT NULL,
    boundary_hash TEXT NOT NULL, cursor INTEGER NOT NULL, cursor_hash TEXT NOT NULL,
    updated_at TEXT NOT NULL, PRIMARY KEY(run_id, path_key));
CREATE INDEX IF NOT EXISTS files_path ON files(path_key, cursor);
CREATE TABLE IF NOT EXISTS coverage(
    pk INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL,
    source_id TEXT NOT NULL, status TEXT NOT NULL, observed_at TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS coverage_source ON coverage(run_id, source_id, pk);
CREATE TABLE IF NOT EXISTS objects(
    ref TEXT PRIMARY KEY, bytes INTEGER NOT NULL, media_type TEXT NOT NULL,
    redacted INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS object_data(
    pk INTEGER PRIMARY KEY, ref TEXT NOT NULL UNIQUE, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS actions(
    pk INTEGER PRIMARY KEY, run_id TEXT NOT NULL, source_id TEXT NOT NULL,
    entry_id TEXT NOT NULL, object_hash TEXT NOT NULL, kind TEXT NOT NULL,
    harness TEXT NOT NULL, session_id TEXT NOT NULL, target TEXT, agent_id TEXT,
    tool_call_id TEXT, recorded_at TEXT, body_limited INTEGER NOT NULL,
    UNIQUE(run_id, entry_id, kind, agent_id));
CREATE INDEX IF NOT EXISTS actions_session ON actions(harness, session_id);
CREATE INDEX IF NOT EXISTS actions_target ON actions(harness, target);
CREATE TABLE IF NOT EXISTS runtime_events(
    pk INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, run_id TEXT,
    source TEXT NOT NULL, type TEXT NOT NULL, pid INTEGER, ppid INTEGER, argv TEXT,
    started_at TEXT, observed_run TEXT, session_id TEXT, harness TEXT, tool_call_id TEXT,
    created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runtime_events_run ON runtime_events(run_id, pk);
CREATE TABLE IF NOT EXISTS runtime_edges(
    run_id TEXT NOT NULL, event_id TEXT NOT NULL, entry_id TEXT NOT NULL,
    tool_call_id TEXT, inherited INTEGER NOT NULL, pass_ref TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runtime_edges_run ON runtime_edges(run_id, event_id);
CREATE TABLE IF NOT EXISTS runtime_reports(
    pk INTEGER PRIMARY KEY, run_id TEXT NOT NULL, observed_at TEXT NOT NULL,
    ref TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runtime_reports_ref ON runtime_reports(run_id, ref);
CREATE TABLE IF NOT EXISTS links(
    run_id TEXT NOT NULL, entry_id TEXT NOT NULL, node_id TEXT NOT NULL, kind TEXT NOT NULL,
    relation TEXT, evidence TEXT NOT NULL, PRIMARY KEY(run_id, entry_id, node_id, kind));
CREATE INDEX IF NOT EXISTS links_kind ON links(run_id, kind);
""" + _ENTRIES_TABLE.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS")

_ENTRY_INDEXES: Final = """
CREATE UNIQUE INDEX IF NOT EXISTS entries_key
    ON entries(run_id, source_pk, sequence, ordinal, revision);
CREATE INDEX IF NOT EXISTS entries_id ON entries(run_id, id);
CREATE INDEX IF NOT EXISTS entries_tool ON entries(run_id, tool_call_id)
    WHERE tool_call_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_cites ON entries(run_id, substr(content_ref, 8, 8))
    WHERE content_ref IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_cites_raw ON entries(run_id, substr(raw_ref, 8, 8))
    WHERE raw_ref IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_cites_intent ON entries(run_id, substr(intent_ref, 8, 8))
    WHERE intent_ref IS NOT NULL;
"""
"""The entries table's indexes (schema 3). ``entries_key`` is the page order and the
uniqueness of a revision (``source_key`` is ``<source id>:<sequence>:<ordinal>`` and a
source's ``pk`` names its id, so it is the schema 1 ``UNIQUE(run_id, source_key, revision)``
too); it also finds a source's entries (``run_id`` and ``source_pk``). ``entries_id``: an
entry by id (links, artifacts, the ``entry`` filter); ``entries_tool``: the ``tool_call``
filter; ``entries_cites``, ``entries_cites_raw`` and ``entries_cites_intent``: whether a
run cites a body (:data:`CITED`; before schema 3 only ``content_ref`` had one, and a ref the
run does not cite scanned every entry of the run twice, 70 ms at 75,000 entries). These
three key a ref by 8 of its hex digits, not all 71 characters: refs are random, so every
insert touches its own leaf, and a key a third the size means a third the leaves, which a
file's rows then share (the Codex files of the bench, one process: write CPU 0.79 -> 0.72 s,
WAL 244 -> 184 MB); a lookup checks the whole ref on the rows found. The last four hold only
the rows that have the value: under ``basic`` no entry has a ``raw_ref``."""


def connect(home: Path) -> sqlite3.Connection:
    """Open (creating when absent) the evidence database under ``home``."""
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = home / DB_FILE
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        # Only a database with no pages yet takes it (before WAL, which fixes the size).
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        conn.execute("PRAGMA foreign_keys=ON")
        # ANALYZE reads a bounded sample per index (see refresh_statistics).
        conn.execute("PRAGMA analysis_limit=400")
        conn.executescript(_DDL)
        row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta(name, value) VALUES ('schema_version', ?), ('cursor_key', ?)",
                (SCHEMA_VERSION, secrets.token_hex(32)),
            )
        elif row["value"] in _OLDER:
            _upgrade(conn, row["value"])
        elif row["value"] != SCHEMA_VERSION:
            conn.close()
            raise EvidenceStoreUnavailable(
                "the evidence database has an unknown schema version",
                details={"schema_version": row["value"]},
            )
        conn.executescript(_ENTRY_INDEXES)
    except (sqlite3.Error, OSError):
        raise EvidenceStoreUnavailable("the evidence database cannot be opened") from None
    return conn


def _entries_without_unique(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: the entries table is rebuilt without its ``UNIQUE(run_id, source_key,
    revision)`` (``entries_key`` is the same constraint) and loses ``entries_page`` and
    ``entries_source``; rows, primary keys and bodies are copied as they are."""
    columns = ", ".join(_ENTRY_COLUMNS)
    conn.execute("ALTER TABLE entries RENAME TO entries_v1")
    conn.execute(_ENTRIES_TABLE)
    conn.execute(f"INSERT INTO entries({columns}) SELECT {columns} FROM entries_v1 ORDER BY pk")
    conn.execute("DROP TABLE entries_v1")


def _runs_entry_ids(conn: sqlite3.Connection) -> None:
    """Schema 2 -> 3: ``runs.entry_ids``, null for every run there is (their ids stay);
    ``entries_content`` gives way to ``entries_cites`` (see ``_ENTRY_INDEXES``)."""
    conn.execute("ALTER TABLE runs ADD COLUMN entry_ids TEXT")
    conn.execute("DROP INDEX IF EXISTS entries_content")


_MIGRATIONS: Final = (("1", "2", _entries_without_unique), ("2", "3", _runs_entry_ids))
"""Each step: the version it starts from, the one it leaves, and the change."""
_OLDER: Final = frozenset(start for start, _, _ in _MIGRATIONS)


def _upgrade(conn: sqlite3.Connection, version: str) -> None:
    """Migrate from ``version`` to :data:`SCHEMA_VERSION`, a step per transaction; a step
    another connection made first is not made again."""
    for start, end, change in _MIGRATIONS:
        if version != start:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
            if row["value"] == start:
                change(conn)
                conn.execute("UPDATE meta SET value=? WHERE name='schema_version'", (end,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        version = end


CITED: Final = (
    "SELECT 1 FROM entries WHERE run_id=:run AND substr(content_ref, 8, 8)=:key "
    "AND +content_ref=:ref LIMIT 1",
    "SELECT 1 FROM runtime_reports WHERE run_id=:run AND ref=:ref LIMIT 1",
    "SELECT 1 FROM entries WHERE run_id=:run AND substr(raw_ref, 8, 8)=:key "
    "AND +raw_ref=:ref LIMIT 1",
    "SELECT 1 FROM entries WHERE run_id=:run AND substr(intent_ref, 8, 8)=:key "
    "AND +intent_ref=:ref LIMIT 1",
)
"""The ways a run cites a stored body, the most asked first, each one index search;
parameters ``run``, ``ref`` and ``key`` (8 digits of the ref, see :func:`cites`). (The
``+`` keeps SQLite from putting the ref into ``substr(...)``, which then no longer matched
the index; an OR over the columns made it scan the run.)"""


def cites(conn: sqlite3.Connection, run_id: str, ref: str) -> bool:
    """Whether the run cites ``ref`` as a stored body (see :data:`CITED`)."""
    params = {"run": run_id, "ref": ref, "key": ref[7:15]}
    return any(conn.execute(query, params).fetchone() is not None for query in CITED)


def refresh_statistics(conn: sqlite3.Connection, analyzed_rows: int) -> int:
    """Refresh the query planner's statistics (a bounded sample, a few milliseconds) when the
    entries table has doubled since ``analyzed_rows``; returns the size they describe.

    Without them SQLite joins the run's links queries from the entries side and scans every
    entry of the run on each ingest; with them it starts from the few sources concerned.
    """
    row = conn.execute("SELECT MAX(pk) FROM entries").fetchone()
    rows = int(row[0] or 0)
    if rows >= 2 * analyzed_rows and rows > analyzed_rows:
        conn.execute("ANALYZE")
        return rows
    return analyzed_rows


def cursor_key(conn: sqlite3.Connection) -> bytes:
    """The secret that signs page cursors (created with the database)."""
    row = conn.execute("SELECT value FROM meta WHERE name='cursor_key'").fetchone()
    return bytes.fromhex(row["value"])
