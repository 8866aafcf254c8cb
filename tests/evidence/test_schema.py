"""The evidence database's schema version: schema 1 and 2 stores are migrated, others refused."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pytest

from braid_actors.errors import EvidenceStoreUnavailable
from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._schema import (
    CACHE_KIB,
    CITED,
    DB_FILE,
    ENTRY_IDS,
    PAGE_SIZE,
    SCHEMA_VERSION,
    connect,
)

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from pathlib import Path

RUN = "run_schema"

_V1_ENTRIES = """
CREATE TABLE entries(
    pk INTEGER PRIMARY KEY, id TEXT NOT NULL, run_id TEXT NOT NULL,
    source_pk INTEGER NOT NULL, source_key TEXT NOT NULL, sequence INTEGER NOT NULL,
    ordinal INTEGER NOT NULL, revision INTEGER NOT NULL, latest INTEGER NOT NULL,
    kind TEXT NOT NULL, tool_call_id TEXT, scope TEXT, content_ref TEXT, raw_ref TEXT,
    intent_ref TEXT, object_hash TEXT NOT NULL, body TEXT NOT NULL,
    UNIQUE(run_id, source_key, revision));
CREATE INDEX entries_page ON entries(run_id, source_pk, sequence, ordinal, revision);
CREATE INDEX entries_id ON entries(run_id, id);
CREATE INDEX entries_source ON entries(source_pk, latest, sequence, ordinal);
CREATE INDEX entries_tool ON entries(run_id, tool_call_id);
CREATE INDEX entries_content ON entries(run_id, content_ref);
"""
"""The entries table and indexes of schema 1, as its stores have them."""


LEGACY_ID = re.compile(r"ctx_[0-9a-f]{32}")
"""An entry id of a run recorded before schema 3: the digest of (run, source key)."""


def _ingest_fixtures(home: Path, *, legacy: bool = False) -> list[Path]:
    """Every Claude Code and Codex fixture into ``RUN``; ``legacy``: a run recorded before
    schema 3 (its ``runs`` row as the migration leaves it, ``entry_ids`` null)."""
    paths = [
        *sorted((FIXTURES / "claude-code").rglob("*.jsonl")),
        *sorted((FIXTURES / "codex").rglob("*.jsonl")),
    ]
    with EvidenceStore.open(home) as store:
        if legacy:
            with closing(sqlite3.connect(home / DB_FILE, isolation_level=None)) as conn:
                conn.execute("INSERT INTO runs(run_id, created_at) VALUES (?, '')", (RUN,))
        for path in paths:
            store.ingest(path, run_id=RUN)
    return paths


_V2_CITES = """
CREATE INDEX entries_content ON entries(run_id, content_ref) WHERE content_ref IS NOT NULL;
"""
"""Schema 2's one citation index, in place of schema 3's three."""


def _make_v2(home: Path) -> None:
    """Turn a store into what schema 2 wrote: ``runs`` without ``entry_ids``, and its one
    citation index."""
    with closing(sqlite3.connect(home / DB_FILE, isolation_level=None)) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN entry_ids")
        for name in ("entries_cites", "entries_cites_raw", "entries_cites_intent"):
            conn.execute(f"DROP INDEX {name}")
        conn.execute(_V2_CITES)
        conn.execute("UPDATE meta SET value='2' WHERE name='schema_version'")


def _ids(home: Path) -> dict[str, list[tuple[str, int, int]]]:
    """``(id, sequence, ordinal)`` of every entry, by source key's source id."""
    with closing(sqlite3.connect(home / DB_FILE)) as conn:
        rows = conn.execute("SELECT id, source_key, sequence, ordinal FROM entries ORDER BY pk")
        out: dict[str, list[tuple[str, int, int]]] = {}
        for entry, key, sequence, ordinal in rows:
            out.setdefault(key.split(":")[0], []).append((entry, sequence, ordinal))
        return out


