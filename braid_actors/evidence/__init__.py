"""Recorded evidence: transcript parsers, redaction, content-addressed objects, coverage.

The store turns provider transcripts (Claude Code session JSONL, Codex rollouts, Braid's
own local runner session files) into normalized entries in SQLite, with redacted bodies as
content-addressed objects, and answers the reads of the recorded-context API
(``spec/agentprovenance-context-api.yaml``): overview, entry pages, content pages, session
relations, and runtime coverage and correlation. ``serve_evidence`` serves those reads over
HTTP on 127.0.0.1 (``make_app`` is the ASGI application itself), behind a bearer token.

```python
with EvidenceStore.open(home) as store:
    report = store.ingest(path, run_id="run_…", policy="basic")
    reports = list(store.ingest_many(paths, run_id="run_…"))  # in order, maybe in parallel
    store.overview("run_…")
    page = store.entries("run_…", kind="tool_call", limit=50)
    store.content("run_…", page["entries"][0]["content"]["ref"])
```

The names below are loaded on first use (PEP 562): an ingest worker process (see
``_parallel``) imports this package too, and needs neither the HTTP server nor trio.
"""

import typing

from braid_actors import _lazy

if typing.TYPE_CHECKING:
    from braid_actors.evidence._coverage import COUNT_KEYS
    from braid_actors.evidence._detect import HARNESSES
    from braid_actors.evidence._http import (
        EvidenceApp,
        EvidenceServer,
        ensure_token,
        make_app,
        serve_evidence,
    )
    from braid_actors.evidence._objects import MAX_OBJECT_BYTES
    from braid_actors.evidence._paging import ENTRY_KINDS
    from braid_actors.evidence._parallel import PARALLEL_MIN_BYTES, worker_count
    from braid_actors.evidence._paths import TRANSCRIPT_PATTERNS, transcript_paths
    from braid_actors.evidence._policy import PRESETS, CapturePolicy, make_policy
    from braid_actors.evidence._redact import Redactor
    from braid_actors.evidence._rows import IngestReport, SourceReport
    from braid_actors.evidence._runtime import ProcessObservation
    from braid_actors.evidence._store import EvidenceStore

_SOURCES: dict[str, str] = {
    "COUNT_KEYS": "braid_actors.evidence._coverage",
    "HARNESSES": "braid_actors.evidence._detect",
    "EvidenceApp": "braid_actors.evidence._http",
    "EvidenceServer": "braid_actors.evidence._http",
    "ensure_token": "braid_actors.evidence._http",
    "make_app": "braid_actors.evidence._http",
    "serve_evidence": "braid_actors.evidence._http",
    "MAX_OBJECT_BYTES": "braid_actors.evidence._objects",
    "ENTRY_KINDS": "braid_actors.evidence._paging",
    "PARALLEL_MIN_BYTES": "braid_actors.evidence._parallel",
    "worker_count": "braid_actors.evidence._parallel",
    "TRANSCRIPT_PATTERNS": "braid_actors.evidence._paths",
    "transcript_paths": "braid_actors.evidence._paths",
    "PRESETS": "braid_actors.evidence._policy",
    "CapturePolicy": "braid_actors.evidence._policy",
    "make_policy": "braid_actors.evidence._policy",
    "Redactor": "braid_actors.evidence._redact",
    "IngestReport": "braid_actors.evidence._rows",
    "SourceReport": "braid_actors.evidence._rows",
    "ProcessObservation": "braid_actors.evidence._runtime",
    "EvidenceStore": "braid_actors.evidence._store",
}
"""Where each public name lives."""


# The type checker reads the imports above, so a wrong name stays an error.
if not typing.TYPE_CHECKING:
    __getattr__, __dir__ = _lazy.names(__name__, _SOURCES)


__all__ = [
    "COUNT_KEYS",
    "ENTRY_KINDS",
    "HARNESSES",
    "MAX_OBJECT_BYTES",
    "PARALLEL_MIN_BYTES",
    "PRESETS",
    "TRANSCRIPT_PATTERNS",
    "CapturePolicy",
    "EvidenceApp",
    "EvidenceServer",
    "EvidenceStore",
    "IngestReport",
    "ProcessObservation",
    "Redactor",
    "SourceReport",
    "ensure_token",
    "make_app",
    "make_policy",
    "serve_evidence",
    "transcript_paths",
    "worker_count",
]
