"""The scripted model server, checked over real HTTP with a plain client (``http.client``)."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tools.model_stub import (
    ModelStub,
    Script,
    ScriptError,
    _server,
    load_script,
    open_model_stub,
    parse_script,
    serve_model_stub,
)

ROOT = Path(__file__).resolve().parents[2]

Reply = tuple[int, dict[str, str], bytes]


def _request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


async def call(
    stub: ModelStub,
    path: str,
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> Reply:
    """One request from a worker thread, so the server keeps running in this trio loop."""
    raw = None if body is None else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})}
    return await trio.to_thread.run_sync(_request, stub.url, method, path, raw, sent)


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Parse an SSE body into ``(event name, data)`` pairs."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_anthropic_stream_of_text_has_the_api_event_order() -> None:
    """A text step streams message_start … message_stop, deltas adding up to the text."""
    steps = {"anthropic": [{"text": "Hello from the stub.", "usage": {"input_tokens": 42}}]}
    async with open_model_stub(parse_script(steps)) as stub:
        body = {
            "model": "claude-x",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        status, headers, raw = await call(
            stub, "/v1/messages?beta=true", body, headers={"x-api-key": "sk-secret"}
        )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert start["model"] == "claude-x"
    assert start["usage"]["input_tokens"] == 42
    deltas = [d["delta"]["text"] for n, d in events if n == "content_block_delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == "Hello from the stub."
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "end_turn"
    assert final["usage"]["output_tokens"] == 5
    [seen] = stub.requests
    assert (seen.api, seen.method, seen.route, seen.step, seen.status) == (
        "anthropic",
        "POST",
        "/v1/messages",
        0,
        200,
    )
    assert seen.path == "/v1/messages?beta=true"
    assert seen.body == body
    assert seen.headers["x-api-key"] == "<redacted>"


async def test_anthropic_thinking_and_tool_use_blocks_stream_in_order() -> None:
    """Thinking, text and tool_use blocks come in that order; the tool input is partial JSON."""
    step = {
        "thinking": "Let me run it.",
        "text": "Running.",
        "tool_use": {"name": "Bash", "input": {"command": "echo hi"}, "id": "toolu_1"},
    }
    async with open_model_stub(parse_script({"anthropic": [step]})) as stub:
        _, _, raw = await call(stub, "/v1/messages", {"model": "m", "stream": True})
    events = sse(raw)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2] == {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
    deltas = [d for n, d in events if n == "content_block_delta"]
    thinking = "".join(d["delta"].get("thinking", "") for d in deltas if d["index"] == 0)
    assert thinking == "Let me run it."
    assert any(d["delta"]["type"] == "signature_delta" for d in deltas if d["index"] == 0)
    partial = [d["delta"]["partial_json"] for d in deltas if d["index"] == 2]
    assert json.loads("".join(partial)) == {"command": "echo hi"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_without_stream_answers_one_message() -> None:
    """``stream`` absent: one JSON message with the same content blocks and usage."""
    step = {"text": "plain", "tool_use": {"name": "Read", "input": {"file_path": "/x"}}}
    async with open_model_stub(parse_script({"anthropic": [step]})) as stub:
        status, headers, raw = await call(stub, "/v1/messages", {"model": "m"})
    assert status == 200
    assert headers["content-type"] == "application/json"
    message = json.loads(raw)
    assert message["type"] == "message"
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
    assert message["content"][1]["id"].startswith("toolu_")
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 10


async def test_anthropic_errors_as_http_status_and_in_stream() -> None:
    """An error step answers its HTTP status with the API's error body; ``in_stream`` fails
    a started stream with an ``error`` event."""
    steps = {
        "anthropic": [
            {"error": {"status": 529, "message": "busy"}},
            {"error": {"in_stream": True, "message": "broke", "type": "api_error"}},
        ]
    }
    async with open_model_stub(parse_script(steps)) as stub:
        status, headers, raw = await call(stub, "/v1/messages", {"stream": True})
        assert status == 529
        assert "retry-after-ms" in headers
        assert json.loads(raw) == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "busy"},
        }
        status, _, raw = await call(stub, "/v1/messages", {"stream": True})
    assert status == 200
    events = sse(raw)
    assert [n for n, _ in events] == ["message_start", "ping", "error"]
    assert events[-1][1]["error"] == {"type": "api_error", "message": "broke"}
    assert [r.status for r in stub.requests] == [529, 200]


async def test_count_tokens_and_models_answer_without_a_step() -> None:
    """Side endpoints answer sanely and consume no step."""
    async with open_model_stub(parse_script({"anthropic": [{"text": "kept"}]})) as stub:
        status, _, raw = await call(stub, "/v1/messages/count_tokens", {"messages": ["x" * 400]})
        assert status == 200
        assert json.loads(raw)["input_tokens"] > 50
        status, _, raw = await call(stub, "/v1/models", None, method="GET")
        assert status == 200
        assert {m["id"] for m in json.loads(raw)["data"]} >= {"claude-sonnet-4-5"}
        status, _, raw = await call(stub, "/", None, method="HEAD")
        assert (status, raw) == (200, b"")
        status, _, raw = await call(stub, "/v1/messages", {"stream": False})
    assert json.loads(raw)["content"][0]["text"] == "kept"
    assert [r.step for r in stub.requests] == [None, None, None, 0]
    assert stub.model_requests("anthropic") == stub.requests[3:]


async def test_openai_stream_of_text_has_the_api_event_order() -> None:
    """A text step streams created, in_progress, the message item, completed with usage."""
    usage = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30}
    steps = {"openai": [{"text": "Hello from the stub.", "usage": usage}]}
    async with open_model_stub(parse_script(steps)) as stub:
        body = {"model": "gpt-x", "stream": True, "input": []}
        status, headers, raw = await call(
            stub, "/v1/responses", body, headers={"authorization": "Bearer sk-secret"}
        )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * (len(events) - 8),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(name == data["type"] for name, data in events)
    deltas = [d["delta"] for n, d in events if n == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == "Hello from the stub."
    item = events[-2][1]["item"]
    assert item["type"] == "message"
    assert item["content"] == [
        {"type": "output_text", "text": "Hello from the stub.", "annotations": []}
    ]
    done = events[-1][1]["response"]
    assert done["status"] == "completed"
    assert done["model"] == "gpt-x"
    assert done["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 30},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 120,
    }
    [seen] = stub.requests
    assert (seen.api, seen.route, seen.step) == ("openai", "/v1/responses", 0)
    assert seen.headers["authorization"] == "<redacted>"


async def test_openai_reasoning_and_function_call_items() -> None:
    """Reasoning comes first, then one function_call per call with its call_id and JSON
    arguments streamed as deltas."""
    step = {
        "thinking": "Use the shell.",
        "function_call": [
            {"name": "exec_command", "arguments": {"cmd": "echo hi"}, "id": "call_1"},
            {"name": "apply_patch", "arguments": "*** Begin Patch"},
        ],
    }
    async with open_model_stub(parse_script({"openai": [step]})) as stub:
        _, _, raw = await call(stub, "/v1/responses", {"stream": True})
    events = sse(raw)
    items = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "function_call", "function_call"]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "Use the shell."}]
    assert items[1]["call_id"] == "call_1"
    assert json.loads(items[1]["arguments"]) == {"cmd": "echo hi"}
    assert items[2]["arguments"] == "*** Begin Patch"
    assert items[2]["call_id"].startswith("call_")
    summary = [d["delta"] for n, d in events if n == "response.reasoning_summary_text.delta"]
    assert "".join(summary) == "Use the shell."
    arguments = [
        d["delta"]
        for n, d in events
        if n == "response.function_call_arguments.delta" and d["item_id"] == items[1]["id"]
    ]
    assert json.loads("".join(arguments)) == {"cmd": "echo hi"}
    assert events[-1][1]["response"]["output"] == items


async def test_openai_errors_as_http_status_and_failed_response() -> None:
    """An HTTP error step answers its status; ``in_stream`` ends with ``response.failed``."""
    steps = {
        "openai": [
            {"error": {"status": 500, "message": "down"}},
            {"error": {"in_stream": True, "message": "broke"}},
            {"text": "plain JSON"},
        ]
    }
    async with open_model_stub(parse_script(steps)) as stub:
        status, _, raw = await call(stub, "/v1/responses", {"stream": True})
        assert status == 500
        assert json.loads(raw)["error"]["message"] == "down"
        _, _, raw = await call(stub, "/v1/responses", {"stream": True})
        events = sse(raw)
        assert events[-1][0] == "response.failed"
        assert events[-1][1]["response"]["error"] == {"code": "server_error", "message": "broke"}
        _, _, raw = await call(stub, "/v1/responses", {"stream": False})
    answer = json.loads(raw)
    assert answer["object"] == "response"
    assert answer["output"][0]["content"][0]["text"] == "plain JSON"


async def test_steps_run_out_into_the_fallback_and_match_skips_side_requests() -> None:
    """Each API keeps its own cursor; a ``match`` step waits for a matching request; once
    the steps are used up the fallback text answers."""
    raw = {
        "anthropic": [{"text": "first"}, {"text": "second", "match": "the real question"}],
        "openai": [{"text": "only"}],
        "fallback": "no more",
    }
    texts = []
    async with open_model_stub(parse_script(raw)) as stub:
        for body in (
            {"messages": ["hi"]},
            {"messages": ["a title please"]},
            {"messages": ["the real question"]},
            {"messages": ["again"]},
        ):
            _, _, reply = await call(stub, "/v1/messages", body)
            texts.append(json.loads(reply)["content"][0]["text"])
        _, _, reply = await call(stub, "/v1/responses", {})
        texts.append(json.loads(reply)["output"][0]["content"][0]["text"])
    assert texts == ["first", "no more", "second", "no more", "only"]
    assert [r.step for r in stub.requests] == [0, None, 1, None, 0]


async def test_a_list_script_serves_both_apis() -> None:
    """A bare list of steps is the script of both APIs."""
    async with open_model_stub(parse_script([{"text": "both"}])) as stub:
        _, _, a = await call(stub, "/v1/messages", {})
        _, _, o = await call(stub, "/v1/responses", {})
    assert json.loads(a)["content"][0]["text"] == "both"
    assert json.loads(o)["output"][0]["content"][0]["text"] == "both"


async def test_delay_waits_before_answering() -> None:
    """A step's ``delay`` holds the answer back at least that long."""
    async with open_model_stub(parse_script([{"delay": 0.3, "text": "late"}])) as stub:
        started = trio.current_time()
        await call(stub, "/v1/messages", {})
        assert trio.current_time() - started >= 0.3