def _pages(store: EvidenceStore) -> list[dict[str, Any]]:
    """Every entries page of the run, following the cursors."""
    out = [store.entries(RUN, limit=200)]
    while out[-1].get("next_cursor"):
        out.append(store.entries(RUN, cursor=out[-1]["next_cursor"], limit=200))
    return out


def _rows(home: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(home / DB_FILE)) as conn:
        return conn.execute("SELECT * FROM entries ORDER BY pk").fetchall()


def _entry_indexes(home: Path) -> set[str]:
    with closing(sqlite3.connect(home / DB_FILE)) as conn:
        return {
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='entries'"
            )
        }


def _make_v1(home: Path) -> None:
    """Turn a store into what schema 1 wrote: the same rows in the old table."""
    _make_v2(home)
    with closing(sqlite3.connect(home / DB_FILE, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        conn.execute("ALTER TABLE entries RENAME TO entries_v2")
        for name in sorted(_entry_indexes(home)):
            conn.execute(f"DROP INDEX {name}")
        for statement in _V1_ENTRIES.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO entries SELECT * FROM entries_v2 ORDER BY pk")
        conn.execute("DROP TABLE entries_v2")
        conn.execute("UPDATE meta SET value='1' WHERE name='schema_version'")
        conn.execute("COMMIT")


def test_a_schema_1_store_is_migrated_with_every_row_as_it_was(tmp_path: Path) -> None:
    home = tmp_path / "home"
    paths = _ingest_fixtures(home, legacy=True)
    with EvidenceStore.open(home) as store:
        pages = _pages(store)
    rows = _rows(home)
    new_indexes = _entry_indexes(home)
    assert new_indexes == {
        "entries_key",
        "entries_id",
        "entries_tool",
        "entries_cites",
        "entries_cites_raw",
        "entries_cites_intent",
    }
    _make_v1(home)
    assert "entries_source" in _entry_indexes(home)

    with EvidenceStore.open(home) as store:
        assert _pages(store) == pages
        # Ingesting the same files again stores nothing: every row is a duplicate.
        for path in paths:
            for source in store.ingest(path, run_id=RUN).sources:
                assert source.coverage["counts"]["stored"] == 0
    assert _rows(home) == rows
    assert _entry_indexes(home) == new_indexes
    with closing(sqlite3.connect(home / DB_FILE)) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
        assert version == SCHEMA_VERSION == "3"
        # The revision constraint holds as schema 1's did.
        first = rows[0]
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO entries SELECT * FROM entries WHERE pk=?", (first[0],))
        conn.execute(
            "INSERT INTO entries(id, run_id, source_pk, source_key, sequence, ordinal, "
            "revision, latest, kind, object_hash, body) SELECT id, run_id, source_pk, "
            "source_key, sequence, ordinal, revision + 1, latest, kind, object_hash, body "
            "FROM entries WHERE pk=?",
            (first[0],),
        )


def test_a_schema_2_store_keeps_its_runs_ids_and_its_new_runs_get_source_ids(
    tmp_path: Path,
) -> None:
    """Migrated from schema 2, a run keeps its digest entry ids (re-ingesting its files stores
    nothing, as every row is a duplicate), while a run created afterwards gets source ids."""
    home = tmp_path / "home"
    paths = _ingest_fixtures(home, legacy=True)
    indexes = _entry_indexes(home)
    _make_v2(home)
    assert "entries_content" in _entry_indexes(home)
    rows = _rows(home)
    assert all(LEGACY_ID.fullmatch(row[1]) for row in rows)
    with EvidenceStore.open(home) as store:
        for path in paths:
            for source in store.ingest(path, run_id=RUN).sources:
                assert source.coverage["counts"]["stored"] == 0
        store.ingest(paths[1], run_id="run_after", resume_offset=0)  # (not prior context)
    with closing(sqlite3.connect(home / DB_FILE)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone() == (
            "3",
        )
        runs = dict(conn.execute("SELECT run_id, entry_ids FROM runs"))
    assert runs == {RUN: None, "run_after": ENTRY_IDS}
    assert _entry_indexes(home) == indexes
    after = [row for row in _rows(home) if row[2] == "run_after"]
    assert after
    assert not any(LEGACY_ID.fullmatch(row[1]) for row in after)
    assert _rows(home)[: len(rows)] == rows


def test_a_runs_entry_ids_begin_with_their_sources_prefix(tmp_path: Path) -> None:
    """A file's entries share an id prefix of their own (neighbours in the indexes keyed by
    entry id), end with their place in the file, and are the same in another store."""
    _ingest_fixtures(tmp_path / "a")
    by_source = _ids(tmp_path / "a")
    assert len(by_source) > 10
    prefixes = set()
    for entries in by_source.values():
        (prefix,) = {entry.rsplit("_", 2)[0] for entry, _, _ in entries}
        assert re.fullmatch(r"ctx_[0-9a-f]{16}", prefix)
        assert all(entry == f"{prefix}_{seq}_{ordinal}" for entry, seq, ordinal in entries)
        prefixes.add(prefix)
    assert len(prefixes) == len(by_source)
    _ingest_fixtures(tmp_path / "b")
    assert _ids(tmp_path / "b") == by_source


def test_every_citation_check_is_answered_from_an_index(tmp_path: Path) -> None:
    """``content`` asks whether the run cites a ref in each column that can hold one: every
    question is an index search, never a scan of the run's entries."""
    _ingest_fixtures(tmp_path / "home")
    with closing(sqlite3.connect(tmp_path / "home" / DB_FILE)) as conn:
        for query in CITED:
            plan = " ".join(
                row[3]
                for row in conn.execute(
                    f"EXPLAIN QUERY PLAN {query}", {"run": RUN, "ref": "sha256:x", "key": "x"}
                )
            )
            # The index's key holds the ref (or 8 of its digits): not a walk through the run.
            assert re.fullmatch(
                r"SEARCH \w+ USING (COVERING )?INDEX \w+ \(run_id=\? AND "
                r"(\w*ref|<expr>)=\?\)",
                plan,
            ), (query, plan)


def test_an_unknown_schema_version_is_refused_with_a_stable_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with EvidenceStore.open(home):
        pass
    with closing(sqlite3.connect(home / DB_FILE, isolation_level=None)) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE name='schema_version'")
    with pytest.raises(EvidenceStoreUnavailable) as caught:
        EvidenceStore.open(home)
    assert caught.value.code == "store_unavailable"
    assert caught.value.details == {"schema_version": "99"}


def test_every_connection_holds_the_larger_page_cache(tmp_path: Path) -> None:
    """The store's and every ingest worker's connection come from ``connect``: each keeps
    up to ``CACHE_KIB`` of pages, not SQLite's 2,000 KiB default."""
    assert CACHE_KIB >= 32_768
    with closing(connect(tmp_path / "home")) as conn:
        assert conn.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
    with closing(sqlite3.connect(tmp_path / "home" / DB_FILE)) as plain:
        assert plain.execute("PRAGMA cache_size").fetchone()[0] == -2000


def test_a_new_store_gets_the_larger_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    """A store created now has ``PAGE_SIZE`` pages; one created with SQLite's default
    pages keeps them (the size of a WAL database can't change) and still ingests."""
    assert PAGE_SIZE > 4096
    _ingest_fixtures(tmp_path / "new")
    with closing(sqlite3.connect(tmp_path / "new" / DB_FILE)) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
    old = tmp_path / "old"
    old.mkdir()
    with closing(sqlite3.connect(old / DB_FILE)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE early(x)")  # the file now has its (default) page size
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    _ingest_fixtures(old)
    with closing(sqlite3.connect(old / DB_FILE)) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    with EvidenceStore.open(tmp_path / "new") as new_store, EvidenceStore.open(old) as old_store:
        ids = [[e["id"] for e in page["entries"]] for page in _pages(new_store)]
        assert sum(map(len, ids)) > 200
        assert ids == [[e["id"] for e in page["entries"]] for page in _pages(old_store)]
