"""The interpreter settings the process that runs Braid takes once the app is up."""

from __future__ import annotations

import json
import subprocess
import sys

from braid_actors.app._service import GC_THRESHOLDS, SWITCH_INTERVAL

PROBE = """
import gc, json, sys
from braid_actors.app import settle_process
before = [sys.getswitchinterval(), list(gc.get_threshold()), gc.get_freeze_count()]
settle_process()
after = [sys.getswitchinterval(), list(gc.get_threshold()), gc.get_freeze_count()]
print(json.dumps([before, after]))
"""


def test_settle_process_freezes_the_heap_and_sets_the_collector_and_switch_interval() -> None:
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
