"""Store behaviour: re-ingest, resume cursors, prior context, objects, content pages."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pytest
import trio

from braid_actors.errors import (
    EvidenceContentNotFound,
    EvidenceInvalidArgument,
    EvidenceReadFailed,
    EvidenceRunNotFound,
)
from braid_actors.evidence import CapturePolicy

from ._helpers import claude_line, jsonl

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore

S = "11111111-2222-3333-4444-555555555555"


def _turn(n: int) -> list[dict[str, Any]]:
    return [
        claude_line(S, "user", f"question {n}", uuid=f"u{n}"),
        claude_line(
            S,
            "assistant",
            [
                {
                    "type": "tool_use",
                    "id": f"toolu_{n}",
                    "name": "Bash",
                    "input": {"command": f"echo {n}"},
                }
            ],
            uuid=f"a{n}",
            message_id=f"msg_{n}",
        ),
        claude_line(
            S,
            "user",
            [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": str(n)}],
            uuid=f"r{n}",
        ),
    ]


def _objects(home: Path) -> set[str]:
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        return {ref for (ref,) in conn.execute("SELECT ref FROM object_data")}


def _sql(home: Path, statement: str, *args: object) -> None:
    """One write through a second connection (the store's own stays open)."""
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        conn.execute(statement, args)
        conn.commit()


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def test_reingest_is_idempotent(store: EvidenceStore, home: Path, tmp_path: Path) -> None:
    """Ingesting the same file again stores nothing new and counts every entry as a duplicate."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1) + _turn(2))
    first = store.ingest(path, run_id="run_i").coverage[0]
    objects = _objects(home)
    page = store.entries("run_i", limit=200)
    second = store.ingest(path, run_id="run_i").coverage[0]
    assert first["counts"]["stored"] > 0
    assert second["counts"]["stored"] == 0
    assert second["counts"]["duplicates"] == first["counts"]["stored"]
    assert second["status"] == "ok"
    assert _objects(home) == objects
    again = store.entries("run_i", limit=200)
    assert [e["object_hash"] for e in again["entries"]] == [
        e["object_hash"] for e in page["entries"]
    ]
    assert len(store.overview("run_i")["coverage"]) == 1


def test_grown_file_continues_from_its_cursor(store: EvidenceStore, tmp_path: Path) -> None:
    """A grown file adds only its new records for the same run; earlier ones are duplicates."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    first = store.ingest(path, run_id="run_g").coverage[0]
    _append(path, _turn(2))
    second = store.ingest(path, run_id="run_g").coverage[0]
    assert second["counts"]["duplicates"] == first["counts"]["stored"]
    assert second["counts"]["stored"] == 3
    assert "prior_context" not in second
    scopes = {e["execution_scope"] for e in store.entries("run_g", limit=200)["entries"]}
    assert scopes == {"current_execution"}


@pytest.mark.parametrize("policy", ["basic", "detailed"])
def test_a_resuming_run_sees_earlier_records_as_prior_context(
    store: EvidenceStore, tmp_path: Path, policy: str
) -> None:
    """A run resuming another run's file gets the prefix as separate prior context."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    store.ingest(path, run_id="run_first")
    _append(path, _turn(2))
    report = store.ingest(path, run_id="run_second", policy=policy)
    (coverage,) = report.coverage
    prior = coverage["prior_context"]
    assert (prior["first_line"], prior["last_line"]) == (1, 3)
    assert (coverage["first_line"], coverage["last_line"]) == (4, 6)
    assert coverage["counts"]["read"] == 3 and prior["counts"]["read"] == 3
    assert coverage["status"] == "ok"
    entries = store.entries("run_second", limit=200)["entries"]
    current = [e for e in entries if e["execution_scope"] == "current_execution"]
    assert {e["sequence"] for e in current} == {4, 5, 6}
    prior_entries = [e for e in entries if e["execution_scope"] == "prior_context"]
    if policy == "basic":
        assert prior_entries == []
        # line 1: configuration + message + task; line 2: configuration (model) + call; 3: result
        assert {"category": "history", "reason": "capture_policy", "records": 6} in coverage[
            "omissions"
        ]
        assert prior["counts"]["stored"] == 0
    else:
        assert {e["sequence"] for e in prior_entries} == {1, 2, 3}
        assert prior["counts"]["stored"] == len(prior_entries)
    assert "task" in coverage["missing_fields"] and "task" not in prior["missing_fields"]


def test_explicit_resume_offset(store: EvidenceStore, tmp_path: Path) -> None:
    """A given resume offset must be a line start; a run keeps its recorded boundary."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1) + _turn(2))
    offset = len(path.read_bytes().splitlines(keepends=True)[0])
    with pytest.raises(EvidenceInvalidArgument) as bad:
        store.ingest(path, run_id="run_x", resume_offset=offset - 1)
    assert bad.value.code == "invalid_argument"
    (coverage,) = store.ingest(path, run_id="run_x", resume_offset=offset).coverage
    assert coverage["prior_context"]["last_line"] == 1 and coverage["first_line"] == 2
    with pytest.raises(EvidenceInvalidArgument):
        store.ingest(path, run_id="run_x", resume_offset=0)


def test_rewritten_file_is_reported(store: EvidenceStore, tmp_path: Path) -> None:
    """A rewritten prefix says source_rewritten; changed records become revisions."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    store.ingest(path, run_id="run_w")
    records = _turn(1)
    records[0] = claude_line(S, "user", "question one, edited", uuid="u1")
    jsonl(path, records)
    (coverage,) = store.ingest(path, run_id="run_w").coverage
    assert coverage["status"] == "partial"
    assert {"code": "source_rewritten"} in coverage["issues"]
    first = store.entries("run_w", limit=200)["entries"][0]
    revisions = store.entries("run_w", entry=first["id"], revisions=True)["entries"]
    assert len(revisions) == 2


def test_capture_policy_is_fixed_by_the_first_ingest(store: EvidenceStore, tmp_path: Path) -> None:
    """A run keeps the policy of its first ingest; asking for another is an invalid argument."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    store.ingest(path, run_id="run_p", policy="detailed")
    store.ingest(path, run_id="run_p")
    with pytest.raises(EvidenceInvalidArgument):
        store.ingest(path, run_id="run_p", policy="basic")
    assert store.overview("run_p")["capture_policy"]["preset"] == "detailed"


def test_missing_empty_and_unknown_files(store: EvidenceStore, tmp_path: Path) -> None:
    """A missing file is no_input, an empty one empty, an unknown format failed; none of them ok."""
    (missing,) = store.ingest(tmp_path / "nope.jsonl", run_id="run_n").coverage
    assert missing["status"] == "no_input"
    assert missing["counts"]["discovered"] == 0 and missing["counts"]["read"] is None
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert store.ingest(tmp_path / "empty.jsonl", run_id="run_n").coverage[0]["status"] == "empty"
    (tmp_path / "odd.jsonl").write_text('{"hello": 1}\nnot json\n', encoding="utf-8")
    (odd,) = store.ingest(tmp_path / "odd.jsonl", run_id="run_n").coverage
    assert odd["status"] == "failed"
    assert odd["issues"] == [{"code": "unknown_format"}]
    assert odd["counts"]["failed"] == 1 and odd["counts"]["unrecognized"] == 1


def test_objects_are_content_addressed_and_verified(
    store: EvidenceStore, home: Path, tmp_path: Path
) -> None:
    """A body is stored under the digest of its bytes; a tampered object is an error, never
    served, and so is a missing one."""
    store.ingest(jsonl(tmp_path / "s.jsonl", _turn(1)), run_id="run_o")
    (call,) = store.entries("run_o", kind="tool_call")["entries"]
    ref = call["content"]["ref"]
    hexpart = ref.removeprefix("sha256:")
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        (data,) = conn.execute("SELECT data FROM object_data WHERE ref=?", (ref,)).fetchone()
    assert hashlib.sha256(data).hexdigest() == hexpart == call["content"]["sha256"]
    assert json.loads(store.content("run_o", ref)["content"]) == {"command": "echo 1"}
    _sql(home, "UPDATE object_data SET data=? WHERE ref=?", b'{"command":"rm -rf /"}', ref)
    with pytest.raises(EvidenceReadFailed) as failure:
        store.content("run_o", ref)
    assert failure.value.code == "evidence_read_failed"
    _sql(home, "DELETE FROM object_data WHERE ref=?", ref)
    with pytest.raises(EvidenceReadFailed):
        store.content("run_o", ref)


def test_objects_of_older_stores_are_read_from_files(
    store: EvidenceStore, home: Path, tmp_path: Path
) -> None:
    """A store written when objects were files (objects/sha256/ab/cdef…) still serves them,
    verified the same way."""
    store.ingest(jsonl(tmp_path / "s.jsonl", _turn(1)), run_id="run_f")
    (call,) = store.entries("run_f", kind="tool_call")["entries"]
    ref = call["content"]["ref"]
    hexpart = ref.removeprefix("sha256:")
    _sql(home, "DELETE FROM object_data WHERE ref=?", ref)
    path = home / "objects" / "sha256" / hexpart[:2] / hexpart[2:]
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"command":"echo 1"}')
    assert json.loads(store.content("run_f", ref)["content"]) == {"command": "echo 1"}
    path.write_bytes(b'{"command":"rm -rf /"}')
    with pytest.raises(EvidenceReadFailed):
        store.content("run_f", ref)
    path.unlink()
    with pytest.raises(EvidenceReadFailed):
        store.content("run_f", ref)


