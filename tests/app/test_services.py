"""Service actors under the root supervisor: a failing service is restarted, state intact."""

from __future__ import annotations

import functools
from pathlib import Path

import trio

from braid_actors import graph
from braid_actors.app import BraidApp, call, open_app


async def test_a_failing_service_restarts_with_the_graph_rebuilt(tmp_path: Path) -> None:
    """A crash inside the runs supervisor restarts journal and runs; work goes on."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(functools.partial(open_app, tmp_path / "h", env={}))
        conv = await call(app, "create_conversation", {"workspace": str(workspace)})
        first = await call(app, "submit_turn", {"branchId": conv["branchId"], "text": "one"})
        await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 30})
        before = graph.checksum(app.state)
        old_runs, old_journal = app.services.runs, app.services.journal
        assert old_runs is not None

        async def bug() -> None:
            raise RuntimeError("a bug in the runs supervisor")

        assert old_runs._nursery is not None
        old_runs._nursery.start_soon(bug)
        with trio.fail_after(30):
            while app.services.runs is old_runs or app.services.journal is old_journal:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert graph.checksum(app.state) == before  # rebuilt from the journal
        second = await call(app, "submit_turn", {"branchId": conv["branchId"], "text": "two"})
        record = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 30})
        assert record["state"] == "succeeded"
        assert record["sessionLabel"] == "resumed session"
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()
