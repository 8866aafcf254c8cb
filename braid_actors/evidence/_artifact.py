"""Saved artifact pages (``/api/artifact``): every node the other routes hand out, read back.

A ``node`` is resolved in the run, in this order:

- ``sha256:`` + 64 hex that the run cites as a stored object (an entry's ``content``,
  ``raw_content`` or ``intent_content`` of any revision, or a runtime correlation report):
  that object, verified against its hash (``source: object``); both modes show its bytes,
  since an object is its own saved envelope;
- ``sha256:`` + 64 hex that is an entry revision's ``object_hash``: that exact revision;
- ``sha256:`` + 64 hex that is a coverage report's ``object_hash``: that report's database
  record;
- an entry id: its revisions. When they select different bodies for the mode (a changed
  record), the id is ``ambiguous``: no body, and ``versions`` lists each revision's exact
  node (``ref``: its stored object, else its ``object_hash``). Otherwise its latest revision;
- a runtime event id: the event's database record.

An entry revision shows, in ``body`` mode, its ``content`` and in ``raw`` mode its
``raw_content`` (the saved source record): the stored object when there is one, else the
ContentRef's own state (``omitted`` by the capture policy, ``unavailable``) and reason.
Database records (runtime events, coverage reports) are shown in both modes as their
recorded fields in canonical JSON (``source: db``, ``integrity: database_record``); their
values were redacted when stored, and ``redacted`` says whether a redaction marker is in
them. A node the run does not record is ``unavailable`` (``node_not_recorded``); an object
that fails its hash check is ``integrity_failure`` and one whose file is gone
``unavailable`` (``object_missing``) — each a 200 with no content, never a 404.

Pages are UTF-8 byte ranges of the displayed body: ``offset`` must be a character boundary
inside the body (else ``invalid_argument``, 400), and a page ends on a boundary at most
``limit`` bytes later. ``view_lang`` changes nothing: no heading is generated.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Final

from braid_actors.errors import EvidenceReadFailed

from ._objects import REF_RE
from ._paging import BODIES, check_run, entry_body, invalid
from ._schema import cites

if TYPE_CHECKING:
    import sqlite3

    from ._objects import ObjectStore

SCHEMA: Final = "agentprovenance.artifact_page/v1"
MAX_VERSIONS: Final = 50
MARKER: Final = "[REDACTED:"
"""The prefix of every redaction marker (see :mod:`._redact`)."""


def artifact_page(
    conn: sqlite3.Connection,
    objects: ObjectStore,
    run_id: str,
    node: str,
    mode: str,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """One ``ArtifactPage`` (see the module docstring)."""
    run_id = check_run(conn, run_id)
    if mode not in ("body", "raw"):
        raise invalid("mode must be body or raw", "mode")
    reader = _Reader(conn, objects, run_id, mode, offset, limit)
    if REF_RE.fullmatch(node):
        return reader.by_hash(node)
    revisions = conn.execute(
        f"SELECT e.revision, {BODIES} FROM entries e JOIN sources s "
        "ON s.pk = e.source_pk WHERE e.run_id=? AND e.id=? ORDER BY e.revision",
        (run_id, node),
    ).fetchall()
    if revisions:
        return reader.entry_id([entry_body(r["body"], r["source_body"]) for r in revisions])
    event = conn.execute(
        "SELECT * FROM runtime_events WHERE run_id=? AND event_id=?", (run_id, node)
    ).fetchone()
    if event is not None:
        return reader.record(_event_record(event), None)
    return reader.missing("unavailable", "node_not_recorded")


class _Reader:
    def __init__(
        self,
        conn: sqlite3.Connection,
        objects: ObjectStore,
        run_id: str,
        mode: str,
        offset: int,
        limit: int,
    ) -> None:
        self.conn = conn
        self.objects = objects
        self.run_id = run_id
        self.mode = mode
        self.offset = offset
        self.limit = limit

    def base(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA, "mode": self.mode, "offset": self.offset}

    # ---- resolution ------------------------------------------------------------------

    def by_hash(self, ref: str) -> dict[str, Any]:
        if self.cited(ref):
            meta = self.conn.execute("SELECT * FROM objects WHERE ref=?", (ref,)).fetchone()
            if meta is not None:
                return self.stored(ref, meta["media_type"], bool(meta["redacted"]))
        revision = self.conn.execute(
            f"SELECT {BODIES} FROM entries e JOIN sources s "
            "ON s.pk = e.source_pk WHERE e.run_id=? AND e.object_hash=? "
            "ORDER BY e.revision DESC LIMIT 1",
            (self.run_id, ref),
        ).fetchone()
        if revision is not None:
            return self.revision(entry_body(revision["body"], revision["source_body"]))
        report = self.conn.execute(
            "SELECT body FROM coverage WHERE run_id=? AND json_extract(body, '$.object_hash')=? "
            "ORDER BY pk DESC LIMIT 1",
            (self.run_id, ref),
        ).fetchone()
        if report is not None:
            return self.record(json.loads(report["body"]), ref)
        return self.missing("unavailable", "node_not_recorded")

    def cited(self, ref: str) -> bool:
        """Whether the run cites ``ref`` as a stored body."""
        return cites(self.conn, self.run_id, ref)

    def entry_id(self, revisions: list[dict[str, Any]]) -> dict[str, Any]:
        field = "content" if self.mode == "body" else "raw_content"
        exact = [(_exact(entry, field), entry["source"]["id"]) for entry in revisions]
        if len({node for node, _ in exact}) == 1:
            return self.revision(revisions[-1])
        page = self.missing("ambiguous", "multiple_revisions")
        page["versions"] = [{"ref": node, "source_id": src} for node, src in exact[:MAX_VERSIONS]]
        page["versions_has_more"] = len(exact) > MAX_VERSIONS
        return page

    def revision(self, entry: dict[str, Any]) -> dict[str, Any]:
        content = entry["content" if self.mode == "body" else "raw_content"]
        if content.get("state") == "stored" and "ref" in content:
            meta = self.conn.execute(
                "SELECT * FROM objects WHERE ref=?", (content["ref"],)
            ).fetchone()
            if meta is not None:
                return self.stored(content["ref"], meta["media_type"], bool(meta["redacted"]))
            return self.missing("unavailable", "object_not_recorded", content["ref"])
        state = content.get("state") or "unavailable"
        return self.missing(state, content.get("reason") or "source_not_recorded")

    # ---- pages -----------------------------------------------------------------------

    def missing(self, state: str, reason: str, ref: str | None = None) -> dict[str, Any]:
        """A page with no content: an explicit unavailable, omitted or ambiguous state."""
        page = {
            **self.base(),
            "kind": "unavailable",
            "content_state": state,
            "reason": reason,
            "size": 0,
            "truncated": False,
            "redacted": False,
            "next_offset": self.offset,
            "total_bytes": None,
            "has_more": False,
        }
        if ref is not None:
            page["ref"] = ref
        return page

    def stored(self, ref: str, media_type: str, redacted: bool) -> dict[str, Any]:
        try:
            data = self.objects.get(ref)
        except EvidenceReadFailed:
            if self.objects.exists(ref):
                return self.missing("integrity_failure", "object_hash_mismatch", ref)
            return self.missing("unavailable", "object_missing", ref)
        extra = {
            "ref": ref,
            "source": "object",
            "integrity": "object_hash_verified",
            "mime": media_type,
        }
        return self.text(data, ref[len("sha256:") :], redacted, extra)

    def record(self, fields: dict[str, Any], ref: str | None) -> dict[str, Any]:
        text = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        data = text.encode("utf-8")
        extra: dict[str, Any] = {
            "source": "db",
            "integrity": "database_record",
            "mime": "application/json",
        }
        if ref is not None:
            extra["ref"] = ref
        return self.text(data, hashlib.sha256(data).hexdigest(), MARKER in text, extra)

    def text(
        self, data: bytes, sha256: str, redacted: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            binary = self.missing("binary", "not_utf8_text", extra.get("ref"))
            binary.update(kind="binary", size=len(data), total_bytes=len(data), sha256=sha256)
            return binary
        start, end = utf8_page(data, self.offset, self.limit)
        total = len(data)
        page: dict[str, Any] = {
            **self.base(),
            "kind": "text",
            **extra,
            "content_state": "stored",
            "sha256": sha256,
            "size": total,
            "truncated": end < total,
            "redacted": redacted,
            "next_offset": end,
            "total_bytes": total,
            "has_more": end < total,
        }
        if end > start:
            page["content"] = data[start:end].decode("utf-8")
        return page


def utf8_page(data: bytes, offset: int, limit: int) -> tuple[int, int]:
    """The byte range of one page: ``offset`` must be a character boundary within ``data``;
    the end is the last boundary at most ``limit`` bytes on (``limit`` ≥ 4 always advances)."""
    total = len(data)
    if not 0 <= offset <= total:
        raise invalid("offset is outside the content", "offset")
    if offset < total and _continuation(data[offset]):
        raise invalid("offset is not at a UTF-8 character boundary", "offset")
    end = min(offset + limit, total)
    while end < total and _continuation(data[end]):
        end -= 1
    return offset, end


def _continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _exact(entry: dict[str, Any], field: str) -> str:
    content = entry[field]
    if content.get("state") == "stored" and "ref" in content:
        return str(content["ref"])
    return str(entry["object_hash"])


def _event_record(row: sqlite3.Row) -> dict[str, Any]:
    record = {key: row[key] for key in row.keys() if key not in ("pk", "argv")}  # noqa: SIM118
    record["argv"] = None if row["argv"] is None else json.loads(row["argv"])
    return record