def test_content_is_run_scoped(store: EvidenceStore, tmp_path: Path) -> None:
    """Content is served only for refs the run cites; unknown runs and refs are not found."""
    store.ingest(jsonl(tmp_path / "a.jsonl", _turn(1)), run_id="run_a")
    store.ingest(jsonl(tmp_path / "b.jsonl", [claude_line(S, "user", "other")]), run_id="run_b")
    ref = store.entries("run_a", kind="tool_call")["entries"][0]["content"]["ref"]
    with pytest.raises(EvidenceContentNotFound) as missing:
        store.content("run_b", ref)
    assert missing.value.code == "content_not_found"
    with pytest.raises(EvidenceRunNotFound) as no_run:
        store.content("run_zzz", ref)
    assert no_run.value.code == "run_not_found"
    with pytest.raises(EvidenceInvalidArgument):
        store.content("run_a", "sha256:nothex")


def test_content_pages_are_utf8_safe(store: EvidenceStore, tmp_path: Path) -> None:
    """Pages end on character boundaries, reassemble exactly, refuse mid-character offsets."""
    text = "aé漢🙂" * 50
    store.ingest(jsonl(tmp_path / "s.jsonl", [claude_line(S, "user", text)]), run_id="run_u")
    ref = store.entries("run_u", kind="message")["entries"][0]["content"]["ref"]
    pieces, offset = [], 0
    while True:
        page = store.content("run_u", ref, offset=offset, limit=5)
        assert page["schema_version"] == "agentprovenance.content_page/v1"
        assert len(page["content"].encode("utf-8")) <= 5
        pieces.append(page["content"])
        assert page["next_offset"] > offset
        offset = page["next_offset"]
        if not page["has_more"]:
            break
    assert "".join(pieces) == text
    assert page["total_bytes"] == len(text.encode("utf-8"))
    for bad in ({"offset": 2}, {"limit": 3}, {"limit": 262_145}, {"offset": 10_000}):
        with pytest.raises(EvidenceInvalidArgument):
            store.content("run_u", ref, **bad)


