"""Comparison records (``/api/compare/records``) projected from stored entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from braid_actors.errors import EvidenceInvalidArgument, EvidenceRunNotFound
from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._records import compare_records

from ._helpers import claude_line, jsonl


def all_pages(store: EvidenceStore, run_id: str) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = compare_records(store, {"run": run_id, "cursor": cursor})
        pages.append(page)
        if not page["has_more"]:
            return pages
        cursor = page["next_cursor"]


def transcript(home: Path) -> Path:
    return jsonl(
        home / "s.jsonl",
        [
            claude_line("s-1", "user", "fix the build", uuid="u1"),
            claude_line("s-1", "assistant", [{"type": "text", "text": "ok"}], uuid="u2"),
        ],
    )


def test_task_and_configuration_fields_are_projected(home: Path) -> None:
    """Under the detailed policy the task is the recorded prompt and each configuration
    field is one record whose value digests the recorded JSON value."""
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(transcript(home), policy="detailed").run_id
        pages = all_pages(store, run_id)
        records = [r for p in pages for r in p["records"]]
        task = [r for r in records if r["dimension"] == "task"]
        assert len(task) == 1
        assert task[0]["value"]["preview"] == json.dumps("fix the build")
        assert task[0]["partial"] is False
        configuration = {r["label"]: r for r in records if r["dimension"] == "configuration"}
        assert configuration["workdir"]["value"]["preview"] == json.dumps("/work/project")
        assert all(r["key"] == "configuration/" + r["label"] for r in configuration.values())
        first = pages[0]["issues"]
        assert {i["dimension"] for i in first} == {"files", "network", "outbound", "access_control"}
        assert all(i["code"] == "dimension_not_recorded" for i in first)
        assert all(not p["issues"] for p in pages[1:])


def test_an_omitted_configuration_body_is_a_null_value_with_an_issue(home: Path) -> None:
    """Under the basic policy configuration bodies are omitted: the record's value is null
    (not invented), partial, and the page names the missing evidence."""
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(transcript(home), policy="basic").run_id
        pages = all_pages(store, run_id)
        records = [r for p in pages for r in p["records"] if r["dimension"] == "configuration"]
        assert records
        assert all(r["value"] is None and r["partial"] for r in records)
        codes = {(i["dimension"], i["code"]) for p in pages for i in p["issues"]}
        assert ("configuration", "content_not_recorded") in codes


def test_refusals(home: Path) -> None:
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(transcript(home)).run_id
        with pytest.raises(EvidenceRunNotFound):
            compare_records(store, {"run": "run_missing", "cursor": None})
        for values in (
            {"cursor": "x"},
            {"cursor": "1:garbage"},
            {"cursor": None, "session": "s-1"},
        ):
            with pytest.raises(EvidenceInvalidArgument):
                compare_records(store, {"run": run_id, "cursor": None, **values})
