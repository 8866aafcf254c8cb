"""Opaque page cursors and the entry listing (``/v1/context/entries``).

A cursor is ``base64url(payload) "." base64url(mac)``: the payload is canonical JSON
``{"v": 1, "s": scope, "r": run, "f": filters digest, "p": position}`` and the mac is
HMAC-SHA256 under the store's own secret (``meta.cursor_key``), truncated to 16 bytes. A
cursor that does not verify, names another run or was made for other filters is refused
with ``invalid_argument`` (``details.reason``: ``malformed``, ``tampered``, ``other_run``,
``other_filters``). Positions are keyset positions, so paging is stable while new entries
arrive behind the cursor.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument, EvidenceRunNotFound
from braid_actors.model import canonical_json, digest

from ._materialize import SCHEMA
from ._parsed import loads_stored

if TYPE_CHECKING:
    import sqlite3

ENTRY_KINDS: Final = (
    "message",
    "tool_call",
    "tool_result",
    "task",
    "configuration",
    "approval",
    "session",
)
GROUPS: Final = {
    "conversation": ("message", "tool_call", "tool_result", "task"),
    "configuration": ("configuration", "approval"),
}
MAX_LIMIT: Final = 200
DEFAULT_LIMIT: Final = 50
MAX_CURSOR: Final = 8192
MAX_IDENT: Final = 512


def invalid(message: str, field: str, reason: str | None = None) -> EvidenceInvalidArgument:
    details: dict[str, Any] = {"field": field}
    if reason:
        details["reason"] = reason
    return EvidenceInvalidArgument(message, details=details)


@attrs.frozen
class CursorCodec:
    """Signs and checks cursors with the store's secret."""

    key: bytes

    def encode(self, scope: str, run_id: str, filters: str, position: list[Any]) -> str:
        payload = canonical_json({"v": 1, "s": scope, "r": run_id, "f": filters, "p": position})
        mac = hmac.new(self.key, payload, hashlib.sha256).digest()[:16]
        return f"{_b64(payload)}.{_b64(mac)}"

    def decode(self, token: str, scope: str, run_id: str, filters: str) -> list[Any]:
        if not isinstance(token, str) or not token or len(token) > MAX_CURSOR:
            raise invalid("the cursor is not valid", "cursor", "malformed")
        head, _, tail = token.partition(".")
        try:
            payload = _unb64(head)
            mac = _unb64(tail)
        except (ValueError, binascii.Error):
            raise invalid("the cursor is not valid", "cursor", "malformed") from None
        expected = hmac.new(self.key, payload, hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(mac, expected):
            raise invalid("the cursor is not valid", "cursor", "tampered")
        body = json.loads(payload)
        if body.get("s") != scope or body.get("r") != run_id:
            raise invalid("the cursor belongs to another run or listing", "cursor", "other_run")
        if body.get("f") != filters:
            raise invalid("the cursor was made for other filters", "cursor", "other_filters")
        position = body.get("p")
        if not isinstance(position, list):
            raise invalid("the cursor is not valid", "cursor", "malformed")
        return position


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text:
        raise ValueError("empty")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not the canonical encoding")  # one cursor has exactly one spelling
    return data


def check_run(conn: sqlite3.Connection, run_id: object) -> str:
    """``run_id`` when it is a well-formed run this store knows."""
    if not isinstance(run_id, str) or not 1 <= len(run_id) <= MAX_IDENT:
        raise invalid("run must be a string of 1 to 512 characters", "run")
    if conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
        raise EvidenceRunNotFound("no evidence is recorded for this run", details={"run": run_id})
    return run_id


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise invalid(f"limit must be an integer from 1 to {MAX_LIMIT}", "limit")
    return limit


@attrs.frozen
class EntryFilters:
    """The entry listing's filters (each exact; null means not filtered)."""

    session: str | None = None
    harness: str | None = None
    source: str | None = None
    kind: str | None = None
    tool_call: str | None = None
    entry: str | None = None
    node: str | None = None
    group: str | None = None
    revisions: bool = False

    def check(self) -> None:
        for field in ("session", "harness", "source", "tool_call", "entry", "node"):
            value = getattr(self, field)
            if value is not None and (
                not isinstance(value, str) or not 1 <= len(value) <= MAX_IDENT
            ):
                raise invalid(f"{field} must be a string of 1 to 512 characters", field)
        if self.kind is not None and self.kind not in ENTRY_KINDS:
            raise invalid("kind is not an entry kind", "kind")
        if self.group is not None and self.group not in GROUPS:
            raise invalid("group must be conversation or configuration", "group")
        if not isinstance(self.revisions, bool):
            raise invalid("revisions must be a boolean", "revisions")

    def fingerprint(self) -> str:
        return digest(attrs.asdict(self))


def entries_page(
    conn: sqlite3.Connection,
    codec: CursorCodec,
    run_id: str,
    filters: EntryFilters,
    cursor: str | None,
    limit: int,
) -> dict[str, Any]:
    """One ``EntryPage``; its entries of one source share that source's object."""
    run_id = check_run(conn, run_id)
    limit = check_limit(limit)
    filters.check()
    fingerprint = filters.fingerprint()
    where = ["e.run_id = ?"]
    params: list[Any] = [run_id]
    if not filters.revisions:
        where.append("e.latest = 1")
    for column, value in (
        ("s.session_id", filters.session),
        ("s.harness", filters.harness),
        ("s.id", filters.source),
        ("e.kind", filters.kind),
        ("e.tool_call_id", filters.tool_call),
        ("e.id", filters.entry),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if filters.group is not None:
        kinds = GROUPS[filters.group]
        where.append(f"e.kind IN ({','.join('?' * len(kinds))})")
        params.extend(kinds)
    if filters.node is not None:
        where.append(
            "(e.id = ? OR e.object_hash = ? OR e.id IN "
            "(SELECT entry_id FROM runtime_edges WHERE run_id = ? AND event_id = ?))"
        )
        params.extend([filters.node, filters.node, run_id, filters.node])
    if cursor is not None:
        position = codec.decode(cursor, "entries", run_id, fingerprint)
        if len(position) != 4 or not all(isinstance(p, int) for p in position):
            raise invalid("the cursor is not valid", "cursor", "malformed")
        where.append("(e.source_pk, e.sequence, e.ordinal, e.revision) > (?, ?, ?, ?)")
        params.extend(position)
    rows = conn.execute(
        "SELECT e.source_pk, e.sequence, e.ordinal, e.revision, CAST(e.body AS BLOB) AS body "
        "FROM entries e JOIN sources s ON s.pk = e.source_pk WHERE "
        + " AND ".join(where)
        + " ORDER BY e.source_pk, e.sequence, e.ordinal, e.revision LIMIT ?",
        (*params, limit + 1),
    ).fetchall()
    has_more = len(rows) > limit
    rows = rows[:limit]
    # A page holds the entries of a few sources: each source body is read once.
    sources = _sources(conn, {row["source_pk"] for row in rows})
    entries = []
    for row in rows:
        entry: dict[str, Any] = loads_stored(row["body"])
        entry["source"] = sources[row["source_pk"]]
        entries.append(entry)
    page: dict[str, Any] = {
        "schema_version": SCHEMA,
        "run_id": run_id,
        "entries": entries,
        "has_more": has_more,
        "limit": limit,
    }
    if has_more and rows:
        last = rows[-1]
        page["next_cursor"] = codec.encode(
            "entries",
            run_id,
            fingerprint,
            [last["source_pk"], last["sequence"], last["ordinal"], last["revision"]],
        )
    return page


def _sources(conn: sqlite3.Connection, pks: set[int]) -> dict[int, dict[str, Any]]:
    """The Source wire objects of these sources, by pk."""
    marks = ",".join("?" * len(pks))
    found = conn.execute(
        f"SELECT pk, CAST(body AS BLOB) AS body FROM sources WHERE pk IN ({marks})", tuple(pks)
    )
    return {row["pk"]: loads_stored(row["body"]) for row in found}


BODIES: Final = "CAST(e.body AS BLOB) AS body, CAST(s.body AS BLOB) AS source_body"
"""The columns :func:`entry_body` reads (entries ``e`` joined to sources ``s``): the texts
as UTF-8 bytes, which orjson reads without a copy to ``str`` first."""


def entry_body(body: bytes, source_body: bytes) -> dict[str, Any]:
    """An Entry wire object from its stored row (selected as :data:`BODIES`)."""
    # orjson where it reads the same value: json took 80% of a 200-entry page's time.
    entry: dict[str, Any] = loads_stored(body)
    entry["source"] = loads_stored(source_body)
    return entry
