"""The pure half of an ingest pass: a file's bytes to the rows it would write.

:func:`prepare` parses a file and materializes its drafts (scope, redaction, policy, objects,
ids, hashes) given the little the database says about the file beforehand (:class:`FileRows`:
its cursor and boundary in this run, other runs' cursors). It touches no database;
:mod:`._ingest` reads those rows, and stores a :class:`Prepared` in one transaction.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument

from ._claude import parse_claude
from ._codex import parse_codex
from ._gemini import parse_gemini, split_gemini
from ._local import parse_local
from ._materialize import EntryRow, Materializer, entry_id, entry_id_prefix, source_entry_id
from ._parsed import LineSplit, Outcome
from ._policy import CapturePolicy

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    from ._redact import Redactor

PARSERS: Final[dict[str, Callable[..., Outcome]]] = {
    "claude_code": parse_claude,
    "codex": parse_codex,
    "gemini_cli": parse_gemini,
    "local": parse_local,
}


@attrs.frozen
class FileRows:
    """What the store recorded about one file before a pass (see ``_ingest``'s docstring)."""

    own: tuple[int, str, int, str] | None
    """``(boundary, boundary_hash, cursor, cursor_hash)`` of this run, if recorded."""
    others: tuple[tuple[int, str], ...]
    """``(cursor, cursor_hash)`` of the other runs, longest cursor first."""
    legacy_ids: bool = False
    """The run was recorded before schema 3: its entry ids are ``_materialize.entry_id``'s."""


def file_rows(conn: sqlite3.Connection, run_id: str, path_key: str) -> FileRows:
    row = conn.execute(
        "SELECT boundary, boundary_hash, cursor, cursor_hash FROM files "
        "WHERE run_id=? AND path_key=?",
        (run_id, path_key),
    ).fetchone()
    others = conn.execute(
        "SELECT cursor, cursor_hash FROM files WHERE path_key=? AND run_id<>? ORDER BY cursor DESC",
        (path_key, run_id),
    ).fetchall()
    run = conn.execute("SELECT entry_ids FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return FileRows(
        None if row is None else (int(row[0]), str(row[1]), int(row[2]), str(row[3])),
        tuple((int(r[0]), str(r[1])) for r in others),
        legacy_ids=run is not None and run[0] is None,
    )


def boundary_of(
    data: bytes, resume_offset: int | None, files: FileRows
) -> tuple[int, list[dict[str, Any]]]:
    """The pass's resume boundary and the file issues found deciding it."""
    issues: list[dict[str, Any]] = []
    own = files.own
    if resume_offset is not None:
        if not 0 <= resume_offset <= len(data) or (
            resume_offset and data[resume_offset - 1 : resume_offset] != b"\n"
        ):
            raise EvidenceInvalidArgument(
                "resume_offset must be the offset of a line start in the file",
                details={"field": "resume_offset"},
            )
        if own is not None and own[0] != resume_offset:
            raise EvidenceInvalidArgument(
                "this run already recorded another resume boundary for the file",
                details={"field": "resume_offset"},
            )
        return resume_offset, issues
    if own is not None:
        boundary, boundary_hash, cursor, cursor_hash = own
        if not _prefix_matches(data, cursor, cursor_hash):
            issues.append({"code": "source_rewritten"})
        if _prefix_matches(data, boundary, boundary_hash):
            return boundary, issues
        return 0, issues
    for cursor, cursor_hash in files.others:
        if cursor > 0 and _prefix_matches(data, cursor, cursor_hash):
            return cursor, issues
    return 0, issues


@attrs.define(eq=False)
class Prepared:
    """A parsed and materialized file, ready to be stored."""

    path_key: str
    harness: str
    policy: CapturePolicy
    boundary: int
    issues: list[dict[str, Any]]
    boundary_hash: str
    cursor: int
    cursor_hash: str
    split: LineSplit
    outcome: Outcome
    sources: dict[str, dict[str, Any]]
    rows: list[EntryRow]
    starts: dict[int, int]
    """Start offset of each line by number."""
    pending: dict[str, bytes]
    objects_written: dict[str, tuple[int, str, bool]]
    omissions: dict[tuple[str, str], Counter[str]]
    truncated: Counter[tuple[str, str]]


def prepare(
    data: bytes,
    split: LineSplit,
    detected: str,
    *,
    path_key: str,
    stem: str,
    run_id: str,
    policy: CapturePolicy,
    redactor: Redactor,
    resume_offset: int | None,
    files: FileRows,
) -> Prepared:
    """Parse and materialize a file of a supported format (``split`` = its lines)."""
    if detected == "gemini_cli":
        split = split_gemini(data)  # one JSON document: records, not lines
    outcome = PARSERS[detected](split, fallback_session=stem)
    boundary, issues = boundary_of(data, resume_offset, files)
    mat = Materializer(
        run_id=run_id,
        path_key=path_key,
        policy=policy,
        redactor=redactor,
        boundary=boundary,
        lines={line.number: line for line in split.lines},
    )
    sources = {key: mat.source(outcome, info) for key, info in outcome.sessions.items()}
    if files.legacy_ids:
        ids = {
            d.key: entry_id(run_id, f"{sources[d.session]['id']}:{d.line}:{d.ordinal}")
            for d in outcome.drafts
        }
    else:
        prefix = {key: entry_id_prefix(run_id, source["id"]) for key, source in sources.items()}
        ids = {d.key: source_entry_id(prefix[d.session], d.line, d.ordinal) for d in outcome.drafts}
    rows = [row for d in outcome.drafts if (row := mat.entry(d, sources[d.session], ids))]
    cursor = split.complete_end
    view = memoryview(data)
    return Prepared(
        path_key=path_key,
        harness=detected,
        policy=policy,
        boundary=boundary,
        issues=issues,
        boundary_hash=_hash(view[:boundary]),
        cursor=cursor,
        cursor_hash=_hash(view[:cursor]),
        split=split,
        outcome=outcome,
        sources=sources,
        rows=rows,
        starts={number: line.start for number, line in mat.lines.items()},
        pending=mat.pending,
        objects_written=mat.objects_written,
        omissions=mat.omissions,
        truncated=mat.truncated,
    )


def _hash(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _prefix_matches(data: bytes, length: int, expected: str) -> bool:
    return length <= len(data) and _hash(memoryview(data)[:length]) == expected
