"""The Claude Code parser on generated transcripts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ._helpers import claude_line, jsonl

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore

S = "11111111-2222-3333-4444-555555555555"
USAGE = {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 100}


def _entries(store: EvidenceStore, run: str, **filters: Any) -> list[dict[str, Any]]:
    page = store.entries(run, limit=200, **filters)
    assert not page["has_more"]
    return list(page["entries"])


def _conversation(session: str = S) -> list[dict[str, Any]]:
    return [
        {
            "type": "file-history-snapshot",
            "messageId": "m0",
            "snapshot": {"trackedFileBackups": {}},
        },
        claude_line(session, "user", "please list files", uuid="u1", permissionMode="default"),
        claude_line(
            session,
            "assistant",
            [{"type": "thinking", "thinking": "hmm", "signature": "x"}],
            uuid="a1",
            usage=USAGE,
        ),
        claude_line(
            session, "assistant", [{"type": "text", "text": "Listing."}], uuid="a2", usage=USAGE
        ),
        claude_line(
            session,
            "assistant",
            [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
            uuid="a3",
            usage={**USAGE, "output_tokens": 42},
        ),
        claude_line(
            session,
            "user",
            [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb"}],
            uuid="u2",
            toolUseResult={"stdout": "a\nb"},
        ),
    ]


def test_one_response_over_several_lines_counts_usage_once(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Lines sharing a message id count one response, with the last line's (final) usage."""
    report = store.ingest(jsonl(tmp_path / "s.jsonl", _conversation()), run_id="run_u")
    summary = report.sources[0].summary
    assert summary["usage_responses"] == 1
    assert summary["usage_lines"] == 3
    assert summary["usage_output_tokens"] == 42
    assert summary["usage_input_tokens"] == 10


def test_tool_result_cites_its_call(store: EvidenceStore, tmp_path: Path) -> None:
    """A tool result matches its call by id, carries the tool name and cites the call entry."""
    store.ingest(jsonl(tmp_path / "s.jsonl", _conversation()), run_id="run_t")
    (call,) = _entries(store, "run_t", kind="tool_call")
    (result,) = _entries(store, "run_t", kind="tool_result")
    assert call["status"] == "requested" and call["tool_name"] == "Bash"
    assert result["status"] == "returned"
    assert result["tool_call_id"] == "toolu_1" and result["tool_name"] == "Bash"
    assert result["evidence_refs"] == [call["id"]]
    assert _entries(store, "run_t", tool_call="toolu_1") == [call, result]


def test_orphan_result_is_completion_only(store: EvidenceStore, tmp_path: Path) -> None:
    """A result whose call is not in the file is completion_only and reported."""
    records = [
        claude_line(S, "user", [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}])
    ]
    report = store.ingest(jsonl(tmp_path / "s.jsonl", records), run_id="run_o")
    (coverage,) = report.coverage
    assert coverage["status"] == "partial"
    assert coverage["issues"] == [{"code": "orphan_tool_result", "line": 1}]
    (result,) = _entries(store, "run_o", kind="tool_result")
    assert result["status"] == "completion_only"


