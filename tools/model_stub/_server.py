"""The scripted model server: h11 over trio on 127.0.0.1, one task per connection.

Design note. The server is a trio task started with ``nursery.start`` (or
:func:`open_model_stub`), so it lives exactly as long as its owner and a trio test can run a
real CLI as a subprocess in the same loop while the server answers. Each connection is an
``h11.Connection`` fed from its socket; a request is read whole (bounded by
:data:`MAX_BODY_BYTES`), recorded, and answered from the script — SSE when the body asks
for ``stream``. Everything is bounded: connections (:data:`MAX_CONNECTIONS`), idle reads
(:data:`IDLE_TIMEOUT`), recorded requests (:data:`MAX_REQUESTS`, then 503), step delays (at
parse time) and, optionally, the server's lifetime.
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import attrs
import h11
import trio

from tools.model_stub import _anthropic, _openai
from tools.model_stub._script import Script, Step
from tools.model_stub._sse import frame

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body accepted (after decoding); bigger ones get 413."""
MAX_CONNECTIONS = 64
"""Connections served at once; more are closed on arrival."""
IDLE_TIMEOUT = 60.0
"""Seconds a connection may stay silent while the server waits for a request."""
MAX_REQUESTS = 10_000
"""Requests recorded per server; past that every request gets 503."""
REDACTED = "<redacted>"

Api = Literal["anthropic", "openai", "other"]
_MODEL_ROUTES: dict[str, Literal["anthropic", "openai"]] = {
    "/v1/messages": "anthropic",
    "/v1/responses": "openai",
}
_API_OF_ROUTE: dict[str, Api] = {**_MODEL_ROUTES, "/v1/messages/count_tokens": "anthropic"}
_SECRET_WORDS = ("auth", "key", "token", "secret", "cookie")


@attrs.frozen
class RecordedRequest:
    """One request the server received, as tests assert on it."""

    api: Api
    """Which API the path belongs to (``other`` for anything unknown)."""
    method: str
    path: str
    """The request target, query included."""
    headers: Mapping[str, str]
    """Lower-cased names; credentials and cookies replaced by ``<redacted>``."""
    body: Any
    """The parsed JSON body; the text when it is not JSON; null when empty."""
    status: int
    """The status the server answered with."""
    step: int | None
    """Index of the script step that answered; null for the fallback and non-model calls."""

    @property
    def route(self) -> str:
        """The path without its query string."""
        return self.path.split("?", 1)[0]

    @property
    def proxied(self) -> bool:
        """A proxy request (``CONNECT host:port`` or an absolute URL): traffic meant for
        another host, which reaches the stub when the proxy variables point at it."""
        return self.method == "CONNECT" or not self.path.startswith("/")

    def to_json(self) -> dict[str, Any]:
        return {
            "api": self.api,
            "method": self.method,
            "path": self.path,
            "headers": dict(self.headers),
            "body": self.body,
            "status": self.status,
            "step": self.step,
        }


