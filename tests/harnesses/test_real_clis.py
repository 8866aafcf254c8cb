"""The real Claude Code and Codex CLIs, fully offline against the scripted model server.

Each run gets a fresh HOME (XDG dirs and TMPDIR inside it) and workspace under ``tmp_path``
and an environment built from scratch, so nothing from this machine leaks in. The proxy
variables point at the stub itself with only loopback exempt: a request meant for any other
host would arrive at the stub as a proxy request, and every test asserts there was none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import trio

from tools.model_stub import ModelStub, open_model_stub, parse_script
from tools.model_stub.harness import claude_bin, codex_bin

CLI_TIMEOUT = 45.0
"""Seconds one CLI run may take (they take well under one here)."""
CLAUDE_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = "gpt-5.5"
"""A model the pinned Codex has metadata for (others work but warn)."""
MARKER = "braid-tool-ok"


def offline_env(tmp_path: Path, stub: ModelStub) -> dict[str, str]:
    """The variables every run shares: a private HOME and a proxy trap."""
    home = tmp_path / "home"
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "TMPDIR": home / "tmp",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {name: str(path) for name, path in dirs.items()}
    env.update(
        PATH=os.environ.get("PATH", "/usr/bin:/bin"),
        LANG="C.UTF-8",
        HTTP_PROXY=stub.url,
        HTTPS_PROXY=stub.url,
        http_proxy=stub.url,
        https_proxy=stub.url,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def claude_env(tmp_path: Path, stub: ModelStub) -> dict[str, str]:
    return {
        **offline_env(tmp_path, stub),
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": "sk-ant-stub",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def codex_env(tmp_path: Path, stub: ModelStub) -> dict[str, str]:
    env = offline_env(tmp_path, stub)
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'model_provider = "stub"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "workspace-write"\n'
        "check_for_update_on_startup = false\n"
        "\n"
        "[analytics]\n"  # else: OTLP metrics to ab.chatgpt.com
        "enabled = false\n"
        "\n"
        "[features]\n"  # else: plugin sync from github.com, api.github.com, chatgpt.com
        "plugins = false\n"
        "\n"
        "[model_providers.stub]\n"
        'name = "stub"\n'
        f'base_url = "{stub.openai_base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "BRAID_STUB_API_KEY"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    return {**env, "CODEX_HOME": str(codex_home), "BRAID_STUB_API_KEY": "sk-stub"}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def run_cli(
    argv: list[str], *, env: dict[str, str], cwd: Path, exit_code: int = 0
) -> list[dict[str, Any]]:
    """Run a CLI to its end, check its exit code and return its JSON lines. It runs in its
    own process group, which is killed whole afterwards: on timeout, and for anything it
    left behind."""
    logs = cwd.parent / "logs"
    logs.mkdir(exist_ok=True)
    out, err = logs / f"{Path(argv[0]).name}.stdout", logs / f"{Path(argv[0]).name}.stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        with trio.fail_after(CLI_TIMEOUT):
            await process.wait()
    finally:
        _kill_group(process.pid)
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await process.wait()
    stderr_text = err.read_text(errors="replace")
    assert process.returncode == exit_code, f"{argv[0]} exited {process.returncode}:\n{stderr_text}"
    lines = out.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def assert_only_model_calls(stub: ModelStub, route: str) -> None:
    """Everything the CLI sent reached the stub as a model call: nothing went elsewhere."""
    assert stub.requests, "the CLI sent the model stub nothing"
    proxied = [f"{r.method} {r.path}" for r in stub.requests if r.proxied]
    assert not proxied, f"the CLI tried to reach other hosts: {proxied}"
    others = [
        f"{r.method} {r.path}" for r in stub.requests if (r.method, r.route) != ("POST", route)
    ]
    assert not others, f"requests other than model calls: {others}"


def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def claude_argv(prompt: str, *extra: str) -> list[str]:
    return [
        str(claude_bin()),
        "-p",
        prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        CLAUDE_MODEL,
        *extra,
    ]


def codex_argv(*args: str) -> list[str]:
    """``codex exec --json`` with ``args`` (a prompt, or ``resume THREAD PROMPT``)."""
    return [str(codex_bin()), "exec", "--json", "--skip-git-repo-check", *args]


def last_user_text(body: dict[str, Any]) -> str:
    """The text parts of the last user message of an Anthropic request."""
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


async def test_claude_code_answers_with_the_scripted_text(tmp_path: Path) -> None:
    """Claude Code prints the scripted text, a result with usage and cost, and sent the
    prompt to the stub as a streaming Messages request."""
    usage = {"input_tokens": 120, "output_tokens": 30}
    steps = {"anthropic": [{"text": "Hello from the stub.", "usage": usage}]}
    async with open_model_stub(parse_script(steps)) as stub:
        cwd = workspace(tmp_path)
        events = await run_cli(
            claude_argv("Say hello to Braid."), env=claude_env(tmp_path, stub), cwd=cwd
        )
    init = next(e for e in events if e["type"] == "system" and e.get("subtype") == "init")
    assert init["cwd"] == str(cwd)
    assert init["apiKeySource"] == "ANTHROPIC_API_KEY"
    texts = [
        block["text"]
        for e in events
        if e["type"] == "assistant"
        for block in e["message"]["content"]
        if block["type"] == "text"
    ]
    assert texts == ["Hello from the stub."]
    result = events[-1]
    assert (result["type"], result["subtype"], result["is_error"]) == ("result", "success", False)
    assert result["result"] == "Hello from the stub."
    assert result["session_id"] == init["session_id"]
    assert result["usage"]["input_tokens"] == 120
    assert result["usage"]["output_tokens"] == 30
    model_usage = result["modelUsage"][CLAUDE_MODEL]
    assert (model_usage["inputTokens"], model_usage["outputTokens"]) == (120, 30)
    assert result["total_cost_usd"] > 0
    assert result["total_cost_usd"] == model_usage["costUSD"]

    assert_only_model_calls(stub, "/v1/messages")
    [request] = stub.model_requests("anthropic")
    assert request.body["model"] == CLAUDE_MODEL
    assert request.body["stream"] is True
    assert last_user_text(request.body).endswith("Say hello to Braid.")
    assert "Bash" in {tool["name"] for tool in request.body["tools"]}
    assert request.headers["x-api-key"] == "<redacted>"
    assert request.headers["x-claude-code-session-id"] == init["session_id"]
    transcript = tmp_path / "home" / ".claude" / "projects"
    assert list(transcript.glob(f"*/{init['session_id']}.jsonl"))


async def test_claude_code_runs_a_scripted_bash_call_and_returns_its_output(
    tmp_path: Path,
) -> None:
    """The scripted Bash tool call really runs (allowed by a rule) and its output goes back
    to the model as a tool_result in the next request."""
    call = {"name": "Bash", "input": {"command": f"echo {MARKER}", "description": "marker"}}
    steps = {
        "anthropic": [
            {"thinking": "Run the command.", "tool_use": call},
            {"text": f"It printed {MARKER}."},
        ]
    }
    async with open_model_stub(parse_script(steps)) as stub:
        events = await run_cli(
            claude_argv("Run the marker command.", "--allowedTools", f"Bash(echo {MARKER})"),
            env=claude_env(tmp_path, stub),
            cwd=workspace(tmp_path),
        )
    tool_use = next(
        block
        for e in events
        if e["type"] == "assistant"
        for block in e["message"]["content"]
        if block["type"] == "tool_use"
    )
    assert tool_use["input"]["command"] == f"echo {MARKER}"
    results = [
        block
        for e in events
        if e["type"] == "user"
        for block in e["message"]["content"]
        if block.get("type") == "tool_result"
    ]
    assert [(r["tool_use_id"], r["content"], r["is_error"]) for r in results] == [
        (tool_use["id"], MARKER, False)
    ]
    assert events[-1]["result"] == f"It printed {MARKER}."

    assert_only_model_calls(stub, "/v1/messages")
    first, second = stub.model_requests("anthropic")
    assert (first.step, second.step) == (0, 1)
    sent_back = second.body["messages"]
    assistant = sent_back[-2]
    assert assistant["role"] == "assistant"
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]
    assert assistant["content"][1]["id"] == tool_use["id"]
    [result] = [b for b in sent_back[-1]["content"] if b["type"] == "tool_result"]
    assert result["tool_use_id"] == tool_use["id"]
    assert result["content"].startswith(MARKER)  # Claude Code may append a reminder


async def test_codex_answers_with_the_scripted_text(tmp_path: Path) -> None:
    """``codex exec --json`` prints the scripted agent message and the turn's usage, and
    sent the prompt to the stub as a streaming Responses request."""
    usage = {"input_tokens": 200, "output_tokens": 40, "cache_read_input_tokens": 50}
    steps = {"openai": [{"text": "Hello from the stub.", "usage": usage}]}
    async with open_model_stub(parse_script(steps)) as stub:
        events = await run_cli(
            codex_argv("Say hello to Braid."),
            env=codex_env(tmp_path, stub),
            cwd=workspace(tmp_path),
        )
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started"
    assert kinds[-1] == "turn.completed"
    messages = [
        e["item"]["text"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"
    ]
    assert messages == ["Hello from the stub."]
    assert not [e for e in events if e["type"] == "item.completed" and e["item"]["type"] == "error"]
    turn_usage = events[-1]["usage"]
    assert turn_usage["input_tokens"] == 200
    assert turn_usage["cached_input_tokens"] == 50
    assert turn_usage["output_tokens"] == 40

    assert_only_model_calls(stub, "/v1/responses")
    [request] = stub.model_requests("openai")
    assert request.body["model"] == CODEX_MODEL
    assert request.body["stream"] is True
    user = [i for i in request.body["input"] if i.get("role") == "user"][-1]
    assert user["content"] == [{"type": "input_text", "text": "Say hello to Braid."}]
    assert request.headers["authorization"] == "<redacted>"
    thread = events[0]["thread_id"]
    sessions = tmp_path / "home" / ".codex" / "sessions"
    assert list(sessions.rglob(f"rollout-*{thread}.jsonl"))


async def test_codex_runs_a_scripted_shell_call_and_returns_its_output(tmp_path: Path) -> None:
    """The scripted exec_command call really runs in Codex's sandbox and its output goes
    back as a function_call_output with the same call_id."""
    call = {"name": "exec_command", "arguments": {"cmd": f"echo {MARKER}"}, "id": "call_braid_1"}
    steps = {
        "openai": [
            {"thinking": "Run the command.", "function_call": call},
            {"text": f"It printed {MARKER}."},
        ]
    }
    async with open_model_stub(parse_script(steps)) as stub:
        events = await run_cli(
            codex_argv("Run the marker command."),
            env=codex_env(tmp_path, stub),
            cwd=workspace(tmp_path),
        )
    done = [e["item"] for e in events if e["type"] == "item.completed"]
    assert [i["type"] for i in done] == ["reasoning", "command_execution", "agent_message"]
    command = done[1]
    assert MARKER in command["command"]
    assert (command["exit_code"], command["status"]) == (0, "completed")
    assert command["aggregated_output"].strip() == MARKER
    assert done[2]["text"] == f"It printed {MARKER}."

    assert_only_model_calls(stub, "/v1/responses")
    first, second = stub.model_requests("openai")
    offered = {tool.get("name") for tool in first.body["tools"]}
    assert "exec_command" in offered, f"this Codex offers no exec_command tool: {offered}"
    calls = [i for i in second.body["input"] if i.get("type") == "function_call"]
    assert [(c["call_id"], c["name"]) for c in calls] == [("call_braid_1", "exec_command")]
    [output] = [i for i in second.body["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_braid_1"
    assert MARKER in str(output["output"])


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """An Anthropic request's messages as ``(role, text)``, without system reminders."""
    out = []
    for message in body["messages"]:
        content = message["content"]
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content]
        text = "".join(p for p in parts if not p.lstrip().startswith("<system-reminder>"))
        out.append((message["role"], text))
    return out


