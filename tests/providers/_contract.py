"""Harnesses for the provider contract suite (``test_contract.py``).

A harness wraps one adapter and gives the suite adapter-neutral ways to script a turn: a
:class:`Say` answer, a :class:`Slow` turn (to cancel) and a :class:`Shell` tool call (to ask
permission for). The local worker is scripted through the prompt itself (its text is echoed
as ``You said: …``, ``?sleep N`` streams slowly, ``!command`` runs a shell command); the
CLIs are scripted through the model stub's steps, the prompt being any text.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import trio

from braid_actors.model import Part, TextPart, Usage
from braid_actors.providers import (
    ClaudeCodeProvider,
    ClaudeTimeouts,
    CodexProvider,
    CodexTimeouts,
    ContextMessage,
    InteractionAnswer,
    InteractionRequest,
    LocalProvider,
    LocalTimeouts,
    PortableContext,
    Provider,
    RunControl,
    SessionInfo,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.workers import ProcessInfo, process_gone, read_session, session_path
from tools.model_stub import ModelStub, RecordedRequest, open_model_stub, parse_script
from tools.model_stub.harness import claude_bin, codex_bin

ADAPTERS: Final = ("local", "claude_code", "codex")
TURN_TIMEOUT: Final = 60.0
"""Seconds one turn may take (a CLI run takes a few)."""
MARKER: Final = "contract-marker"
"""The file the scripted shell call would create in the workspace."""


@attrs.frozen
class Say:
    """A turn whose answer is ``text``."""

    text: str


@attrs.frozen
class Slow:
    """A turn that takes about 20 s unless cancelled."""


@attrs.frozen
class Shell:
    """A turn that calls a shell tool to create :data:`MARKER` (needs permission)."""


Step = Say | Slow | Shell


@attrs.define(eq=False)
class RecordingSink:
    """A RunSink that records every call and answers permissions from a script."""

    answers: list[InteractionAnswer] = attrs.Factory(list)
    workers: list[WorkerInfo] = attrs.Factory(list)
    sessions: list[SessionInfo] = attrs.Factory(list)
    parts: list[Part] = attrs.Factory(list)
    interactions: list[InteractionRequest] = attrs.Factory(list)
    usages: list[tuple[Usage, float | None]] = attrs.Factory(list)
    session_seen: trio.Event = attrs.Factory(trio.Event)
    part_seen: trio.Event = attrs.Factory(trio.Event)

    async def worker_started(self, worker: WorkerInfo) -> None:
        self.workers.append(worker)
        await trio.lowlevel.checkpoint()

    async def session(self, info: SessionInfo) -> None:
        self.sessions.append(info)
        self.session_seen.set()
        await trio.lowlevel.checkpoint()

    async def part(self, part: Part) -> None:
        self.parts.append(part)
        self.part_seen.set()
        await trio.lowlevel.checkpoint()

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        self.interactions.append(request)
        await trio.lowlevel.checkpoint()
        return self.answers.pop(0) if self.answers else InteractionAnswer(allow=True)

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        self.usages.append((usage, cost_usd))
        await trio.lowlevel.checkpoint()

    def final_parts(self) -> list[Part]:
        """The last version of each part, in the order parts first appeared."""
        latest: dict[str, Part] = {}
        for part in self.parts:
            latest[part.part_id] = part
        return list(latest.values())

    def final_texts(self) -> list[str]:
        return [p.text for p in self.final_parts() if isinstance(p, TextPart)]

    def leftovers(self) -> list[str]:
        """Every process (or group member) of the turn's workers still running."""
        left = []
        for worker in self.workers:
            info = ProcessInfo(worker.pid, worker.create_time, worker.pgid, worker.command)
            if not process_gone(info):
                left.append(f"pid {worker.pid}")
            try:
                os.killpg(worker.pgid, 0)
            except ProcessLookupError:
                pass
            except PermissionError:
                left.append(f"group {worker.pgid} (not ours)")
            else:
                left.append(f"group {worker.pgid}")
        return left


_ids = itertools.count(1)


@attrs.define(eq=False)
class Harness:
    """One adapter under contract, with the means to script its turns."""

    provider: Provider
    workspace: Path

    def script(self, *steps: Step) -> None:
        """What the next turns will do, in order (one step per model answer)."""

    def prompt(self, step: Step) -> str:
        return "Please go on."

    async def in_flight(self, sink: RecordingSink) -> None:
        """Returns once a slow turn is really running (so a cancel meets it mid-turn)."""
        await sink.session_seen.wait()

    def model_input(self, session_id: str) -> str:
        """Everything the model was given in the latest turn of ``session_id``."""
        raise NotImplementedError

    def request(
        self,
        step: Step,
        *,
        session: SessionRequest | None = None,
        context: PortableContext | None = None,
    ) -> TurnRequest:
        n = next(_ids)
        return TurnRequest(
            run_id=f"run_c{n}",
            turn_id=f"turn_c{n}",
            workspace=self.workspace,
            user_message_id=f"msg_cu{n}",
            assistant_message_id=f"msg_ca{n}",
            text=self.prompt(step),
            session=session or SessionRequest(),
            context=context,
        )

    async def run(
        self, turn: TurnRequest, sink: RecordingSink, control: RunControl | None = None
    ) -> TurnResult:
        with trio.fail_after(TURN_TIMEOUT):
            result = await self.provider.run_turn(turn, sink, control)
        assert not sink.leftovers(), f"left running after the turn: {sink.leftovers()}"
        return result


