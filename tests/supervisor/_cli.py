"""Shared setup for running Braid on the real Claude Code and Codex CLIs, offline."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from braid_actors.app import BraidApp, open_app
from braid_actors.providers import (
    ClaudeCodeProvider,
    ClaudeTimeouts,
    CodexProvider,
    CodexTimeouts,
    LocalProvider,
    Provider,
)
from tools.model_stub.harness import claude_bin, codex_bin

if TYPE_CHECKING:
    from pathlib import Path

    import trio

    from tools.model_stub import ModelStub


def offline_env(stub: ModelStub) -> dict[str, str]:
    """Proxy every other host to the stub (which refuses and records it)."""
    proxy = {k: stub.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    return {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **proxy}


def claude_provider(tmp_path: Path, stub: ModelStub) -> ClaudeCodeProvider:
    return ClaudeCodeProvider(
        bin=str(claude_bin()),
        home=tmp_path / "claude-home",
        base_url=stub.url,
        env={"ANTHROPIC_API_KEY": "sk-ant-stub", **offline_env(stub)},
        model="claude-sonnet-4-5",
        timeouts=ClaudeTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
    )


def codex_provider(tmp_path: Path, stub: ModelStub) -> CodexProvider:
    return CodexProvider(
        bin=str(codex_bin()),
        home=tmp_path / "codex-home",
        base_url=stub.openai_base_url,
        env={"BRAID_CODEX_API_KEY": "sk-stub", "BRAID_CODEX_MAX_RETRIES": "0", **offline_env(stub)},
        model="gpt-5.5",
        timeouts=CodexTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
    )


async def braid_with(nursery: trio.Nursery, home: Path, runner: Provider) -> BraidApp:
    """A Braid on ``home`` whose runners are the local one and ``runner``."""
    providers: dict[str, Provider] = {
        "local": LocalProvider(home / "runners" / "local"),
        runner.name: runner,
    }
    app: BraidApp = await nursery.start(
        functools.partial(open_app, home, env={}, providers=providers)
    )
    return app
