"""Coverage reports (the spec's ``Coverage``) and their counting rules.

Counts describe one source in one processing range (the current range, or the retained prior
context before the resume boundary). Line counts:

- ``discovered``: non-blank physical lines of the file in the range (an incomplete last line
  included), whatever session they belong to;
- ``matched``: those attributed to this source (its session);
- ``read``: matched complete lines; ``deferred``: a matched incomplete last line, left for the
  next ingest (the cursor stops before it);
- ``failed``: read lines that are not JSON objects (an issue names the line, never its body);
- ``parsed``: read lines that decoded; ``unrecognized``: parsed lines of an unknown record
  type (counted and reported, never fatal and never silently dropped).

Entry counts: ``stored`` (new entries or new revisions written by this pass), ``duplicates``
(entries already stored unchanged), ``truncated`` (entries whose body exceeded the object
limit). A null count means not known; zero means observed zero.

Status: ``empty`` when the current range has no matched line; ``failed`` when lines were read
and none decoded; ``partial`` when any issue was reported in either range; otherwise ``ok``.
Omissions configured by the capture policy never make a report partial.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, Final

import attrs

from braid_actors.model import digest, parse_time

from ._materialize import SCHEMA
from ._parsed import CHANGE_HISTORY, CHECKED_FIELDS

COUNT_KEYS: Final = (
    "discovered",
    "matched",
    "read",
    "parsed",
    "stored",
    "duplicates",
    "truncated",
    "failed",
    "unrecognized",
    "deferred",
)
MAX_ISSUES: Final = 64


def zero_counts() -> dict[str, int | None]:
    return dict.fromkeys(COUNT_KEYS, 0)


def unknown_counts(**known: int) -> dict[str, int | None]:
    counts: dict[str, int | None] = dict.fromkeys(COUNT_KEYS, None)
    counts.update(known)
    return counts


@attrs.define(eq=False)
class Tally:
    """What one range of one source held."""

    counts: dict[str, int | None] = attrs.Factory(zero_counts)
    first_line: int | None = None
    last_line: int | None = None
    started: tuple[datetime, str] | None = None
    ended: tuple[datetime, str] | None = None
    present: set[str] = attrs.Factory(set)
    issues: list[dict[str, Any]] = attrs.Factory(list)

    def add(self, key: str, amount: int = 1) -> None:
        self.counts[key] = (self.counts[key] or 0) + amount

    def line(self, number: int, timestamp: str | None) -> None:
        self.first_line = number if self.first_line is None else min(self.first_line, number)
        self.last_line = number if self.last_line is None else max(self.last_line, number)
        if timestamp:
            try:
                moment = parse_time(timestamp)
            except ValueError:
                return
            if self.started is None or moment < self.started[0]:
                self.started = (moment, timestamp)
            if self.ended is None or moment > self.ended[0]:
                self.ended = (moment, timestamp)

    def missing_fields(self) -> list[str]:
        return [f for f in CHECKED_FIELDS if f not in self.present] + [CHANGE_HISTORY]

    def span(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.started:
            body["started_at"] = self.started[1]
        if self.ended:
            body["ended_at"] = self.ended[1]
        if self.first_line is not None:
            body["first_line"] = self.first_line
        if self.last_line is not None:
            body["last_line"] = self.last_line
        return body


def decide_status(current: Tally, issues: int) -> str:
    counts = current.counts
    if not counts.get("matched"):
        return "empty"
    if (counts.get("read") or 0) > 0 and not counts.get("parsed"):
        return "failed"
    return "partial" if issues else "ok"


def bounded(issues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most :data:`MAX_ISSUES`, the last one saying the list was cut."""
    if len(issues) <= MAX_ISSUES:
        return issues
    return [*issues[: MAX_ISSUES - 1], {"code": "issue_limit"}]


def coverage_report(
    *,
    run_id: str,
    source: dict[str, Any],
    observed_at: str,
    current: Tally,
    prior: Tally | None,
    policy: dict[str, Any] | None,
    omissions: dict[str, int],
    last_success_at: str | None,
    status: str | None = None,
    missing_fields: list[str] | None = None,
) -> dict[str, Any]:
    """One ``Coverage`` object (``status`` and ``missing_fields`` computed unless given)."""
    issues = list(current.issues) + (list(prior.issues) if prior else [])
    decided = status or decide_status(current, len(issues))
    body: dict[str, Any] = {
        "schema_version": SCHEMA,
        "id": "cov_" + secrets.token_hex(12),
        "run_id": run_id,
        "source": source,
        "status": decided,
        "observed_at": observed_at,
        **current.span(),
        "counts": dict(current.counts),
        "issues": bounded(issues),
        "missing_fields": current.missing_fields() if missing_fields is None else missing_fields,
    }
    if decided in ("ok", "partial", "empty"):
        body["last_success_at"] = observed_at
    elif last_success_at:
        body["last_success_at"] = last_success_at
    if prior is not None:
        body["prior_context"] = {
            "first_line": prior.first_line or 1,
            "last_line": prior.last_line or 0,
            **{k: v for k, v in prior.span().items() if k in ("started_at", "ended_at")},
            "counts": dict(prior.counts),
            "missing_fields": prior.missing_fields(),
        }
    if policy is not None:
        body["capture_policy"] = policy
    listed = [
        {"category": category, "reason": "capture_policy", "records": count}
        for category, count in sorted(omissions.items())
        if count > 0
    ]
    if listed:
        body["omissions"] = listed
    body["object_hash"] = digest({k: v for k, v in body.items() if k != "object_hash"})
    return body
