"""The Dashboard's search catalog and artifact reader, served for real over ingested fixtures.

The run holds two real transcripts (Claude Code and Codex), a copy of a third one with one
record changed and read again (so one entry has two revisions), and runtime events derived
from the Codex shell commands, correlated by the store. Expected catalogs are computed
from the store's entry pages and plain SQLite reads, not from the catalog code.
"""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import jsonschema_rs
import pytest
import trio

from braid_actors.evidence import EvidenceStore, ProcessObservation, make_app, serve_evidence
from braid_actors.evidence._schema import DB_FILE
from braid_actors.model import parse_time

from ._helpers import FIXTURES, read_records
from .test_http import CLAUDE, CODEX, SPEC, Served, asgi_get, assert_error, get

CODEX_FILE = CODEX / "samples" / "codex_session.jsonl"
EDITED = FIXTURES / "claude-code" / "lanegrid__agtrace" / "crates" / "agtrace-providers"
EDITED_FILE = EDITED / "tests" / "samples" / "claude_session.jsonl"
TOOL_KINDS = ("tool_call", "tool_result")
SECRET = "sk-ant-api03-" + "Zq7" * 12
ARTIFACT_KEYS = {
    "schema_version",
    "kind",
    "content_state",
    "mode",
    "size",
    "truncated",
    "redacted",
    "offset",
    "next_offset",
    "total_bytes",
    "has_more",
}


def conforms(schema: str, body: dict[str, Any]) -> None:
    """``body`` validates against the spec's component ``schema`` (every field and bound)."""
    root = {"$ref": f"#/components/schemas/{schema}", "components": SPEC["components"]}
    jsonschema_rs.validator_for(root).validate(body)


@attrs.frozen
class Dash:
    served: Served
    other_run: str

    @property
    def url(self) -> str:
        return str(self.served.server.dashboard_url)


def _edit_one_prompt(path: Path) -> None:
    """Change the text of the first string-content user prompt of a copied transcript."""
    records = read_records(path)
    for record in records:
        message = record.get("message") or {}
        if record.get("type") == "user" and isinstance(message.get("content"), str):
            message["content"] += " (edited)"
            break
    else:
        raise AssertionError("the fixture has no string prompt")
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _observations(store: EvidenceStore, run: str) -> list[ProcessObservation]:
    """One exec per recorded Codex shell command, 200 ms into its call, and one process no
    call explains."""
    found: list[ProcessObservation] = []
    for entry in store.entries(run, kind="tool_call", harness="codex", limit=200)["entries"]:
        if entry["content"].get("state") != "stored":
            continue
        try:
            command = json.loads(store.content(run, entry["content"]["ref"])["content"])
        except ValueError:
            continue
        if isinstance(command, dict) and isinstance(command.get("command"), str):
            start = parse_time(entry["recorded_at"]) + timedelta(milliseconds=200)
            argv = ("bash", "-lc", command["command"])
            found.append(ProcessObservation(4000 + len(found), 1, argv, start, run_id=run))
    assert found
    lone = parse_time("2030-01-01T00:00:00Z")
    found.append(ProcessObservation(9999, 1, ("sleep", "1"), lone, run_id=run))
    header = f"Authorization: Bearer {SECRET}"
    found.append(ProcessObservation(9998, 1, ("curl", "-H", header), lone, run_id=run))
    return found


@pytest.fixture
async def dash(home: Path, tmp_path: Path, nursery: trio.Nursery) -> Dash:
    copy = tmp_path / "edited.jsonl"
    shutil.copyfile(EDITED_FILE, copy)
    with EvidenceStore.open(home) as store:
        run = store.ingest(CLAUDE / "short.jsonl", policy="detailed").run_id
        store.ingest(CODEX_FILE, run_id=run, resume_offset=0)
        store.ingest(copy, run_id=run, resume_offset=0)
        _edit_one_prompt(copy)
        store.ingest(copy, run_id=run)
        store.begin_runtime_capture(run)
        store.record_runtime(run, _observations(store, run))
        assert store.correlate(run)["edges"] >= 1
        other = store.ingest(CLAUDE / "short.jsonl", policy="basic").run_id
    start = functools.partial(serve_evidence, home, port=0, dashboard_port=0, spec=SPEC)
    server = await nursery.start(start)
    return Dash(Served(home, run, server), other)


