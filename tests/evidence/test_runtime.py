"""Runtime evidence: capture statuses, command/time/process correlation, coverage."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from braid_actors.errors import EvidenceInvalidArgument
from braid_actors.evidence import ProcessObservation
from braid_actors.evidence._schema import DB_FILE

from ._helpers import claude_line, jsonl

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore

S = "11111111-2222-3333-4444-555555555555"
RUN = "run_rt"
REPORT_KEYS = {
    "schema_version",
    "run_id",
    "method",
    "confidence",
    "status",
    "input_complete",
    "observed_at",
    "tool_calls",
    "unclocked_calls",
    "runtime_events",
    "exec_events",
    "matched_execs",
    "inherited_execs",
    "ambiguous_execs",
    "unknown_scope_events",
    "invalid_events",
    "edges",
}


def _at(clock: str) -> datetime:
    return datetime.fromisoformat(f"2026-01-01T{clock}+00:00").astimezone(UTC)


def _call(n: int, command: str, start: str | None, end: str) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": command}}
    call = claude_line(
        S,
        "assistant",
        [use],
        uuid=f"a{n}",
        message_id=f"msg_{n}",
        timestamp=start and f"2026-01-01T{start}.000Z",
    )
    result = claude_line(
        S,
        "user",
        [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "done"}],
        uuid=f"r{n}",
        timestamp=f"2026-01-01T{end}.000Z",
    )
    return [call, result]


def _transcript(tmp_path: Path) -> Path:
    records = [claude_line(S, "user", "build it", uuid="u0")]
    records += _call(1, "make test", "10:00:00", "10:00:30")
    records += _call(2, "ls -la", "10:01:00", "10:01:05")
    records += _call(3, "echo hi", "10:02:00", "10:02:10")
    records += _call(4, "echo hi", "10:02:01", "10:02:11")
    records += _call(5, "date", None, "10:03:00")
    return jsonl(tmp_path / "s.jsonl", records)


def _observations() -> list[ProcessObservation]:
    return [
        ProcessObservation(
            100, 1, ("/bin/bash", "-c", "-l", "make test"), _at("10:00:01"), run_id=RUN
        ),
        ProcessObservation(101, 100, ("cc", "-o", "x", "x.c"), _at("10:00:05"), run_id=RUN),
        ProcessObservation(200, 1, ("ls", "-la"), _at("10:01:01"), run_id=RUN),
        ProcessObservation(300, 1, ("sh", "-c", "echo hi"), _at("10:02:05"), run_id=RUN),
        ProcessObservation(400, 1, ("python3", "x.py"), _at("10:05:00"), run_id=RUN),
        ProcessObservation(500, 1, ("make", "test"), _at("10:00:02"), run_id=None),
        ProcessObservation(None, None, ("ghost",), _at("10:00:03"), run_id=RUN),
    ]


def test_no_recorded_capture_is_legacy_not_recorded(store: EvidenceStore, tmp_path: Path) -> None:
    """No capture record is legacy_not_recorded, and correlation is no_input."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    capture = store.overview(RUN)["runtime_coverage"]["capture"]
    assert capture["status"] == "legacy_not_recorded"
    assert capture["run_dropped_events"] is None and capture["node_counter_delta"] is None
    report = store.correlate(RUN)
    assert set(report) >= REPORT_KEYS
    assert report["status"] == "no_input" and report["issues"] == ["runtime_capture_not_recorded"]
    assert report["method"] == "agentprov.command_time_process/v2" and report["confidence"] == 0.8


def test_disabled_capture_says_so(store: EvidenceStore, tmp_path: Path) -> None:
    """Disabled capture says disabled, refuses events and never reports ok."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    store.disable_runtime_capture(RUN)
    coverage = store.runtime_coverage(RUN)
    assert coverage["capture"]["status"] == "disabled"
    assert coverage["capture"]["kernel_state"] == "disabled"
    with pytest.raises(EvidenceInvalidArgument):
        store.record_runtime(RUN, _observations())
    report = store.correlate(RUN)
    assert report["status"] == "no_input" and report["issues"] == ["runtime_capture_disabled"]


def test_enabled_capture_without_events_is_no_input(store: EvidenceStore, tmp_path: Path) -> None:
    """Capture that ran but stored nothing is no_input, not ok."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    store.begin_runtime_capture(RUN)
    assert store.runtime_coverage(RUN)["capture"]["status"] == "no_input"
    assert store.correlate(RUN)["status"] == "no_input"


