"""One ingest pass: read a file, parse it, store what is new, report coverage per source.

Resume cursor and prior context. Each (run, file) keeps a *cursor* (the offset after the last
complete line ingested, with the SHA-256 of the bytes before it) and a *boundary* (where this
run's own execution starts in the file, with the hash of the prefix before it):

- the run's first ingest of a file takes its boundary from ``resume_offset`` when given, else
  from the longest cursor another run recorded for the same file whose prefix hash still
  matches (that prefix is history the harness read before this run resumed it), else 0;
- later ingests keep the boundary; lines before it are ``prior_context``, the rest
  ``current_execution``. When the file no longer starts with the bytes a cursor hashed, the
  report says ``source_rewritten`` and the boundary falls back to 0.

The whole file is parsed on every pass (so calls and results, usage ids and subagent links
are resolved across the cursor); entries already stored unchanged are counted
``duplicates`` and not written again, so re-ingesting is idempotent and a grown file only
adds its new records. An incomplete last line is ``deferred`` and the cursor stops before it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import attrs

from braid_actors.errors import EvidenceInvalidArgument

from ._coverage import Tally, coverage_report
from ._detect import HARNESSES, UNSUPPORTED, detect
from ._links import LinkRow, file_link_rows, put_file_links
from ._materialize import CURRENT, PRIOR, EntryRow, entry_text
from ._objects import ObjectStore
from ._parsed import split_lines
from ._prepare import FileRows, Prepared, file_rows, prepare
from ._rows import IngestReport, Rows, SourceReport, ensure_run, run_policy, transaction
from ._run_links import PassChanges, rebuild_run_links
from ._unparsed import unparsed, unsupported

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from pathlib import Path

    from ._parsed import Outcome
    from ._policy import CapturePolicy
    from ._redact import Redactor

    Write = Callable[[Callable[[], AbstractContextManager[object]]], IngestReport]
    """Writes a prepared file inside the ``turn()`` it is given (see :meth:`Ingest.prepare`)."""


@attrs.define(eq=False)
class Ingest(Rows):
    """One parsed ingest pass (the rows it writes, plus the object store)."""

    objects: ObjectStore = attrs.field(kw_only=True)

    def prepare(
        self,
        path: Path,
        *,
        run_id: str,
        harness: str | None,
        policy: CapturePolicy,
        wanted: CapturePolicy | None,
        resume_offset: int | None,
    ) -> Write:
        """Read, parse and prepare ``path`` under ``policy`` (the run's policy as read before
        the pass, for ``wanted``) now; the function returned writes it, in one transaction
        entered inside the ``turn()`` it is given (see ``_parallel``: a file waits there for
        the files before it).

        The file is prepared before the transaction, from what the database said then; inside
        it the run's policy and the file's rows are read again, and a file whose inputs
        changed meanwhile (another writer ingested it, or started the run) is prepared again:
        what is written always rests on what the transaction reads.
        """
        path_key = self.path_key(path, harness)

        def report_only(report: Callable[[CapturePolicy], IngestReport]) -> Write:
            """A pass that stores no entries: only its report, under the run's policy."""

            def write(turn: Callable[[], AbstractContextManager[object]]) -> IngestReport:
                with turn(), transaction(self.conn):
                    return report(run_policy(self.conn, run_id, wanted))

            return write

        try:
            data = path.read_bytes()
        except OSError as exc:
            why = "no_input" if isinstance(exc, FileNotFoundError) else "unreadable"
            return report_only(
                lambda chosen: unparsed(self, run_id, path_key, path.stem, harness, chosen, why)
            )
        split = split_lines(data)
        detected = harness or detect(split, data)
        if detected is None or detected in UNSUPPORTED:
            return report_only(
                lambda chosen: unsupported(
                    self, run_id, path_key, path.stem, detected, chosen, split, data
                )
            )

        def prepared_with(chosen: CapturePolicy, files: FileRows) -> tuple[Prepared, Ready]:
            done = prepare(
                data,
                split,
                detected,
                path_key=path_key,
                stem=path.stem,
                run_id=run_id,
                policy=chosen,
                redactor=self.redactor,
                resume_offset=resume_offset,
                files=files,
            )
            return done, self.ready(run_id, done)

        files = file_rows(self.conn, run_id, path_key)
        prepared, counted = prepared_with(policy, files)

        def write(turn: Callable[[], AbstractContextManager[object]]) -> IngestReport:
            with turn(), transaction(self.conn):
                chosen = run_policy(self.conn, run_id, wanted)
                files_now = file_rows(self.conn, run_id, path_key)
                if chosen != policy or files_now != files:
                    return self.store(run_id, *prepared_with(chosen, files_now))
                return self.store(run_id, prepared, counted)

        return write

    def path_key(self, path: Path, harness: str | None) -> str:
        """The file's redacted absolute path (checking ``harness`` first)."""
        if harness is not None and harness not in (*HARNESSES, *UNSUPPORTED):
            raise EvidenceInvalidArgument(
                "unknown harness", details={"field": "harness", "known": list(HARNESSES)}
            )
        return self.redactor.clean(str(path.resolve()))

    def ready(self, run_id: str, prepared: Prepared) -> Ready:
        """What of the write can be computed before the file's write turn (pure): each
        source's coverage tallies, the stored text of each row (with this pass's
        ``created_at``), whether or not the row turns out to be new, and the file links'
        rows. (The turns' writes are the serial part of a parallel ingest.)"""
        texts = [entry_text(dict(row.body, created_at=self.now)) for row in prepared.rows]
        links = file_link_rows(run_id, prepared.outcome.links, prepared.rows, self.redactor.clean)
        return Ready(tallies(prepared), texts, links)

    def store(self, run_id: str, prepared: Prepared, counted: Ready) -> IngestReport:
        """Write a prepared file (inside the caller's transaction) and report its coverage
        per source (``counted``: :meth:`ready` of ``prepared``, computed before the turn)."""
        p = prepared
        sources, rows, outcome = p.sources, p.rows, p.outcome
        ensure_run(self.conn, run_id, p.policy, self.now)
        was_linked = self._in_run_links(run_id, sources)
        agents_before = self._agents(sources)
        pks = {key: self.put_source(run_id, p.path_key, src) for key, src in sources.items()}
        written, inserted, revised, known = self._put_entries(run_id, rows, counted.texts, pks)
        self._put_objects(p)
        calls = self._put_actions(run_id, outcome, rows, sources)
        put_file_links(self.conn, run_id, counted.links, known)
        if was_linked or _may_link(sources, outcome, inserted):
            changes = _changes(
                sources, agents_before, inserted, revised, calls, outcome, self.redactor
            )
            rebuild_run_links(self.conn, run_id, changes)
        self._put_file(run_id, p)
        reports = [
            self._report(run_id, key, p, written, *counted.tallies[key]) for key in outcome.sessions
        ]
        return IngestReport(run_id, p.path_key, p.harness, tuple(reports))

    # ---- run links -------------------------------------------------------------------

    def _in_run_links(self, run_id: str, sources: dict[str, dict[str, Any]]) -> bool:
        """Whether a source of this file already takes part in the run's cross-file links
        (it was a subagent's sidechain, or recorded a ``task_agent`` action)."""
        ids = [src["id"] for src in sources.values()]
        if not ids:
            return False
        marks = ",".join("?" * len(ids))
        sessions = [src["session_id"] for src in sources.values()]
        session_marks = ",".join("?" * len(sessions))
        # ... or a spawn of the run names one of its sessions (a delegation's child).
        found = self.conn.execute(
            f"SELECT 1 FROM sources WHERE id IN ({marks}) AND agent_id IS NOT NULL "
            f"UNION ALL SELECT 1 FROM actions WHERE run_id=? AND kind IN ('task_agent', 'spawn') "
            f"AND source_id IN ({marks}) "
            f"UNION ALL SELECT 1 FROM actions WHERE run_id=? AND kind='spawn' "
            f"AND target IN ({session_marks}) LIMIT 1",
            (*ids, run_id, *ids, run_id, *sessions),
        ).fetchone()
        return found is not None

    def _agents(self, sources: dict[str, dict[str, Any]]) -> dict[str, str | None]:
        """The recorded ``agent_id`` of each of these sources the store already holds."""
        ids = [src["id"] for src in sources.values()]
        if not ids:
            return {}
        found = self.conn.execute(
            f"SELECT id, agent_id FROM sources WHERE id IN ({','.join('?' * len(ids))})", ids
        )
        return {row["id"]: row["agent_id"] for row in found}

    # ---- writes ----------------------------------------------------------------------

    def _put_entries(
        self, run_id: str, rows: list[EntryRow], texts: list[str], pks: dict[str, int]
    ) -> tuple[Counter[tuple[str, str, str]], list[EntryRow], bool, list[str]]:
        """Write new entries and revisions; count (session, scope, stored|duplicates) and
        return the rows written, whether any was a new revision, and the ids of the rows
        whose source key the run held before this pass (only those can have links yet)."""
        tally: Counter[tuple[str, str, str]] = Counter()
        existing: dict[str, tuple[int, str]] = {}
        for pk in set(pks.values()):
            for found in self.conn.execute(
                "SELECT source_key, revision, object_hash FROM entries "
                "WHERE run_id=? AND source_pk=? AND latest=1",
                (run_id, pk),
            ):
                existing[found["source_key"]] = (found["revision"], found["object_hash"])
        superseded: list[tuple[str, int, int, int]] = []
        inserts: list[tuple[Any, ...]] = []
        inserted: list[EntryRow] = []
        held: list[str] = []
        for row, text in zip(rows, texts, strict=True):
            known = existing.get(row.source_key)
            if known is not None:
                held.append(row.id)
            if known is not None and known[1] == row.object_hash:
                tally[(row.session, row.scope, "duplicates")] += 1
                continue
            revision = 0
            if known is not None:
                revision = known[0] + 1
                superseded.append((run_id, pks[row.session], row.sequence, row.ordinal))
            inserts.append(
                (
                    row.id,
                    run_id,
                    pks[row.session],
                    row.source_key,
                    row.sequence,
                    row.ordinal,
                    revision,
                    row.kind,
                    row.tool_call_id,
                    row.scope,
                    row.content_ref,
                    row.raw_ref,
                    row.intent_ref,
                    row.object_hash,
                    text,
                )
            )
            tally[(row.session, row.scope, "stored")] += 1
            inserted.append(row)
        # Each source key appears once per pass, so marking the earlier revisions first and
        # inserting afterwards is the same as doing both row by row. (A source key is its
        # source's pk, sequence and ordinal: the ``entries_key`` index.)
        self.conn.executemany(
            "UPDATE entries SET latest=0 WHERE run_id=? AND source_pk=? AND sequence=? "
            "AND ordinal=?",
            superseded,
        )
        self.conn.executemany(
            "INSERT INTO entries(id, run_id, source_pk, source_key, sequence, ordinal, "
            "revision, latest, kind, tool_call_id, scope, content_ref, raw_ref, intent_ref, "
            "object_hash, body) VALUES (?,?,?,?,?,?,?,1,?,?,?,?,?,?,?,?)",
            inserts,
        )
        return tally, inserted, bool(superseded), held

    def _put_objects(self, prepared: Prepared) -> None:
        self.objects.put_many(prepared.pending.items())
        self.conn.executemany(
            "INSERT OR IGNORE INTO objects(ref, bytes, media_type, redacted) VALUES (?,?,?,?)",
            [
                (ref, size, media, int(red))
                for ref, (size, media, red) in prepared.objects_written.items()
            ],
        )

    def _put_actions(
        self,
        run_id: str,
        outcome: Outcome,
        rows: list[EntryRow],
        sources: dict[str, dict[str, Any]],
    ) -> frozenset[str]:
        """Write the actions of current-execution entries; return the call entries of the
        ``task_agent`` actions that were new."""
        by_key = {(row.sequence, row.ordinal): row for row in rows}
        clean = self.redactor.clean
        calls: set[str] = set()
        for action in outcome.actions:
            row = by_key.get(action.draft)
            if row is None or row.scope != CURRENT:
                continue  # prior-context actions are excluded from relations
            source = sources[action.session]
            written = self.conn.execute(
                "INSERT OR IGNORE INTO actions(run_id, source_id, entry_id, object_hash, kind, "
                "harness, session_id, target, agent_id, tool_call_id, recorded_at, body_limited) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    source["id"],
                    row.id,
                    row.object_hash,
                    action.kind,
                    source["harness"],
                    source["session_id"],
                    clean(action.target) if action.target else None,
                    clean(action.agent_id) if action.agent_id else None,
                    row.tool_call_id,
                    row.body.get("recorded_at"),
                    int(action.body_limited),
                ),
            )
            if written.rowcount and action.kind == "task_agent":
                calls.add(row.id)
        return frozenset(calls)

    def _put_file(self, run_id: str, prepared: Prepared) -> None:
        self.conn.execute(
            "INSERT INTO files(run_id, path_key, boundary, boundary_hash, cursor, cursor_hash, "
            "updated_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT(run_id, path_key) DO UPDATE SET "
            "boundary=excluded.boundary, boundary_hash=excluded.boundary_hash, "
            "cursor=excluded.cursor, cursor_hash=excluded.cursor_hash, "
            "updated_at=excluded.updated_at",
            (
                run_id,
                prepared.path_key,
                prepared.boundary,
                prepared.boundary_hash,
                prepared.cursor,
                prepared.cursor_hash,
                self.now,
            ),
        )

    # ---- reports ---------------------------------------------------------------------

    def _report(
        self,
        run_id: str,
        key: str,
        prepared: Prepared,
        written: Counter[tuple[str, str, str]],
        current: Tally,
        prior: Tally | None,
    ) -> SourceReport:
        source, outcome = prepared.sources[key], prepared.outcome
        ranges = {CURRENT: current, PRIOR: prior}
        omissions: Counter[str] = Counter()
        for scope, tally_or_none in ranges.items():
            if tally_or_none is None:
                continue
            tally_or_none.add("stored", written[(key, scope, "stored")])
            tally_or_none.add("duplicates", written[(key, scope, "duplicates")])
            tally_or_none.add("truncated", prepared.truncated[(key, scope)])
            omissions.update(prepared.omissions.get((key, scope), Counter()))
        report = coverage_report(
            run_id=run_id,
            source=source,
            observed_at=self.now,
            current=current,
            prior=prior,
            policy=prepared.policy.to_wire(),
            omissions=dict(omissions),
            last_success_at=self.last_success(run_id, source["id"]),
        )
        self.put_coverage(run_id, report)
        summary = dict(outcome.stats.get(key, Counter()))
        for name, value in outcome.usage.get(key, Counter()).items():
            summary[f"usage_{name}"] = value
        return SourceReport(report, dict(sorted(summary.items())))