async def walk(dash: Dash, run: str, **scope: str) -> list[dict[str, Any]]:
    """Every catalog page of ``run`` followed by cursor; checks the page shape."""
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"run": run, **scope}
        if cursor is not None:
            params["cursor"] = cursor
        response = await get(f"{dash.url}/api/search/sources", params, dash.served.auth)
        assert response.status_code == 200, response.text
        page = response.json()
        conforms("SearchSourcePage", page)
        assert page["schema_version"] == "agentprovenance.search_sources/v1"
        assert page["run_id"] == run and len(page["sources"]) <= 50
        if scope:
            assert (page["harness"], page["session_id"]) == (scope["harness"], scope["session"])
        pages.append(page)
        assert page["has_more"] == ("next_cursor" in page)
        if not page["has_more"]:
            return pages
        cursor = page["next_cursor"]


def _all_entries(store: EvidenceStore, run: str, **filters: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = store.entries(run, cursor=cursor, limit=200, **filters)
        out.extend(page["entries"])
        if not page["has_more"]:
            return out
        cursor = page["next_cursor"]


def expected_catalog(
    home: Path, run: str, harness: str | None = None, session: str | None = None
) -> list[str]:
    """Source ids in catalog order, from entry pages and plain SQLite."""
    scope: dict[str, Any] = {} if harness is None else {"harness": harness, "session": session}
    with EvidenceStore.open(home) as store:
        latest = _all_entries(store, run, **scope)
        every = _all_entries(store, run, revisions=True, **scope)
    current = {e["id"]: e["object_hash"] for e in latest}
    ids = [f"entry:{e['id']}" for e in latest if e["kind"] not in TOOL_KINDS]
    ids += [f"version:{e['object_hash']}" for e in every if current[e["id"]] != e["object_hash"]]
    ids += [f"entry:{e['id']}" for e in latest if e["kind"] in TOOL_KINDS]
    conn = sqlite3.connect(home / DB_FILE)
    query = "SELECT event_id FROM runtime_events WHERE run_id=?"
    args: tuple[Any, ...] = (run,)
    if harness is not None:
        query += " AND harness=? AND session_id=?"
        args = (run, harness, session)
    ids += ["runtime:" + r[0] for r in conn.execute(query + " ORDER BY pk", args)]
    if harness is None:
        reports = conn.execute("SELECT ref FROM runtime_reports WHERE run_id=? ORDER BY pk", (run,))
        ids += ["runtime_report:" + r[0] for r in reports]
    conn.close()
    return ids


def expected_node(store: EvidenceStore, run: str, source: dict[str, Any]) -> str:
    """The exact reader of an entry source: its stored body, else the entry id when the
    entry has one revision (a superseded one is never that), else the revision's hash."""
    entry = source["entry"]
    if entry["content"].get("state") == "stored":
        return str(entry["content"]["ref"])
    revisions = store.entries(run, entry=entry["id"], revisions=True)["entries"]
    if len(revisions) == 1:
        return str(entry["id"])
    return str(entry["object_hash"])


async def test_catalog_lists_every_stage_in_order(dash: Dash) -> None:
    """Followed by cursor, the catalog is the latest context entries, then the superseded
    revision, then the tool records, then the runtime events and the correlation report:
    each exactly once, in order, every stage non-empty, at most 50 a page."""
    run = dash.served.run_id
    pages = await walk(dash, run)
    sources = [s for page in pages for s in page["sources"]]
    assert [s["id"] for s in sources] == expected_catalog(dash.served.home, run)
    assert len(pages) >= 2
    prefixes = {s["id"].split(":")[0] for s in sources}
    assert prefixes == {"entry", "version", "runtime", "runtime_report"}
    assert {s["category"] for s in sources} == {"messages", "tools", "configuration", "runtime"}
    with EvidenceStore.open(dash.served.home) as store:
        for source in sources:
            if "entry" not in source:
                continue
            entry = source["entry"]
            assert source["category"] == {"message": "messages"}.get(
                entry["kind"], "tools" if entry["kind"] in TOOL_KINDS else "configuration"
            )
            assert source["content"] == entry["content"]
            assert (source["source_id"], source["session_id"]) == (
                entry["source"]["id"],
                entry["source"]["session_id"],
            )
            assert source["node"] == expected_node(store, run, source)
            if source["id"].startswith("entry:"):
                assert entry == store.entries(run, entry=entry["id"])["entries"][0]
                links = store.links(run, entry["id"])["links"]
                assert source.get("graph_node") == (links[0]["node_id"] if links else None)
    runtime = [s for s in sources if s["id"].startswith("runtime:")]
    attributed = [s for s in runtime if "graph_node" in s]
    assert attributed and len(attributed) < len(runtime)
    for source in runtime:
        assert source["content"] == {"state": "reader", "bytes": None}
        assert source["node"] == source["id"].removeprefix("runtime:")
    with EvidenceStore.open(dash.served.home) as store:
        for source in attributed:
            call = store.entries(run, entry=source["graph_node"])["entries"][0]
            assert call["kind"] == "tool_call"
            assert source["session_id"] == call["source"]["session_id"]


async def test_nothing_is_catalogued_that_the_store_does_not_hold(dash: Dash) -> None:
    """A run with one transcript, no runtime capture and no changed records lists its
    entries only: no version, no runtime source is made up."""
    run = dash.other_run
    sources = [s for page in await walk(dash, run) for s in page["sources"]]
    assert [s["id"] for s in sources] == expected_catalog(dash.served.home, run)
    assert sources and all(s["id"].startswith("entry:") for s in sources)
    with EvidenceStore.open(dash.served.home) as store:
        assert all(s["node"] == expected_node(store, run, s) for s in sources)
    assert any(s["node"].startswith("ctx_") for s in sources)


async def test_session_scope_keeps_only_that_sessions_records(dash: Dash) -> None:
    """With harness and session the catalog holds only that native session's entries and
    the runtime events attributed to it; no run-wide report. Half a scope is 400 and a
    session the run does not hold is 404."""
    run, home = dash.served.run_id, dash.served.home
    with EvidenceStore.open(home) as store:
        codex = store.entries(run, harness="codex", limit=1)["entries"][0]["source"]
    scope = {"harness": "codex", "session": codex["session_id"]}
    sources = [s for page in await walk(dash, run, **scope) for s in page["sources"]]
    assert [s["id"] for s in sources] == expected_catalog(home, run, "codex", codex["session_id"])
    assert all(s.get("session_id") == codex["session_id"] for s in sources)
    assert any(s["id"].startswith("runtime:") for s in sources)
    assert not any(s["id"].startswith("runtime_report:") for s in sources)
    url = f"{dash.url}/api/search/sources"
    auth = dash.served.auth
    for half in ({"harness": "codex"}, {"session": codex["session_id"]}):
        assert_error(await get(url, {"run": run, **half}, auth), 400, "invalid_argument")
    absent = {"run": run, "harness": "claude_code", "session": codex["session_id"]}
    assert_error(await get(url, absent, auth), 404, "content_not_found")


async def test_catalog_cursors_are_bound_to_run_and_scope(dash: Dash) -> None:
    """A tampered cursor, another run's cursor and a cursor of another session scope are
    all invalid_argument."""
    run, auth = dash.served.run_id, dash.served.auth
    url = f"{dash.url}/api/search/sources"
    cursor = (await get(url, {"run": run}, auth)).json()["next_cursor"]
    head, _, tail = cursor.partition(".")
    flipped = head[:-2] + ("A" if head[-2] != "A" else "B") + head[-1] + "." + tail
    for bad in (flipped, cursor[:-1], "0.0"):
        assert_error(await get(url, {"run": run, "cursor": bad}, auth), 400, "invalid_argument")
    foreign = {"run": dash.other_run, "cursor": cursor}
    assert_error(await get(url, foreign, auth), 400, "invalid_argument")
    with EvidenceStore.open(dash.served.home) as store:
        session = store.entries(run, harness="codex", limit=1)["entries"][0]["source"]
    scoped = {"run": run, "harness": "codex", "session": session["session_id"], "cursor": cursor}
    assert_error(await get(url, scoped, auth), 400, "invalid_argument")


async def artifact(dash: Dash, **params: Any) -> dict[str, Any]:
    """One authorized /api/artifact page of the main run (unless ``run`` is given)."""
    query = {"run": dash.served.run_id, **params}
    response = await get(f"{dash.url}/api/artifact", query, dash.served.auth)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    conforms("ArtifactPage", page)
    assert (
        set(page) >= ARTIFACT_KEYS and page["schema_version"] == "agentprovenance.artifact_page/v1"
    )
    return page


async def read_whole(dash: Dash, node: str, mode: str = "body", limit: int = 65536) -> str:
    parts, offset = [], 0
    while True:
        page = await artifact(dash, node=node, mode=mode, offset=offset, limit=limit)
        assert page["kind"] == "text" and page["content_state"] == "stored", page
        parts.append(page.get("content", ""))
        if not page["has_more"]:
            assert page["next_offset"] == page["total_bytes"] == page["size"]
            return "".join(parts)
        assert page["truncated"] and page["next_offset"] > offset
        offset = page["next_offset"]


@pytest.mark.parametrize("which", ["detailed", "basic"])
async def test_every_catalog_node_is_read_by_the_artifact_route(dash: Dash, which: str) -> None:
    """Each source's node opens in /api/artifact: stored bodies verified and equal to the
    content route's bytes, an omitted body (basic retention) its explicit state, a runtime
    event its database record, the correlation report its object."""
    run = dash.served.run_id if which == "detailed" else dash.other_run
    sources = [s for page in await walk(dash, run) for s in page["sources"]]
    states = {s["content"]["state"] for s in sources}
    assert states == ({"stored", "reader"} if which == "detailed" else {"stored", "omitted"})
    with EvidenceStore.open(dash.served.home) as store:
        for source in sources:
            page = await artifact(dash, node=source["node"], run=run)
            content = source["content"]
            if content["state"] == "stored":
                assert page["source"] == "object" and page["integrity"] == "object_hash_verified"
                assert page["ref"] == content["ref"] and page["sha256"] == content["sha256"]
                whole = store.content(run, content["ref"], limit=262_144)
                assert page["total_bytes"] == whole["total_bytes"] == content["bytes"]
                if not whole["has_more"]:
                    assert page.get("content", "") == whole["content"]
            elif content["state"] == "reader":
                assert page["source"] == "db" and page["integrity"] == "database_record"
                record = json.loads(await read_whole(dash, source["node"]))
                assert record["event_id"] == source["node"] and record["run_id"] == run
                assert record["tool_call_id"] == source.get("tool_call_id", record["tool_call_id"])
            else:
                assert page["kind"] == "unavailable" and "content" not in page
                assert page["content_state"] == content["state"]
                assert page["reason"] == content.get("reason", "source_not_recorded")
                assert page["total_bytes"] is None


async def test_runtime_records_are_served_redacted(dash: Dash) -> None:
    """A runtime event whose command line held a token is catalogued without it, and its
    database record reads back with the redaction marker and redacted true."""
    run = dash.served.run_id
    pages = await walk(dash, run)
    assert SECRET not in json.dumps(pages)
    conn = sqlite3.connect(dash.served.home / DB_FILE)
    (event_id,) = conn.execute(
        "SELECT event_id FROM runtime_events WHERE run_id=? AND pid=9998", (run,)
    ).fetchone()
    conn.close()
    (source,) = [s for page in pages for s in page["sources"] if s.get("node") == event_id]
    assert source["label"] == "exec pid 9998" and "graph_node" not in source
    page = await artifact(dash, node=event_id, mode="raw")
    assert page["redacted"] is True and SECRET not in json.dumps(page)
    record = json.loads(await read_whole(dash, event_id))
    assert record["argv"][:2] == ["curl", "-H"] and "[REDACTED:" in record["argv"][2]


async def test_utf8_paging_and_boundaries(dash: Dash) -> None:
    """A body with multi-byte characters reads back whole in 4-byte pages; an offset inside
    a character is 400 invalid_argument, as is one past the end."""
    run = dash.served.run_id
    with EvidenceStore.open(dash.served.home) as store:
        bodies = [
            (e["content"]["ref"], store.content(run, e["content"]["ref"], limit=262_144))
            for e in _all_entries(store, run)
            if e["content"].get("state") == "stored" and (e["content"]["bytes"] or 0) < 4000
        ]
    ref, whole = next((r, w) for r, w in bodies if not w["content"].isascii())
    data = whole["content"].encode("utf-8")
    assert await read_whole(dash, ref, limit=4) == whole["content"]
    inside = next(i for i, byte in enumerate(data) if byte & 0xC0 == 0x80)
    url, auth = f"{dash.url}/api/artifact", dash.served.auth
    for offset in (inside, len(data) + 1):
        params = {"run": run, "node": ref, "offset": offset}
        assert_error(await get(url, params, auth), 400, "invalid_argument")


async def test_entry_ids_revisions_and_raw_mode(dash: Dash) -> None:
    """An entry id with one revision reads its body (raw mode: its saved source record). The
    edited line's entries have two revisions: where they select different bodies for the
    mode the id is ambiguous and lists each exact version (each opens); where both
    revisions keep the same body (the configuration snapshot of the line) the id reads it."""
    run = dash.served.run_id
    with EvidenceStore.open(dash.served.home) as store:
        every = _all_entries(store, run, revisions=True)
        twice: dict[str, list[dict[str, Any]]] = {}
        for entry in every:
            twice.setdefault(entry["id"], []).append(entry)
        changed = {k: v for k, v in twice.items() if len(v) > 1}
        assert {v[0]["kind"] for v in changed.values()} == {"message", "task", "configuration"}
        single = next(e for e in every if e["id"] not in changed and "ref" in e["raw_content"])
        body = store.content(run, single["content"]["ref"], limit=262_144)["content"]
        raw = store.content(run, single["raw_content"]["ref"], limit=262_144)["content"]
    assert await read_whole(dash, single["id"]) == body
    assert await read_whole(dash, single["id"], mode="raw") == raw
    for versions in changed.values():
        for mode, field in (("body", "content"), ("raw", "raw_content")):
            page = await artifact(dash, node=versions[0]["id"], mode=mode)
            refs = [v[field]["ref"] for v in versions]
            if len(set(refs)) == 1:
                assert page["kind"] == "text" and page["ref"] == refs[0]
                continue
            assert (page["kind"], page["content_state"]) == ("unavailable", "ambiguous")
            assert "content" not in page and page["versions_has_more"] is False
            assert page["versions"] == [
                {"ref": ref, "source_id": v["source"]["id"]}
                for ref, v in zip(refs, versions, strict=True)
            ]
            for version in page["versions"]:
                await read_whole(dash, version["ref"], mode=mode)
    config = next(v for v in changed.values() if v[0]["kind"] == "configuration")
    assert config[0]["content"]["ref"] == config[1]["content"]["ref"]
    for version in config:
        by_hash = await artifact(dash, node=version["object_hash"], mode="raw")
        assert by_hash["ref"] == version["raw_content"]["ref"]


async def test_omitted_missing_tampered_and_unknown_nodes(dash: Dash) -> None:
    """Under basic retention an omitted tool result says omitted (capture_policy) in both
    modes; an unknown node is unavailable; a tampered object is integrity_failure and a
    deleted one unavailable — all 200 with no content. An unknown run is 400."""
    other, auth = dash.other_run, dash.served.auth
    with EvidenceStore.open(dash.served.home) as store:
        result = store.entries(other, kind="tool_result", limit=1)["entries"][0]
    for mode in ("body", "raw"):
        params = {"run": other, "node": result["object_hash"], "mode": mode}
        page = (await get(f"{dash.url}/api/artifact", params, auth)).json()
        assert (page["kind"], page["content_state"], page["reason"]) == (
            "unavailable",
            "omitted",
            "capture_policy",
        )
        assert "content" not in page and page["total_bytes"] is None
    unknown = await artifact(dash, node="ctx_" + "0" * 32)
    assert (unknown["content_state"], unknown["reason"]) == ("unavailable", "node_not_recorded")
    with EvidenceStore.open(dash.served.home) as store:
        stored = [
            e["content"]["ref"]
            for e in _all_entries(store, dash.served.run_id)
            if e["content"].get("state") == "stored"
        ]
    # Objects are rows of the evidence database: alter one, delete another.
    with closing(sqlite3.connect(dash.served.home / "evidence.sqlite3")) as conn, conn:
        (data,) = conn.execute("SELECT data FROM object_data WHERE ref=?", (stored[0],)).fetchone()
        conn.execute(
            "UPDATE object_data SET data=? WHERE ref=?", (bytes(data) + b"tampered", stored[0])
        )
        conn.execute("DELETE FROM object_data WHERE ref=?", (stored[1],))
    tampered = await artifact(dash, node=stored[0])
    assert (tampered["content_state"], tampered["reason"]) == (
        "integrity_failure",
        "object_hash_mismatch",
    )
    gone = await artifact(dash, node=stored[1])
    assert (gone["content_state"], gone["reason"]) == ("unavailable", "object_missing")
    assert "content" not in tampered and "content" not in gone
    missing = {"run": "run_missing", "node": stored[0]}
    assert_error(await get(f"{dash.url}/api/artifact", missing, auth), 400, "run_not_found")


async def test_coverage_evidence_opens_as_a_database_record(dash: Dash) -> None:
    """A coverage report's object_hash (session-relation evidence when no entry was kept)
    opens as that report's database record."""
    run = dash.served.run_id
    with EvidenceStore.open(dash.served.home) as store:
        report = store.overview(run)["coverage"][0]
    page = await artifact(dash, node=report["object_hash"])
    assert (page["source"], page["integrity"], page["ref"]) == (
        "db",
        "database_record",
        report["object_hash"],
    )
    assert json.loads(await read_whole(dash, report["object_hash"])) == report


async def test_a_closed_store_is_500_on_the_dashboard_readers(home: Path) -> None:
    """The catalog and the artifact reader answer 500 store_unavailable when the index
    cannot be read, never an empty catalog or an unavailable artifact."""
    store = EvidenceStore.open(home)
    store.close()
    app = make_app(store, token="t0ken", dashboard=True, spec=SPEC)
    for path, query in (
        ("/api/search/sources", b"run=run_x"),
        ("/api/artifact", b"run=run_x&node=ctx_x"),
    ):
        status, body = await asgi_get(app, path, query)
        assert status == 500
        assert body["error"]["code"] == "store_unavailable"
