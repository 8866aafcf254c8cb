"""Entry pages: opaque cursors bound to run and filters, page limits, stable order."""

from __future__ import annotations

import base64
import json
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING

import pytest

from braid_actors.errors import EvidenceInvalidArgument
from braid_actors.evidence import EvidenceStore
from braid_actors.workers._session import SessionLine, create_session

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

COUNT = 1_100


def _ingest_small(store: EvidenceStore, folder: Path) -> None:
    path = folder / "run_small" / "sess_00112233445566778899aabb.jsonl"
    create_session(path, [SessionLine("msg_1", "user", "hello")])
    store.ingest(path, run_id="run_small")


def _ingest_big(store: EvidenceStore, folder: Path, run: str) -> None:
    lines = [
        SessionLine(f"msg_{i}", "user" if i % 2 else "assistant", f"line {i} ünïcödé")
        for i in range(1, COUNT + 1)
    ]
    path = folder / run / "sess_00112233445566778899aabb.jsonl"
    create_session(path, lines)
    store.ingest(path, run_id=run)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvidenceStore]:
    """One store, read-only for these tests, holding two runs of 1,100 lines each."""
    folder = tmp_path_factory.mktemp("paging")
    with EvidenceStore.open(folder / "home") as store:
        _ingest_big(store, folder, "run_big")
        _ingest_big(store, folder, "run_other")
        yield store


def _reason(exc: pytest.ExceptionInfo[EvidenceInvalidArgument]) -> object:
    assert exc.value.code == "invalid_argument"
    return exc.value.details.get("reason")


