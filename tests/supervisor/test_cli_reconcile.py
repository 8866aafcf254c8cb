"""Restart reconciliation of real Claude Code and Codex runs.

A real `braid headless` process starts a turn on the real CLI (offline, against the
scripted model) and is SIGKILLed mid-turn — or, with ``BRAID_CRASH_AT``, right after the
turn's usage became durable but before the run ended. A new Braid on the same home then
reconciles the run through the provider: the CLI's own session record decides. Every test
checks that the recorded worker is gone afterwards (psutil: pid + create time + group),
that the model was asked exactly once (nothing dispatched twice), and the run's truthful
end: the real outcome when the record proves it, ``unknown`` with the reason otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from braid_actors.app import BraidApp, call, open_app
from braid_actors.model import Limits
from braid_actors.providers import (
    LocalProvider,
    Provider,
    SessionRequest,
    TurnRequest,
)
from tests.cli._daemon import clean_env
from tests.supervisor._cli import claude_provider, codex_provider
from tests.supervisor.test_reconcile import Headless
from tools.model_stub import ModelStub, open_model_stub, parse_script
from tools.model_stub.harness import claude_bin, codex_bin

PROMPT = "say something slowly"


def _env(home: Path, stub: ModelStub, crash_at: str | None) -> dict[str, str]:
    env = {
        **clean_env(),
        "BRAID_HOME": str(home),
        "BRAID_CLAUDE_BIN": str(claude_bin()),
        "BRAID_CODEX_BIN": str(codex_bin()),
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": "sk-ant-stub",
        "OPENAI_BASE_URL": stub.openai_base_url,
        "OPENAI_API_KEY": "sk-stub",
    }
    if crash_at is not None:
        env["BRAID_CRASH_AT"] = crash_at
    return env


def _model_calls(stub: ModelStub) -> list[Any]:
    return [
        r
        for r in stub.requests
        if r.path.startswith(("/v1/messages", "/v1/responses")) and PROMPT in json.dumps(r.body)
    ]


@attrs.define
class Crashed:
    """What the killed Braid left behind."""

    run_id: str
    branch_id: str
    workers: list[dict[str, Any]]


async def _start_headless(
    home: Path, stub: ModelStub, crash_at: str | None
) -> tuple[trio.Process, Headless]:
    """A real `braid headless` on ``home`` (killing itself at ``crash_at``, if given)."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "braid_actors.cli.main", "headless"],
        stdin=-1,
        stdout=-1,
        env=_env(home, stub, crash_at),
    )
    return proc, Headless(proc)


async def _crash_mid_turn(
    home: Path, workspace: Path, stub: ModelStub, runner: str, crash_at: str | None = None
) -> Crashed:
    """Start the turn in a real `braid headless`; kill it once the model was asked (or let
    it kill itself at ``crash_at``)."""
    proc, first = await _start_headless(home, stub, crash_at)
    conv = await first.ask("create_conversation", {"workspace": str(workspace), "runner": runner})
    sent = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": PROMPT})
    workers: list[dict[str, Any]] = []
    with trio.fail_after(60):
        while not workers or not _model_calls(stub):
            if crash_at is not None and proc.poll() is not None:
                break
            try:
                listed = await first.ask("list_workers", {"runId": sent["runId"]})
            except AssertionError:  # it crashed at its point while answering
                break
            workers = listed["workers"]
            await trio.sleep(0.05)
    if crash_at is None:
        proc.kill()  # SIGKILL: no shutdown of any kind
    assert await proc.wait() == -9
    return Crashed(sent["runId"], conv["branchId"], workers)


@pytest.fixture
async def restarted(tmp_path: Path) -> AsyncIterator[Any]:
    """Opens a fresh Braid on the home with the given CLI provider."""
    async with trio.open_nursery() as nursery:
        apps: list[BraidApp] = []

        async def open_home(home: Path, runner: Provider, limits: Limits | None = None) -> BraidApp:
            providers: dict[str, Provider] = {
                "local": LocalProvider(home / "runners" / "local"),
                runner.name: runner,
            }
            app: BraidApp = await nursery.start(
                functools.partial(
                    open_app,
                    home,
                    env={"BRAID_HOME": str(home)},
                    providers=providers,
                    default_limits=limits,
                )
            )
            apps.append(app)
            return app

        yield open_home
        for app in apps:
            if not app.stopped.is_set():
                await app.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


