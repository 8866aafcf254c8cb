"""The Gemini CLI parser: the shared fixture against a plain-json count, and generated chats."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from braid_actors.evidence import EvidenceStore

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from pathlib import Path

FIXTURE = (
    FIXTURES
    / "gemini-cli/lanegrid__agtrace/crates/agtrace-providers/tests/samples/gemini_session.json"
)
S = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
SECRET = "sk-ant-api03-Zq9xWv8uTs7rQp6oNm5lKj4iHg3fEd2cBa1Zy0Xw-AbCdEfGh"


def gemini_counts(path: Path) -> Counter[str]:
    """Independent counts of a Gemini CLI chat document (plain ``json``)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    counts: Counter[str] = Counter()
    calls: set[str] = set()
    answered: set[str] = set()
    usage: dict[str, dict[str, Any]] = {}
    for message in document["messages"]:
        counts["records"] += 1
        kind = message.get("type")
        tool_calls = message.get("toolCalls") or []
        if kind == "user":
            counts["messages"] += 1
        elif kind == "gemini":
            if message.get("content") or not tool_calls:
                counts["messages"] += 1
            counts["reasoning"] += len(message.get("thoughts") or [])
            if message.get("tokens"):
                usage[message["id"]] = message["tokens"]
        for call in tool_calls:
            counts["tool_calls"] += 1
            calls.add(call["id"])
            for part in call.get("result") or []:
                if "functionResponse" in part:
                    counts["tool_results"] += 1
                    answered.add(part["functionResponse"].get("id") or call["id"])
    counts["unmatched_calls"] = len(calls - answered)
    counts["usage_responses"] = len(usage)
    counts["usage_output_tokens"] = sum(u.get("output", 0) for u in usage.values())
    counts["usage_total_tokens"] = sum(u.get("total", 0) for u in usage.values())
    return counts


def _chat(path: Path, messages: list[Any], **header: Any) -> Path:
    document = {
        "sessionId": S,
        "projectHash": "0" * 64,
        "startTime": "2026-01-01T00:00:00.000Z",
        "lastUpdated": "2026-01-01T00:01:00.000Z",
        **header,
        "messages": messages,
    }
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def _reply(msg_id: str, text: str, *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": msg_id,
        "timestamp": "2026-01-01T00:00:10.000Z",
        "type": "gemini",
        "content": text,
        "model": "gemini-2.5-flash",
        "toolCalls": list(calls),
        **extra,
    }


def _call(call_id: str, *result_ids: str, status: str = "success") -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "run_shell_command",
        "args": {"command": "ls"},
        "result": [
            {
                "functionResponse": {
                    "id": r,
                    "name": "run_shell_command",
                    "response": {"output": "ok"},
                }
            }
            for r in result_ids
        ],
        "status": status,
        "timestamp": "2026-01-01T00:00:11.000Z",
    }


def _user(text: Any) -> dict[str, Any]:
    return {"id": "u1", "timestamp": "2026-01-01T00:00:01.000Z", "type": "user", "content": text}


def test_fixture_counts_match_plain_json(tmp_path: Path) -> None:
    """Messages, reasoning, calls, results, unmatched calls and usage match a json count."""
    expected = gemini_counts(FIXTURE)
    assert expected["tool_calls"] > 0
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(FIXTURE, run_id="run_gemini")
        assert report.harness == "gemini_cli"
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["source"]["session_id"] == "f0a689a6-b0ac-407f-afcc-4fafa9e14e8a"
        assert coverage["source"]["parser_version"] == "braid.gemini_cli/1"
        assert coverage["source"]["format_version"] == "gemini_cli.chat_json"
        for key in (
            "messages",
            "reasoning",
            "tool_calls",
            "tool_results",
            "usage_responses",
            "usage_output_tokens",
            "usage_total_tokens",
        ):
            assert source.summary.get(key, 0) == expected[key], key
        assert source.summary.get("unmatched_calls", 0) == expected["unmatched_calls"]
        unmatched = [i for i in coverage["issues"] if i["code"] == "unmatched_tool_call"]
        assert len(unmatched) == expected["unmatched_calls"]
        assert (coverage["status"] == "ok") == (expected["unmatched_calls"] == 0)
        counts = coverage["counts"]
        assert counts["read"] == counts["parsed"] == expected["records"] + 1  # + header
        assert counts["failed"] == counts["unrecognized"] == 0
        overview = store.overview("run_gemini")
        assert overview["tool_calls"] == expected["tool_calls"]
        assert overview["tool_results"] == expected["tool_results"]
        assert overview["messages"] == expected["messages"] + expected["reasoning"]
        results = store.entries("run_gemini", kind="tool_result", limit=200)["entries"]
        calls = store.entries("run_gemini", kind="tool_call", limit=200)["entries"]
        assert {r["tool_call_id"] for r in results} == {c["tool_call_id"] for c in calls}
        again = store.ingest(FIXTURE, run_id="run_gemini")
        (repeat,) = again.sources
        assert repeat.coverage["counts"]["stored"] == 0
        assert repeat.coverage["counts"]["duplicates"] == counts["stored"]