@attrs.define(eq=False)
class LocalHarness(Harness):
    provider: LocalProvider

    def prompt(self, step: Step) -> str:
        if isinstance(step, Say):
            return step.text
        if isinstance(step, Slow):
            return "?sleep 20"
        return f"!touch {MARKER}"

    async def in_flight(self, sink: RecordingSink) -> None:
        await sink.part_seen.wait()

    def model_input(self, session_id: str) -> str:
        lines = read_session(session_path(self.provider.sessions_dir, session_id)).lines
        return "\n".join(line.text for line in lines)


@attrs.define(eq=False)
class CliHarness(Harness):
    stub: ModelStub
    api: Literal["anthropic", "openai"]
    shell_call: list[dict[str, Any]]
    asked: trio.Event = attrs.Factory(trio.Event)
    """Set when the model is asked for an answer after the current script was set."""

    def script(self, *steps: Step) -> None:
        raw: list[dict[str, Any]] = []
        for step in steps:
            if isinstance(step, Say):
                raw.append({"text": step.text})
            elif isinstance(step, Slow):
                raw.append({"text": "too late", "delay": 20})
            else:
                raw += self.shell_call
        self.stub.set_script(parse_script({self.api: raw}))
        self.asked = trio.Event()
        self.stub.on_request = self._recorded

    def _recorded(self, request: RecordedRequest) -> None:
        if any(r is request for r in self.stub.model_requests(self.api)):
            self.asked.set()

    async def in_flight(self, sink: RecordingSink) -> None:
        await sink.session_seen.wait()
        await self.asked.wait()  # its model request arrived (and its answer is delayed)

    def model_input(self, session_id: str) -> str:
        return json.dumps(self.stub.model_requests(self.api)[-1].body)

    def assert_offline(self) -> None:
        proxied = [f"{r.method} {r.path}" for r in self.stub.requests if r.proxied]
        assert not proxied, f"the CLI tried to reach other hosts: {proxied}"


def _proxy_env(stub: ModelStub) -> dict[str, str]:
    return {
        "HTTP_PROXY": stub.url,
        "HTTPS_PROXY": stub.url,
        "http_proxy": stub.url,
        "https_proxy": stub.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@asynccontextmanager
async def open_harness(name: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """The harness for adapter ``name`` (one of :data:`ADAPTERS`), cleaned up on exit."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    if name == "local":
        local = LocalProvider(tmp_path / "sessions", timeouts=LocalTimeouts(cancel_grace=3.0))
        yield LocalHarness(provider=local, workspace=workspace)
        return
    async with open_model_stub(parse_script([])) as stub:
        cli: CliHarness
        if name == "claude_code":
            claude = ClaudeCodeProvider(
                bin=str(claude_bin()),
                home=tmp_path / "home",
                base_url=stub.url,
                env={"ANTHROPIC_API_KEY": "sk-ant-stub", **_proxy_env(stub)},
                model="claude-sonnet-4-5",
                timeouts=ClaudeTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
            )
            bash = {"name": "Bash", "input": {"command": f"touch {MARKER}", "description": "m"}}
            cli = CliHarness(
                provider=claude,
                workspace=workspace,
                stub=stub,
                api="anthropic",
                shell_call=[{"tool_use": bash}, {"text": "Done."}],
            )
        elif name == "codex":
            codex = CodexProvider(
                bin=str(codex_bin()),
                home=tmp_path / "home",
                base_url=stub.openai_base_url,
                env={
                    "BRAID_CODEX_API_KEY": "sk-stub",
                    "BRAID_CODEX_MAX_RETRIES": "0",
                    **_proxy_env(stub),
                },
                model="gpt-5.5",
                timeouts=CodexTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
            )
            call = {"name": "exec_command", "arguments": {"cmd": f"touch {MARKER}"}}
            cli = CliHarness(
                provider=codex,
                workspace=workspace,
                stub=stub,
                api="openai",
                shell_call=[{"function_call": call}, {"text": "Done."}],
            )
        else:
            raise ValueError(f"no harness for {name!r}")
        yield cli
        cli.assert_offline()


def context_of(user: str, assistant: str) -> PortableContext:
    """A two-message (user, assistant) portable context with the given texts."""
    return PortableContext(
        source_conversation_id="conv_contract",
        source_branch_id="br_contract",
        through_message_id="msg_ctx2",
        messages=(
            ContextMessage("msg_ctx1", "user", (TextPart("part_ctx1", user),)),
            ContextMessage("msg_ctx2", "assistant", (TextPart("part_ctx2", assistant),)),
        ),
        complete=True,
        digest="sha256:" + "0" * 64,
    )
