"""Files no parser reads: missing, unreadable, empty, unknown or unsupported (Gemini CLI).

Each still gets a source and a coverage report, never ``ok``: ``no_input`` for a missing
file (counts other than ``discovered`` unknown), ``failed`` for an unreadable one or an
unknown or unsupported format (with ``unknown_format`` / ``unsupported_format``), ``empty``
for a file with no line. The caller holds the pass's transaction.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from ._coverage import Tally, coverage_report, unknown_counts, zero_counts
from ._materialize import source_id
from ._rows import IngestReport, Rows, SourceReport, ensure_run

if TYPE_CHECKING:
    from ._parsed import LineSplit
    from ._policy import CapturePolicy

PARSER_VERSION: Final = "braid.unsupported/1"


def unparsed(
    rows: Rows,
    run_id: str,
    path_key: str,
    stem: str,
    harness: str | None,
    policy: CapturePolicy,
    reason: str,
) -> IngestReport:
    name = harness or "unknown"
    tally = Tally(counts=unknown_counts(discovered=0))
    if reason == "unreadable":
        tally.issues.append({"code": "source_unreadable"})
    status = "no_input" if reason == "no_input" else "failed"
    return _single(rows, run_id, path_key, stem, name, None, policy, tally, status)


def unsupported(
    rows: Rows,
    run_id: str,
    path_key: str,
    stem: str,
    detected: str | None,
    policy: CapturePolicy,
    split: LineSplit,
    data: bytes,
) -> IngestReport:
    name = detected or "unknown"
    tally = Tally(counts=zero_counts())
    if detected == "gemini_cli":
        document = json.loads(data)
        session = str(document.get("sessionId") or stem)
        for key in ("discovered", "matched", "read", "parsed", "unrecognized"):
            tally.add(key)
        tally.issues.append({"code": "unsupported_format"})
        return _single(
            rows, run_id, path_key, session, name, "gemini_cli.chat_json", policy, tally, "failed"
        )
    for line in split.lines:
        for key in ("discovered", "matched", "read"):
            tally.add(key)
        tally.add("failed" if line.obj is None else "parsed")
        if line.obj is not None:
            tally.add("unrecognized")
    if split.deferred is not None:
        for key in ("discovered", "matched", "deferred"):
            tally.add(key)
    if not tally.counts["matched"]:
        return _single(rows, run_id, path_key, stem, name, None, policy, tally, "empty")
    tally.issues.append({"code": "unknown_format"})
    return _single(rows, run_id, path_key, stem, name, None, policy, tally, "failed")


def _single(
    rows: Rows,
    run_id: str,
    path_key: str,
    session: str,
    harness: str,
    format_version: str | None,
    policy: CapturePolicy,
    tally: Tally,
    status: str,
) -> IngestReport:
    clean = rows.redactor.clean
    session_id = clean(session)
    source: dict[str, Any] = {
        "id": source_id(run_id, harness, path_key, session_id),
        "harness": harness,
        "channel": "transcript",
        "session_id": session_id,
        "path": clean(path_key),
        "parser_version": PARSER_VERSION,
        "binding": "explicit",
        "binding_evidence": ["caller_run_id"],
    }
    if format_version:
        source["format_version"] = format_version
    ensure_run(rows.conn, run_id, policy, rows.now)
    rows.put_source(run_id, path_key, source)
    report = coverage_report(
        run_id=run_id,
        source=source,
        observed_at=rows.now,
        current=tally,
        prior=None,
        policy=policy.to_wire(),
        omissions={},
        last_success_at=rows.last_success(run_id, source["id"]),
        status=status,
        missing_fields=[],
    )
    rows.put_coverage(run_id, report)
    return IngestReport(run_id, path_key, harness, (SourceReport(report, {}),))
