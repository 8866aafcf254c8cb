"""What a fresh interpreter has imported: for tests that keep a start-up light."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded_after(modules: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter holds once it has imported ``modules``."""
    probe = (
        f"import json, sys\nimport {', '.join(modules)}\n"
        f"print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    found: list[str] = json.loads(out.stdout)
    return found
