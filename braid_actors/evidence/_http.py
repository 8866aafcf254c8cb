"""The recorded-context HTTP API: a plain ASGI application served by Hypercorn on trio.

Theory of operation. :func:`make_app` builds one ASGI callable over an
:class:`EvidenceStore`. A request is routed by exact path, its query is checked against the
spec's parameter bounds (:mod:`._http_params`), and the read runs on a worker thread
(``trio.to_thread.run_sync``; the store serializes its own calls). Every answer is JSON: a
body shaped like the spec's response schema, or the spec's ``Error`` shape with the error's
stable code. Evidence errors map to statuses in one place (:data:`STATUS`); anything else is
logged and answered ``500 evidence_read_failed`` without its text. An empty page is only ever
what the store recorded.

Two ports, both bound to 127.0.0.1 only:

* the API port serves ``/v1/context/{overview,entries,session-relations,content,links,compare}``;
* the dashboard port (``dashboard=True``) serves the same routes under ``/api/context/`` plus
  ``/api/compare/records`` (:mod:`._records`), ``/api/search/sources`` (the staged catalog,
  :mod:`._catalog`) and ``/api/artifact`` (every node the routes hand out, :mod:`._artifact`).
  Those three document 500, not 503, for an unreadable index; ``/api/artifact`` documents no
  404, so an unknown run is 400 there and an unrecorded node an explicit ``unavailable`` page.

Authentication. Every route except ``/openapi.json`` needs ``Authorization: Bearer TOKEN``,
on both ports: the dashboard mirror carries the same evidence as ``/v1/context``, so leaving
it open would bypass the token (the spec's ``security: []`` on the dashboard-only routes is
read as "no separate scheme", and the dashboard shares the API token). The token is
``$BRAID_HOME/evidence.token``, 32 random bytes in URL-safe base64, created with ``O_EXCL``
and mode 0600 on first serve and compared in constant time. Without it, or with a wrong one,
the answer is 401 with the ``Error`` shape (code ``invalid_argument``, the spec's only code
for a refused request) and no data.

``/openapi.json`` is the spec itself (the YAML, loaded with PyYAML) on both ports.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
import trio
import yaml

from braid_actors.errors import (
    EvidenceContentNotFound,
    EvidenceError,
    EvidenceInvalidArgument,
    EvidenceReadFailed,
    EvidenceRunNotFound,
    EvidenceStoreUnavailable,
)

from . import _http_views as views
from ._http_params import CONTEXT_ROUTES, DASHBOARD_ROUTES, Param, parse_query
from ._materialize import SCHEMA
from ._records import compare_records
from ._store import EvidenceStore

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, MutableMapping

    from hypercorn.typing import ASGIFramework

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    View = Callable[[EvidenceStore, dict[str, Any]], dict[str, Any]]

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 8574
MAX_REQUEST_HEAD: Final = 256 * 1024
TOKEN_FILE: Final = "evidence.token"
SPEC_FILE: Final = "agentprovenance-context-api.yaml"
STATUS: Final[dict[type[EvidenceError], int]] = {
    EvidenceInvalidArgument: 400,
    EvidenceRunNotFound: 404,
    EvidenceContentNotFound: 404,
    EvidenceReadFailed: 500,
    EvidenceStoreUnavailable: 503,
}
"""HTTP status of each evidence error (its ``code`` is the body's ``error.code``)."""


def default_spec_path() -> Path:
    """Where the spec is read from: ``$BRAID_EVIDENCE_SPEC``, else the copy shipped in
    this package (a test keeps it byte-identical to ``shared/spec``)."""
    chosen = os.environ.get("BRAID_EVIDENCE_SPEC")
    if chosen:
        return Path(chosen)
    return Path(__file__).resolve().parent / SPEC_FILE


def load_spec(path: Path | None = None) -> dict[str, Any] | None:
    """The spec as a JSON-compatible dict, or None when its file is absent."""
    try:
        text = (path or default_spec_path()).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    spec: dict[str, Any] = yaml.safe_load(text)
    return spec


def ensure_token(home: Path) -> str:
    """The API token under ``home``, created (O_EXCL, mode 0600) when there is none yet."""
    path = Path(home) / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = path.read_text(encoding="ascii").strip()
        if not existing:
            raise EvidenceStoreUnavailable("the evidence token file is empty") from None
        return existing
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    return token


@attrs.frozen
class _Route:
    params: tuple[Param, ...]
    view: View
    dashboard_only: bool = False
    """The dashboard routes document 500 (not 503) for an unavailable index, and
    ``/api/artifact`` documents no 404."""


def _context_views() -> dict[str, View]:
    return {
        "overview": lambda s, v: s.overview(v["run"]),
        "entries": lambda s, v: s.entries(
            v["run"],
            **{k: v[k] for k in ("session", "harness", "source", "kind", "tool_call")},
            **{k: v[k] for k in ("entry", "node", "group", "revisions", "cursor", "limit")},
        ),
        "session-relations": lambda s, v: s.session_relations(
            v["run"],
            harness=v["harness"],
            session=v["session"],
            cursor=v["cursor"],
            limit=v["limit"],
        ),
        "content": lambda s, v: s.content(v["run"], v["ref"], offset=v["offset"], limit=v["limit"]),
        "links": views.links,
        "compare": views.compare,
    }


def _routes(dashboard: bool) -> dict[str, _Route]:
    prefix = "/api/context/" if dashboard else "/v1/context/"
    table = _context_views()
    routes = {prefix + name: _Route(params, table[name]) for name, params in CONTEXT_ROUTES.items()}
    if dashboard:
        extra: dict[str, View] = {
            "/api/compare/records": compare_records,
            "/api/search/sources": views.search_sources,
            "/api/artifact": views.artifact,
        }
        for path, params in DASHBOARD_ROUTES.items():
            routes[path] = _Route(params, extra[path], dashboard_only=True)
    return routes


def error_body(code: str, message: str) -> dict[str, Any]:
    """The spec's ``Error`` shape."""
    return {"schema_version": SCHEMA, "error": {"code": code, "message": message}}


def _status(exc: EvidenceError, route: _Route) -> int:
    status = next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 500)
    if route.dashboard_only and status == 503:
        return 500
    if route.dashboard_only and status == 404 and route.view is views.artifact:
        return 400
    return status


