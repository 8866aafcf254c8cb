"""Runtime evidence: process observations, their correlation to tool calls, and coverage.

Braid's workers observe processes through psutil (pid, ppid, argv, start time, and the run
the process was started for); :func:`record` stores each observation as a runtime event
(argv redacted). There is no kernel sensor, so ``kernel_state`` is ``unavailable`` and node
counters are null; a run whose capture was never recorded reports ``legacy_not_recorded``,
one whose capture was switched off ``disabled`` — never ``ok``.

:func:`correlate` is ``agentprov.command_time_process/v2`` (confidence tier 0.8, not a
calibrated probability). Eligible calls are the run's current-execution tool calls whose
input names a command; each has a window from its ``recorded_at`` to its result's (or
:data:`OPEN_WINDOW` when no result), widened by :data:`SLACK`; a call without a timestamp is
``unclocked``. Each exec event, in start order, matches the calls whose window holds its
start and whose command equals the event's (after unwrapping ``sh -c`` style wrappers) or is
contained in it: one call is a match and publishes an edge, several are ``ambiguous``
(no edge), none falls back to the parent process: a child of a matched exec inside that
call's window is ``inherited`` (counted in ``matched_execs``). Events without a run scope (or
another run's) are ``unknown_scope``; events without pid, start or argv are ``invalid``.
Each pass replaces the run's edges and saves its report as an object (``ref``).
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument
from braid_actors.model import canonical_json, digest, format_time, parse_time

from ._links import rebuild_runtime_links
from ._paging import check_run
from ._schema import ENTRY_IDS

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Iterable

    from ._objects import ObjectStore
    from ._redact import Redactor

METHOD: Final = "agentprov.command_time_process/v2"
CONFIDENCE: Final = 0.8
SLACK: Final = timedelta(seconds=2)
OPEN_WINDOW: Final = timedelta(minutes=10)
MAX_CALLS: Final = 10_000
MAX_EVENTS: Final = 100_000
MAX_GAPS: Final = 25
_SHELLS: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})


@attrs.frozen
class ProcessObservation:
    """One observed process."""

    pid: int | None
    ppid: int | None
    argv: tuple[str, ...]
    started_at: datetime | None
    """Process start time (aware, UTC)."""
    run_id: str | None = None
    """The run the process declared (null: unknown scope)."""
    event_type: str = "exec"
    source: str = "braid_worker"
    session_id: str | None = None
    harness: str | None = None


def set_capture(conn: sqlite3.Connection, run_id: str, state: str, now: str) -> None:
    """Record that runtime capture is ``enabled`` or ``disabled`` for a run."""
    conn.execute(
        "INSERT OR IGNORE INTO runs(run_id, created_at, entry_ids) VALUES (?, ?, ?)",
        (run_id, now, ENTRY_IDS),
    )
    if state == "enabled":
        conn.execute(
            "UPDATE runs SET runtime_capture='enabled', runtime_started_at="
            "COALESCE(runtime_started_at, ?) WHERE run_id=?",
            (now, run_id),
        )
    else:
        conn.execute("UPDATE runs SET runtime_capture=? WHERE run_id=?", (state, run_id))


def end_capture(conn: sqlite3.Connection, run_id: str, now: str) -> None:
    conn.execute("UPDATE runs SET runtime_ended_at=? WHERE run_id=?", (now, run_id))


def record(
    conn: sqlite3.Connection,
    redactor: Redactor,
    run_id: str,
    observations: Iterable[ProcessObservation],
    now: str,
) -> int:
    """Store observations as runtime events; returns how many were new."""
    row = conn.execute("SELECT runtime_capture FROM runs WHERE run_id=?", (run_id,)).fetchone()
    if row is not None and row["runtime_capture"] == "disabled":
        raise EvidenceInvalidArgument(
            "runtime capture is disabled for this run", details={"field": "run"}
        )
    set_capture(conn, run_id, "enabled", now)
    added = 0
    for obs in observations:
        argv = [redactor.clean(str(arg)) for arg in obs.argv]
        started = format_time(obs.started_at) if obs.started_at is not None else None
        event_id = "rt_" + digest([run_id, obs.pid, started, argv, obs.event_type])[7:31]
        cursor = conn.execute(
            "INSERT OR IGNORE INTO runtime_events(event_id, run_id, source, type, pid, ppid, "
            "argv, started_at, observed_run, session_id, harness, created_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                event_id,
                run_id,
                obs.source,
                obs.event_type,
                obs.pid,
                obs.ppid,
                json.dumps(argv, ensure_ascii=False),
                started,
                obs.run_id,
                redactor.clean(obs.session_id) if obs.session_id else None,
                obs.harness,
                now,
            ),
        )
        added += cursor.rowcount
    return added


# ---- correlation -----------------------------------------------------------------------


@attrs.frozen
class _Call:
    entry_id: str
    tool_call_id: str | None
    session_id: str
    harness: str
    command: str
    start: datetime
    end: datetime


def correlate(
    conn: sqlite3.Connection, objects: ObjectStore, run_id: str, now: str
) -> dict[str, Any]:
    """Run one correlation pass and return its ``RuntimeCorrelationReport``."""
    run_id = check_run(conn, run_id)
    report: dict[str, Any] = {
        "schema_version": "agentprovenance.runtime_correlation/v1",
        "run_id": run_id,
        "method": METHOD,
        "confidence": CONFIDENCE,
        "status": "no_input",
        "input_complete": False,
        "observed_at": now,
        "tool_calls": 0,
        "unclocked_calls": 0,
        "runtime_events": 0,
        "exec_events": 0,
        "matched_execs": 0,
        "inherited_execs": 0,
        "ambiguous_execs": 0,
        "unknown_scope_events": 0,
        "invalid_events": 0,
        "edges": 0,
        "issues": [],
    }
    capture = conn.execute("SELECT runtime_capture FROM runs WHERE run_id=?", (run_id,)).fetchone()
    state = capture["runtime_capture"] if capture else None
    if state != "enabled":
        report["issues"] = [
            "runtime_capture_disabled" if state == "disabled" else "runtime_capture_not_recorded"
        ]
        return _save(conn, objects, run_id, report, [])
    calls, read_calls, unclocked, calls_complete = _calls(conn, objects, run_id)
    report["tool_calls"] = read_calls
    report["unclocked_calls"] = unclocked
    events = conn.execute(
        "SELECT * FROM runtime_events WHERE run_id=? ORDER BY started_at, pk LIMIT ?",
        (run_id, MAX_EVENTS + 1),
    ).fetchall()
    events_complete = len(events) <= MAX_EVENTS
    events = events[:MAX_EVENTS]
    report["input_complete"] = calls_complete and events_complete
    report["runtime_events"] = len(events)
    edges: list[tuple[str, _Call, bool]] = []
    matched_pids: dict[int, tuple[datetime, _Call]] = {}
    for event in events:
        argv = json.loads(event["argv"] or "[]")
        started = _time(event["started_at"])
        if event["pid"] is None or started is None or not argv:
            report["invalid_events"] += 1
            continue
        if event["observed_run"] != run_id:
            report["unknown_scope_events"] += 1
            continue
        if event["type"] != "exec":
            continue
        report["exec_events"] += 1
        command = _event_command(argv)
        hits = [
            c for c in calls if c.start - SLACK <= started <= c.end + SLACK and _same(c, command)
        ]
        if len(hits) > 1:
            report["ambiguous_execs"] += 1
            continue
        if hits:
            edges.append((event["event_id"], hits[0], False))
            matched_pids[event["pid"]] = (started, hits[0])
            continue
        parent = matched_pids.get(event["ppid"]) if event["ppid"] is not None else None
        if parent is not None and parent[0] <= started <= parent[1].end + SLACK:
            edges.append((event["event_id"], parent[1], True))
            matched_pids[event["pid"]] = (started, parent[1])
            report["inherited_execs"] += 1
    report["matched_execs"] = len(edges)
    report["edges"] = len(edges)
    if not events:
        report["status"] = "no_input"
    elif not report["exec_events"]:
        report["status"] = "empty"
    elif report["ambiguous_execs"] and not edges:
        report["status"] = "ambiguous"
    elif (
        len(edges) == report["exec_events"]
        and not report["invalid_events"]
        and not report["unknown_scope_events"]
        and report["input_complete"]
    ):
        report["status"] = "ok"
    else:
        report["status"] = "partial"
    if not report["input_complete"]:
        report["issues"].append("input_scan_limit")
    return _save(conn, objects, run_id, report, edges)


def _save(
    conn: sqlite3.Connection,
    objects: ObjectStore,
    run_id: str,
    report: dict[str, Any],
    edges: list[tuple[str, _Call, bool]],
) -> dict[str, Any]:
    ref = objects.put(canonical_json(report))
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "INSERT OR IGNORE INTO objects(ref, bytes, media_type, redacted) VALUES (?,?,?,0)",
            (ref, len(canonical_json(report)), "application/json"),
        )
        conn.execute("DELETE FROM runtime_edges WHERE run_id=?", (run_id,))
        conn.execute("UPDATE runtime_events SET tool_call_id=NULL WHERE run_id=?", (run_id,))
        for event_id, call, inherited in edges:
            conn.execute(
                "INSERT INTO runtime_edges(run_id, event_id, entry_id, tool_call_id, inherited, "
                "pass_ref) VALUES (?,?,?,?,?,?)",
                (run_id, event_id, call.entry_id, call.tool_call_id, int(inherited), ref),
            )
            conn.execute(
                "UPDATE runtime_events SET tool_call_id=?, session_id=COALESCE(session_id, ?), "
                "harness=COALESCE(harness, ?) WHERE event_id=?",
                (call.tool_call_id or call.entry_id, call.session_id, call.harness, event_id),
            )
        rebuild_runtime_links(conn, run_id)
        conn.execute(
            "INSERT INTO runtime_reports(run_id, observed_at, ref, body) VALUES (?,?,?,?)",
            (run_id, report["observed_at"], ref, canonical_json(report).decode("utf-8")),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {**report, "ref": ref}


def _calls(
    conn: sqlite3.Connection, objects: ObjectStore, run_id: str
) -> tuple[list[_Call], int, int, bool]:
    rows = conn.execute(
        "SELECT e.id, e.tool_call_id, e.content_ref, e.body, s.session_id, s.harness "
        "FROM entries e JOIN sources s ON s.pk = e.source_pk WHERE e.run_id=? AND e.latest=1 AND "
        "e.kind='tool_call' AND e.scope='current_execution' ORDER BY e.pk LIMIT ?",
        (run_id, MAX_CALLS + 1),
    ).fetchall()
    complete = len(rows) <= MAX_CALLS
    rows = rows[:MAX_CALLS]
    ends: dict[str, datetime] = {}
    for result in conn.execute(
        "SELECT tool_call_id, body FROM entries WHERE run_id=? AND latest=1 AND kind='tool_result' "
        "AND tool_call_id IS NOT NULL",
        (run_id,),
    ):
        moment = _time(json.loads(result["body"]).get("recorded_at"))
        if moment is not None:
            ends[result["tool_call_id"]] = moment
    calls: list[_Call] = []
    unclocked = 0
    for row in rows:
        body = json.loads(row["body"])
        start = _time(body.get("recorded_at"))
        if start is None:
            unclocked += 1
            continue
        command = _call_command(objects, row["content_ref"])
        if not command:
            continue
        end = ends.get(row["tool_call_id"] or "", start + OPEN_WINDOW)
        calls.append(
            _Call(
                row["id"],
                row["tool_call_id"],
                row["session_id"],
                row["harness"],
                command,
                start,
                max(end, start),
            )
        )
    return calls, len(rows), unclocked, complete


def _call_command(objects: ObjectStore, ref: str | None) -> str | None:
    if ref is None:
        return None
    try:
        value = json.loads(objects.get(ref))
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    command = value.get("command", value.get("cmd"))
    if isinstance(command, list) and all(isinstance(a, str) for a in command):
        return _normal(_event_command(command))
    return _normal(command) if isinstance(command, str) else None


def _event_command(argv: list[str]) -> str:
    if len(argv) >= 3 and os.path.basename(argv[0]) in _SHELLS:
        rest = argv[1:]
        script = False
        while rest and rest[0].startswith("-"):
            flag = rest.pop(0)
            script = script or "c" in flag[1:]
        if script and rest:
            return _normal(rest[0])
    return _normal(shlex.join(argv))


def _same(call: _Call, command: str) -> bool:
    return bool(command) and (command == call.command or call.command in command)


def _normal(text: str) -> str:
    return " ".join(text.split())


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


# ---- coverage --------------------------------------------------------------------------


def coverage(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    """The run's ``RuntimeCoverage`` (capture diagnostics and stored-event scope fields)."""
    run = conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
    state = run["runtime_capture"] if run is not None else None
    events = conn.execute(
        "SELECT * FROM runtime_events WHERE run_id=? ORDER BY pk", (run_id,)
    ).fetchall()
    capture: dict[str, Any] = {
        "schema_version": "agentprovenance.runtime_capture/v1",
        "run_id": run_id,
        "status": "legacy_not_recorded",
        "scope": "unknown",
        "kernel_state": "unknown",
        "node_counter_delta": None,
        "node_pending_events": None,
        "node_queued_bytes": None,
        "run_dropped_events": None,
        "run_impact": "unknown",
        "issues": [],
        "limitations": ["process_observation_only", "no_kernel_sensor"],
    }
    if state == "disabled":
        capture.update(status="disabled", kernel_state="disabled")
    elif state == "enabled":
        capture.update(scope="node_capture_during_run", kernel_state="unavailable")
        capture["status"] = "ok" if events else "no_input"
        for key, column in (("started_at", "runtime_started_at"), ("ended_at", "runtime_ended_at")):
            if run[column]:
                capture[key] = run[column]
    summary, missing, by_source, by_type, gaps = _scope_fields(events)
    correlation: dict[str, Any] = {
        "schema_version": "agentprovenance.observability_coverage/v1",
        "run_id": run_id,
        "result_set_id": "rs_" + digest([e["event_id"] for e in events])[7:31],
        "summary": summary,
        "missing_fields": missing,
        "by_source": by_source,
        "by_type": by_type,
        "next_steps": _next_steps(state, summary),
        "gaps": gaps,
    }
    correlation["page_hash"] = digest(correlation)
    return {
        "schema_version": "agentprovenance.runtime_coverage/v1",
        "run_id": run_id,
        "capture": capture,
        "correlation": correlation,
    }