def _gone(worker: dict[str, Any]) -> bool:
    """The recorded process no longer runs (pid + create time + group; a zombie is gone)."""
    try:
        proc = psutil.Process(worker["pid"])
        if abs(proc.create_time() - worker["createTime"]) > 0.05:
            return True
        return proc.status() == psutil.STATUS_ZOMBIE or os.getpgid(proc.pid) != worker["pgid"]
    except (psutil.NoSuchProcess, ProcessLookupError):
        return True


def _texts(app: BraidApp, record: dict[str, Any]) -> list[str]:
    message = app.state.messages[record["assistantMessageId"]]
    return [p.text for p in message.parts if p.kind == "text"]


def _session_cost(trace: str) -> float | None:
    costs = [
        json.loads(line)["totalCostUSD"]
        for line in Path(trace).read_text().splitlines()
        if '"cost-state"' in line
    ]
    return costs[-1] if costs else None


async def test_claude_turn_that_finishes_while_braid_is_down_is_collected(
    tmp_path: Path, restarted: Any
) -> None:
    """Claude Code completes its turn without Braid; the restart collects it from the session
    file (text, usage, cost as recorded), and the next turn continues that session."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = parse_script(
        {"anthropic": [{"text": "slow answer", "delay": 3}, {"text": "second answer"}]}
    )
    async with open_model_stub(script) as stub:
        crashed = await _crash_mid_turn(home, workspace, stub, "claude_code")
        assert [w for w in crashed.workers if not _gone(w)], "the CLI outlives its supervisor"
        provider = claude_provider(tmp_path, stub)
        provider = attrs.evolve(provider, home=home / "runners" / "claude_code" / "home")
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": crashed.run_id, "timeoutS": 60})
        assert record["state"] == "succeeded", record["outcome"]
        assert _texts(app, record) == ["slow answer"]
        assert record["usage"]["inputTokens"] == 10
        assert record["usage"]["outputTokens"] == 5
        assert record["costUsd"] is not None
        assert record["costUsd"] == _session_cost(record["tracePath"])
        assert all(_gone(w) for w in crashed.workers)
        assert len(_model_calls(stub)) == 1, "the turn must not be dispatched twice"
        second = await call(app, "submit_turn", {"branchId": crashed.branch_id, "text": "and now?"})
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "resumed session"


async def test_claude_turn_still_running_after_the_bound_is_stopped_and_unknown(
    tmp_path: Path, restarted: Any
) -> None:
    """A turn that does not end within the reconcile bound is stopped: unknown, with why."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = parse_script({"anthropic": [{"text": "far too slow", "delay": 30}]})
    async with open_model_stub(script) as stub:
        crashed = await _crash_mid_turn(home, workspace, stub, "claude_code")
        provider = claude_provider(tmp_path, stub)
        provider = attrs.evolve(
            provider,
            home=home / "runners" / "claude_code" / "home",
            timeouts=attrs.evolve(provider.timeouts, reconcile_wait=1.0),
        )
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": crashed.run_id, "timeoutS": 60})
        assert record["state"] == "unknown"
        assert record["outcome"]["kind"] == "lost"
        assert "not provably over" in record["outcome"]["reason"]
        assert "stopped" in record["outcome"]["reason"]
        assert _texts(app, record) == []  # nothing was guessed
        assert all(_gone(w) for w in crashed.workers)
        assert len(_model_calls(stub)) == 1


