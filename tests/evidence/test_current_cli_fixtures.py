"""Transcripts the current pinned CLIs wrote here (tests/fixtures) ingest exactly.

They were produced by the real Claude Code 2.1.332 and Codex 0.171.0 running offline
against the scripted model (one shell tool call each), so the parsers are checked
against today's formats as well as the published older ones in shared/. The record types
these CLIs added are all recognized, so both files ingest ``ok``:

- Claude Code ``atis-latch``: its one field ``atis`` (empty here) says nothing we can read,
  so it is a ``session`` entry carrying the record's fields as they are (nothing derived).
- Codex ``event_msg/thread_settings_applied``: a settings snapshot, so a ``configuration``
  entry whose present fields are the settings keys the record holds.
"""

from __future__ import annotations

import json
from pathlib import Path

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._claude import parse_claude
from braid_actors.evidence._codex import parse_codex
from braid_actors.evidence._parsed import split_lines

from ._helpers import claude_counts, codex_counts, read_records

HERE = Path(__file__).resolve().parents[1] / "fixtures"

# Record types the current CLIs added, and the entry each becomes (independent list).
NEW_CLAUDE_TYPES = {
    "api-request-shape": ("configuration", "api_request_shape"),
    "api-request-blob": ("session", "api_request_blob"),
    "api-request": ("configuration", "api_request"),
    "tools-used": ("session", "tools_used"),
    "last-prompt": ("session", "last_prompt"),
    "cost-state": ("session", "cost_state"),
    "atis-latch": ("session", "atis_latch"),
}
NEW_CODEX_TYPES = {
    "world_state": ("configuration", "world_state"),
    "token_usage_record": ("session", "token_usage_record"),
}
NEW_CODEX_EVENTS = {"thread_settings_applied": ("configuration", "thread_settings_applied")}


def _lines(path: Path, types: set[str] | dict[str, tuple[str, str]]) -> set[int]:
    return {n for n, r in enumerate(read_records(path), start=1) if r.get("type") in types}


def _codex_event_lines(path: Path) -> dict[int, dict[str, object]]:
    return {
        n: r
        for n, r in enumerate(read_records(path), start=1)
        if r.get("type") == "event_msg" and r["payload"].get("type") in NEW_CODEX_EVENTS
    }


def test_current_claude_code_session_ingests_with_exact_counts(tmp_path: Path) -> None:
    """A session file from the pinned Claude Code: counts and usage match plain JSON; every
    record is recognized, so the coverage is ``ok`` with no issues."""
    path = HERE / "claude-code" / "session-tool-call.jsonl"
    expected = claude_counts(path)
    assert expected["tool_calls"] == 1
    assert _lines(path, {"atis-latch"})  # the record kind this check is about is here
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_claude")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "ok"
        assert coverage["issues"] == []
        assert coverage["counts"]["unrecognized"] == 0
        assert coverage["counts"]["parsed"] == len(read_records(path))
        latches = store.entries("run_current_claude", kind="session")["entries"]
        (latch, *_) = [e for e in latches if e["status"] == "atis_latch"]
        body = store.content("run_current_claude", latch["content"]["ref"])["content"]
        assert json.loads(body) == {"atis": ""}
        for key in ("tool_calls", "tool_results", "messages", "reasoning", "unmatched_calls"):
            assert source.summary.get(key, 0) == expected[key], key
        # cost-state repeats the assistant usage: it must not be counted a second time.
        assert source.summary["usage_responses"] == expected["usage_responses"] == 3
        assert source.summary["usage_output_tokens"] == expected["usage_output_tokens"] == 15


def test_current_claude_code_new_records_become_entries() -> None:
    path = HERE / "claude-code" / "session-tool-call.jsonl"
    out = parse_claude(split_lines(path.read_bytes()), fallback_session="x")
    records = read_records(path)
    for number in _lines(path, NEW_CLAUDE_TYPES):
        drafts = [d for d in out.drafts if d.line == number]
        kind, status = NEW_CLAUDE_TYPES[records[number - 1]["type"]]
        assert [(d.kind, d.status) for d in drafts][-1:] == [(kind, status)], number
        assert drafts[-1].content is not None
        assert drafts[-1].content.media_type == "application/json"
    assert out.usage[next(iter(out.sessions))]["input_tokens"] == 30


def test_current_codex_rollout_ingests_with_exact_counts(tmp_path: Path) -> None:
    """A rollout from the pinned Codex: counts and usage match plain JSON; every record is
    recognized (``thread_settings_applied`` too), so the coverage is ``ok`` with no issues."""
    path = HERE / "codex" / "rollout-tool-call.jsonl"
    expected = codex_counts(path)
    assert expected["tool_calls"] == 1
    assert _codex_event_lines(path)
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_codex")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "ok"
        assert coverage["issues"] == []
        assert coverage["counts"]["unrecognized"] == 0
        assert coverage["counts"]["parsed"] == len(read_records(path))
        for key in ("tool_calls", "tool_results", "messages", "unmatched_calls"):
            assert source.summary.get(key, 0) == expected[key], key
        # token_usage_record repeats the token_count totals: counted once, not twice.
        assert source.summary["usage_responses"] == expected["usage_responses"] == 2
        assert source.summary["usage_total_tokens"] == expected["usage_total_tokens"] == 30


def test_current_codex_new_records_become_entries() -> None:
    path = HERE / "codex" / "rollout-tool-call.jsonl"
    out = parse_codex(split_lines(path.read_bytes()), fallback_session="x")
    records = read_records(path)
    for number in _lines(path, NEW_CODEX_TYPES):
        drafts = [d for d in out.drafts if d.line == number]
        kind, status = NEW_CODEX_TYPES[records[number - 1]["type"]]
        assert [(d.kind, d.status) for d in drafts] == [(kind, status)], number
    for number, record in _codex_event_lines(path).items():
        (draft,) = [d for d in out.drafts if d.line == number]
        payload = record["payload"]
        assert isinstance(payload, dict)
        assert (draft.kind, draft.status) == NEW_CODEX_EVENTS[payload["type"]]
        assert draft.content is not None and draft.content.value == payload
        # Present fields are exactly the settings keys this record holds.
        settings = payload["thread_settings"]
        assert {"model", "model_provider_id", "approval_policy", "cwd"} <= settings.keys()
        assert draft.fields == {
            "configuration",
            "configuration.model",
            "configuration.provider",
            "configuration.approval_policy",
            "configuration.workdir",
            "configuration.sandbox_policy",
            "configuration.directory_restrictions",
            "configuration.network_restrictions",
        }
    (session,) = out.sessions
    assert out.stats[session]["token_usage_records"] == 2