Tallies = dict[str, tuple[Tally, Tally | None]]
"""Each source's tallies (by session key, see :func:`tallies`): current execution, and prior
context when the file has a boundary."""


def _range_of(pair: tuple[Tally, Tally | None], start: int, boundary: int) -> Tally:
    """The tally of the range a record starting at byte ``start`` falls in."""
    current, prior = pair
    return prior if prior is not None and start < boundary else current


def tallies(prepared: Prepared) -> Tallies:
    """The line counts, span, present fields and issues of each source's ranges (current
    execution, prior context), by session key: everything of its coverage but what the
    write decides; pure, so computed before the file's write turn. One pass over the
    file's lines, drafts and issues for all sources (a pass per source, with a method call
    per count, was ~5% of a Claude Code ingest)."""
    outcome, split, starts = prepared.outcome, prepared.split, prepared.starts
    boundary = prepared.boundary
    pairs = {key: (Tally(), Tally() if boundary > 0 else None) for key in outcome.sessions}
    # Every source sees every line of the file in the range it falls in.
    before = sum(1 for line in split.lines if line.start < boundary) if boundary > 0 else 0
    after = len(split.lines) - before
    # Per (session, prior range): [matched, failed, unrecognized], added at the end.
    seen: dict[tuple[str, bool], list[int]] = {}
    for info in outcome.lines:
        pair = pairs.get(info.session)
        if pair is None:
            continue
        tally = _range_of(pair, starts[info.number], boundary)
        in_prior = tally is not pair[0]
        counted = seen.get((info.session, in_prior))
        if counted is None:
            counted = seen[info.session, in_prior] = [0, 0, 0]
        counted[0] += 1
        tally.line(info.number, info.timestamp)
        if info.status == "failed":
            counted[1] += 1
        elif info.status == "unrecognized":
            counted[2] += 1
    last_owner = None
    if split.deferred is not None:
        last_owner = outcome.lines[-1].session if outcome.lines else next(iter(outcome.sessions))
    for key, (current, prior) in pairs.items():
        ranges = [(current, after, False)]
        if prior is not None:
            ranges.append((prior, before, True))
        for tally, discovered, in_prior in ranges:
            if discovered:
                tally.add("discovered", discovered)
            matched, failed, unrecognized = seen.get((key, in_prior), (0, 0, 0))
            if matched:
                tally.add("matched", matched)
                tally.add("read", matched)
            if failed:
                tally.add("failed", failed)
            if matched - failed:
                tally.add("parsed", matched - failed)
            if unrecognized:
                tally.add("unrecognized", unrecognized)
        if split.deferred is not None:
            current.add("discovered")
            if last_owner == key:
                current.add("matched")
                current.add("deferred")
                current.issues.append({"code": "incomplete_line", "line": split.deferred.number})
    for draft in outcome.drafts:
        pair = pairs.get(draft.session)
        if pair is not None:
            _range_of(pair, starts[draft.line], boundary).present.update(draft.fields)
    for issue in outcome.issues:
        pair = pairs.get(issue.session) if issue.session is not None else None
        if pair is None:
            continue
        start = starts.get(issue.line, boundary) if issue.line is not None else boundary
        body: dict[str, Any] = {"code": issue.code}
        if issue.line is not None:
            body["line"] = issue.line
        if issue.field:
            body["field"] = issue.field
        tally = _range_of(pair, start, boundary)
        if pair[1] is not None:
            body["scope"] = PRIOR if tally is pair[1] else CURRENT
        tally.issues.append(body)
    for current, _ in pairs.values():
        current.issues.extend(prepared.issues)
    return pairs


