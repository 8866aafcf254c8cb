"""Crash matrix: SIGKILL Braid at every durable boundary, restart, and check the record.

For each crash point a real `braid serve` daemon (``BRAID_CRASH_AT=<point>``) runs a scripted
session — a permission-gated tool turn, a plain turn, a cancelled turn, a drain shutdown —
and kills itself with SIGKILL at that point. A fresh Braid on the same home then runs the
same script again with the same operation ids (what a client that lost its connection
does) and finishes. Afterwards:

- every acknowledged reply's identifiers are in the graph (no acknowledged event lost);
- every run was dispatched at most once and the tool ran exactly once (nothing twice);
- ``journal verify`` is clean;
- every run is in a truthful terminal state;
- no local worker process is left (checked with psutil).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from braid_actors._faults import CRASH_POINTS
from braid_actors.app import BraidApp, call, open_app
from braid_actors.cli.verify import verify_home
from braid_actors.errors import BraidError
from braid_actors.journal import Journal, load_or_create_key
from braid_actors.workers import find_local_workers
from tests.cli._daemon import clean_env

Ask = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class Died(Exception):
    """The Braid process ended (it crashed at its crash point)."""


async def _settle(ask: Ask, run_id: str, *, answer_op: str | None = None) -> dict[str, Any]:
    with trio.fail_after(60):
        while True:
            record = await ask("wait_run", {"runId": run_id, "timeoutS": 0.3})
            if record["state"] in ("succeeded", "failed", "cancelled", "unknown"):
                return record
            pending = [i for i in record["interactions"] if i["state"] == "pending"]
            if record["state"] == "blocked" and pending and answer_op is not None:
                try:
                    await ask(
                        "respond_interaction",
                        {
                            "runId": run_id,
                            "interactionId": pending[0]["interactionId"],
                            "answer": {"allow": True},
                            "operationId": answer_op,
                        },
                    )
                except BraidError as exc:
                    if exc.code != "interaction_not_pending":
                        raise  # only "not answerable until reconciled" may be retried


async def script(ask: Ask, workspace: Path, acked: list[dict[str, Any]]) -> None:
    """The session both processes run; every step is idempotent by its operation id."""

    async def step(command: str, params: dict[str, Any]) -> dict[str, Any]:
        result = await ask(command, params)
        acked.append(result)
        return result

    conv = await step(
        "create_conversation", {"workspace": str(workspace), "operationId": "op-conv"}
    )
    branch = conv["branchId"]
    t1 = await step(
        "submit_turn", {"branchId": branch, "text": "!echo x >> marks.txt", "operationId": "op-t1"}
    )
    await _settle(ask, t1["runId"], answer_op="op-a1")
    t2 = await step("submit_turn", {"branchId": branch, "text": "hello", "operationId": "op-t2"})
    await _settle(ask, t2["runId"])
    t3 = await step("submit_turn", {"branchId": branch, "text": "?sleep 6", "operationId": "op-t3"})
    with trio.fail_after(30):
        while (await ask("wait_run", {"runId": t3["runId"], "timeoutS": 0.2}))["state"] in (
            "queued",
            "admitted",
        ):
            pass
    await step("cancel_run", {"runId": t3["runId"], "operationId": "op-c3"})
    await _settle(ask, t3["runId"])
    await ask("shutdown", {"drain": True})


class SocketClient:
    """A JSONL client on the daemon's socket; :class:`Died` once the daemon is gone."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = b""
        self._n = 0

    async def ask(self, command: str, params: dict[str, Any]) -> dict[str, Any]:
        self._n += 1
        body = json.dumps({"id": self._n, "command": command, "params": params}) + "\n"
        try:
            await self.stream.send_all(body.encode())
            with trio.fail_after(60):
                while b"\n" not in self._buf:
                    chunk = await self.stream.receive_some(65536)
                    if not chunk:
                        raise Died
                    self._buf += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise Died from None
        line, self._buf = self._buf.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        if not reply["ok"]:
            error = reply["error"]
            raise _as_error(error["code"], error["message"])
        result: dict[str, Any] = reply["result"]
        return result


async def _serve(home: Path, env: dict[str, str]) -> tuple[trio.Process, SocketClient]:
    """Start `braid serve`, wait for its ready line, connect to its socket."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "braid_actors.cli.main", "--home", str(home), "serve"],
        stdout=-1,
        env=env,
    )
    assert proc.stdout is not None
    ready = b""
    with trio.fail_after(30):
        while b"serving on" not in ready:
            chunk = await proc.stdout.receive_some(4096)
            assert chunk, "braid serve exited before it was ready"
            ready += chunk
    stream = await trio.open_unix_socket(str(home / "braid.sock"))
    return proc, SocketClient(stream)


def _as_error(code: str, message: str) -> BraidError:
    exc = BraidError(message)
    exc.code = code  # type: ignore[misc]
    return exc


@pytest.mark.parametrize(
    "point",
    [
        *CRASH_POINTS[:12],
        "journal.committed@9",
        "shutdown.requested",
    ],
)
async def test_crash_at_each_durable_boundary(tmp_path: Path, point: str) -> None:
    """Kill at the point, restart, rerun: nothing lost, nothing twice, all truthful."""
    # A short home: the daemon's socket path must fit in 107 bytes.
    home = Path(tempfile.mkdtemp(prefix="bcm", dir="/tmp")) / "h"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {**clean_env(), "BRAID_CRASH_AT": point}
    proc, client = await _serve(home, env)
    acked: list[dict[str, Any]] = []
    async with client.stream:
        with pytest.raises(Died):
            await script(client.ask, workspace, acked)
    assert await proc.wait() == -9, "braid serve must have died by SIGKILL at the point"
    assert (home / "braid.sock").exists()  # a SIGKILLed daemon cleans nothing up

    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(
            functools.partial(open_app, home, env={"BRAID_HOME": str(home)})
        )

        async def ask(command: str, params: dict[str, Any]) -> dict[str, Any]:
            if command == "shutdown":
                return {"stopped": False}
            return await call(app, command, params)

        again: list[dict[str, Any]] = []
        await script(ask, workspace, again)
        state = app.state
        for reply in acked:
            for key, coll in (
                ("conversationId", state.conversations),
                ("runId", state.runs),
                ("turnId", state.turns),
                ("branchId", state.branches),
            ):
                if key in reply:
                    assert reply[key] in coll, f"acknowledged {key} {reply[key]} was lost"
        runs = sorted(state.runs.values(), key=lambda r: r.created_at)
        assert len(runs) == 3
        assert [r.state for r in runs[:2]] == ["succeeded", "succeeded"], [
            (r.state, r.outcome) for r in runs
        ]
        assert runs[2].state == "cancelled", runs[2].outcome
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()

    assert (workspace / "marks.txt").read_text() == "x\n", "the tool must run exactly once"
    journal_key = load_or_create_key(home, {})
    with Journal.open(home, journal_key, readonly=True) as journal:
        dispatched = [r.data["run_id"] for r in journal.read() if r.type == "run.dispatched"]
    assert len(dispatched) == len(set(dispatched)) == 3
    report = verify_home(home, {"BRAID_HOME": str(home)})
    assert report.ok, report.render()
    assert find_local_workers(home / "runners" / "local" / "spool") == {}
    shutil.rmtree(home.parent, ignore_errors=True)