@attrs.define(eq=False)
class ModelStub:
    """A running server: its URL, its script and what it has received."""

    script: Script
    url: str
    """``http://127.0.0.1:<port>``: the Anthropic base URL (``ANTHROPIC_BASE_URL``)."""
    requests: list[RecordedRequest] = attrs.Factory(list)
    on_request: Callable[[RecordedRequest], None] | None = None
    """Called with each request as it is recorded (``--record`` writes them out)."""
    ids: Iterator[str] = attrs.Factory(lambda: (f"stub{n:06d}" for n in itertools.count(1)))
    """Suffixes of the ids the answers carry (``msg_``, ``toolu_``, ``call_``…): deterministic."""
    _cursors: dict[str, int] = attrs.Factory(dict)
    _slots: trio.CapacityLimiter = attrs.Factory(lambda: trio.CapacityLimiter(MAX_CONNECTIONS))

    @property
    def openai_base_url(self) -> str:
        """The OpenAI base URL (the ``/v1`` prefix included)."""
        return f"{self.url}/v1"

    def model_requests(self, api: Api) -> list[RecordedRequest]:
        """The requests that asked ``api``'s model for an answer, in order."""
        route = {"anthropic": "/v1/messages", "openai": "/v1/responses"}.get(api)
        return [r for r in self.requests if r.api == api and r.route == route]

    def set_script(self, script: Script) -> None:
        """Play ``script`` from its first step for the requests to come."""
        self.script = script
        self._cursors.clear()

    def take_step(self, api: Literal["anthropic", "openai"], body: Any) -> tuple[int | None, Step]:
        """The step that answers this request (and consume it), or the fallback."""
        steps = self.script.anthropic if api == "anthropic" else self.script.openai
        at = self._cursors.get(api, 0)
        if at < len(steps):
            step = steps[at]
            if step.match is None or step.match in json.dumps(body, ensure_ascii=False):
                self._cursors[api] = at + 1
                return at, step
        return None, self.script.fallback

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until the client closes it or it goes idle."""
        async with stream:
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                return
            try:
                await _Connection(self, stream).serve()
            finally:
                self._slots.release()


@attrs.define(eq=False)
class _Connection:
    stub: ModelStub
    stream: trio.abc.Stream
    conn: h11.Connection = attrs.Factory(lambda: h11.Connection(h11.SERVER))

    async def serve(self) -> None:
        try:
            while True:
                request = await self._next_event()
                if not isinstance(request, h11.Request):
                    return
                body = await self._read_body()
                if body is None:
                    await self._reply_json(413, {"error": "request body too large"})
                    return
                await self._answer(request, body)
                if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                    return
                self.conn.start_next_cycle()
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.TooSlowError):
            return

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.fail_after(IDLE_TIMEOUT):
                data = await self.stream.receive_some(65_536)
            self.conn.receive_data(bytes(data))

    async def _read_body(self) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_BYTES:
                    return None
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    async def _answer(self, request: h11.Request, raw: bytes) -> None:
        stub = self.stub
        method = request.method.decode("ascii", "replace")
        path = request.target.decode("ascii", "replace")
        headers = _headers(request.headers)
        route = path.split("?", 1)[0]
        api: Api = _API_OF_ROUTE.get(route, "other")
        decoded = _decode(raw, headers.get("content-encoding", "identity"))
        body = None if decoded is None else _parse(decoded)
        if len(stub.requests) >= MAX_REQUESTS:
            await self._reply_json(503, {"error": "model stub request limit reached"})
            return

        at: int | None = None
        step: Step | None = None
        reply: Any = None
        if decoded is None:
            status, reply = 415, {"error": "the body's content-encoding could not be decoded"}
        elif method == "CONNECT" or not path.startswith("/"):
            status, reply = 403, {"error": f"the model stub does not proxy to {path}"}
        elif method == "POST" and route in _MODEL_ROUTES:
            at, step = stub.take_step(_MODEL_ROUTES[route], body)
            status = step.error.status if step.error and step.error.status >= 400 else 200
        elif method == "POST" and route == "/v1/messages/count_tokens":
            status, reply = 200, _anthropic.count_tokens(body)
        elif method == "GET" and route == "/v1/models":
            status, reply = 200, _models()
        elif method in ("GET", "HEAD") and route in ("/", "/v1", "/health"):
            status, reply = 200, {"ok": True}
        else:
            status, reply = 404, {"error": {"type": "not_found_error", "message": path}}

        entry = RecordedRequest(api, method, path, headers, body, status, at)
        stub.requests.append(entry)
        if stub.on_request is not None:
            stub.on_request(entry)
        if step is None:
            await self._reply_json(status, None if method == "HEAD" else reply)
        else:
            await self._model(_MODEL_ROUTES[route], step, body if isinstance(body, dict) else {})

    async def _model(
        self, api: Literal["anthropic", "openai"], step: Step, body: Mapping[str, Any]
    ) -> None:
        render = _anthropic if api == "anthropic" else _openai
        await trio.sleep(step.delay)
        model = str(body.get("model") or "stub-model")
        ids = self.stub.ids
        if step.error is not None and step.error.status >= 400:
            error = render.error_body(step.error)
            await self._reply_json(step.error.status, error, _retry_headers())
        elif body.get("stream") is True:
            events = render.stream(step, model=model, ids=ids)
            await self._reply_sse([frame(name, data) for name, data in events])
        else:
            await self._reply_json(200, render.reply(step, model=model, ids=ids))

    async def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def _reply_json(
        self, status: int, body: Any, extra: Sequence[tuple[str, str]] = ()
    ) -> None:
        """A JSON reply (``body`` null: none, as for HEAD)."""
        payload = b"" if body is None else json.dumps(body).encode()
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
            ("request-id", f"req_{next(self.stub.ids)}"),
            *extra,
        ]
        if self.conn.their_state is not h11.DONE:
            headers.append(("connection", "close"))
        await self._send(h11.Response(status_code=status, headers=headers))
        await self._send(h11.Data(data=payload))
        await self._send(h11.EndOfMessage())

    async def _reply_sse(self, frames: Sequence[bytes]) -> None:
        headers = [
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("request-id", f"req_{next(self.stub.ids)}"),
        ]
        await self._send(h11.Response(status_code=200, headers=headers))
        for chunk in frames:
            await self._send(h11.Data(data=chunk))
        await self._send(h11.EndOfMessage())


def _headers(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name_b, value_b in raw:
        name = name_b.decode("latin-1").lower()
        value = value_b.decode("latin-1")
        if any(word in name for word in _SECRET_WORDS):
            value = REDACTED
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def _decode(raw: bytes, encoding: str) -> bytes | None:
    """Undo gzip/deflate (bounded by :data:`MAX_BODY_BYTES`); null when it can't."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate"):
        return None
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
    try:
        out = inflater.decompress(raw, MAX_BODY_BYTES)
    except zlib.error:
        return None
    return None if inflater.unconsumed_tail else out


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _retry_headers() -> list[tuple[str, str]]:
    # Clients that retry wait as little as they are allowed to.
    return [("retry-after-ms", "10"), ("retry-after", "0")]


