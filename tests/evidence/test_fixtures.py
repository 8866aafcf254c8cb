"""Every real transcript fixture ingests with counts that match an independent count."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from braid_actors.evidence import EvidenceStore, IngestReport

from ._helpers import FIXTURES, claude_counts, codex_counts

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def _fixture_files() -> list[Path]:
    if not FIXTURES.is_dir():
        # Not an empty parameter set (pytest would skip): a missing file fails loudly.
        return [FIXTURES / "missing-fixture-folder.jsonl"]
    return sorted(
        p
        for p in FIXTURES.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".json") and p.name != "manifest.json"
    )


FILES = _fixture_files()
HARNESS_OF = {"claude-code": "claude_code", "codex": "codex", "gemini-cli": "gemini_cli"}


def _harness(path: Path) -> str:
    return HARNESS_OF[path.relative_to(FIXTURES).parts[0]]


@pytest.fixture(scope="module")
def ingested(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EvidenceStore, dict[Path, IngestReport]]]:
    with EvidenceStore.open(tmp_path_factory.mktemp("fixtures")) as store:
        reports = {
            path: store.ingest(path, run_id=f"run_fixture_{index}")
            for index, path in enumerate(FILES)
        }
        yield store, reports


def test_fixture_folder_exists() -> None:
    """The shared transcript fixtures exist beside the repository, for all three harnesses."""
    assert FIXTURES.is_dir(), FIXTURES
    assert {_harness(p) for p in FILES} == {"claude_code", "codex", "gemini_cli"}
    assert len(FILES) >= 14


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:48])
def test_fixture_coverage_is_honest(
    ingested: tuple[EvidenceStore, dict[Path, IngestReport]], path: Path
) -> None:
    """Detection names the harness, every line is read, and ok means no issue."""
    store, reports = ingested
    report = reports[path]
    assert report.harness == _harness(path)
    if report.harness == "gemini_cli":
        # One JSON document: its records are the session header and each message.
        lines = 1 + len(json.loads(path.read_bytes())["messages"])
        assert store.overview(report.run_id)["messages"] > 0
    else:
        lines = sum(1 for line in path.read_bytes().splitlines() if line.strip())
    assert sum(c["counts"]["read"] for c in report.coverage) == lines
    for coverage in report.coverage:
        counts = coverage["counts"]
        assert counts["parsed"] == counts["read"]
        assert counts["failed"] == counts["unrecognized"] == counts["deferred"] == 0
        assert (coverage["status"] == "ok") == (coverage["issues"] == [])
        assert coverage["status"] in ("ok", "partial")
        assert {i["code"] for i in coverage["issues"]} <= {"unmatched_tool_call"}
        assert coverage["missing_fields"][-1] == "configuration.change_history_completeness"
        assert coverage["capture_policy"]["preset"] == "basic"


@pytest.mark.parametrize(
    "path", [p for p in FILES if _harness(p) == "claude_code"], ids=lambda p: p.name[:48]
)
def test_claude_fixture_counts(
    ingested: tuple[EvidenceStore, dict[Path, IngestReport]], path: Path
) -> None:
    """Claude Code counts match plain JSON counting."""
    store, reports = ingested
    report = reports[path]
    expected = claude_counts(path)
    (source,) = report.sources
    summary = source.summary
    for key in (
        "tool_calls",
        "tool_results",
        "messages",
        "reasoning",
        "unmatched_calls",
        "sidechain_records",
        "compactions",
        "usage_responses",
        "usage_output_tokens",
    ):
        assert summary.get(key, 0) == expected[key], key
    overview = store.overview(report.run_id)
    assert overview["tool_calls"] == expected["tool_calls"]
    assert overview["tool_results"] == expected["tool_results"]
    assert overview["messages"] == expected["messages"] + expected["reasoning"]
    unmatched = [i for i in source.coverage["issues"] if i["code"] == "unmatched_tool_call"]
    assert len(unmatched) == expected["unmatched_calls"]


@pytest.mark.parametrize(
    "path", [p for p in FILES if _harness(p) == "codex"], ids=lambda p: p.name[:48]
)
def test_codex_fixture_counts(
    ingested: tuple[EvidenceStore, dict[Path, IngestReport]], path: Path
) -> None:
    """Codex counts match plain JSON counting."""
    store, reports = ingested
    report = reports[path]
    expected = codex_counts(path)
    (source,) = report.sources
    summary = source.summary
    for key in (
        "tool_calls",
        "tool_results",
        "messages",
        "reasoning",
        "message_events",
        "unmatched_calls",
        "compactions",
        "usage_responses",
        "usage_total_tokens",
    ):
        assert summary.get(key, 0) == expected[key], key
    overview = store.overview(report.run_id)
    assert overview["tool_calls"] == expected["tool_calls"]
    assert overview["tool_results"] == expected["tool_results"]
    assert overview["messages"] == (
        expected["messages"] + expected["reasoning"] + expected["message_events"]
    )
    unmatched = [i for i in source.coverage["issues"] if i["code"] == "unmatched_tool_call"]
    assert len(unmatched) == expected["unmatched_calls"]
    assert (source.coverage["status"] == "partial") == bool(expected["unmatched_calls"])


def test_unfinished_codex_turn_is_partial(
    ingested: tuple[EvidenceStore, dict[Path, IngestReport]],
) -> None:
    """The rollout ending on a call without output is partial and names that line."""
    _, reports = ingested
    (path,) = [p for p in FILES if "13-19-38" in p.name]
    (coverage,) = reports[path].coverage
    assert coverage["status"] == "partial"
    assert coverage["issues"] == [{"code": "unmatched_tool_call", "line": 18}]


def test_subagent_and_compaction_agent_link_to_parent(tmp_path: Path) -> None:
    """Subagents link to the parent's Task call, the compaction agent to the boundary."""
    base = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts"
    main = base / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    with EvidenceStore.open(tmp_path) as store:
        store.ingest(main, run_id="run_tree")
        for agent in sorted((base / main.stem / "subagents").iterdir()):
            report = store.ingest(agent, run_id="run_tree")
            (source,) = report.sources
            assert source.coverage["source"]["agent_id"]
            assert source.coverage["source"]["session_id"] == main.stem
        links = {link["agent_id"]: link for link in store.agent_links("run_tree")}
        assert links["a881341"]["status"] == "linked"
        assert links["a881341"]["tool_call_id"] == "toolu_01VmaERAwhb19LGUwu9GenaK"
        assert links["acompact-fffbd0"]["status"] == "compaction"
        boundary = store.entries("run_tree", entry=links["acompact-fffbd0"]["parent_entry_id"])
        assert boundary["entries"][0]["status"] == "compact_boundary"
        summaries = store.entries("run_tree", kind="message", session=main.stem, limit=200)
        assert any(e["status"] == "compact_summary" for e in summaries["entries"])
