"""A pass recomputes only the cross-file links it can have changed, and that is enough.

Two copies of the Claude Code fixtures, each with its own session ids (so each copy's
compaction agents and Task calls belong to other sessions than the other copy's), are
ingested into one run in interleaved orders, then some files again (all duplicates);
after every ingest the run's ``task_agent`` and ``compaction_agent`` links are exactly what
a full rebuild gives.
"""

from __future__ import annotations

import json
import random
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING

import pytest

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._run_links import rebuild_run_links

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from pathlib import Path

KINDS = ("task_agent", "compaction_agent")
RUN = "run_scope"


def _links(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return sorted(
        tuple(row)
        for row in conn.execute(
            "SELECT entry_id, node_id, kind, relation, evidence FROM links "
            "WHERE run_id=? AND kind IN (?, ?)",
            (RUN, *KINDS),
        )
    )


def _check(home: Path) -> int:
    with closing(sqlite3.connect(home / "evidence.sqlite3", isolation_level=None)) as conn:
        conn.row_factory = sqlite3.Row
        stored = _links(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            rebuild_run_links(conn, RUN)
            rebuilt = _links(conn)
        finally:
            conn.execute("ROLLBACK")
    assert stored == rebuilt
    return len(stored)


def _copies(tmp_path: Path) -> list[Path]:
    """Every Claude Code fixture, twice, the second copy's session ids changed."""
    base = FIXTURES / "claude-code"
    out: list[Path] = []
    for path in sorted(base.rglob("*.jsonl")):
        data = path.read_bytes()
        sessions = {
            record["sessionId"]
            for line in data.splitlines()
            if line.strip()
            and isinstance(record := json.loads(line), dict)
            and isinstance(record.get("sessionId"), str)
        }
        for copy in (0, 1):
            changed, rel = data, str(path.relative_to(base))
            for session in sessions if copy else ():
                renamed = f"{copy:08x}{session[8:]}"
                changed = changed.replace(session.encode(), renamed.encode())
                rel = rel.replace(session, renamed)
            target = tmp_path / "in" / str(copy) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(changed)
            out.append(target)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scoped_link_updates_are_the_full_rebuild(tmp_path: Path, seed: int) -> None:
    files = _copies(tmp_path)
    assert any("acompact" in p.name for p in files) and any("agent-a" in p.name for p in files)
    rng = random.Random(seed)
    order = rng.sample(files, len(files)) + rng.sample(files, 4)  # then some again
    home = tmp_path / "home"
    counts = []
    with EvidenceStore.open(home) as store:
        for path in order:
            store.ingest(path, run_id=RUN)
            counts.append(_check(home))
    assert counts[-1] > 0