def test_unknown_and_malformed_lines_are_counted_not_fatal(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Unknown records are unrecognized, broken lines failed: issues name lines, never bodies."""
    path = jsonl(tmp_path / "s.jsonl", _conversation())
    with path.open("a", encoding="utf-8") as handle:
        handle.write(
            json.dumps({"type": "brand-new-record", "sessionId": S, "secretish": "zzz-body"}) + "\n"
        )
        handle.write('{"type": "user", "message": "cut off zzz-body\n')
    report = store.ingest(path, run_id="run_m")
    (coverage,) = report.coverage
    counts = coverage["counts"]
    assert counts["read"] == 8 and counts["parsed"] == 7
    assert counts["unrecognized"] == 1 and counts["failed"] == 1
    assert coverage["status"] == "partial"
    assert {"code": "unrecognized_record", "line": 7, "field": "type"} in coverage["issues"]
    assert {"code": "malformed_json", "line": 8} in coverage["issues"]
    assert "zzz-body" not in json.dumps(coverage)
    assert len(_entries(store, "run_m", kind="tool_call")) == 1


def test_incomplete_last_line_is_deferred_then_read(store: EvidenceStore, tmp_path: Path) -> None:
    """A line still being written is deferred, then stored once complete."""
    path = jsonl(tmp_path / "s.jsonl", _conversation())
    tail = json.dumps(
        claude_line(S, "assistant", [{"type": "text", "text": "done"}], message_id="msg_2")
    )
    with path.open("a", encoding="utf-8") as handle:
        handle.write(tail[:40])
    first = store.ingest(path, run_id="run_d").coverage[0]
    assert first["counts"]["deferred"] == 1 and first["counts"]["failed"] == 0
    assert {"code": "incomplete_line", "line": 7} in first["issues"]
    with path.open("a", encoding="utf-8") as handle:
        handle.write(tail[40:] + "\n")
    second = store.ingest(path, run_id="run_d").coverage[0]
    assert second["status"] == "ok"
    assert second["counts"]["deferred"] == 0
    assert second["counts"]["stored"] == 1
    assert second["counts"]["duplicates"] == first["counts"]["stored"]


def test_session_switch_after_resume_makes_two_sources(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """A sessionId switch yields one source per session and a switch entry citing the first."""
    other = "99999999-8888-7777-6666-555555555555"
    records = [
        *_conversation(),
        claude_line(other, "user", "continue please", uuid="u9"),
        claude_line(
            other, "assistant", [{"type": "text", "text": "ok"}], uuid="a9", message_id="msg_9"
        ),
    ]
    report = store.ingest(jsonl(tmp_path / f"{other}.jsonl", records), run_id="run_s")
    sessions = [c["source"]["session_id"] for c in report.coverage]
    assert sessions == [S, other]
    assert [c["counts"]["matched"] for c in report.coverage] == [6, 2]
    assert all(c["counts"]["discovered"] == 8 for c in report.coverage)
    (switch,) = _entries(store, "run_s", session=other, kind="session")
    assert switch["status"] == "session_switch"
    earlier = _entries(store, "run_s", session=S)
    assert switch["evidence_refs"] == [earlier[-1]["id"]]
    assert report.sources[1].summary["session_switches"] == 1


def test_rejected_tool_use_is_a_denied_approval(store: EvidenceStore, tmp_path: Path) -> None:
    """A rejected tool use is a denied approval, so approval fields are not missing."""
    records = [
        *_conversation()[:5],
        claude_line(
            S,
            "user",
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "is_error": True,
                    "content": "The user doesn't want to proceed with this tool use. STOP",
                }
            ],
            toolUseResult="User rejected tool use",
        ),
    ]
    report = store.ingest(jsonl(tmp_path / "s.jsonl", records), run_id="run_r")
    (approval,) = _entries(store, "run_r", kind="approval")
    assert approval["status"] == "denied" and approval["tool_call_id"] == "toolu_1"
    (result,) = _entries(store, "run_r", kind="tool_result")
    assert result["status"] == "error"
    missing = report.coverage[0]["missing_fields"]
    assert "approval" not in missing and "approval_decision" not in missing
    assert "configuration.model" not in missing and "configuration.permission_mode" not in missing
    assert "configuration.sandbox_policy" in missing


def test_session_records_are_entries(store: EvidenceStore, tmp_path: Path) -> None:
    """attachment, queue-operation, snapshot, system and progress records are recognized."""
    records: list[dict[str, Any]] = [
        {"type": "queue-operation", "operation": "enqueue", "sessionId": S, "content": "next"},
        {"type": "attachment", "sessionId": S, "attachment": {"type": "file", "name": "a.txt"}},
        {"type": "progress", "sessionId": S, "data": {"type": "hook_progress"}},
        {
            "type": "system",
            "subtype": "compact_boundary",
            "sessionId": S,
            "compactMetadata": {"trigger": "auto"},
        },
        *_conversation()[:2],
    ]
    report = store.ingest(jsonl(tmp_path / "s.jsonl", records), run_id="run_x")
    (coverage,) = report.coverage
    assert coverage["status"] == "ok"
    statuses = [e["status"] for e in _entries(store, "run_x", kind="session")]
    assert statuses == ["queue_enqueue", "attachment", "compact_boundary", "file_history_snapshot"]
    assert report.sources[0].summary["compactions"] == 1


def test_policy_presets_decide_what_is_kept(store: EvidenceStore, tmp_path: Path) -> None:
    """basic omits result bodies and raw records (digests and intent kept); detailed keeps them."""
    path = jsonl(tmp_path / "s.jsonl", _conversation())
    basic = store.ingest(path, run_id="run_basic", policy="basic").coverage[0]
    (result,) = _entries(store, "run_basic", kind="tool_result")
    assert result["content"]["state"] == "omitted"
    assert result["content"]["reason"] == "capture_policy"
    assert result["content"]["digest_scope"] == "parsed_content"
    assert result["content"]["bytes"] == 3 and len(result["content"]["sha256"]) == 64
    assert "ref" not in result["content"]
    assert result["raw_content"]["digest_scope"] == "source_record"
    (answer,) = [
        e
        for e in _entries(store, "run_basic", kind="message")
        if e["role"] == "assistant" and e["status"] == "recorded"
    ]
    intent = answer["intent_content"]
    assert intent["state"] == "stored" and intent["reason"] == "derived_intent_projection"
    assert json.loads(store.content("run_basic", intent["ref"])["content"])["answer"] == "Listing."
    categories = {o["category"]: o["records"] for o in basic["omissions"]}
    assert categories["tool_result"] == 1 and categories["source_records"] >= 6
    assert basic["status"] == "ok"
    detailed = store.ingest(path, run_id="run_detailed", policy="detailed").coverage[0]
    assert "omissions" not in detailed
    (kept,) = _entries(store, "run_detailed", kind="tool_result")
    assert kept["content"]["state"] == "stored"
    assert store.content("run_detailed", kept["content"]["ref"])["content"] == "a\nb"
    raw = json.loads(store.content("run_detailed", kept["raw_content"]["ref"])["content"])
    assert raw["toolUseResult"] == {"stdout": "a\nb"}
    assert all("intent_content" not in e for e in _entries(store, "run_detailed"))


def test_a_configuration_snapshot_is_recorded_only_when_a_setting_changes(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Records that repeat the settings add nothing; a change (also back to an earlier value,
    and a reply's model, first seen or another one) adds a snapshot of every setting known so
    far; a record without a setting keeps what was known."""

    def user(uuid: str, **extra: Any) -> dict[str, Any]:
        return claude_line(S, "user", "go on", uuid=uuid, **extra)

    other_model = claude_line(S, "assistant", [{"type": "text", "text": "ok"}], uuid="a3")
    other_model["message"]["model"] = "claude-other"
    records = [
        user("u1", permissionMode="default"),
        user("u2", permissionMode="default"),
        claude_line(S, "assistant", [{"type": "text", "text": "ok"}], uuid="a1"),
        claude_line(S, "assistant", [{"type": "text", "text": "ok"}], uuid="a2"),
        other_model,
        user("u3", permissionMode="plan"),
        {**user("u4", permissionMode="plan"), "cwd": None, "version": None},
        user("u5", permissionMode="default"),
        user("u6", permissionMode="default"),
    ]
    store.ingest(jsonl(tmp_path / "s.jsonl", records), run_id="run_cfg", policy="detailed")
    snapshots = _entries(store, "run_cfg", kind="configuration")
    bodies = [
        json.loads(store.content("run_cfg", e["content"]["ref"])["content"]) for e in snapshots
    ]
    base = {"application_version": "2.1.0", "workdir": "/work/project"}
    assert bodies == [
        {**base, "permission_mode": "default"},
        {**base, "permission_mode": "default", "model": "claude-test"},
        {**base, "permission_mode": "default", "model": "claude-other"},
        {**base, "permission_mode": "plan", "model": "claude-other"},
        {**base, "permission_mode": "default", "model": "claude-other"},
    ]
    assert [e["sequence"] for e in snapshots] == [1, 3, 5, 6, 8]