def _scope_fields(
    events: list[sqlite3.Row],
) -> tuple[dict[str, Any], dict[str, int], dict[str, int], dict[str, int], list[dict[str, Any]]]:
    total = len(events)
    missing = {"session": 0, "tool_call": 0, "process": 0}
    by_source: dict[str, int] = {}
    by_type: dict[str, int] = {}
    full = 0
    gaps: list[dict[str, Any]] = []
    for event in events:
        by_source[event["source"]] = by_source.get(event["source"], 0) + 1
        by_type[event["type"]] = by_type.get(event["type"], 0) + 1
        absent = [
            name
            for name, present in (
                ("session", event["session_id"]),
                ("tool_call", event["tool_call_id"]),
                ("process", event["pid"] is not None and event["started_at"]),
            )
            if not present
        ]
        for name in absent:
            missing[name] += 1
        if not absent:
            full += 1
        elif len(gaps) < MAX_GAPS:
            gap: dict[str, Any] = {
                "event_id": event["event_id"],
                "source": event["source"],
                "type": event["type"],
                "missing": absent,
                "correlation_method": METHOD,
                "correlation_confidence": CONFIDENCE if event["tool_call_id"] else 0.0,
                "created_at": event["created_at"],
                "suggested_binding": "tool_call" if "tool_call" in absent else "session",
            }
            for key in ("pid", "ppid"):
                if event[key] is not None:
                    gap[key] = event[key]
            gaps.append(gap)

    def ratio(count: int) -> float:
        return count / total if total else 0.0

    summary = {
        "runtime_events": total,
        "fully_correlated": full,
        "missing_session": missing["session"],
        "missing_tool_call": missing["tool_call"],
        "missing_process": missing["process"],
        "fully_correlated_ratio": ratio(full),
        "tool_call_coverage_ratio": ratio(total - missing["tool_call"]),
        "process_coverage_ratio": ratio(total - missing["process"]),
        "correlation_gap_count": total - full,
    }
    return summary, missing, by_source, by_type, gaps


def _next_steps(state: str | None, summary: dict[str, Any]) -> list[str]:
    if state is None:
        return ["runtime capture was not recorded for this run"]
    if state == "disabled":
        return ["runtime capture was disabled for this run"]
    if not summary["runtime_events"]:
        return ["no runtime events were stored for this run"]
    if summary["missing_tool_call"]:
        return ["run a correlation pass to attribute events to tool calls"]
    return []


def now_text() -> str:
    return format_time(datetime.now(UTC))
