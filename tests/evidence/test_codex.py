"""The Codex parser on generated rollouts (envelope and legacy formats)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ._helpers import codex_line, codex_meta, jsonl

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore

S = "019b0000-0000-7000-8000-000000000001"


def _entries(store: EvidenceStore, run: str, **filters: Any) -> list[dict[str, Any]]:
    return list(store.entries(run, limit=200, **filters)["entries"])


def _call(call_id: str, name: str = "shell", **args: Any) -> dict[str, Any]:
    payload = {
        "type": "function_call",
        "name": name,
        "call_id": call_id,
        "arguments": json.dumps(args),
    }
    return codex_line("response_item", payload)


def _output(call_id: str, text: str = "ok") -> dict[str, Any]:
    return codex_line(
        "response_item", {"type": "function_call_output", "call_id": call_id, "output": text}
    )


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "input_text" if role == "user" else "output_text"
    return codex_line(
        "response_item",
        {"type": "message", "role": role, "content": [{"type": kind, "text": text}]},
    )


def _tokens(total: int) -> dict[str, Any]:
    usage = {"input_tokens": total - 1, "output_tokens": 1, "total_tokens": total}
    return codex_line("event_msg", {"type": "token_count", "info": {"total_token_usage": usage}})


def test_calls_match_outputs_and_unmatched_calls_are_reported(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Outputs pair with calls by call_id; a call left without output is an issue with its line."""
    records = [
        codex_meta(S),
        _call("c1", command=["ls"]),
        _output("c1"),
        _call("c2", command=["pwd"]),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_c")
    (coverage,) = report.coverage
    assert coverage["issues"] == [{"code": "unmatched_tool_call", "line": 4}]
    assert report.sources[0].summary["unmatched_calls"] == 1
    (result,) = _entries(store, "run_c", kind="tool_result")
    assert result["tool_call_id"] == "c1" and result["tool_name"] == "shell"


def test_event_copies_of_text_cite_the_response_item(store: EvidenceStore, tmp_path: Path) -> None:
    """Message events stay separate entries that cite the response item with the same text."""
    records = [
        codex_meta(S),
        _message("user", "hello"),
        codex_line("event_msg", {"type": "user_message", "message": "hello"}),
        codex_line("event_msg", {"type": "agent_message", "message": "hi there"}),
        _message("assistant", "hi there"),
        codex_line("event_msg", {"type": "agent_message", "message": "only an event"}),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_e")
    summary = report.sources[0].summary
    assert summary["messages"] == 2 and summary["message_events"] == 3
    assert summary["duplicate_messages"] == 2
    messages = _entries(store, "run_e", kind="message")
    by_line = {e["sequence"]: e for e in messages}
    assert by_line[3]["status"] == "source_message_event"
    assert by_line[3]["evidence_refs"] == [by_line[2]["id"]]
    assert by_line[4]["evidence_refs"] == [by_line[5]["id"]]
    assert "evidence_refs" not in by_line[6]
    assert by_line[3]["content"]["ref"] == by_line[2]["content"]["ref"]


def test_repeated_token_counts_are_counted_once(store: EvidenceStore, tmp_path: Path) -> None:
    """Identical cumulative token_count snapshots count once; the latest total is the usage."""
    records = [codex_meta(S), _tokens(10), _tokens(10), _tokens(25), _tokens(25), _tokens(25)]
    summary = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_k").sources[0].summary
    assert summary["token_count_events"] == 5
    assert summary["token_count_duplicates"] == 3
    assert summary["usage_responses"] == 2
    assert summary["usage_total_tokens"] == 25


def test_forked_from_id_becomes_session_metadata(store: EvidenceStore, tmp_path: Path) -> None:
    """forked_from_id is typed metadata; no fork is {}; an invalid one is absent with an issue."""
    fork = store.ingest(
        jsonl(tmp_path / "a.jsonl", [codex_meta(S, forked_from_id="019b-origin")]), run_id="run_f"
    )
    (meta,) = _entries(store, "run_f", kind="configuration")
    assert meta["status"] == "session_metadata"
    assert meta["session_metadata"] == {"forked_from_id": "019b-origin"}
    assert meta["content"]["state"] == "omitted"
    assert fork.coverage[0]["status"] == "ok"
    store.ingest(jsonl(tmp_path / "b.jsonl", [codex_meta("019b-plain")]), run_id="run_g")
    assert _entries(store, "run_g", kind="configuration")[0]["session_metadata"] == {}
    bad = store.ingest(
        jsonl(tmp_path / "c.jsonl", [codex_meta("019b-bad", forked_from_id=" x ")]), run_id="run_h"
    )
    assert "session_metadata" not in _entries(store, "run_h", kind="configuration")[0]
    assert bad.coverage[0]["issues"] == [
        {"code": "invalid_session_metadata", "line": 1, "field": "forked_from_id"}
    ]


def test_first_session_meta_owns_a_replaying_child(store: EvidenceStore, tmp_path: Path) -> None:
    """A child replaying its parent's session_meta stays the child's source."""
    parent = "019b-parent"
    records = [
        codex_meta(S, forked_from_id=parent),
        codex_meta(parent),
        _message("user", "replayed history"),
        _message("user", "new work"),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_p")
    (coverage,) = report.coverage
    assert coverage["source"]["session_id"] == S
    statuses = [e["status"] for e in _entries(store, "run_p", kind="configuration")]
    assert statuses == ["session_metadata", "replayed_session_metadata"]
    assert report.sources[0].summary["replayed_session_meta"] == 1


def test_subagent_rollout_names_its_parent(store: EvidenceStore, tmp_path: Path) -> None:
    """source.subagent.thread_spawn.parent_thread_id becomes the source's parent_session_id."""
    spawn = {"subagent": {"thread_spawn": {"parent_thread_id": "019b-boss", "depth": 1}}}
    report = store.ingest(
        jsonl(tmp_path / "r.jsonl", [codex_meta(S, source=spawn)]), run_id="run_sa"
    )
    assert report.coverage[0]["source"]["parent_session_id"] == "019b-boss"


def test_turn_context_is_configuration(store: EvidenceStore, tmp_path: Path) -> None:
    """turn_context fields count as present configuration; unchecked ones stay missing."""
    context = {
        "cwd": "/w",
        "model": "gpt-x",
        "approval_policy": "on-request",
        "sandbox_policy": {
            "type": "workspace-write",
            "writable_roots": [],
            "network_access": False,
        },
    }
    records = [
        codex_meta(S),
        codex_line("turn_context", context),
        codex_line("event_msg", {"type": "task_started", "turn_id": "t1"}),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_tc")
    missing = report.coverage[0]["missing_fields"]
    for present in (
        "task",
        "configuration",
        "configuration.model",
        "configuration.provider",
        "configuration.application_version",
        "configuration.workdir",
        "configuration.approval_policy",
        "configuration.sandbox_policy",
        "configuration.directory_restrictions",
        "configuration.network_restrictions",
    ):
        assert present not in missing, present
    assert missing == [
        "approval",
        "approval_decision",
        "configuration.permission_mode",
        "configuration.mcp_servers",
        "configuration.tools",
        "configuration.skills",
        "configuration.plugins",
        "configuration.change_history_completeness",
    ]


def test_escalation_request_is_an_approval_without_decision(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """An escalation request is an approval request; its decision stays missing."""
    records = [
        codex_meta(S),
        _call(
            "c1",
            name="shell_command",
            command="make",
            with_escalated_permissions=True,
            justification="needs net",
        ),
        _output("c1"),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_ap")
    (approval,) = _entries(store, "run_ap", kind="approval")
    assert approval["status"] == "requested" and approval["tool_call_id"] == "c1"
    missing = report.coverage[0]["missing_fields"]
    assert "approval" not in missing and "approval_decision" in missing


def test_compacted_replacement_outputs_are_context_replacements(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Outputs in a compaction's replacement history are not new executions or orphans."""
    replacement = [
        {"type": "function_call_output", "call_id": "old", "output": "x"},
        {"type": "message", "role": "user", "content": []},
    ]
    records = [
        codex_meta(S),
        codex_line("compacted", {"message": "", "replacement_history": replacement}),
        codex_line("event_msg", {"type": "context_compacted"}),
    ]
    report = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_cp")
    assert report.coverage[0]["status"] == "ok"
    summary = report.sources[0].summary
    assert summary["compactions"] == 1 and summary.get("tool_results", 0) == 0
    (result,) = _entries(store, "run_cp", kind="tool_result")
    assert result["status"] == "context_replacement"


def test_unknown_event_is_unrecognized(store: EvidenceStore, tmp_path: Path) -> None:
    """An unknown event_msg type is counted unrecognized and the file is still read."""
    records = [
        codex_meta(S),
        codex_line("event_msg", {"type": "quantum_flux"}),
        _message("user", "hi"),
    ]
    (coverage,) = store.ingest(jsonl(tmp_path / "r.jsonl", records), run_id="run_un").coverage
    assert coverage["counts"]["unrecognized"] == 1 and coverage["counts"]["parsed"] == 3
    assert coverage["status"] == "partial"


def test_legacy_pre_envelope_rollout(store: EvidenceStore, tmp_path: Path) -> None:
    """The legacy pre-envelope format is read like the envelope one."""
    records: list[dict[str, Any]] = [
        {"id": S, "timestamp": "2025-05-01T10:00:00.000Z", "instructions": None, "git": {}},
        {"record_type": "state"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {
            "type": "function_call",
            "name": "shell",
            "call_id": "c1",
            "arguments": '{"command": ["ls"]}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": '{"output": "a"}'},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "done"}],
        },
        {"record_type": "state"},
    ]
    report = store.ingest(jsonl(tmp_path / "rollout-old.jsonl", records), run_id="run_l")
    assert report.harness == "codex"
    (coverage,) = report.coverage
    assert coverage["status"] == "ok"
    assert coverage["source"]["session_id"] == S
    assert coverage["source"]["format_version"] == "codex.rollout_jsonl/legacy"
    summary = report.sources[0].summary
    assert summary["messages"] == 2 and summary["tool_calls"] == 1 and summary["tool_results"] == 1
