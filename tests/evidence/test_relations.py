"""Session relations: kinds, evidence, issue codes, discovery limits and paging."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from braid_actors.errors import EvidenceContentNotFound, EvidenceInvalidArgument

from ._helpers import codex_line, codex_meta, jsonl

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.evidence import EvidenceStore


def _child(session: str, parent: str) -> dict[str, Any]:
    return codex_meta(session, source={"subagent": {"thread_spawn": {"parent_thread_id": parent}}})


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return codex_line(
        "response_item",
        {"type": "function_call", "name": name, "call_id": call_id, "arguments": json.dumps(args)},
    )


def _output(call_id: str, output: str) -> dict[str, Any]:
    return codex_line(
        "response_item", {"type": "function_call_output", "call_id": call_id, "output": output}
    )


def _ingest(
    store: EvidenceStore,
    tmp_path: Path,
    name: str,
    records: list[dict[str, Any]],
    run: str = "run_r",
) -> None:
    store.ingest(jsonl(tmp_path / f"{name}.jsonl", records), run_id=run)


def _relations(store: EvidenceStore, session: str, run: str = "run_r") -> list[dict[str, Any]]:
    page = store.session_relations(run, harness="codex", session=session, limit=200)
    assert page["schema_version"] == "agentprovenance.agent_context/v1"
    return list(page["relations"])


def _only(relations: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (relation,) = [r for r in relations if r["kind"] == kind]
    return relation


def test_parent_relation_points_from_parent_to_child(store: EvidenceStore, tmp_path: Path) -> None:
    """parent_session_id is a parent relation from parent to child, backed by an entry."""
    _ingest(store, tmp_path, "boss", [codex_meta("s-boss")])
    _ingest(store, tmp_path, "kid", [_child("s-kid", "s-boss")])
    for subject in ("s-kid", "s-boss"):
        relation = _only(_relations(store, subject), "parent")
        assert (
            relation["from"]["session_id"] == "s-boss" and relation["to"]["session_id"] == "s-kid"
        )
        assert relation["from"]["available"] and relation["from"]["run_id"] == "run_r"
        (evidence,) = relation["evidence"]
        assert evidence["basis"] == "source_parent_session_id"
        assert evidence["object_hash"].startswith("sha256:") and evidence["entry_id"].startswith(
            "ctx_"
        )
        assert "issues" not in relation


def test_self_parent(store: EvidenceStore, tmp_path: Path) -> None:
    """A source naming its own session as parent is flagged self_parent."""
    _ingest(store, tmp_path, "self", [_child("s-self", "s-self")])
    relation = _only(_relations(store, "s-self"), "parent")
    assert relation["issues"] == ["self_parent"]


def test_parent_cycle(store: EvidenceStore, tmp_path: Path) -> None:
    """Parents that lead back to the start are flagged parent_cycle."""
    _ingest(store, tmp_path, "a", [_child("s-a", "s-b")])
    _ingest(store, tmp_path, "b", [_child("s-b", "s-a")])
    relations = [r for r in _relations(store, "s-a") if r["kind"] == "parent"]
    assert len(relations) == 2
    assert all("parent_cycle" in r["issues"] for r in relations)


def test_conflicting_parents(store: EvidenceStore, tmp_path: Path) -> None:
    """Two sources of one session naming different parents are flagged conflicting_parents."""
    _ingest(store, tmp_path, "c1", [_child("s-c", "s-p1")])
    _ingest(store, tmp_path, "c2", [_child("s-c", "s-p2")])
    relations = [r for r in _relations(store, "s-c") if r["kind"] == "parent"]
    assert {r["from"]["session_id"] for r in relations} == {"s-p1", "s-p2"}
    assert all(r["issues"] == ["conflicting_parents"] for r in relations)
    assert all(not r["from"]["available"] and "run_id" not in r["from"] for r in relations)


def test_fork_delegation_and_message_request(store: EvidenceStore, tmp_path: Path) -> None:
    """Fork metadata, spawn results and send_input calls give fork, delegation, request."""
    _ingest(
        store,
        tmp_path,
        "lead",
        [
            codex_meta("s-lead", forked_from_id="s-origin"),
            _call("c1", "spawn_agent", {"message": "go"}),
            _output("c1", json.dumps({"agent_id": "s-helper"})),
            _call("c2", "send_input", {"id": "s-helper", "message": "more"}),
            _output("c2", "{}"),
        ],
    )
    relations = _relations(store, "s-lead")
    fork = _only(relations, "fork")
    assert (fork["from"]["session_id"], fork["to"]["session_id"]) == ("s-origin", "s-lead")
    assert fork["evidence"][0]["basis"] == "native_fork_metadata"
    delegation = _only(relations, "delegation")
    assert (delegation["from"]["session_id"], delegation["to"]["session_id"]) == (
        "s-lead",
        "s-helper",
    )
    assert delegation["to"] == {"harness": "codex", "session_id": "s-helper", "available": False}
    assert delegation["evidence"][0]["basis"] == "native_spawn_result"
    request = _only(relations, "message_request")
    assert request["evidence"][0]["basis"] == "native_send_input_call"
    assert len({r["id"] for r in relations}) == len(relations)


def test_same_session_in_two_runs_and_prior_actions_excluded(
    store: EvidenceStore, tmp_path: Path
) -> None:
    """Another run's copy is same_session; prior-context actions add no evidence."""
    records = [
        codex_meta("s-twice"),
        _call("c1", "spawn_agent", {}),
        _output("c1", '{"agent_id": "s-h"}'),
    ]
    path = jsonl(tmp_path / "twice.jsonl", records)
    store.ingest(path, run_id="run_one")
    store.ingest(path, run_id="run_two")  # everything is prior context for run_two
    relations = _relations(store, "s-twice", run="run_two")
    same = _only(relations, "same_session")
    assert {e["run_id"] for e in same["evidence"]} == {"run_one", "run_two"}
    assert same["from"]["run_id"] == "run_two" and same["to"]["run_id"] == "run_one"
    delegation = _only(relations, "delegation")
    assert {e["run_id"] for e in delegation["evidence"]} == {"run_one"}