@attrs.frozen
class Ready:
    """The pure part of a prepared file's write (:meth:`Ingest.ready`)."""

    tallies: Tallies
    texts: list[str]
    """The stored text of each of the prepared rows, in order."""
    links: list[LinkRow]
    """The file links' rows (``_links.file_link_rows``)."""


def _may_link(
    sources: dict[str, dict[str, Any]], outcome: Outcome, inserted: list[EntryRow]
) -> bool:
    """Whether this pass can change the run's cross-file links (``rebuild_run_links``).

    Those links are computed from: sources with an ``agent_id`` and their latest entries,
    ``task_agent`` and ``spawn`` actions and the kind of the call entry each names, the
    entries of the sessions a spawn names, and ``session`` entries with status
    ``compact_boundary`` (any revision) of the sessions compaction agents belong to. A pass
    touches only its own file's sources and entries, so when none of its sources has (or
    had, see ``_in_run_links``) an ``agent_id``, a ``task_agent`` or ``spawn`` action, or is
    a session a spawn names, and it writes no ``compact_boundary`` entry, every input of the
    rebuild is as it was and so is its result: the rebuild, which reads the whole run, is
    skipped.
    """
    return (
        any(src.get("agent_id") for src in sources.values())
        or any(action.kind in ("task_agent", "spawn") for action in outcome.actions)
        or any(
            row.kind == "session" and row.body.get("status") == "compact_boundary"
            for row in inserted
        )
    )