class EvidenceApp:
    """The ASGI callable; see the module docstring for routes and authentication."""

    def __init__(
        self,
        store: EvidenceStore,
        *,
        token: str,
        dashboard: bool = False,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        if not token:
            raise ValueError("the evidence API needs a non-empty token")
        self._store = store
        self._token = token.encode("utf-8")
        self._routes = _routes(dashboard)
        self._spec = None if spec is None else _json(dict(spec))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        status, body, extra = await self._answer(scope)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        path = scope["path"]
        if path == "/openapi.json" and scope["method"] in ("GET", "HEAD"):
            if self._spec is None:
                return 404, _json(error_body("content_not_found", "the spec is not installed")), []
            return 200, self._spec, []
        route = self._routes.get(path)
        if route is None:
            return 404, _json(error_body("content_not_found", "no such route")), []
        if scope["method"] != "GET":
            allow = [(b"allow", b"GET")]
            return 405, _json(error_body("invalid_argument", "only GET is served")), allow
        if not self._authorized(scope):
            challenge = [(b"www-authenticate", b'Bearer realm="braid-evidence"')]
            body = error_body("invalid_argument", "a valid bearer token is required")
            return 401, _json(body), challenge
        try:
            values = parse_query(scope.get("query_string", b""), route.params)
            answer = await trio.to_thread.run_sync(route.view, self._store, values)
        except EvidenceError as exc:
            return _status(exc, route), _json(error_body(exc.code, exc.message)), []
        except Exception:
            # Translation at the edge: the failure is logged, its text never leaves.
            log.exception("evidence API read failed: %s", path)
            body = error_body("evidence_read_failed", "the evidence could not be read")
            return 500, _json(body), []
        return 200, _json(answer), []

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                given = bytes(value)
                break
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential.strip(), self._token)


def make_app(
    store: EvidenceStore,
    *,
    token: str,
    dashboard: bool = False,
    spec: Mapping[str, Any] | None = None,
) -> EvidenceApp:
    """The ASGI app over ``store``: the API routes, or with ``dashboard`` the dashboard's.

    ``spec`` is served at ``/openapi.json`` (default: :func:`load_spec`).
    """
    return EvidenceApp(
        store, token=token, dashboard=dashboard, spec=load_spec() if spec is None else spec
    )


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# ---- serving ---------------------------------------------------------------------------


@attrs.define(eq=False)
class EvidenceServer:
    """A running evidence API: its URLs, its token, and a graceful stop."""

    api_url: str
    """``http://127.0.0.1:PORT`` of the ``/v1/context`` routes."""
    dashboard_url: str | None
    """``http://127.0.0.1:PORT`` of the dashboard routes, when served."""
    token: str
    """The bearer token both ports require."""
    _stopping: trio.Event = attrs.Factory(trio.Event)

    def stop(self) -> None:
        """Ask both servers to shut down gracefully."""
        self._stopping.set()


async def serve_evidence(
    home: Path,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    dashboard_port: int | None = None,
    spec: Mapping[str, Any] | None = None,
    task_status: trio.TaskStatus[EvidenceServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the evidence store under ``home`` until cancelled or ``stop()``.

    Port 0 picks a free port; the started :class:`EvidenceServer` names the bound URLs.
    Only 127.0.0.1 is accepted as ``host``.
    """
    import hypercorn.config
    import hypercorn.trio

    if host != "127.0.0.1":
        raise EvidenceInvalidArgument(
            "the evidence API binds 127.0.0.1 only", details={"field": "host"}
        )
    spec = load_spec() if spec is None else spec
    token = ensure_token(home)
    with EvidenceStore.open(home) as store:
        async with trio.open_nursery() as nursery:
            urls: list[str] = []
            stopping = trio.Event()
            wanted = [(port, False)]
            if dashboard_port is not None:
                wanted.append((dashboard_port, True))
            for number, dashboard in wanted:
                config = hypercorn.config.Config()
                config.bind = [f"{host}:{number}"]
                config.accesslog = None
                # The spec allows 16384-character cursors; percent-encoded UTF-8 may need
                # 12 bytes a character, so the request line must fit well past h11's 16 KiB.
                config.h11_max_incomplete_size = MAX_REQUEST_HEAD
                config.errorlog = log
                app = make_app(store, token=token, dashboard=dashboard, spec=spec)
                serve = functools.partial(
                    hypercorn.trio.serve,
                    cast("ASGIFramework", app),
                    config,
                    shutdown_trigger=stopping.wait,
                )
                binds: list[str] = await nursery.start(serve)
                urls.append(binds[0])
            dashboard_url = urls[1] if len(urls) > 1 else None
            task_status.started(EvidenceServer(urls[0], dashboard_url, token, stopping))