async def test_claude_code_resumes_and_forks_its_own_session(tmp_path: Path) -> None:
    """``--resume`` continues the same session with the earlier turns sent as context;
    ``--fork-session`` starts a new session id carrying the same history."""
    steps = [{"text": "first answer"}, {"text": "second answer"}, {"text": "third answer"}]
    async with open_model_stub(parse_script({"anthropic": steps})) as stub:
        env, cwd = claude_env(tmp_path, stub), workspace(tmp_path)
        first = await run_cli(claude_argv("one"), env=env, cwd=cwd)
        session = first[-1]["session_id"]
        second = await run_cli(claude_argv("two", "--resume", session), env=env, cwd=cwd)
        forked = await run_cli(
            claude_argv("three", "--resume", session, "--fork-session"), env=env, cwd=cwd
        )
    assert second[-1]["session_id"] == session
    assert second[-1]["result"] == "second answer"
    assert forked[-1]["session_id"] != session
    assert forked[-1]["result"] == "third answer"
    assert_only_model_calls(stub, "/v1/messages")
    bodies = [r.body for r in stub.model_requests("anthropic")]
    assert [conversation(b) for b in bodies] == [
        [("user", "one")],
        [("user", "one"), ("assistant", "first answer"), ("user", "two")],
        [
            ("user", "one"),
            ("assistant", "first answer"),
            ("user", "two"),
            ("assistant", "second answer"),
            ("user", "three"),
        ],
    ]