def _changes(
    sources: dict[str, dict[str, Any]],
    agents_before: dict[str, str | None],
    inserted: list[EntryRow],
    revised: bool,
    calls: frozenset[str],
    outcome: Outcome,
    redactor: Redactor,
) -> PassChanges:
    """What the pass wrote that ``task_agent`` links rest on (see ``PassChanges``)."""
    moved = any(
        src["id"] in agents_before and agents_before[src["id"]] != src.get("agent_id")
        for src in sources.values()
    )
    members = [
        (row.id, row.kind, src["id"], src["session_id"], src["agent_id"])
        for row in inserted
        if (src := sources[row.session]).get("agent_id")
    ]
    # Subagents are (session, agent id); a source's session never changes (its id names it).
    agents = {
        (src["session_id"], src["agent_id"]) for src in sources.values() if src.get("agent_id")
    }
    session_of = {src["id"]: src["session_id"] for src in sources.values()}
    agents.update((session_of[source], agent) for source, agent in agents_before.items() if agent)
    agents.update(
        (sources[action.session]["session_id"], redactor.clean(action.agent_id))
        for action in outcome.actions
        if action.kind == "task_agent" and action.agent_id
    )
    return PassChanges(
        additive=not revised and not moved,
        members=members,
        calls=calls,
        agents=frozenset(agents),
        sessions=frozenset(src["session_id"] for src in sources.values()),
    )
