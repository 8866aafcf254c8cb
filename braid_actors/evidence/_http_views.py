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

from ._materialize import SCHEMA

if TYPE_CHECKING:
    from ._store import EvidenceStore

SNAPSHOT_KINDS: Final = frozenset({"task", "configuration", "approval"})
COMPARE_BODY_LIMIT: Final = 1 << 20
MAX_DEPTH: Final = 32
MAX_CHANGES: Final = 200
PREVIEW_BYTES: Final = 512
_READ_PAGE: Final = 262_144
_CATEGORY: Final = {
    "message": "messages",
    "tool_call": "tools",
    "tool_result": "tools",
    "task": "configuration",
    "configuration": "configuration",
    "approval": "configuration",
    "session": "configuration",
}


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


def search_sources(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``SearchSourcePage`` of the run's latest context entries (50 a page).

    Only the context-revision stage is catalogued: the store keeps no artifact versions, and
    its runtime records have no reader here, so the catalog ends after the entries.
    """
    run_id, harness, session = values["run"], values["harness"], values["session"]
    if (harness is None) != (session is None):
        raise EvidenceInvalidArgument(
            "session scope needs both harness and session",
            details={"field": "session" if session is None else "harness"},
        )
    if harness is not None:
        # Raises content_not_found when the native session does not occur in the run.
        store.session_relations(run_id, harness=harness, session=session, limit=1)
    page = store.entries(
        run_id, harness=harness, session=session, cursor=values["cursor"], limit=50
    )
    body: dict[str, Any] = {
        "schema_version": "agentprovenance.search_sources/v1",
        "run_id": page["run_id"],
        "sources": [search_source(entry) for entry in page["entries"]],
        "has_more": page["has_more"],
    }
    if harness is not None:
        body.update(harness=harness, session_id=session)
    if "next_cursor" in page:
        body["next_cursor"] = page["next_cursor"]
    return body


def search_source(entry: dict[str, Any]) -> dict[str, Any]:
    source = entry["source"]
    label = " ".join(
        str(part) for part in (entry["kind"], entry.get("tool_name") or entry.get("role")) if part
    )
    item: dict[str, Any] = {
        "id": f"entry:{entry['id']}",
        "category": _CATEGORY[entry["kind"]],
        "kind": entry["kind"],
        "label": label,
        "source_id": source["id"],
        "harness": source["harness"],
        "session_id": source["session_id"],
        "entry": entry,
        "content": entry["content"],
    }
    if "ref" in entry["content"]:
        item["node"] = entry["content"]["ref"]
    for field in ("agent_id", "tool_call_id", "recorded_at", "execution_scope"):
        if field in entry:
            item[field] = entry[field]
    return item


def artifact(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """``ArtifactPage`` of a stored object the run cites; other nodes are ``unavailable``."""
    run_id, node, offset = values["run"], values["node"], values["offset"]
    base: dict[str, Any] = {
        "schema_version": "agentprovenance.artifact_page/v1",
        "mode": values["mode"],
        "offset": offset,
    }
    try:
        page = store.content(run_id, node, offset=offset, limit=values["limit"])
    except EvidenceInvalidArgument as exc:
        if exc.details.get("field") != "ref":
            raise
        page = None
    except EvidenceContentNotFound:
        page = None
    if page is None:
        store.overview(run_id)  # an unknown run is refused, not reported as unavailable
        return {
            **base,
            "kind": "unavailable",
            "content_state": "unavailable",
            "reason": "node_not_recorded",
            "size": 0,
            "truncated": False,
            "redacted": False,
            "next_offset": offset,
            "total_bytes": None,
            "has_more": False,
        }
    body = {
        **base,
        "kind": "text",
        "ref": page["ref"],
        "source": "object",
        "content_state": "stored",
        "integrity": "object_hash_verified",
        "sha256": page["sha256"],
        "size": page["total_bytes"],
        "mime": page["media_type"],
        "truncated": page["has_more"],
        "redacted": page["redacted"],
        "next_offset": page["next_offset"],
        "total_bytes": page["total_bytes"],
        "has_more": page["has_more"],
    }
    if page["content"]:
        body["content"] = page["content"]
    return body