async def test_codex_exec_resume_continues_its_thread(tmp_path: Path) -> None:
    """``codex exec resume <thread>`` sends the earlier turn back as context."""
    steps = [{"text": "first answer"}, {"text": "second answer"}]
    async with open_model_stub(parse_script({"openai": steps})) as stub:
        env, cwd = codex_env(tmp_path, stub), workspace(tmp_path)
        first = await run_cli(codex_argv("one"), env=env, cwd=cwd)
        thread = first[0]["thread_id"]
        second = await run_cli(codex_argv("resume", thread, "two"), env=env, cwd=cwd)
    assert second[0] == {"type": "thread.started", "thread_id": thread}
    [message] = [e["item"] for e in second if e["type"] == "item.completed"]
    assert message == {"id": message["id"], "type": "agent_message", "text": "second answer"}
    assert_only_model_calls(stub, "/v1/responses")
    _, resumed = stub.model_requests("openai")
    turns = [
        (i["role"], "".join(c.get("text", "") for c in i["content"]))
        for i in resumed.body["input"]
        if i.get("type") == "message" and i["role"] in ("user", "assistant")
    ]
    assert turns[-3:] == [("user", "one"), ("assistant", "first answer"), ("user", "two")]


async def test_claude_code_reports_a_model_error_as_an_error_result(tmp_path: Path) -> None:
    """A 500 from the model (retries off) ends the run with exit 1 and an error result that
    carries the status and the server's message."""
    failure = {"error": {"status": 500, "message": "scripted failure"}}
    async with open_model_stub(parse_script({"fallback": failure})) as stub:
        env = {**claude_env(tmp_path, stub), "CLAUDE_CODE_MAX_RETRIES": "0"}
        events = await run_cli(claude_argv("hi"), env=env, cwd=workspace(tmp_path), exit_code=1)
    result = events[-1]
    assert (result["type"], result["is_error"]) == ("result", True)
    assert (result["api_error_status"], result["terminal_reason"]) == (500, "api_error")
    assert "scripted failure" in result["result"]
    assert [r.status for r in stub.requests] == [500]


async def test_codex_reports_a_model_error_as_a_failed_turn(tmp_path: Path) -> None:
    """A 400 from the model ends ``codex exec`` with exit 1, an ``error`` event and
    ``turn.failed`` carrying the server's message."""
    failure = {"error": {"status": 400, "message": "scripted failure"}}
    async with open_model_stub(parse_script({"fallback": failure})) as stub:
        events = await run_cli(
            codex_argv("hi"), env=codex_env(tmp_path, stub), cwd=workspace(tmp_path), exit_code=1
        )
    assert [e["type"] for e in events] == ["thread.started", "turn.started", "error", "turn.failed"]
    assert "scripted failure" in events[-1]["error"]["message"]
    assert [r.status for r in stub.requests] == [400]
