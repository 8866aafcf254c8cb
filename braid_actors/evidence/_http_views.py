"""The evidence API's reads beyond a single store call: links, compare, search, artifact.

Whole-run comparison records (``/api/compare/records``) are projected in :mod:`._records`.

Each view is a synchronous function ``(store, values) -> dict`` run on a worker thread; the
values are already checked against the spec's parameter bounds. Views answer only from the
store's recorded evidence: when the store records nothing that could answer, they say so in
the spec's own terms (an explicit reason or state, or an error), never with an invented page.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Final

from braid_actors.errors import (
    EvidenceContentNotFound,
    EvidenceInvalidArgument,
    EvidenceReadFailed,
)

from ._artifact import artifact_page
from ._catalog import entry_source, search_page
from ._materialize import SCHEMA

if TYPE_CHECKING:
    from ._store import EvidenceStore

SNAPSHOT_KINDS: Final = frozenset({"task", "configuration", "approval"})
COMPARE_BODY_LIMIT: Final = 1 << 20
MAX_DEPTH: Final = 32
MAX_CHANGES: Final = 200
PREVIEW_BYTES: Final = 512
_READ_PAGE: Final = 262_144


def find_entry(store: EvidenceStore, run_id: str, entry_id: str) -> dict[str, Any]:
    """The latest revision of one recorded entry of the run (``content_not_found`` if none)."""
    page = store.entries(run_id, entry=entry_id, limit=1)
    if not page["entries"]:
        raise EvidenceContentNotFound("the run records no entry with this id")
    entry: dict[str, Any] = page["entries"][0]
    return entry


def links(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``EntryLinks``: the entry's recorded graph links (or ``no_recorded_graph_link``)."""
    return store.links(values["run"], values["entry"])


# ---- compare ---------------------------------------------------------------------------


def compare(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``SnapshotComparison`` of two recorded task, configuration or approval entries."""
    left = find_entry(store, values["run"], values["left"])
    right = find_entry(store, values["right_run"] or values["run"], values["right"])
    for side in (left, right):
        if side["kind"] not in SNAPSHOT_KINDS:
            raise EvidenceInvalidArgument(
                "compare reads task, configuration or approval snapshots",
                details={"field": "left" if side is left else "right"},
            )
    body: dict[str, Any] = {
        "schema_version": SCHEMA,
        "scope": "recorded_values",
        "left": left,
        "right": right,
        "changes": [],
        "has_more": False,
    }
    documents = []
    for side in (left, right):
        document, reason = _snapshot(store, side)
        if reason is not None:
            return {**body, "status": "unknown", "reason": reason}
        documents.append(document)
    changes: list[dict[str, Any]] = []
    more = _diff(documents[0], documents[1], "", 0, changes)
    body.update(changes=changes, has_more=more, status="different" if changes else "same")
    return body


def _snapshot(store: EvidenceStore, entry: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The comparable document ``{"content": …, "status": …}`` of an entry, or why not."""
    content = entry["content"]
    if content.get("state") != "stored" or "ref" not in content:
        return {}, "content_not_recorded"
    if content.get("bytes") is None or content["bytes"] > COMPARE_BODY_LIMIT:
        return {}, "comparison_content_limit"
    text = read_all(store, entry["run_id"], content["ref"])
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    document: dict[str, Any] = {"content": value}
    if "status" in entry:
        document["status"] = entry["status"]
    return document, None


def read_all(store: EvidenceStore, run_id: str, ref: str) -> str:
    """A whole stored body, read in verified pages."""
    parts: list[str] = []
    offset = 0
    while True:
        page = store.content(run_id, ref, offset=offset, limit=_READ_PAGE)
        parts.append(page["content"])
        if not page["has_more"]:
            return "".join(parts)
        if page["next_offset"] <= offset:
            raise EvidenceReadFailed("a stored body did not page forward", details={"ref": ref})
        offset = page["next_offset"]


_ABSENT: Final = object()


def _diff(before: Any, after: Any, path: str, depth: int, out: list[dict[str, Any]]) -> bool:
    """Append the differences of two JSON values to ``out``; true when some were left out."""
    if before is after or (type(before) is type(after) and before == after):
        return False
    if depth < MAX_DEPTH and isinstance(before, dict) and isinstance(after, dict):
        more = False
        for key in sorted(set(before) | set(after)):
            step = f"{path}/{_escape(key)}"
            more |= _diff(before.get(key, _ABSENT), after.get(key, _ABSENT), step, depth + 1, out)
        return more
    if depth < MAX_DEPTH and isinstance(before, list) and isinstance(after, list):
        more = False
        for index in range(max(len(before), len(after))):
            old = before[index] if index < len(before) else _ABSENT
            new = after[index] if index < len(after) else _ABSENT
            more |= _diff(old, new, f"{path}/{index}", depth + 1, out)
        return more
    if len(out) >= MAX_CHANGES:
        return True
    out.append({"path": path, "before": snapshot_value(before), "after": snapshot_value(after)})
    return False


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def snapshot_value(value: Any) -> dict[str, Any]:
    """A ``SnapshotValue``: presence, a UTF-8-safe preview and the full value's digest."""
    if value is _ABSENT:
        return {"present": False, "truncated": False}
    data = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    preview = data[:PREVIEW_BYTES].decode("utf-8", errors="ignore")
    return {
        "present": True,
        "preview": preview,
        "truncated": len(data) > PREVIEW_BYTES,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


# ---- dashboard -------------------------------------------------------------------------


def search_source(entry: dict[str, Any]) -> dict[str, Any]:
    """The ``SearchSource`` of one entry (the comparison records' ``evidence``)."""
    return entry_source(entry)


def search_sources(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``SearchSourcePage``: the staged catalog of :mod:`._catalog`."""
    return store.read_with(
        lambda conn, codec, _objects: search_page(
            conn, codec, values["run"], values["harness"], values["session"], values["cursor"]
        )
    )


def artifact(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``ArtifactPage`` of any node the routes hand out (see :mod:`._artifact`)."""
    return store.read_with(
        lambda conn, _codec, objects: artifact_page(
            conn,
            objects,
            values["run"],
            values["node"],
            values["mode"],
            values["offset"],
            values["limit"],
        )
    )