def test_overview_shape(store: EvidenceStore, tmp_path: Path) -> None:
    """The overview has the spec's required keys, one coverage per source, and stored counts."""
    store.ingest(jsonl(tmp_path / "s.jsonl", _turn(1) + _turn(2)), run_id="run_v")
    overview = store.overview("run_v")
    assert set(overview) >= {
        "schema_version",
        "run_id",
        "coverage",
        "messages",
        "tool_calls",
        "tool_results",
        "snapshots",
        "has_more_sources",
        "runtime_coverage",
    }
    (coverage,) = overview["coverage"]
    assert set(coverage) >= {
        "schema_version",
        "id",
        "run_id",
        "source",
        "status",
        "observed_at",
        "counts",
        "issues",
        "missing_fields",
    }
    assert set(coverage["source"]) >= {"id", "harness", "session_id", "parser_version", "binding"}
    assert (
        overview["tool_calls"] == 2 and overview["tool_results"] == 2 and overview["messages"] == 2
    )
    with pytest.raises(EvidenceRunNotFound):
        store.overview("run_missing")


def test_issues_are_bounded(store: EvidenceStore, tmp_path: Path) -> None:
    """A report lists at most 64 issues, the last one saying the list was cut."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(f"broken {n}\n" for n in range(100))
    (coverage,) = store.ingest(path, run_id="run_many").coverage
    assert coverage["counts"]["failed"] == 100
    assert len(coverage["issues"]) == 64
    assert coverage["issues"][-1] == {"code": "issue_limit"}
    assert coverage["status"] == "partial"


async def test_store_is_usable_from_worker_threads(store: EvidenceStore, tmp_path: Path) -> None:
    """An actor can drive the store through trio.to_thread, whichever thread it gets."""
    path = jsonl(tmp_path / "s.jsonl", _turn(1))
    report = await trio.to_thread.run_sync(lambda: store.ingest(path, run_id="run_thread"))
    assert report.coverage[0]["status"] == "ok"
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(trio.to_thread.run_sync, store.overview, "run_thread")
    assert (await trio.to_thread.run_sync(store.overview, "run_thread"))["tool_calls"] == 1


def test_tool_result_override_keeps_results_under_basic(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """basic with overrides.tool_results keeps result bodies, still omits raw records."""
    policy = CapturePolicy("basic", tool_result_override=True)
    (coverage,) = store.ingest(
        jsonl(tmp_path / "s.jsonl", _turn(1)), run_id="run_ov", policy=policy
    ).coverage
    assert coverage["capture_policy"]["overrides"] == {"tool_results": True}
    assert coverage["capture_policy"]["tool_results"] is True
    assert coverage["capture_policy"]["source_records"] is False
    (result,) = store.entries("run_ov", kind="tool_result")["entries"]
    assert result["content"]["state"] == "stored"
    assert result["raw_content"]["state"] == "omitted"
