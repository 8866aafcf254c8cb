"""Transcripts the current pinned CLIs wrote here (tests/fixtures) ingest exactly.

They were produced by the real Claude Code 2.1.332 and Codex 0.171.0 running offline
against the scripted model (one shell tool call each), so the parsers are checked
against today's formats as well as the published older ones in shared/. The record types
these CLIs added are recognized now; the few whose meaning the record does not show stay
counted ``unrecognized`` and keep the coverage an honest ``partial`` — never dropped, never
fatal, never ``ok``:

- Claude Code ``atis-latch``: its one field ``atis`` (empty here) says nothing we can read.
- Codex ``event_msg/thread_settings_applied``: an event type outside this parser's list.
"""

from __future__ import annotations

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
}
UNKNOWN_CLAUDE_TYPES = {"atis-latch"}
NEW_CODEX_TYPES = {
    "world_state": ("configuration", "world_state"),
    "token_usage_record": ("session", "token_usage_record"),
}
UNKNOWN_CODEX_EVENTS = {"thread_settings_applied"}


def _lines(path: Path, types: set[str] | dict[str, tuple[str, str]]) -> set[int]:
    return {n for n, r in enumerate(read_records(path), start=1) if r.get("type") in types}


def _unknown_codex_lines(path: Path) -> set[int]:
    return {
        n
        for n, r in enumerate(read_records(path), start=1)
        if r.get("type") == "event_msg" and r["payload"].get("type") in UNKNOWN_CODEX_EVENTS
    }


def test_current_claude_code_session_ingests_with_exact_counts(tmp_path: Path) -> None:
    """A session file from the pinned Claude Code: counts and usage match plain JSON; only
    ``atis-latch`` lines are unrecognized."""
    path = HERE / "claude-code" / "session-tool-call.jsonl"
    expected = claude_counts(path)
    assert expected["tool_calls"] == 1
    unknown = _lines(path, UNKNOWN_CLAUDE_TYPES)
    assert unknown
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_claude")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "partial"
        assert {i["code"] for i in coverage["issues"]} == {"unrecognized_record"}
        assert {i["line"] for i in coverage["issues"]} == unknown
        assert coverage["counts"]["unrecognized"] == len(unknown)
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
    """A rollout from the pinned Codex: counts and usage match plain JSON; only the
    ``thread_settings_applied`` event is unrecognized."""
    path = HERE / "codex" / "rollout-tool-call.jsonl"
    expected = codex_counts(path)
    assert expected["tool_calls"] == 1
    unknown = _unknown_codex_lines(path)
    assert unknown
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_codex")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "partial"
        assert {i["code"] for i in coverage["issues"]} == {"unrecognized_record"}
        assert {i["line"] for i in coverage["issues"]} == unknown
        assert coverage["counts"]["unrecognized"] == len(unknown)
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
    (session,) = out.sessions
    assert out.stats[session]["token_usage_records"] == 2
