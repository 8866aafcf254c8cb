"""Braid's own local runner session files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors.workers._session import SessionLine, create_session, session_digest

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore


def _lines() -> list[SessionLine]:
    return [
        SessionLine("msg_1", "system", "be brief"),
        SessionLine("msg_2", "user", "hello"),
        SessionLine("msg_3", "assistant", "You said: hello (2 earlier message(s) in this session)"),
    ]


def test_local_session_file_is_detected_and_read(store: EvidenceStore, tmp_path: Path) -> None:
    """A local session file is detected; lines are messages; the first user line is the task."""
    lines = _lines()
    path = tmp_path / "sessions" / "sess_0123456789abcdef01234567.jsonl"
    create_session(path, lines)
    report = store.ingest(path, run_id="run_local")
    assert report.harness == "local"
    (coverage,) = report.coverage
    assert coverage["status"] == "ok"
    source = coverage["source"]
    assert source["session_id"] == "sess_0123456789abcdef01234567"
    assert f"session_digest={session_digest(lines)}" in source["binding_evidence"]
    assert "boundary=msg_3" in source["binding_evidence"]
    entries = store.entries("run_local")["entries"]
    assert [(e["kind"], e.get("role")) for e in entries] == [
        ("message", "system"),
        ("message", "user"),
        ("task", "user"),
        ("message", "assistant"),
    ]
    assert "configuration" in coverage["missing_fields"]


def test_foreign_line_in_a_local_file_is_unrecognized(store: EvidenceStore, tmp_path: Path) -> None:
    """A line that is not the documented shape is counted unrecognized, never guessed at."""
    path = tmp_path / "sess_0123456789abcdef.jsonl"
    create_session(path, _lines())
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"messageId": "msg_4", "role": "robot", "text": "?"}\n')
    (coverage,) = store.ingest(path, run_id="run_bad", harness="local").coverage
    assert coverage["counts"]["unrecognized"] == 1
    assert coverage["status"] == "partial"
    assert not any(e.startswith("session_digest=") for e in coverage["source"]["binding_evidence"])
