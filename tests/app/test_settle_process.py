"""The interpreter settings of the process that runs Braid (``open_app(settle=True)``)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from typing import TYPE_CHECKING

from braid_actors.app._service import GC_THRESHOLDS, OPEN_FILES_CEILING, SWITCH_INTERVAL

if TYPE_CHECKING:
    from pathlib import Path

PROBE = """
import gc, json, sys
from braid_actors.app import freeze_long_lived, tune_process
before = [sys.getswitchinterval(), list(gc.get_threshold()), gc.get_freeze_count()]
tune_process()
freeze_long_lived()
after = [sys.getswitchinterval(), list(gc.get_threshold()), gc.get_freeze_count()]
print(json.dumps([before, after]))
"""


def test_tuning_freezes_the_heap_and_sets_the_collector_and_switch_interval() -> None:
    """In a fresh interpreter (the settings are process-wide): the switch interval and the
    collector's thresholds become Braid's, and what was alive is frozen."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, after = json.loads(done.stdout)
    assert before[0] == 0.005 and before[2] == 0  # CPython's defaults, nothing frozen
    assert after[0] == SWITCH_INTERVAL == 0.001
    assert tuple(after[1]) == GC_THRESHOLDS
    assert after[2] > 10_000  # the imports are out of later passes


LIMIT_PROBE = """
import json, resource
from braid_actors.app import tune_process
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
tune_process()
print(json.dumps([hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
"""


def test_tuning_raises_the_open_files_limit_to_the_hard_limit() -> None:
    """A process started with a soft limit of 256 open files (far below what hundreds of
    runs' pipes need) runs Braid with its hard limit (or 2**20 when that is unlimited)."""
    done = subprocess.run(
        [sys.executable, "-c", LIMIT_PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    hard, soft = json.loads(done.stdout)
    assert hard > 256
    assert soft == (OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard)


OPEN_PROBE = """
import functools, gc, json, pathlib, sys
import trio
from braid_actors.app import call, open_app
from braid_actors.supervisor import RunsSupervisor

home = pathlib.Path(sys.argv[1])
seen = {}
reconcile = RunsSupervisor._reconcile

async def probed(self):
    # what the collector still walks when the first run could be reconciled
    walked = {id(o) for o in gc.get_objects()}
    seen["loaded_walked"] = [id(c) in walked for c in self.state.conversations.values()]
    seen["switch"] = sys.getswitchinterval()
    seen["thresholds"] = list(gc.get_threshold())
    await reconcile(self)

RunsSupervisor._reconcile = probed

async def main(settle):
    async with trio.open_nursery() as nursery:
        app = await nursery.start(functools.partial(open_app, home, env={}, settle=settle))
        if not settle:
            await call(app, "create_conversation", {"workspace": str(home)})
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()

trio.run(main, False)
plain = dict(seen)
trio.run(main, True)
print(json.dumps([plain, seen]))
"""


def test_open_app_settled_freezes_the_loaded_graph_before_reconciling(tmp_path: Path) -> None:
    """``open_app(settle=True)`` (``braid serve``, ``braid headless``) tunes the process
    before the load and takes the loaded graph out of the collector's passes before any
    run is reconciled; without ``settle`` nothing process-wide changes."""
    done = subprocess.run(
        [sys.executable, "-c", OPEN_PROBE, str(tmp_path / "home")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    plain, settled = json.loads(done.stdout)
    assert plain["switch"] == 0.005 and tuple(plain["thresholds"]) != GC_THRESHOLDS
    assert plain["loaded_walked"] == []  # the first start had nothing to load
    assert settled["switch"] == SWITCH_INTERVAL
    assert tuple(settled["thresholds"]) == GC_THRESHOLDS
    assert settled["loaded_walked"] == [False]  # the conversation loaded from the journal