def test_unmatched_orphans_unknown_kinds_and_usage_once(tmp_path: Path) -> None:
    """Unmatched calls and orphan results are reported, unknown kinds counted, usage once."""
    tokens = {"input": 10, "output": 3, "cached": 0, "thoughts": 1, "tool": 0, "total": 14}
    path = _chat(
        tmp_path / "session.json",
        [
            _user([{"text": "first"}, {"text": "prompt"}]),
            _reply("g1", "", _call("c1", "c1"), _call("c2"), tokens=tokens),
            _reply("g1", "same reply again", tokens=tokens),
            _reply("g2", "", _call("c3", "c9", status="error")),
            {"id": "x1", "type": "compression", "content": "?"},
            {"id": "i1", "type": "info", "content": "switched model"},
            "not an object",
        ],
    )
    with EvidenceStore.open(tmp_path / "home") as store:
        (source,) = store.ingest(path, run_id="run_g").sources
        coverage = source.coverage
        assert coverage["status"] == "partial"
        codes = Counter(i["code"] for i in coverage["issues"])
        assert codes == {
            "unmatched_tool_call": 2,
            "orphan_tool_result": 1,
            "unrecognized_record": 1,
            "not_an_object": 1,
        }
        counts = coverage["counts"]
        assert counts["read"] == 8
        assert counts["unrecognized"] == 1
        assert counts["failed"] == 1
        summary = source.summary
        assert summary["tool_calls"] == 3
        assert summary["tool_results"] == 2
        assert summary["unmatched_calls"] == 2
        assert summary["orphan_results"] == 1
        assert summary["usage_responses"] == 1
        assert summary["usage_total_tokens"] == 14
        assert summary["messages"] == 2  # the user prompt and the repeated reply's text
        results = store.entries("run_g", kind="tool_result")["entries"]
        assert sorted(r["status"] for r in results) == ["completion_only", "returned"]
        (task,) = store.entries("run_g", kind="task")["entries"]
        assert task["status"] == "initial_prompt"


def test_secrets_are_redacted(tmp_path: Path) -> None:
    """Bodies go through the redactor like every other parser's."""
    path = _chat(tmp_path / "s.json", [_user(f"use key {SECRET} please"), _reply("g1", "ok")])
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        store.ingest(path, run_id="run_r", policy="detailed")
        entries = store.entries("run_r", kind="message")["entries"]
        bodies = [store.content("run_r", e["content"]["ref"]) for e in entries]
    assert SECRET not in json.dumps(bodies)
    assert "please" in json.dumps(bodies)
    for stored in home.rglob("*"):
        if stored.is_file():
            assert SECRET.encode() not in stored.read_bytes(), stored


def test_broken_document_is_failed_not_fatal(tmp_path: Path) -> None:
    """A chat that does not decode, named explicitly, is one failed record."""
    path = tmp_path / "broken.json"
    path.write_text('{"sessionId": "x", "messages": [', encoding="utf-8")
    with EvidenceStore.open(tmp_path / "home") as store:
        (source,) = store.ingest(path, run_id="run_b", harness="gemini_cli").sources
    assert source.coverage["status"] == "failed"
    assert source.coverage["counts"]["failed"] == 1
    assert source.coverage["source"]["session_id"] == "broken"


def test_messages_that_are_not_a_list_are_reported(tmp_path: Path) -> None:
    """A ``messages`` value that is not a list is an issue, never silently dropped."""
    path = _chat(tmp_path / "odd.json", [])
    path.write_text(path.read_text().replace('"messages": []', '"messages": {}'))
    with EvidenceStore.open(tmp_path / "home") as store:
        (source,) = store.ingest(path, run_id="run_o", harness="gemini_cli").sources
    assert source.coverage["status"] == "partial"
    assert source.coverage["issues"] == [
        {"code": "unrecognized_record", "line": 1, "field": "messages"}
    ]