async def test_gzip_bodies_are_decoded_and_unknown_paths_recorded() -> None:
    """A gzip request body is recorded decoded; an unknown path gets 404 and is recorded."""
    body = gzip.compress(json.dumps({"model": "m", "input": []}).encode())
    async with open_model_stub(Script()) as stub:
        status, _, _ = await trio.to_thread.run_sync(
            _request,
            stub.url,
            "POST",
            "/v1/responses",
            body,
            {"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert status == 200
        status, _, _ = await call(stub, "/v1/nope", {"a": 1})
    assert status == 404
    assert stub.requests[0].body == {"model": "m", "input": []}
    assert (stub.requests[1].api, stub.requests[1].status) == ("other", 404)


def _connect_through(url: str, target: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        return sock.recv(4096)


async def test_proxy_requests_are_refused_and_recorded() -> None:
    """With the proxy variables pointing at the stub, traffic meant for another host shows
    up as a refused, recorded proxy request."""
    async with open_model_stub(Script()) as stub:
        reply = await trio.to_thread.run_sync(_connect_through, stub.url, "example.com:443")
    assert reply.startswith(b"HTTP/1.1 403 ")
    [seen] = stub.requests
    assert (seen.method, seen.path, seen.proxied, seen.status) == (
        "CONNECT",
        "example.com:443",
        True,
        403,
    )


async def test_oversized_bodies_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body past the limit gets 413 and is not recorded."""
    monkeypatch.setattr(_server, "MAX_BODY_BYTES", 1_000)
    async with open_model_stub(Script()) as stub:
        status, _, _ = await call(stub, "/v1/messages", {"blob": "x" * 2_000})
    assert status == 413
    assert stub.requests == []


async def test_server_stops_with_its_owner_and_after_its_lifetime() -> None:
    """Leaving ``open_model_stub`` closes the port; ``lifetime`` ends the server by itself."""
    async with open_model_stub(Script()) as stub:
        url = stub.url
    with pytest.raises(ConnectionRefusedError):
        await trio.to_thread.run_sync(_request, url, "GET", "/", None, None)
    with trio.fail_after(5):
        await serve_model_stub(Script(), lifetime=0.1)


async def test_set_script_restarts_from_the_first_step() -> None:
    """``set_script`` swaps the script and rewinds both cursors."""
    async with open_model_stub(parse_script([{"text": "one"}])) as stub:
        await call(stub, "/v1/messages", {})
        stub.set_script(parse_script([{"text": "two"}]))
        _, _, raw = await call(stub, "/v1/messages", {})
    assert json.loads(raw)["content"][0]["text"] == "two"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"anthropic": [{"txt": "x"}]}, "anthropic[0] has unknown keys ['txt']"),
        ([{"delay": 61}], "steps[0].delay 61 is longer than 60.0 s"),
        ([{"error": {"status": 200}}], "steps[0].error.status 200 is not an HTTP error"),
        ([{"tool_use": {"input": {}}}], "steps[0].tool_use.name must be a non-empty string"),
        ([{"usage": {"input_tokens": -1}}], "steps[0].usage.input_tokens must be an integer"),
        ({"claude": []}, "unknown script keys ['claude']"),
        ({"fallback": 3}, "fallback must be an object"),
        ({"fallback": {"text": "x", "match": "y"}}, "the script fallback cannot have a match"),
        ("steps", "a script is a list of steps or an object"),
    ],
)
def test_invalid_scripts_are_refused_with_the_step_named(raw: Any, message: str) -> None:
    """Parsing is strict and says which step and field is wrong."""
    with pytest.raises(ScriptError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_script(raw)


def test_load_script_reads_a_file(tmp_path: Path) -> None:
    """A script file parses to the same script as its JSON."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"openai": [{"text": "hi"}], "fallback": "bye"}))
    loaded = load_script(path)
    assert loaded == parse_script({"openai": [{"text": "hi"}], "fallback": "bye"})
    path.write_text("{")
    with pytest.raises(ScriptError, match="is not JSON"):
        load_script(path)


async def test_module_entry_point_prints_its_url_and_serves(tmp_path: Path) -> None:
    """``python -m tools.model_stub --script F`` prints its URL, serves the script and
    appends each request to ``--record``."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"text": "by hand"}]))
    record = tmp_path / "requests.jsonl"
    argv = [sys.executable, "-m", "tools.model_stub", "--script", str(path)]
    argv += ["--record", str(record), "--lifetime", "30"]
    proc = await trio.lowlevel.open_process(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(15):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "the stub exited before printing its URL"
                line += chunk
        url = line.decode().strip()
        assert url.startswith("http://127.0.0.1:")
        _, _, raw = await trio.to_thread.run_sync(
            _request, url, "POST", "/v1/messages", b"{}", {"content-type": "application/json"}
        )
        assert json.loads(raw)["content"][0]["text"] == "by hand"
        assert json.loads(record.read_text())["path"] == "/v1/messages"
    finally:
        proc.kill()
        with trio.fail_after(10):
            await proc.wait()
