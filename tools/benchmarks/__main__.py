"""``tools/bench <name> [options]``: dispatch to one benchmark module.

Add a benchmark by writing ``tools/benchmarks/<module>.py`` with ``main(argv) -> int`` and a
row in :data:`COMMANDS`. Modules are imported only when their command runs.
"""

from __future__ import annotations

import importlib
import sys

from tools.benchmarks._reference import ROUNDS, reference_ms_fresh

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module in this package, one-line description)
    "evidence": ("evidence", "transcript ingest vs orjson and ccusage; entry page latency"),
    "journal": ("journal", "journal actor throughput and ack latency against raw SQLite"),
    "runs": ("runs", "concurrent real runs through the supervisor; restart reconciliation"),
}


def usage() -> str:
    rows = "\n".join(f"  {name:<10} {desc}" for name, (_, desc) in sorted(COMMANDS.items()))
    return f"usage: tools/bench <benchmark> [options]\n\nbenchmarks:\n{rows}\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"unknown benchmark {name!r}\n\n{usage()}")
        return 2
    module = importlib.import_module(f".{COMMANDS[name][0]}", __package__)
    before = reference_ms_fresh()
    code: int = module.main(rest)
    sys.stdout.write(
        f"machine speed: a fixed piece of Python work (tools/benchmarks/_reference.py) took "
        f"{before:.1f} ms before the benchmark and {reference_ms_fresh():.1f} ms after, median of "
        f"{ROUNDS} in a fresh interpreter (slower = a slower machine: compare runs' figures "
        "alongside it)\n"
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