def test_command_time_process_correlation(store: EvidenceStore, tmp_path: Path) -> None:
    """Execs match by command and window, children inherit, overlaps are ambiguous."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    store.begin_runtime_capture(RUN)
    assert store.record_runtime(RUN, _observations()) == 7
    assert store.record_runtime(RUN, _observations()) == 0
    report = store.correlate(RUN)
    assert set(report) == REPORT_KEYS | {"issues", "ref"}
    expected = {
        "status": "partial",
        "input_complete": True,
        "tool_calls": 5,
        "unclocked_calls": 1,
        "runtime_events": 7,
        "exec_events": 5,
        "matched_execs": 3,
        "inherited_execs": 1,
        "ambiguous_execs": 1,
        "unknown_scope_events": 1,
        "invalid_events": 1,
        "edges": 3,
    }
    assert {k: report[k] for k in expected} == expected
    saved = json.loads(store.content(RUN, report["ref"])["content"])
    assert "ref" not in saved and saved["edges"] == 3
    coverage = store.runtime_coverage(RUN)
    assert coverage["capture"]["status"] == "ok"
    assert coverage["capture"]["scope"] == "node_capture_during_run"
    summary = coverage["correlation"]["summary"]
    assert summary["runtime_events"] == 7 and summary["fully_correlated"] == 3
    assert summary["missing_tool_call"] == 4 and summary["missing_process"] == 1
    assert summary["fully_correlated_ratio"] == pytest.approx(3 / 7)
    assert summary["correlation_gap_count"] == 4
    assert len(coverage["correlation"]["gaps"]) == 4
    assert coverage["correlation"]["by_type"] == {"exec": 7}
    make = next(g for g in coverage["correlation"]["gaps"] if g.get("pid") == 500)
    assert make["missing"] == ["session", "tool_call"]


def test_edges_link_events_to_calls(store: EvidenceStore, tmp_path: Path) -> None:
    """A published edge links an event to its call; the node filter follows it."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    store.record_runtime(RUN, _observations()[:2])
    assert store.correlate(RUN)["status"] == "ok"
    correlation = store.runtime_coverage(RUN)["correlation"]
    assert correlation["summary"]["fully_correlated"] == 2
    assert correlation["result_set_id"].startswith("rs_")
    (call,) = store.entries(RUN, tool_call="toolu_1", kind="tool_call")["entries"]
    conn = sqlite3.connect(store.home / DB_FILE)
    try:
        rows = conn.execute("SELECT event_id, entry_id, inherited FROM runtime_edges").fetchall()
    finally:
        conn.close()
    assert {r[1] for r in rows} == {call["id"]}
    assert sorted(r[2] for r in rows) == [0, 1]  # the shell matched, its child inherited
    for event_id, _, _ in rows:
        assert store.entries(RUN, node=event_id)["entries"] == [call]


def test_correlation_edges_are_recorded_links(store: EvidenceStore, tmp_path: Path) -> None:
    """Each pass's edges are mirrored as runtime_process link rows (replaced by the next
    pass), naming the pass that published them; the spec has no relation for a runtime
    destination, so the call's served links stay its transcript links."""
    store.ingest(_transcript(tmp_path), run_id=RUN)
    store.record_runtime(RUN, _observations()[:2])
    (call,) = store.entries(RUN, tool_call="toolu_1", kind="tool_call")["entries"]
    served = store.links(RUN, call["id"])
    for _ in range(2):
        report = store.correlate(RUN)
        conn = sqlite3.connect(store.home / DB_FILE)
        try:
            edges = conn.execute("SELECT entry_id, event_id FROM runtime_edges").fetchall()
            links = conn.execute(
                "SELECT entry_id, node_id, relation, evidence FROM links "
                "WHERE kind='runtime_process'"
            ).fetchall()
        finally:
            conn.close()
        assert sorted((r[0], r[1]) for r in links) == sorted(edges)
        assert len(edges) == 2
        assert all(r[2] is None and json.loads(r[3])["pass_ref"] == report["ref"] for r in links)
    assert store.links(RUN, call["id"]) == served
