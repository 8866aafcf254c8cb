"""Transcripts the current pinned CLIs wrote here (tests/fixtures) ingest exactly.

They were produced by the real Claude Code 2.1.332 and Codex 0.171.0 running offline
against the scripted model (one shell tool call each), so the parsers are checked
against today's formats as well as the published older ones in shared/. Both CLIs now
write record types the parsers do not know yet; those are counted ``unrecognized`` and
make the coverage an honest ``partial`` — never dropped, never fatal, never ``ok``.
"""

from __future__ import annotations

from pathlib import Path

from braid_actors.evidence import EvidenceStore

from ._helpers import claude_counts, codex_counts, read_records

HERE = Path(__file__).resolve().parents[1] / "fixtures"

# Record types the current CLIs write that no parser translates yet (independent list).
NEW_CLAUDE_TYPES = {
    "atis-latch",
    "api-request-shape",
    "api-request-blob",
    "api-request",
    "tools-used",
    "last-prompt",
    "cost-state",
}
NEW_CODEX_TYPES = {"world_state", "token_usage_record"}


def _new_lines(path: Path, types: set[str]) -> set[int]:
    return {n for n, r in enumerate(read_records(path), start=1) if r.get("type") in types}


def test_current_claude_code_session_ingests_with_exact_counts(tmp_path: Path) -> None:
    """A session file from the pinned Claude Code: counts match plain JSON; its new
    record types are counted unrecognized, exactly on their lines."""
    path = HERE / "claude-code" / "session-tool-call.jsonl"
    expected = claude_counts(path)
    assert expected["tool_calls"] == 1
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_claude")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "partial"
        assert {i["code"] for i in coverage["issues"]} == {"unrecognized_record"}
        assert {i["line"] for i in coverage["issues"]} == _new_lines(path, NEW_CLAUDE_TYPES)
        assert coverage["counts"]["unrecognized"] == len(_new_lines(path, NEW_CLAUDE_TYPES))
        for key in ("tool_calls", "tool_results", "messages", "reasoning", "unmatched_calls"):
            assert source.summary.get(key, 0) == expected[key], key


def test_current_codex_rollout_ingests_with_exact_counts(tmp_path: Path) -> None:
    """A rollout from the pinned Codex: counts match plain JSON; unknown types counted."""
    path = HERE / "codex" / "rollout-tool-call.jsonl"
    expected = codex_counts(path)
    assert expected["tool_calls"] == 1
    with EvidenceStore.open(tmp_path) as store:
        report = store.ingest(path, run_id="run_current_codex")
        (source,) = report.sources
        coverage = source.coverage
        assert coverage["status"] == "partial"
        assert {i["code"] for i in coverage["issues"]} == {"unrecognized_record"}
        unknown = {i["line"] for i in coverage["issues"]}
        assert _new_lines(path, NEW_CODEX_TYPES) <= unknown
        for key in ("tool_calls", "tool_results", "messages", "unmatched_calls"):
            assert source.summary.get(key, 0) == expected[key], key