@pytest.mark.parametrize("limit", [200, 137])
def test_cursor_round_trips_over_a_thousand_entries(big: EvidenceStore, limit: int) -> None:
    """next_cursor visits every entry once, in physical order, at most limit per page."""
    seen: list[tuple[int, int]] = []
    ids: set[str] = set()
    cursor = None
    pages = 0
    while True:
        page = big.entries("run_big", cursor=cursor, limit=limit)
        pages += 1
        assert page["limit"] == limit and len(page["entries"]) <= limit
        for entry in page["entries"]:
            seen.append((entry["sequence"], entry["source_ordinal"]))
            ids.add(entry["id"])
        if not page["has_more"]:
            assert "next_cursor" not in page
            break
        cursor = page["next_cursor"]
        assert isinstance(cursor, str) and len(cursor) <= 8192
    assert len(seen) == COUNT + 1  # every line is a message, the first user line also a task
    assert len(ids) == len(seen)
    assert seen == sorted(seen)
    assert pages == -(-len(seen) // limit)


def test_filtered_paging_keeps_the_filter(big: EvidenceStore) -> None:
    """A cursor made for kind=task / role-free filters continues the same filtered listing."""
    first = big.entries("run_big", kind="message", limit=200)
    second = big.entries("run_big", kind="message", limit=200, cursor=first["next_cursor"])
    assert all(e["kind"] == "message" for e in first["entries"] + second["entries"])
    assert first["entries"][-1]["sequence"] < second["entries"][0]["sequence"]


def test_cursor_from_another_run_or_filter_is_refused(big: EvidenceStore) -> None:
    """A cursor used with another run or filters is an invalid_argument with a reason."""
    cursor = big.entries("run_big", limit=10)["next_cursor"]
    with pytest.raises(EvidenceInvalidArgument) as other_run:
        big.entries("run_other", limit=10, cursor=cursor)
    assert _reason(other_run) == "other_run"
    with pytest.raises(EvidenceInvalidArgument) as other_filter:
        big.entries("run_big", limit=10, cursor=cursor, kind="message")
    assert _reason(other_filter) == "other_filters"
    with pytest.raises(EvidenceInvalidArgument) as other_limit_ok:
        big.entries("run_big", limit=10, cursor=cursor, revisions=True)
    assert _reason(other_limit_ok) == "other_filters"
    assert big.entries("run_big", limit=20, cursor=cursor)["entries"]


def test_tampered_cursor_is_refused(big: EvidenceStore) -> None:
    """Editing a cursor's payload (even to name the same run) or its mac makes it invalid."""
    cursor = big.entries("run_big", limit=10)["next_cursor"]
    head, tail = cursor.split(".")
    payload = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    payload["p"][1] = 1_000
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    for token in (f"{forged}.{tail}", f"{head}.{'A' if tail[0] != 'A' else 'B'}{tail[1:]}"):
        with pytest.raises(EvidenceInvalidArgument) as tampered:
            big.entries("run_big", limit=10, cursor=token)
        assert _reason(tampered) == "tampered"
    non_canonical = f"{head}.{tail[:-1]}{chr(ord(tail[-1]) ^ 1)}"
    for token in ("", "garbage", "a.b.c", "x" * 9000, non_canonical):
        with pytest.raises(EvidenceInvalidArgument):
            big.entries("run_big", limit=10, cursor=token)


@pytest.mark.parametrize(
    "bad",
    [
        {"limit": 0},
        {"limit": 201},
        {"limit": True},
        {"kind": "usage"},
        {"group": "everything"},
        {"session": ""},
    ],
)
def test_bad_listing_arguments_are_invalid(big: EvidenceStore, bad: dict[str, object]) -> None:
    """Page limits outside 1–200 and unknown kinds or groups are invalid arguments."""
    with pytest.raises(EvidenceInvalidArgument):
        big.entries("run_big", **bad)  # type: ignore[arg-type]


def test_group_filter(big: EvidenceStore) -> None:
    """group=conversation lists messages, tool records and tasks; group=configuration the rest."""
    conversation = big.entries("run_big", group="conversation", limit=5)["entries"]
    assert {e["kind"] for e in conversation} <= {"message", "tool_call", "tool_result", "task"}
    assert big.entries("run_big", group="configuration")["entries"] == []


def test_a_page_reads_stored_bodies_exactly_as_json_does(tmp_path: Path) -> None:
    """A body holding integers beyond 64 bits, floats, NaN or non-ASCII text comes back in a
    page with those very values (a page reads bodies by orjson where that is exact)."""
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        _ingest_small(store, tmp_path)
    for value in (
        {"session_metadata": {"n": 2**70, "m": -(10**25)}, "f": 0.1, "text": "ünï \u2028"},
        {"session_metadata": {"nan": float("nan"), "inf": float("inf")}, "n": 2**64},
    ):
        body = json.dumps(value | {"id": "ctx_x"}, ensure_ascii=False, sort_keys=True)
        with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn, conn:
            conn.execute("UPDATE entries SET body=?", (body,))
        with EvidenceStore.open(home) as store:
            entry = store.entries("run_small", limit=1)["entries"][0]
        source = entry.pop("source")
        assert source["session_id"] == "sess_00112233445566778899aabb"
        assert repr(entry) == repr(json.loads(body))


def test_every_entry_of_a_page_names_its_own_source(tmp_path: Path) -> None:
    """Pages over a run of several sources (a session and its subagents): each entry carries
    the Source its ``source_key`` names, also where a page holds entries of several."""
    folder = FIXTURES / "claude-code" / "marot__spotter" / "test" / "fixtures" / "transcripts"
    paths = [folder / "subagent.jsonl", *sorted(folder.rglob("agent-*.jsonl"))]
    with EvidenceStore.open(tmp_path / "home") as store:
        for path in paths:
            store.ingest(path, run_id="run_many", policy="detailed")
        cursor, seen, mixed = None, set(), 0
        while True:
            page = store.entries("run_many", cursor=cursor, limit=37)
            ids = {entry["source"]["id"] for entry in page["entries"]}
            mixed += len(ids) > 1
            for entry in page["entries"]:
                assert entry["source_key"].split(":")[0] == entry["source"]["id"]
                assert entry["source"]["session_id"]
            seen |= ids
            cursor = page.get("next_cursor")
            if not cursor:
                break
    assert len(seen) >= 3 and mixed >= 2