def test_subject_must_occur_in_the_run(store: EvidenceStore, tmp_path: Path) -> None:
    """Asking about a session the run does not hold is not found; bad arguments are invalid."""
    _ingest(store, tmp_path, "x", [codex_meta("s-x")])
    with pytest.raises(EvidenceContentNotFound):
        store.session_relations("run_r", harness="codex", session="s-nope")
    with pytest.raises(EvidenceInvalidArgument):
        store.session_relations("run_r", harness="", session="s-x")


def test_relation_pages_and_snapshot_bound_cursor(store: EvidenceStore, tmp_path: Path) -> None:
    """Relations page with a cursor; when the evidence changes the old cursor is refused."""
    _ingest(store, tmp_path, "hub", [codex_meta("s-hub")])
    for n in range(3):
        _ingest(store, tmp_path, f"k{n}", [_child(f"s-k{n}", "s-hub")])
    first = store.session_relations("run_r", harness="codex", session="s-hub", limit=2)
    assert len(first["relations"]) == 2 and first["has_more"] and not first["limited"]
    rest = store.session_relations(
        "run_r", harness="codex", session="s-hub", limit=2, cursor=first["next_cursor"]
    )
    assert len(rest["relations"]) == 1 and not rest["has_more"]
    _ingest(store, tmp_path, "k9", [_child("s-k9", "s-hub")])
    with pytest.raises(EvidenceInvalidArgument):
        store.session_relations(
            "run_r", harness="codex", session="s-hub", limit=2, cursor=first["next_cursor"]
        )


def test_discovery_limits_are_reported(store: EvidenceStore, tmp_path: Path) -> None:
    """Too many actions or an oversized spawn body set limited with the spec's issues."""
    records = [codex_meta("s-busy")]
    for n in range(2049):
        records.append(_call(f"c{n}", "send_input", {"id": "s-peer", "message": "x"}))
    records.append(_call("big", "spawn_agent", {}))
    records.append(_output("big", json.dumps({"agent_id": "s-huge", "pad": "x" * 70_000})))
    _ingest(store, tmp_path, "busy", records)
    page = store.session_relations("run_r", harness="codex", session="s-busy")
    assert page["limited"] is True
    assert page["issues"] == ["session_action_discovery_limit", "session_relation_body_limit"]
    assert not [r for r in page["relations"] if r["kind"] == "delegation"]