async def test_codex_turn_cut_off_by_the_crash_ends_with_its_recorded_abort(
    tmp_path: Path, restarted: Any
) -> None:
    """Codex is stopped at once (SIGINT); its rollout records the abort: a failed turn
    with that reason (Braid did not ask for it), never a success."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = parse_script({"openai": [{"text": "slow answer", "delay": 5}]})
    async with open_model_stub(script) as stub:
        crashed = await _crash_mid_turn(home, workspace, stub, "codex")
        assert [w for w in crashed.workers if not _gone(w)], "exec outlives its supervisor"
        provider = codex_provider(tmp_path, stub)
        provider = attrs.evolve(provider, home=home / "runners" / "codex" / "home")
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": crashed.run_id, "timeoutS": 60})
        assert record["state"] == "failed", record["outcome"]
        assert record["outcome"]["reason"].startswith("turn_aborted")
        assert _texts(app, record) == []
        assert '"turn_aborted"' in await trio.Path(record["tracePath"]).read_text()
        assert all(_gone(w) for w in crashed.workers)
        assert len(_model_calls(stub)) == 1


@pytest.mark.parametrize("runner", ["claude_code", "codex"])
async def test_turn_finished_before_the_crash_is_collected_from_the_record(
    tmp_path: Path, restarted: Any, runner: str
) -> None:
    """Braid dies right after the turn's usage is durable, before the run ends: the record
    proves the turn completed, so the run succeeds with the usage exactly as reported."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = parse_script(
        {"anthropic": [{"text": "quick answer"}], "openai": [{"text": "quick answer"}]}
    )
    async with open_model_stub(script) as stub:
        crashed = await _crash_mid_turn(home, workspace, stub, runner, crash_at="run.usage")
        if runner == "claude_code":
            provider: Provider = attrs.evolve(
                claude_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        else:
            provider = attrs.evolve(
                codex_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": crashed.run_id, "timeoutS": 60})
        assert record["state"] == "succeeded", record["outcome"]
        assert _texts(app, record) == ["quick answer"]
        assert record["usage"]["inputTokens"] == 10
        assert record["usage"]["outputTokens"] == 5
        if runner == "codex":
            assert record["costUsd"] is None  # Codex reports no cost: unknown, never 0
        workers = app.state.runs[crashed.run_id].worker_ids
        assert workers
        for worker_id in workers:
            worker = app.state.workers[worker_id]
            assert worker.status in ("exited", "killed")
            assert _gone({"pid": worker.pid, "createTime": worker.create_time, "pgid": worker.pgid})
        assert len(_model_calls(stub)) == 1


@pytest.mark.parametrize("runner", ["claude_code", "codex"])
async def test_cancel_journaled_before_the_crash_is_settled_truthfully(
    tmp_path: Path, restarted: Any, runner: str
) -> None:
    """Braid dies right after committing a cancel: the restart stops the worker at once.
    Codex records the abort (the cancel's acknowledgement: cancelled); Claude Code records
    nothing when stopped, so its run is unknown — never a guessed cancel or success."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    slow = [{"text": "too late", "delay": 30}]
    async with open_model_stub(parse_script({"anthropic": slow, "openai": slow})) as stub:
        proc, first = await _start_headless(home, stub, "op.cancel_run")
        conv = await first.ask(
            "create_conversation", {"workspace": str(workspace), "runner": runner}
        )
        sent = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": PROMPT})
        with trio.fail_after(60):
            while not _model_calls(stub):  # noqa: ASYNC110 - the stub records requests
                await trio.sleep(0.05)
        workers = (await first.ask("list_workers", {"runId": sent["runId"]}))["workers"]
        with pytest.raises(AssertionError):  # it dies at the point, before answering
            await first.ask("cancel_run", {"runId": sent["runId"]})
        assert await proc.wait() == -9
        if runner == "claude_code":
            provider: Provider = attrs.evolve(
                claude_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        else:
            provider = attrs.evolve(
                codex_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        began = trio.current_time()
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
        assert trio.current_time() - began < 20  # stopped, not waited for
        if runner == "codex":
            assert record["state"] == "cancelled", record["outcome"]
        else:
            assert record["state"] == "unknown", record["outcome"]
            assert "not provably over" in record["outcome"]["reason"]
        assert _texts(app, record) == []
        assert workers
        assert all(_gone(w) for w in workers)
        assert len(_model_calls(stub)) == 1


async def test_cli_process_no_run_recorded_is_stopped_at_restart(
    tmp_path: Path, restarted: Any
) -> None:
    """A CLI the previous supervisor started but never journaled (it died in between) is
    found by the runner home in its environment and stopped before anything is
    dispatched; a CLI of another Braid home is left alone."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    async with open_model_stub(parse_script({"anthropic": []})) as stub:
        ours = attrs.evolve(
            claude_provider(tmp_path, stub), home=home / "runners" / "claude_code" / "home"
        )
        theirs = claude_provider(tmp_path / "elsewhere", stub)
        started = []
        for provider in (ours, theirs):
            turn = TurnRequest(
                run_id="run_x",
                turn_id="turn_x",
                workspace=workspace,
                user_message_id="m_u",
                assistant_message_id="m_a",
                text="never sent",
                session=SessionRequest(),
            )
            started.append(
                await trio.lowlevel.open_process(
                    provider.command(turn),
                    cwd=workspace,
                    env=provider.environment(),
                    stdin=subprocess.PIPE,  # it waits for its input: alive until stopped
                    start_new_session=True,
                )
            )
        mine, other = started
        await trio.sleep(0.5)
        assert mine.poll() is None
        assert other.poll() is None
        app: BraidApp = await restarted(home, ours)
        assert app.runs is not None
        with trio.fail_after(10):
            assert await mine.wait() == -9
        assert other.poll() is None
        other.kill()
        await other.wait()
        assert not _model_calls(stub)


@pytest.mark.parametrize("runner", ["claude_code", "codex"])
async def test_continued_session_turn_is_read_after_its_boundary(
    tmp_path: Path, restarted: Any, runner: str
) -> None:
    """Turn 2 continues turn 1's session; Braid dies once turn 2's usage is durable. The
    record is read from the session's boundary before turn 2: its own reply and its own
    usage (the thread's running total minus turn 1's), never turn 1's."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    steps = [{"text": "first answer"}, {"text": "second answer"}]
    async with open_model_stub(parse_script({"anthropic": steps, "openai": steps})) as stub:
        proc, first = await _start_headless(home, stub, "run.usage@2")
        conv = await first.ask(
            "create_conversation", {"workspace": str(workspace), "runner": runner}
        )
        one = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": "hello"})
        done = await first.ask("wait_run", {"runId": one["runId"], "timeoutS": 60})
        assert done["state"] == "succeeded", done["outcome"]
        two = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": PROMPT})
        with trio.fail_after(60):
            while proc.poll() is None:  # noqa: ASYNC110 - it kills itself at the point
                await trio.sleep(0.05)
        assert await proc.wait() == -9
        if runner == "claude_code":
            provider: Provider = attrs.evolve(
                claude_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        else:
            provider = attrs.evolve(
                codex_provider(tmp_path, stub), home=home / "runners" / runner / "home"
            )
        app: BraidApp = await restarted(home, provider)
        record = await call(app, "wait_run", {"runId": two["runId"], "timeoutS": 60})
        assert record["state"] == "succeeded", record["outcome"]
        assert record["sessionLabel"] == "resumed session"
        assert _texts(app, record) == ["second answer"]
        assert record["usage"]["inputTokens"] == 10  # this turn's own, not the total
        assert record["usage"]["outputTokens"] == 5
        if runner == "claude_code":
            # The CLI's total carries turn 1 on; the run's cost is this turn's share only.
            assert done["costUsd"] is not None
            assert record["costUsd"] == pytest.approx(done["costUsd"])
            assert _session_cost(record["tracePath"]) == pytest.approx(2 * done["costUsd"])
        assert len(_model_calls(stub)) == 1


async def test_survivor_is_observed_again_and_held_to_the_limits(
    tmp_path: Path, restarted: Any
) -> None:
    """While the restart waits for a surviving Claude Code to finish, it is observed like
    any worker: crossing the run's memory limit stops it and fails the run with the
    dimension, the limit and the measured value (never a success or a silent wait)."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = parse_script({"anthropic": [{"text": "too late", "delay": 30}]})
    async with open_model_stub(script) as stub:
        crashed = await _crash_mid_turn(home, workspace, stub, "claude_code")
        provider = attrs.evolve(
            claude_provider(tmp_path, stub), home=home / "runners" / "claude_code" / "home"
        )
        began = trio.current_time()
        app: BraidApp = await restarted(home, provider, Limits(rss_bytes=10_000_000))
        record = await call(app, "wait_run", {"runId": crashed.run_id, "timeoutS": 60})
        assert trio.current_time() - began < 20  # not the 60 s reconcile wait
        assert record["state"] == "failed", record["outcome"]
        assert record["outcome"]["kind"] == "spend_limit_exceeded"
        assert record["outcome"]["dimension"] == "rss_bytes"
        assert record["outcome"]["measured"] > 10_000_000
        assert all(_gone(w) for w in crashed.workers)
        assert len(_model_calls(stub)) == 1
