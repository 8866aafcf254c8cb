"""The evidence HTTP API, served for real by Hypercorn on trio over an ingested fixture."""

from __future__ import annotations

import copy
import functools
import json
import os
import stat
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import hypothesis
import pytest
import schemathesis
import trio
import yaml
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi import checks as openapi_checks

from braid_actors.evidence import (
    EvidenceApp,
    EvidenceServer,
    EvidenceStore,
    make_app,
    serve_evidence,
)
from braid_actors.evidence._http import load_spec

from ._helpers import FIXTURES

# Found where the fixtures are (``shared/`` beside the checkout, or ``$BRAID_SHARED``).
SPEC_PATH = FIXTURES.parents[1] / "spec" / "agentprovenance-context-api.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
CLAUDE = FIXTURES / "claude-code" / "marot__spotter" / "test" / "fixtures" / "transcripts"
CODEX = FIXTURES / "codex" / "lanegrid__agtrace" / "crates" / "agtrace-providers" / "tests"
TRANSCRIPTS = (
    CLAUDE / "short.jsonl",
    CLAUDE / "subagent.jsonl",
    CODEX / "samples" / "codex_session.jsonl",
)
CONTEXT_PATHS = sorted(p for p in SPEC["paths"] if p.startswith("/v1/context/"))
EXAMPLES = 40


@attrs.frozen
class Served:
    home: Path
    run_id: str
    server: EvidenceServer

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.token}"}


@pytest.fixture
async def served(home: Path, nursery: trio.Nursery) -> Served:
    with EvidenceStore.open(home) as store:
        first = store.ingest(TRANSCRIPTS[0], policy="detailed")
        for path in TRANSCRIPTS[1:]:
            store.ingest(path, run_id=first.run_id, resume_offset=0)
    start = functools.partial(serve_evidence, home, port=0, dashboard_port=0, spec=SPEC)
    server: EvidenceServer = await nursery.start(start)
    return Served(home, first.run_id, server)


async def get(url: str, params: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    def call() -> httpx.Response:
        return httpx.get(url, params=params, headers=headers, timeout=10)

    return await trio.to_thread.run_sync(call)


def query_for(path: str, run_id: str) -> dict[str, Any]:
    """Parameters that satisfy ``path``'s required ones."""
    return {
        "/v1/context/overview": {"run": run_id},
        "/v1/context/entries": {"run": run_id},
        "/v1/context/session-relations": {"run": run_id, "harness": "claude_code", "session": "x"},
        "/v1/context/content": {"run": run_id, "ref": "sha256:" + "0" * 64},
        "/v1/context/links": {"run": run_id, "entry": "x"},
        "/v1/context/compare": {"run": run_id, "left": "x", "right": "y"},
    }[path]


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"schema_version", "error"}
    assert body["schema_version"] == "agentprovenance.agent_context/v1"
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code


async def test_token_file_is_private(served: Served) -> None:
    """The token is created once, mode 0600, and is the server's token."""
    path = served.home / "evidence.token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text(encoding="ascii").strip() == served.server.token
    assert len(served.server.token) >= 43


async def test_every_context_route_refuses_without_the_token(served: Served) -> None:
    """Every /v1/context route (and its dashboard mirror) answers 401 and no data without
    the token or with a wrong one."""
    assert len(CONTEXT_PATHS) == 6
    wrong = {"Authorization": "Bearer " + "A" * len(served.server.token)}
    for path in CONTEXT_PATHS:
        params = query_for(path, served.run_id)
        mirror = served.server.dashboard_url + path.replace("/v1/context/", "/api/context/")
        for url in (served.server.api_url + path, str(mirror)):
            for headers in ({}, wrong, {"Authorization": served.server.token}):
                response = await get(url, params, headers)
                assert_error(response, 401, "invalid_argument")
                assert served.run_id not in response.text
                assert response.headers["www-authenticate"].startswith("Bearer")


async def test_overview_entries_and_content_match_the_store(served: Served) -> None:
    """The API's overview, entry pages (followed by cursor) and content pages equal the
    store's own Python answers."""
    api, run = served.server.api_url, served.run_id
    with EvidenceStore.open(served.home) as store:
        response = await get(f"{api}/v1/context/overview", {"run": run}, served.auth)
        assert response.status_code == 200
        assert response.json() == store.overview(run)
        cursor: str | None = None
        seen = 0
        while True:
            params: dict[str, Any] = {"run": run, "limit": 7}
            if cursor is not None:
                params["cursor"] = cursor
            response = await get(f"{api}/v1/context/entries", params, served.auth)
            assert response.status_code == 200
            page = response.json()
            assert page == store.entries(run, cursor=cursor, limit=7)
            seen += len(page["entries"])
            if not page["has_more"]:
                break
            cursor = page["next_cursor"]
        assert seen > 7
        kinds = await get(
            f"{api}/v1/context/entries", {"run": run, "kind": "tool_call"}, served.auth
        )
        assert kinds.json() == store.entries(run, kind="tool_call")
        ref = next(
            e["content"]["ref"]
            for e in store.entries(run, limit=200)["entries"]
            if e["content"].get("ref") and (e["content"]["bytes"] or 0) > 8
        )
        offset, parts = 0, []
        while True:
            params = {"run": run, "ref": ref, "offset": offset, "limit": 4}
            response = await get(f"{api}/v1/context/content", params, served.auth)
            assert response.status_code == 200
            content = response.json()
            assert content == store.content(run, ref, offset=offset, limit=4)
            parts.append(content["content"])
            if not content["has_more"]:
                break
            offset = content["next_offset"]
        whole = store.content(run, ref, limit=262_144)["content"]
        assert "".join(parts) == whole


