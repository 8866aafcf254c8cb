"""Whole-run comparison records (``/api/compare/records``) projected from stored entries.

The catalog reads the run's latest entries in two stages, ``task`` then ``configuration``
entries, at most 50 a page (``sources_read`` counts the current-execution entries read;
retained prior context is skipped). Each entry becomes records:

- a ``task`` entry: one ``task`` record (key ``task``) whose value is the recorded prompt;
- a ``configuration`` entry: one ``configuration`` record per top-level field of its JSON
  body (key ``configuration/<field>``, at most 200 a snapshot), or one record (key
  ``configuration``) when the body is not an object.

``operation`` is the entry's recorded source status. A body that is not stored (omitted by
the capture policy, unavailable at capture) or over 1 MiB gives one record with a null value,
``partial`` true, and an issue (``content_not_recorded`` / ``comparison_content_limit``); a
snapshot over the field limit marks its records partial with ``configuration_field_limit``.
Transcripts record no file, network, outbound or access-control observations, so the first
page reports ``dimension_not_recorded`` for each of those dimensions of every source,
instead of projecting any such record. ``evidence`` is the entry's search catalog source.

``next_cursor`` is ``<stage>:<entry page cursor>``; the entry cursor is signed by the store
and bound to the run and the stage's kind, so a tampered one is ``invalid_argument``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from braid_actors.errors import EvidenceInvalidArgument

from ._http_views import read_all, search_source, snapshot_value

if TYPE_CHECKING:
    from ._store import EvidenceStore

SCHEMA: Final = "agentprovenance.comparison_records/v1"
STAGES: Final = ("task", "configuration")
PAGE_SOURCES: Final = 50
FIELD_LIMIT: Final = 200
BODY_LIMIT: Final = 1 << 20
UNRECORDED: Final = ("files", "network", "outbound", "access_control")


def _invalid(message: str, field: str) -> EvidenceInvalidArgument:
    return EvidenceInvalidArgument(message, details={"field": field})


def _decode(cursor: str | None) -> tuple[int, str | None]:
    if cursor is None:
        return 0, None
    stage, sep, inner = cursor.partition(":")
    if not sep or stage not in ("0", "1"):
        raise _invalid("the cursor is not valid", "cursor")
    return int(stage), inner or None


def compare_records(store: EvidenceStore, values: dict[str, Any]) -> dict[str, Any]:
    """One ``ComparisonPage`` (see the module docstring)."""
    for field in ("harness", "session"):
        if values.get(field) is not None:
            raise _invalid("comparison records cover the whole run, not one session", field)
    run_id = values["run"]
    stage, inner = _decode(values["cursor"])
    page = store.entries(run_id, kind=STAGES[stage], cursor=inner, limit=PAGE_SOURCES)
    records: list[dict[str, Any]] = []
    issues: list[dict[str, Any]] = []
    read = 0
    for entry in page["entries"]:
        if entry.get("execution_scope") == "prior_context":
            continue
        read += 1
        _project(store, entry, records, issues)
    body: dict[str, Any] = {
        "schema_version": SCHEMA,
        "run_id": page["run_id"],
        "records": records,
        "issues": issues,
        "sources_read": read,
        "has_more": False,
    }
    if page["has_more"]:
        body.update(has_more=True, next_cursor=f"{stage}:{page['next_cursor']}")
    elif stage + 1 < len(STAGES):
        body.update(has_more=True, next_cursor=f"{stage + 1}:")
    if values["cursor"] is None:
        for report in store.overview(run_id)["coverage"]:
            source = report["source"]["id"]
            issues.extend(
                {"source_id": source, "dimension": d, "code": "dimension_not_recorded"}
                for d in UNRECORDED
            )
    return body


def _record(
    entry: dict[str, Any], key: str, label: str, value: dict[str, Any] | None, partial: bool
) -> dict[str, Any]:
    return {
        "dimension": entry["kind"],
        "key": key,
        "label": label,
        "operation": entry.get("status") or "recorded",
        "comparison_scope": "observed_set",
        "value": value,
        "partial": partial,
        "evidence": search_source(entry),
    }


def _project(
    store: EvidenceStore,
    entry: dict[str, Any],
    records: list[dict[str, Any]],
    issues: list[dict[str, Any]],
) -> None:
    kind = entry["kind"]
    content = entry["content"]
    problem = None
    if content.get("state") != "stored" or "ref" not in content:
        problem = "content_not_recorded"
    elif content.get("bytes") is None or content["bytes"] > BODY_LIMIT:
        problem = "comparison_content_limit"
    if problem is not None:
        issues.append({"source_id": entry["source"]["id"], "dimension": kind, "code": problem})
        records.append(_record(entry, kind, kind, None, True))
        return
    text = read_all(store, entry["run_id"], content["ref"])
    value: Any = text
    if content.get("media_type") == "application/json":
        try:
            value = json.loads(text)
        except ValueError:
            value = text
    if kind != "configuration" or not isinstance(value, dict):
        records.append(_record(entry, kind, kind, snapshot_value(value), False))
        return
    names = sorted(value)
    limited = len(names) > FIELD_LIMIT
    if limited:
        issues.append(
            {
                "source_id": entry["source"]["id"],
                "dimension": kind,
                "code": "configuration_field_limit",
            }
        )
    for name in names[:FIELD_LIMIT]:
        key = "configuration/" + name.replace("~", "~0").replace("/", "~1")
        records.append(_record(entry, key, name, snapshot_value(value[name]), limited))