def _models() -> dict[str, Any]:
    # One list readable as both APIs' model listings.
    ids = ("claude-sonnet-4-5", "gpt-5-codex", "stub-model")
    data = [
        {
            "id": model,
            "object": "model",
            "type": "model",
            "display_name": model,
            "created": _openai.CREATED_AT,
            "created_at": "2023-11-14T22:13:20Z",
            "owned_by": "stub",
        }
        for model in ids
    ]
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": ids[0],
        "last_id": ids[-1],
    }


async def serve_model_stub(
    script: Script,
    *,
    port: int = 0,
    lifetime: float | None = None,
    task_status: trio.TaskStatus[ModelStub] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``script`` on 127.0.0.1 (``port`` 0: an ephemeral one) until cancelled or
    ``lifetime`` seconds have passed; ``task_status.started`` gets the :class:`ModelStub`."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    bound = listeners[0].socket.getsockname()[1]
    stub = ModelStub(script=script, url=f"http://127.0.0.1:{bound}")
    with trio.move_on_after(math.inf if lifetime is None else lifetime):
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, stub.handle, listeners)
            task_status.started(stub)


@asynccontextmanager
async def open_model_stub(script: Script, *, port: int = 0) -> AsyncIterator[ModelStub]:
    """A model stub serving for the duration of the ``async with`` block."""
    async with trio.open_nursery() as nursery:
        stub: ModelStub = await nursery.start(partial(serve_model_stub, script, port=port))
        try:
            yield stub
        finally:
            nursery.cancel_scope.cancel(reason="the model stub's owner left")