async def test_bad_cursors_and_bounds_are_invalid_arguments(served: Served) -> None:
    """A tampered cursor, a cursor of other filters, and out-of-bounds limits are 400
    invalid_argument; an unknown run is 404 run_not_found."""
    api, run = served.server.api_url, served.run_id
    url = f"{api}/v1/context/entries"
    page = (await get(url, {"run": run, "limit": 1}, served.auth)).json()
    cursor = page["next_cursor"]
    head, _, tail = cursor.partition(".")
    flipped = head[:-2] + ("A" if head[-2] != "A" else "B") + head[-1] + "." + tail
    for bad in (flipped, cursor + "x", "not-a-cursor"):
        assert_error(
            await get(url, {"run": run, "cursor": bad}, served.auth), 400, "invalid_argument"
        )
    other = {"run": run, "limit": 1, "kind": "message", "cursor": cursor}
    assert_error(await get(url, other, served.auth), 400, "invalid_argument")
    for limit in (0, 201, "ten"):
        params = {"run": run, "limit": limit}
        assert_error(await get(url, params, served.auth), 400, "invalid_argument")
    assert_error(await get(url, {"run": "run_missing"}, served.auth), 404, "run_not_found")
    assert_error(await get(url, {}, served.auth), 400, "invalid_argument")
    content = {"run": run, "ref": "sha256:" + "0" * 64}
    response = await get(f"{api}/v1/context/content", content, served.auth)
    assert_error(response, 404, "content_not_found")


async def test_openapi_json_is_the_spec(served: Served) -> None:
    """/openapi.json on both ports is the YAML spec as JSON."""
    for base in (served.server.api_url, str(served.server.dashboard_url)):
        response = await get(f"{base}/openapi.json", {}, {})
        assert response.status_code == 200
        assert response.json() == SPEC
    assert load_spec(SPEC_PATH) == SPEC


async def asgi_get(app: EvidenceApp, path: str, query: bytes) -> tuple[int, dict[str, Any]]:
    """Call the ASGI app directly with one authorized GET."""
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": query,
        "headers": [(b"authorization", b"Bearer t0ken")],
    }
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_a_closed_store_is_503_not_an_empty_page(home: Path) -> None:
    """A store that cannot be read answers store_unavailable with 503 (500 on the
    dashboard-only routes, as the spec documents them), never an empty 200."""
    store = EvidenceStore.open(home)
    store.close()
    for dashboard, path, status in (
        (False, "/v1/context/overview", 503),
        (True, "/api/context/entries", 503),
        (True, "/api/search/sources", 500),
    ):
        app = make_app(store, token="t0ken", dashboard=dashboard, spec=SPEC)
        answer = await asgi_get(app, path, b"run=run_x")
        assert answer[0] == status
        assert answer[1]["error"]["code"] == "store_unavailable"


async def test_links_and_compare_records_match_the_store(served: Served) -> None:
    """/v1/context/links and its dashboard mirror answer the store's links; a known run's
    /api/compare/records pages (followed by cursor) are 200 and cover its task and
    configuration entries; session filters are refused."""
    api, dash, run = served.server.api_url, str(served.server.dashboard_url), served.run_id
    with EvidenceStore.open(served.home) as store:
        results = store.entries(run, kind="tool_result", limit=5)["entries"]
        lone = store.entries(run, kind="configuration", limit=1)["entries"]
        for entry in [*results, *lone]:
            expected = store.links(run, entry["id"])
            for url in (f"{api}/v1/context/links", f"{dash}/api/context/links"):
                response = await get(url, {"run": run, "entry": entry["id"]}, served.auth)
                assert response.status_code == 200, response.text
                assert response.json() == expected
        assert any(store.links(run, e["id"])["links"] for e in results)
        snapshots = {
            e["id"]
            for kind in ("task", "configuration")
            for e in store.entries(run, kind=kind, limit=200)["entries"]
        }
    url = f"{dash}/api/compare/records"
    missing = await get(url, {"run": "run_missing"}, served.auth)
    assert_error(missing, 404, "run_not_found")
    refused = await get(url, {"run": run, "harness": "codex"}, served.auth)
    assert_error(refused, 400, "invalid_argument")
    assert_error(await get(url, {"run": run, "cursor": "9:"}, served.auth), 400, "invalid_argument")
    cursor: str | None = None
    seen: set[str] = set()
    dimensions: set[str] = set()
    while True:
        params = {"run": run} if cursor is None else {"run": run, "cursor": cursor}
        response = await get(url, params, served.auth)
        assert response.status_code == 200, response.text
        page = response.json()
        assert page["schema_version"] == "agentprovenance.comparison_records/v1"
        assert page["sources_read"] <= 50
        seen.update(r["evidence"]["entry"]["id"] for r in page["records"])
        dimensions.update(r["dimension"] for r in page["records"])
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert seen == snapshots
    assert dimensions == {"task", "configuration"}


