"""The evidence store: one synchronous object over the database and the object files.

``EvidenceStore.open(home)`` opens ``home/evidence.sqlite3`` and ``home/objects``. Every
method is a short synchronous call (small-file I/O and SQLite) made under the store's lock,
so an actor may drive it through ``trio.to_thread`` from whichever worker thread it gets.
Reads that the HTTP API serves return dicts shaped exactly like the spec's schemas; errors
are :class:`~braid_actors.errors.EvidenceError` subclasses whose ``code`` is the API's
error code.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

from braid_actors.errors import (
    EvidenceContentNotFound,
    EvidenceInvalidArgument,
    EvidenceStoreUnavailable,
)
from braid_actors.model import new_id

from . import _runtime
from ._gcpause import collection_paused
from ._ingest import Ingest
from ._links import entry_links
from ._materialize import SCHEMA
from ._objects import REF_RE, ObjectStore
from ._paging import DEFAULT_LIMIT, CursorCodec, EntryFilters, check_run, entries_page
from ._parallel import Job, ingest_in_order, worker_count
from ._policy import CapturePolicy, make_policy
from ._redact import Redactor
from ._relations import session_relations
from ._rows import run_policy
from ._run_links import compaction_boundary, sidechains, task_actions
from ._schema import cites, connect, cursor_key, refresh_statistics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from types import TracebackType

    from ._ingest import Write
    from ._rows import IngestReport
    from ._runtime import ProcessObservation

MAX_SOURCES: Final = 256
AUTO_CHECKPOINT_PAGES: Final = 1000  # SQLite's default
DEFAULT_CONTENT_LIMIT: Final = 65_536
_T = TypeVar("_T")


class EvidenceStore:
    """Recorded evidence of runs: ingest transcripts, then read coverage, entries, content."""

    def __init__(
        self,
        home: Path,
        conn: sqlite3.Connection,
        redactor: Redactor,
        patterns: Sequence[str] = (),
    ) -> None:
        self.home = home
        self._patterns = tuple(patterns)  # for the workers of ingest_many
        self._conn = conn
        self._objects = ObjectStore(home / "objects", conn)
        self._redactor = redactor
        self._codec = CursorCodec(cursor_key(conn))
        self._lock = threading.Lock()
        self._analyzed_rows = 0  # entries the planner statistics last described (this process)

    @classmethod
    def open(cls, home: Path, *, redaction_patterns: Sequence[str] = ()) -> EvidenceStore:
        """Open (or create) the store under ``home``; ``redaction_patterns`` are extra regexes."""
        redactor = Redactor.create(redaction_patterns)
        return cls(Path(home), connect(Path(home)), redactor, redaction_patterns)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- ingest ----------------------------------------------------------------------

    def ingest(
        self,
        path: Path,
        *,
        run_id: str | None = None,
        harness: str | None = None,
        policy: str | CapturePolicy | None = None,
        resume_offset: int | None = None,
    ) -> IngestReport:
        """Ingest one transcript file into a run and report its coverage per source.

        Without ``run_id`` a new import run is created and the whole file is its current
        execution. ``harness`` skips detection. ``policy`` (``basic`` / ``detailed``) applies
        to a new run; a run keeps the policy of its first ingest. ``resume_offset`` is the
        byte offset where this run's execution starts in the file (the rest is prior context).
        """
        if run_id is None:
            run_id = new_id("run")
            resume_offset = 0 if resume_offset is None else resume_offset
        else:
            _check_run_id(run_id)
        with collection_paused():
            return self._prepare(Path(path), run_id, harness, policy, resume_offset)(nullcontext)

    def ingest_many(
        self,
        paths: Iterable[Path | str],
        *,
        run_id: str,
        harness: str | None = None,
        policy: str | CapturePolicy | None = None,
        resume_offset: int | None = None,
        workers: int | None = None,
    ) -> Iterator[IngestReport]:
        """Ingest files into one run in their order, yielding each file's report.

        Stores what ``ingest`` of each file in turn stores (the same transactions in the same
        order), and raises where that loop would, after the reports of the files before.
        With ``workers`` > 1 (by default one per usable CPU when the files hold at least
        ``PARALLEL_MIN_BYTES``) that many processes prepare files side by side, each
        writing on its own connection in file order (see ``_parallel``).
        """
        _check_run_id(run_id)
        job = Job(
            str(self.home),
            self._patterns,
            tuple(str(path) for path in paths),
            run_id,
            harness,
            policy,
            resume_offset,
        )
        count = worker_count(job.paths, workers)
        one = functools.partial(self.ingest_with_turn, job=job)
        if count == 1:
            for path in job.paths:
                yield one(path, nullcontext)
            return
        with self.checkpoints_deferred():
            prepare = functools.partial(self.prepare_for_turn, job=job)
            yield from ingest_in_order(prepare, job, count)

    @contextmanager
    def checkpoints_deferred(self) -> Iterator[None]:
        """No automatic WAL checkpoint on this connection inside (a thread of the process
        that runs ``ingest_many`` checkpoints meanwhile, see ``_parallel``)."""
        self._auto_checkpoint(0)
        try:
            yield
        finally:
            self._auto_checkpoint(AUTO_CHECKPOINT_PAGES)

    def _auto_checkpoint(self, pages: int) -> None:
        with self._guard():
            self._conn.execute(f"PRAGMA wal_autocheckpoint={int(pages)}").fetchall()

    def ingest_with_turn(
        self, path: str, turn: Callable[[], AbstractContextManager[object]], *, job: Job
    ) -> IngestReport:
        """``ingest`` of one of ``job``'s files, written inside ``turn()`` (``_parallel``)."""
        with collection_paused():
            return self.prepare_for_turn(path, job=job)(turn)

    def prepare_for_turn(self, path: str, *, job: Job) -> Write:
        """The first half of :meth:`ingest_with_turn`: prepare one of ``job``'s files now;
        the function returned writes it inside the ``turn()`` it is given."""
        return self._prepare(Path(path), job.run_id, job.harness, job.policy, job.resume_offset)

    def _prepare(
        self,
        path: Path,
        run_id: str,
        harness: str | None,
        policy: str | CapturePolicy | None,
        resume_offset: int | None,
    ) -> Write:
        with self._guard():
            wanted = make_policy(policy) if isinstance(policy, str) else policy
            chosen = run_policy(self._conn, run_id, wanted)
            write = Ingest(
                self._conn, self._redactor, _runtime.now_text(), objects=self._objects
            ).prepare(
                path,
                run_id=run_id,
                harness=harness,
                policy=chosen,
                wanted=wanted,
                resume_offset=resume_offset,
            )

        def written(turn: Callable[[], AbstractContextManager[object]]) -> IngestReport:
            with self._guard():
                report = write(turn)
                self._analyzed_rows = refresh_statistics(self._conn, self._analyzed_rows)
                return report

        return written

    # ---- reads -----------------------------------------------------------------------

    def runs(self) -> list[str]:
        """Every run the store holds, oldest first."""
        with self._guard():
            rows = self._conn.execute("SELECT run_id FROM runs ORDER BY created_at, run_id")
            return [r["run_id"] for r in rows]

    def overview(self, run_id: str) -> dict[str, Any]:
        """The run's ``Overview``: latest coverage per source and stored record counts."""
        with self._guard():
            run_id = check_run(self._conn, run_id)
            reports = self._conn.execute(
                "SELECT c.body FROM coverage c JOIN (SELECT source_id, MAX(pk) AS pk "
                "FROM coverage WHERE run_id=? GROUP BY source_id) latest ON latest.pk = c.pk "
                "ORDER BY c.pk LIMIT ?",
                (run_id, MAX_SOURCES + 1),
            ).fetchall()
            counts = dict(
                self._conn.execute(
                    "SELECT kind, COUNT(*) FROM entries WHERE run_id=? AND latest=1 GROUP BY kind",
                    (run_id,),
                ).fetchall()
            )
            policy = self._conn.execute(
                "SELECT policy FROM runs WHERE run_id=?", (run_id,)
            ).fetchone()
            body: dict[str, Any] = {
                "schema_version": SCHEMA,
                "run_id": run_id,
                "coverage": [json.loads(r["body"]) for r in reports[:MAX_SOURCES]],
                "messages": counts.get("message", 0),
                "tool_calls": counts.get("tool_call", 0),
                "tool_results": counts.get("tool_result", 0),
                "snapshots": sum(counts.get(k, 0) for k in ("task", "configuration", "approval")),
                "has_more_sources": len(reports) > MAX_SOURCES,
                "runtime_coverage": _runtime.coverage(self._conn, run_id),
            }
            if policy["policy"]:
                body["capture_policy"] = json.loads(policy["policy"])
            return body

    def entries(
        self,
        run_id: str,
        *,
        session: str | None = None,
        harness: str | None = None,
        source: str | None = None,
        kind: str | None = None,
        tool_call: str | None = None,
        entry: str | None = None,
        node: str | None = None,
        group: str | None = None,
        revisions: bool = False,
        cursor: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """One ``EntryPage``; ``next_cursor`` is bound to this run and these filters."""
        filters = EntryFilters(
            session, harness, source, kind, tool_call, entry, node, group, revisions
        )
        with self._guard():
            return entries_page(self._conn, self._codec, run_id, filters, cursor, limit)

    def content(
        self, run_id: str, ref: str, *, offset: int = 0, limit: int = DEFAULT_CONTENT_LIMIT
    ) -> dict[str, Any]:
        """A ``ContentPage`` of a stored body the run cites, hash-checked on every read."""
        with self._guard():
            run_id = check_run(self._conn, run_id)
            if not isinstance(ref, str) or not REF_RE.fullmatch(ref):
                raise EvidenceInvalidArgument(
                    "ref must be sha256: and 64 hex digits", details={"field": "ref"}
                )
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise EvidenceInvalidArgument(
                    "offset must be an integer", details={"field": "offset"}
                )
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise EvidenceInvalidArgument(
                    "limit must be an integer", details={"field": "limit"}
                )
            cited = cites(self._conn, run_id, ref)
            meta = self._conn.execute("SELECT * FROM objects WHERE ref=?", (ref,)).fetchone()
            if not cited or meta is None:
                raise EvidenceContentNotFound("the run cites no stored content with this ref")
            page = self._objects.page(ref, offset, limit)
            return {
                "schema_version": "agentprovenance.content_page/v1",
                "run_id": run_id,
                "ref": ref,
                "content": page.text,
                "media_type": meta["media_type"],
                "offset": page.offset,
                "next_offset": page.next_offset,
                "total_bytes": page.total_bytes,
                "has_more": page.has_more,
                "sha256": ref[len("sha256:") :],
                "redacted": bool(meta["redacted"]),
            }

    def session_relations(
        self,
        run_id: str,
        *,
        harness: str,
        session: str,
        cursor: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """One ``SessionRelationsPage`` for a native session that occurs in the run."""
        with self._guard():
            return session_relations(
                self._conn, self._codec, run_id, harness, session, cursor, limit
            )

    def links(self, run_id: str, entry_id: str) -> dict[str, Any]:
        """The ``EntryLinks`` of the latest revision of one entry (see :mod:`._links`)."""
        with self._guard():
            run_id = check_run(self._conn, run_id)
            if not isinstance(entry_id, str) or not 1 <= len(entry_id) <= 512:
                raise EvidenceInvalidArgument(
                    "entry must be a string of 1 to 512 characters", details={"field": "entry"}
                )
            known = self._conn.execute(
                "SELECT 1 FROM entries WHERE run_id=? AND id=? AND latest=1", (run_id, entry_id)
            ).fetchone()
            if known is None:
                raise EvidenceContentNotFound("the run records no entry with this id")
            found, more = entry_links(self._conn, run_id, entry_id)
            body: dict[str, Any] = {
                "schema_version": SCHEMA,
                "run_id": run_id,
                "entry_id": entry_id,
                "basis": "recorded_graph_edge",
                "links": found,
                "has_more": more,
            }
            if not found:
                body["reason"] = "no_recorded_graph_link"
            return body

    def agent_links(self, run_id: str) -> list[dict[str, Any]]:
        """Claude Code subagents of the run: each Task call's agent and its sidechain sources.

        ``status`` is ``linked`` (the agent's file was ingested into the run),
        ``agent_source_missing`` (the parent names an agent whose file is not here),
        ``compaction`` (a compaction agent's file, linked to the parent's ``compact_boundary``
        that follows it) or ``parent_call_missing`` (a sidechain file whose Task call is not
        here).
        """
        with self._guard():
            run_id = check_run(self._conn, run_id)
            # A subagent is its (session, agent id): see ``_run_links``.
            chains = sidechains(self._conn, run_id)
            links: list[dict[str, Any]] = []
            named: set[tuple[str, str]] = set()
            for action in task_actions(self._conn, run_id):
                agent = action["agent_id"]
                named.add((action["session_id"], agent))
                found = chains.get((action["session_id"], agent), [])
                links.append(
                    {
                        "agent_id": agent,
                        "tool_call_id": action["tool_call_id"],
                        "parent_entry_id": action["entry_id"],
                        "parent_source_id": action["source_id"],
                        "session_id": action["session_id"],
                        "agent_source_ids": found,
                        "status": "linked" if found else "agent_source_missing",
                    }
                )
            for (session, agent), ids in chains.items():
                if (session, agent) in named:
                    continue
                link: dict[str, Any] = {"agent_id": agent, "agent_source_ids": ids}
                compact = agent.startswith("acompact")
                boundary = compaction_boundary(self._conn, run_id, ids) if compact else None
                if boundary is not None:
                    link.update(
                        parent_entry_id=boundary["id"],
                        parent_source_id=boundary["source_id"],
                        session_id=boundary["session_id"],
                        status="compaction",
                    )
                else:
                    link["status"] = "parent_call_missing"
                links.append(link)
            return links

    # ---- runtime ---------------------------------------------------------------------

    def begin_runtime_capture(self, run_id: str) -> None:
        """Record that runtime capture runs for this run (so an empty capture is ``no_input``)."""
        with self._guard():
            _runtime.set_capture(self._conn, run_id, "enabled", _runtime.now_text())

    def disable_runtime_capture(self, run_id: str) -> None:
        """Record that runtime capture was switched off for this run (status ``disabled``)."""
        with self._guard():
            _runtime.set_capture(self._conn, run_id, "disabled", _runtime.now_text())

    def end_runtime_capture(self, run_id: str) -> None:
        with self._guard():
            _runtime.end_capture(self._conn, run_id, _runtime.now_text())

    def record_runtime(self, run_id: str, observations: Iterable[ProcessObservation]) -> int:
        """Store process observations as runtime events; returns how many were new."""
        with self._guard():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                added = _runtime.record(
                    self._conn, self._redactor, run_id, observations, _runtime.now_text()
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return added

    def correlate(self, run_id: str) -> dict[str, Any]:
        """One correlation pass and its ``RuntimeCorrelationReport``; its edges replace the
        previous pass's."""
        with self._guard():
            return _runtime.correlate(self._conn, self._objects, run_id, _runtime.now_text())

    def runtime_coverage(self, run_id: str) -> dict[str, Any]:
        """The run's ``RuntimeCoverage``."""
        with self._guard():
            return _runtime.coverage(self._conn, check_run(self._conn, run_id))

    def read_with(self, read: Callable[[sqlite3.Connection, CursorCodec, ObjectStore], _T]) -> _T:
        """Run a read defined in another module (``_catalog``, ``_artifact``) under the store's
        lock; SQLite failures become ``store_unavailable`` as for every read here."""
        with self._guard():
            return read(self._conn, self._codec, self._objects)

    def _guard(self) -> _Guard:
        return _Guard(self._lock)


def _check_run_id(run_id: str) -> None:
    if not 1 <= len(run_id) <= 512:
        raise EvidenceInvalidArgument("run must be 1 to 512 characters", details={"field": "run"})


class _Guard:
    """Holds the store's lock and translates SQLite failures into ``store_unavailable``
    (never reported as missing evidence)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()
        if exc is not None and isinstance(exc, sqlite3.Error):
            raise EvidenceStoreUnavailable("the evidence database could not be read") from None