def spec_pinned(served: Served) -> dict[str, Any]:
    """The spec with identifiers pinned to the fixture's recorded ones, so generated cases
    reach stored data (integer and enum parameters stay as the spec declares them)."""
    with EvidenceStore.open(served.home) as store:
        entries = store.entries(served.run_id, limit=200)["entries"]
    refs = sorted({e["content"]["ref"] for e in entries if "ref" in e["content"]})[:20]
    snapshots = [e["id"] for e in entries if e["kind"] in ("task", "configuration", "approval")]
    ids = [e["id"] for e in entries][:20]
    pins: dict[str, list[str]] = {
        "ref": refs,
        "node": [*refs, *ids[:5], *(e["object_hash"] for e in entries[:5]), "node_missing"],
        "entry": ids,
        "left": [*snapshots, *ids[:2]],
        "right": [*snapshots, *ids[:2]],
        "harness": sorted({e["source"]["harness"] for e in entries}),
        "session": sorted({e["source"]["session_id"] for e in entries}),
        "source": sorted({e["source"]["id"] for e in entries}),
        "kind": sorted({e["kind"] for e in entries}),
        "tool_call": sorted({e["tool_call_id"] for e in entries if "tool_call_id" in e})[:10],
    }
    pinned = copy.deepcopy(SPEC)
    pinned["components"]["parameters"]["run"]["schema"] = {"enum": [served.run_id]}
    for operation in pinned["paths"].values():
        for param in operation["get"]["parameters"]:
            if param.get("name") in pins and pins[param["name"]]:
                param["schema"] = {"type": "string", "enum": pins[param["name"]]}
    return pinned


def operation_test(
    operation: schemathesis.APIOperation[Any, Any, Any, Any],
    base_url: str,
    headers: dict[str, str],
    mode: GenerationMode,
) -> Callable[[], None]:
    """A hypothesis test that calls and validates ``operation``'s generated cases."""
    settings = hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )

    @settings
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case[Any]) -> None:
        # Arbitrary runs are legitimately 404, so "valid input must be 2xx" does not apply.
        case.call_and_validate(
            base_url=base_url,
            headers=headers,
            excluded_checks=[openapi_checks.positive_data_acceptance],
        )

    return check


def run_schemathesis(
    raw: dict[str, Any],
    served: Served,
    skip: frozenset[str] = frozenset(),
    mode: GenerationMode = GenerationMode.POSITIVE,
) -> list[str]:
    """Run every operation's generated cases against the live server; the labels it ran."""
    schema = schemathesis.openapi.from_dict(raw)
    ran: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if operation.path in skip:
            continue
        dashboard = operation.path.startswith("/api/") and served.server.dashboard_url
        base_url = dashboard or served.server.api_url
        operation_test(operation, base_url, served.auth, mode)()
        ran.append(operation.label)
    return ran


async def test_schemathesis_finds_nothing(served: Served) -> None:
    """Schemathesis runs every operation of the spec against the live server (with the
    token): valid cases with arbitrary values, valid cases pinned to the fixture's
    identifiers, and schema-violating cases; every check passes (status codes, response
    schemas, no server errors, invalid input refused)."""
    everything = len(SPEC["paths"])
    assert len(await trio.to_thread.run_sync(run_schemathesis, SPEC, served)) == everything
    pinned = await trio.to_thread.run_sync(run_schemathesis, spec_pinned(served), served)
    assert len(pinned) == everything
    negative = functools.partial(run_schemathesis, mode=GenerationMode.NEGATIVE)
    assert len(await trio.to_thread.run_sync(negative, SPEC, served)) == everything


def test_shipped_spec_is_the_shared_contract() -> None:
    """The package's copy of the OpenAPI document is byte-identical to shared/spec."""
    from braid_actors.evidence._http import default_spec_path

    assert default_spec_path().read_bytes() == SPEC_PATH.read_bytes()
